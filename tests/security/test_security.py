"""Privileges by default (SPEC §0): roles, no PUBLIC execute, pinned search_path."""

import re

import pytest
from mbx import drop_role, make_role, raises, rows, scalar

PUBLIC_FUNCTIONS_SQL = """
SELECT p.oid::regprocedure::text FROM pg_proc p
 WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname NOT LIKE '\\_%'
"""


def test_roles_exist_and_admin_is_producer_and_consumer(db):
    got = rows(
        db, "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'mailbox\\_%' ORDER BY 1"
    )
    assert [tuple(r) for r in got] == [
        ("mailbox_admin", False),
        ("mailbox_consumer", False),
        ("mailbox_producer", False),
    ]
    assert scalar(
        db,
        "SELECT pg_has_role('mailbox_admin', 'mailbox_producer', 'MEMBER')"
        " AND pg_has_role('mailbox_admin', 'mailbox_consumer', 'MEMBER')",
    )


def test_public_cannot_execute_any_function(db):
    got = rows(
        db,
        """
        SELECT p.oid::regprocedure::text FROM pg_proc p
         WHERE p.pronamespace = 'mailbox'::regnamespace
           AND has_function_privilege('public', p.oid, 'EXECUTE')""",
    )
    assert got == []


def test_every_security_definer_function_pins_search_path(db):
    got = rows(
        db,
        """
        SELECT p.oid::regprocedure::text, p.proconfig FROM pg_proc p
         WHERE p.pronamespace = 'mailbox'::regnamespace AND p.prosecdef""",
    )
    assert got, "expected SECURITY DEFINER functions"
    for name, config in got:
        assert config[0] == "search_path=pg_catalog, mailbox, pg_temp", name
        # besides the path, only planner settings that change no result (inbox_claim's
        # generic plan and jit = off: docs/inbox.md, "Claims and JIT"; the inbox workers'
        # index plans: "Plans made on an empty queue")
        assert set(config[1:]) <= {
            "max_parallel_workers_per_gather=0",
            "plan_cache_mode=force_generic_plan",
            "jit=off",
            "enable_seqscan=off",
        }, name


def test_every_function_has_a_pinned_search_path(db):
    # The exceptions: the inbox routers (part 35, routes) and the named ones (part 35, named
    # routes), one-expression SQL functions left without SET so the planner inlines them into
    # the pinned public functions (test_the_routers_name_nothing_a_search_path_... and
    # test_the_named_routers_name_nothing_a_search_path_...); inbox_receive and
    # inbox_mark_processed(text, text), one expression each inlined into its caller's
    # statement for the same reason, that calls two pinned SECURITY DEFINER functions by
    # qualified names (inbox/test_inbox_inlined.py::test_the_callers_search_path_redirects_...);
    # enable_outbox, an
    # invoker function that must resolve its table argument with the caller's search_path
    # (it calls the definer _enable_outbox); the
    # procedure run_numberer, which commits and so may not have a SET clause (it pins the
    # path with set_config first: test_run_numberer_resolves_no_operator_through_the_callers_path);
    # _inbox_settle, an invoker function that only the pinned SECURITY DEFINER settle trigger,
    # inbox_claim and _inbox_hold_in_flight call (a SET of its own cost a tenth of a claim;
    # test_nobody_but_the_extension_may_settle_a_claim);
    # and the settings registry _settings(), a VALUES list of literals that names nothing a
    # path could redirect, left without SET so the planner inlines it into the parsers
    # (test_the_settings_registry_names_nothing_a_search_path_could_redirect)
    got = rows(
        db,
        """
        SELECT p.oid::regprocedure::text FROM pg_proc p
         WHERE p.pronamespace = 'mailbox'::regnamespace
           AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')""",
    )
    assert sorted(r[0] for r in got) == [
        "mailbox._inbox_route_claim(mailbox._inbox,integer,timestamp with time zone,boolean)",
        "mailbox._inbox_route_failed(mailbox._inbox,text,text)",
        "mailbox._inbox_route_named_version(text)",
        "mailbox._inbox_route_processed(mailbox._inbox,text)",
        "mailbox._inbox_route_processed_batch(mailbox._inbox,text[])",
        "mailbox._inbox_route_processed_count(mailbox._inbox,text[])",
        "mailbox._inbox_route_processed_named(text,text)",
        "mailbox._inbox_route_receive(mailbox._inbox,text,jsonb,text,text,text,bigint,jsonb,text,integer)",
        "mailbox._inbox_route_receive_batch(mailbox._inbox,jsonb)",
        "mailbox._inbox_route_receive_named(text,text,jsonb,text,text,text,bigint,jsonb,text,integer)",
        "mailbox._inbox_route_unsettled(mailbox._inbox,text[])",
        "mailbox._inbox_settle(bigint)",
        "mailbox._settings()",
        "mailbox.enable_outbox(text,integer,integer,text,boolean,integer)",
        "mailbox.inbox_mark_processed(text,text)",
        "mailbox.inbox_receive(text,text,jsonb,text,text,text,bigint,jsonb,text,integer)",
        "mailbox.run_numberer(integer)",
    ]


def test_nobody_but_the_extension_may_settle_a_claim(db):
    """_inbox_settle has no SET clause (it runs with its pinned callers' search_path), so no
    role but its owner may execute it: called by a hostile role under a search_path of its
    own, it would write lease rows of any inbox."""
    settle = "mailbox._inbox_settle(bigint)"
    owner = scalar(
        db, "SELECT proowner::regrole::text FROM pg_proc WHERE oid = %s::regprocedure", [settle]
    )
    acl = scalar(db, "SELECT proacl::text[] FROM pg_proc WHERE oid = %s::regprocedure", [settle])
    assert acl == [f"{owner}=X/{owner}"]
    for role in ("mailbox_consumer", "mailbox_producer", "mailbox_admin", "public"):
        assert (
            scalar(db, "SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, settle]) is False
        ), role
    consumer = make_role(db, "mailbox_consumer", "mailbox_admin")
    db.execute(f'SET ROLE "{consumer}"')
    with raises("42501"):
        db.execute("SELECT mailbox._inbox_settle(1)")
    db.execute("RESET ROLE")
    drop_role(db, consumer)


def test_settling_a_claim_names_nothing_a_search_path_could_redirect(db):
    """_inbox_settle runs with its caller's search_path (it has no SET clause): a review found
    an unqualified text || int, which an exact operator in any schema on the path wins over
    pg_catalog's polymorphic one. Called under a path of decoys for every operator and type it
    uses, it uses none of them."""
    db.execute("SELECT mailbox.create_inbox('sec')")
    for i in range(3):
        db.execute("SELECT mailbox.inbox_receive('sec', %s, '{}')", [f"s{i}"])
    db.execute("CREATE SCHEMA decoy")
    db.execute(
        "CREATE FUNCTION decoy.boom() RETURNS boolean LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'decoy called' USING ERRCODE = 'P0099'; END$$"
    )
    for op, left, right in (
        ("||", "text", "integer"),
        ("<=", "timestamp with time zone", "timestamp with time zone"),
        ("<>", "bigint", "integer"),
        ("-", "integer", "bigint"),
        ("=", "bigint", "bigint"),
        ("=", "integer", "integer"),
        (">", "integer", "integer"),
    ):
        name = f"decoy_{abs(hash((op, left, right)))}"
        db.execute(
            f"CREATE FUNCTION decoy.{name}(a {left}, b {right}) RETURNS boolean LANGUAGE sql"
            " AS 'SELECT decoy.boom()'"
        )
        db.execute(
            f"CREATE OPERATOR decoy.{op} (LEFTARG = {left}, RIGHTARG = {right},"
            f" FUNCTION = decoy.{name})"
        )
    db.execute("CREATE DOMAIN decoy.text AS pg_catalog.text CHECK (decoy.boom())")
    db.execute("CREATE DOMAIN decoy.int8 AS pg_catalog.int8 CHECK (decoy.boom())")
    with db.transaction():
        assert scalar(db, "SELECT count(*) FROM mailbox.inbox_claim('sec', 'w', 3, 30)") == 3
        db.execute("SET LOCAL search_path = decoy, pg_catalog")
        db.execute("SELECT mailbox._inbox_settle(claim_no) FROM mailbox._inbox_open_claim")
        db.execute("RESET search_path")
        assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease") == 3
    db.execute("DROP SCHEMA decoy CASCADE")


def test_the_routers_name_nothing_a_search_path_could_redirect(db):
    # 10 inboxes, so the CASE splits on OPERATOR(pg_catalog.<) too
    for i in range(10):
        db.execute(f"SELECT mailbox.create_inbox('route{i}')")
    kinds = [r[0] for r in rows(db, "SELECT kind FROM mailbox._inbox_route_kinds()")]
    assert len(kinds) == 8
    token = re.compile(
        r"SELECT|CASE|WHEN|THEN|ELSE|END|\(\$1\)\.inbox_key|OPERATOR\(pg_catalog\.[=<]\)|\d+"
        rf"|mailbox\._inbox_(?:\d+|dispatch)_(?:{'|'.join(kinds)})\((?:\$\d+, )*\$\d+\)|\s+"
    )
    for kind in kinds:
        body = scalar(
            db,
            "SELECT prosrc FROM pg_proc WHERE oid = %s::regproc",
            [f"mailbox._inbox_route_{kind}"],
        )
        assert "OPERATOR(pg_catalog.<)" in body
        assert token.sub("", body) == "", body
        # no SET clause: a function with one is never inlined
        config = scalar(
            db,
            "SELECT proconfig FROM pg_proc WHERE oid = %s::regproc",
            [f"mailbox._inbox_route_{kind}"],
        )
        assert config is None


def test_the_named_routers_name_nothing_a_search_path_could_redirect(db):
    # 10 managed inboxes, so the CASE splits on OPERATOR(pg_catalog.<) too, and one with
    # grants (no arm: it takes the full path, which checks them)
    names = [f"nr{i}" for i in range(10)]
    for name in names + ["granted"]:
        db.execute("SELECT mailbox.create_inbox(%s)", [name])
    db.execute("SELECT mailbox.grant_inbox('granted', 'mailbox_producer', 'receive')")
    token = re.compile(
        r"SELECT|CASE|WHEN|THEN|ELSE|END|\$1|OPERATOR\(pg_catalog\.[=<]\)"
        r"|'(?:[^']|'')*'::pg_catalog\.text|COLLATE pg_catalog\.\"C\"|\d+"
        r"|NULL::pg_catalog\.(?:bool|text)"
        r"|mailbox\._inbox_\d+_(?:receive|processed)_named"
        r"\(NULL::mailbox\._inbox, (?:\$\d+, )*\$\d+\)|\s+"
    )
    for kind in ("receive_named", "processed_named", "named_version"):
        fn = f"mailbox._inbox_route_{kind}"
        body = scalar(db, "SELECT prosrc FROM pg_proc WHERE proname = %s", [fn.split(".")[1]])
        assert "OPERATOR(pg_catalog.<)" in body and "'nr9'" in body, body
        assert "'granted'" not in body, body
        assert token.sub("", body) == "", body
        config = scalar(db, "SELECT proconfig FROM pg_proc WHERE proname = %s", [fn.split(".")[1]])
        assert config is None
    assert scalar(db, "SELECT mailbox.inbox_receive('nr9', 'm', '{}')") is True
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('nr9', 'm')") is True
    assert scalar(db, "SELECT mailbox._inbox_route_processed_named('granted', 'm')") is None
    assert (
        scalar(
            db,
            "SELECT mailbox._inbox_route_receive_named('granted', 'm', '{}',"
            " NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
        )
        is None
    )


def test_the_settings_registry_names_nothing_a_search_path_could_redirect(db):
    body = scalar(db, "SELECT prosrc FROM pg_proc WHERE oid = 'mailbox._settings()'::regprocedure")
    code = re.sub(r"'(?:[^']|'')*'", "''", body)  # string literals out
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", code))
    assert words <= {"VALUES", "bigint", "NULL"}, words - {"VALUES", "bigint", "NULL"}


def test_every_public_function_has_a_comment(db):
    got = rows(db, PUBLIC_FUNCTIONS_SQL + " AND obj_description(p.oid, 'pg_proc') IS NULL")
    assert got == []


def test_public_cannot_read_extension_tables(db):
    got = rows(
        db,
        """
        SELECT c.oid::regclass::text FROM pg_class c
         WHERE c.relnamespace = 'mailbox'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
           AND (has_table_privilege('public', c.oid, 'SELECT')
                OR has_table_privilege('public', c.oid, 'INSERT'))""",
    )
    assert got == []


@pytest.fixture
def nobody(db):
    role = make_role(db)
    yield role
    drop_role(db, role)


def test_role_without_grants_gets_42501_everywhere(db, connect, nobody):
    db.execute("SELECT mailbox.create_outbox('e')")
    conn = connect()
    conn.execute(f'SET ROLE "{nobody}"')
    for call in [
        "SELECT mailbox.create_outbox('x')",
        "SELECT mailbox.enable_outbox('t')",
        "SELECT mailbox.disable_outbox('e')",
        "SELECT mailbox.outbox_publish('e', '{}')",
        "SELECT mailbox.outbox_status('e')",
        "SELECT * FROM mailbox.outbox_delta_rows('e', 1)",
        "SELECT * FROM mailbox.outboxes",
    ]:
        with raises("42501"):
            conn.execute(call)


@pytest.fixture
def consumer(db):
    role = make_role(db, "mailbox_consumer")
    yield role
    drop_role(db, role)


def test_consumer_reads_but_cannot_publish_or_manage(db, connect, consumer):
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t', p_inline_threshold_rows => 0)")
    db.execute("INSERT INTO t VALUES (1), (2)")
    db.execute("SELECT mailbox._sequence_outbox(outbox_key) FROM mailbox._outbox")
    conn = connect()
    conn.execute(f'SET ROLE "{consumer}"')
    assert len(rows(conn, "SELECT * FROM mailbox.outbox_delta_rows('t', 1)")) == 2
    conn.execute("SELECT mailbox.outbox_rows_consumed('t', 1)")
    with raises("42501"):
        conn.execute("SELECT mailbox.outbox_publish('t', '{}')")
    with raises("42501"):
        conn.execute("SELECT mailbox.drop_outbox('t')")


@pytest.fixture
def admin(db):
    role = make_role(db, "mailbox_admin")
    yield role
    drop_role(db, role)


def test_admin_cannot_capture_a_table_it_may_not_read(db, connect, admin):
    db.execute("CREATE TABLE secret (id int)")
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t')")
    conn = connect()
    conn.execute(f'SET ROLE "{admin}"')
    with raises("42501") as info:
        conn.execute("SELECT mailbox.enable_outbox('secret')")
    assert "permission denied to capture table: public.secret" in str(info.value)
    with raises("42501"):
        conn.execute("SELECT mailbox.outbox_snapshot('t')")
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes") == 1


def test_admin_manages_outboxes_on_tables_it_may_read_and_trigger(db, connect, admin):
    db.execute("CREATE TABLE t (id int)")
    db.execute(f'GRANT SELECT, TRIGGER ON t TO "{admin}"')
    conn = connect()
    conn.execute(f'SET ROLE "{admin}"')
    assert scalar(conn, "SELECT mailbox.enable_outbox('t')") == "t"
    conn.execute("SELECT mailbox.create_outbox('e')")
    conn.execute("SELECT mailbox.outbox_publish('e', '{}')")  # admin is also a producer
    assert scalar(conn, "SELECT mailbox.outbox_status('e')")["row_count"] == 1
    assert scalar(conn, "SELECT count(*) FROM mailbox.outboxes") == 2
    assert scalar(conn, "SELECT mailbox.outbox_snapshot('t')") == 0
    conn.execute("SELECT mailbox.drop_outbox('t')")
    conn.execute("SELECT mailbox.drop_outbox('e')")


def test_run_numberer_resolves_no_operator_through_the_callers_path(db):
    """pg_cron runs the numberer as the role that scheduled it. An operator that a tenant put
    on the caller's search_path (an exact match for int / numeric, which pg_catalog lacks)
    must not run inside it; the caller's path comes back afterwards."""
    db.execute("CREATE SCHEMA hostile")
    db.execute("CREATE TABLE hostile.ran (who text)")
    db.execute(
        "CREATE FUNCTION hostile.div(integer, numeric) RETURNS numeric LANGUAGE plpgsql AS"
        " $$ BEGIN INSERT INTO hostile.ran VALUES (current_user); RETURN $1::numeric / $2; END $$"
    )
    db.execute(
        "CREATE OPERATOR hostile./ (LEFTARG = integer, RIGHTARG = numeric, FUNCTION = hostile.div)"
    )
    db.execute("SET search_path = hostile, pg_catalog")
    scalar(db, "SELECT 1 / 1000.0")  # the operator is the one this path resolves
    assert scalar(db, "SELECT count(*) FROM ran") == 1
    db.execute("CALL mailbox.run_numberer(1)")  # idles with pg_sleep(v_idle_ms / 1000.0)
    assert scalar(db, "SELECT count(*) FROM hostile.ran") == 1  # only the check above
    assert scalar(db, "SHOW search_path") == "hostile, pg_catalog"
    db.execute("RESET search_path")
