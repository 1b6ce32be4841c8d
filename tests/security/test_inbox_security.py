"""Inbox privileges (SPEC §0) and what DROP EXTENSION does to inboxes (docs/inbox.md)."""

import psycopg
import pytest
from mbx import drop_role, make_role, raises, rows, scalar


@pytest.fixture
def roles(db):
    db.execute("SELECT mailbox.create_inbox('sec')")
    made = {kind: make_role(db, f"mailbox_{kind}") for kind in ("producer", "consumer", "admin")}
    made["nobody"] = make_role(db)
    yield made
    db.execute("RESET ROLE")
    for name in made.values():
        drop_role(db, name)


def as_role(db, role, sql, params=None):
    db.execute(f'SET ROLE "{role}"')
    try:
        return scalar(db, sql, params)
    finally:
        db.execute("RESET ROLE")


RECEIVE = "SELECT mailbox.inbox_receive('sec', %s, '{}')"
CLAIM = "SELECT count(*) FROM mailbox.inbox_claim('sec', 'w')"
MARK = "SELECT mailbox.inbox_mark_processed('sec', 'p1')"
PARTITION = "SELECT mailbox.inbox_is_my_partition('a', 0, 2)"
HEALTH = "SELECT mailbox.inbox_health('sec')"


def test_each_role_calls_only_its_own_functions(db, roles):
    assert as_role(db, roles["producer"], RECEIVE, ["p1"]) is True
    for sql in (CLAIM, MARK, PARTITION, HEALTH):
        with raises("42501"):
            as_role(db, roles["producer"], sql)
    assert as_role(db, roles["consumer"], CLAIM) == 1
    assert as_role(db, roles["consumer"], MARK) is True
    assert as_role(db, roles["consumer"], PARTITION) in (True, False)
    for sql in (RECEIVE, HEALTH):
        with raises("42501"):
            as_role(db, roles["consumer"], sql, ["p2"] if "%s" in sql else None)
    assert as_role(db, roles["admin"], HEALTH)["processed_count"] == 1
    assert as_role(db, roles["admin"], RECEIVE, ["p3"]) is True
    as_role(db, roles["admin"], "SELECT mailbox.create_inbox('by_admin')")
    assert as_role(db, roles["consumer"], "SELECT count(*) FROM mailbox.pending_sec") == 1
    for sql in (RECEIVE, CLAIM, HEALTH, "SELECT mailbox.create_inbox('x')"):
        with raises("42501"):
            as_role(db, roles["nobody"], sql, ["p4"] if "%s" in sql else None)


def test_create_inbox_in_a_schema_needs_create_there(db, roles):
    db.execute("CREATE SCHEMA locked")
    with raises("42501"):
        as_role(db, roles["admin"], "SELECT mailbox.create_inbox('l', 'locked')")
    db.execute(f'GRANT CREATE ON SCHEMA locked TO "{roles["admin"]}"')
    as_role(db, roles["admin"], "SELECT mailbox.create_inbox('l', 'locked')")
    db.execute("SELECT mailbox.drop_inbox('l', p_cascade => true)")
    db.execute(f'REVOKE CREATE ON SCHEMA locked FROM "{roles["admin"]}"')


def test_create_inbox_refuses_a_schema_a_tenant_owns(db, roles):
    """The owner of a schema can drop or rename any table in it, and so swap a managed table
    under a receive waiting for its lock: refused before anything is made (docs/security.md)."""
    admin = roles["admin"]
    db.execute(f'CREATE SCHEMA ten AUTHORIZATION "{admin}"')
    try:
        with raises("42501") as info:
            as_role(db, admin, "SELECT mailbox.create_inbox('x', 'ten')")
        assert "schema ten" in str(info.value) and admin in str(info.value)
        assert "enable_inbox_tracking" in info.value.diag.message_hint
        with raises("42501"):  # a superuser asking changes nothing: the owner is the hazard
            db.execute("SELECT mailbox.create_inbox('x', 'ten')")
        assert scalar(db, "SELECT to_regclass('ten.x')") is None
        assert scalar(db, "SELECT count(*) FROM mailbox._inbox WHERE inbox_name = 'x'") == 0
        # the way the hint points to: the tenant's own table, adopted, runs as the tenant
        db.execute(f'SET ROLE "{admin}"')
        db.execute(
            "CREATE TABLE ten.x (event_id text PRIMARY KEY, payload jsonb,"
            " processed_at timestamptz, retry_count int DEFAULT 0, error text,"
            " received_at timestamptz DEFAULT now(), event_type text)"
        )
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'ten.x')")
        db.execute("RESET ROLE")
        assert as_role(db, admin, "SELECT mailbox.inbox_receive('x', 'e1', '{}')") is True
        db.execute("SELECT mailbox.drop_inbox('x')")
    finally:
        db.execute("DROP SCHEMA ten CASCADE")


def test_create_inbox_in_public_follows_the_database_owner(db, roles):
    """public belongs to pg_database_owner: trusted only while a superuser owns the database."""
    dbname = scalar(db, "SELECT current_database()")
    owner = scalar(
        db, "SELECT datdba::regrole::text FROM pg_database WHERE datname = current_database()"
    )
    db.execute(f'ALTER DATABASE "{dbname}" OWNER TO "{roles["admin"]}"')
    try:
        with raises("42501") as info:
            db.execute("SELECT mailbox.create_inbox('pub', 'public')")
        assert "schema public" in str(info.value)
    finally:
        db.execute(f'ALTER DATABASE "{dbname}" OWNER TO {owner}')
    db.execute("SELECT mailbox.create_inbox('pub', 'public')")
    db.execute("SELECT mailbox.drop_inbox('pub', p_cascade => true)")


def test_adopting_needs_rights_on_the_table(db, roles):
    db.execute(
        "CREATE TABLE public.theirs (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int, received_at timestamptz)"
    )
    with raises("42501"):
        as_role(db, roles["admin"], "SELECT mailbox.enable_inbox_tracking('t', 'public.theirs')")


ADOPT_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


@pytest.mark.parametrize("missing", ADOPT_PRIVILEGES)
def test_adopting_needs_every_one_of_select_insert_update_delete(db, roles, missing):
    db.execute(
        "CREATE TABLE public.theirs (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int, received_at timestamptz)"
    )
    db.execute(f'GRANT CREATE ON SCHEMA public TO "{roles["admin"]}"')
    held = ", ".join(p for p in ADOPT_PRIVILEGES if p != missing)
    db.execute(f'GRANT {held} ON public.theirs TO "{roles["admin"]}"')
    with raises("42501") as info:
        as_role(db, roles["admin"], "SELECT mailbox.enable_inbox_tracking('t', 'public.theirs')")
    assert f"lacks {missing})" in str(info.value)
    assert info.value.diag.message_hint.startswith(f"GRANT {missing} ON public.theirs TO")
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox") == 1  # only 'sec'
    db.execute(f'GRANT {missing} ON public.theirs TO "{roles["admin"]}"')
    as_role(db, roles["admin"], "SELECT mailbox.enable_inbox_tracking('t', 'public.theirs')")
    db.execute("SELECT mailbox.drop_inbox('t')")
    db.execute(f'REVOKE CREATE ON SCHEMA public FROM "{roles["admin"]}"')


def test_managed_inbox_tables_take_no_code_from_other_roles(db, roles):
    # owned by the extension owner, no TRIGGER or REFERENCES for anyone: nobody else can put
    # a trigger, default, constraint, index or policy on them (docs/inbox.md)
    owner = scalar(
        db, "SELECT pg_get_userbyid(extowner) FROM pg_extension WHERE extname = 'pg_mailbox'"
    )
    assert (
        scalar(
            db, "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'mailbox.sec'::regclass"
        )
        == owner
    )
    for role in ("mailbox_admin", "mailbox_producer", "mailbox_consumer", *roles.values()):
        for privilege in ("TRIGGER", "REFERENCES"):
            assert not scalar(
                db, "SELECT has_table_privilege(%s, 'mailbox.sec', %s)", [role, privilege]
            ), (role, privilege)
    for ddl in (
        "CREATE TRIGGER t BEFORE UPDATE ON mailbox.sec FOR EACH ROW"
        " EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "ALTER TABLE mailbox.sec ADD CHECK (true)",
        "CREATE POLICY p ON mailbox.sec USING (true)",
    ):
        with raises("42501"):
            as_role(db, roles["admin"], ddl)


def test_drop_extension_refuses_while_inboxes_exist_and_cascade_keeps_user_schema_tables(fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as db:
        db.execute("CREATE EXTENSION pg_mailbox CASCADE")
        db.execute("CREATE SCHEMA app")
        db.execute("SELECT mailbox.create_inbox('kept', 'app')")
        db.execute("SELECT mailbox.create_inbox('inside')")  # in schema mailbox
        db.execute(
            "CREATE TABLE app.adopted (event_id text PRIMARY KEY, processed_at timestamptz,"
            " retry_count int NOT NULL DEFAULT 0, received_at timestamptz)"
        )
        db.execute("SELECT mailbox.enable_inbox_tracking('adopted', 'app.adopted')")
        db.execute("SELECT mailbox.enable_inbox_ordering('kept')")
        db.execute("SELECT mailbox.inbox_receive('kept', 'k1', '{}', NULL, NULL, 'A', 1)")
        db.execute("SELECT mailbox.inbox_receive('adopted', 'a1', NULL)")
        with raises("2BP01"):
            db.execute("DROP EXTENSION pg_mailbox")
        db.execute("DROP EXTENSION pg_mailbox CASCADE")
        # no view or function of pg_mailbox is left
        assert (
            rows(
                db,
                "SELECT schemaname, viewname FROM pg_views WHERE schemaname IN ('app', 'mailbox')",
            )
            == []
        )
        assert scalar(db, "SELECT count(*) FROM pg_proc WHERE proname LIKE '%inbox%'") == 0
        assert scalar(db, "SELECT to_regclass('mailbox._inbox')") is None
        # every inbox table keeps its data, also a managed one in schema mailbox (CREATE
        # EXTENSION made that schema, but it is not a member, so it stays with what it holds)
        assert scalar(db, "SELECT event_id FROM app.kept") == "k1"
        assert scalar(db, "SELECT count(*) FROM mailbox.inside") == 0
        assert scalar(db, "SELECT event_id FROM app.adopted") == "a1"
        assert scalar(db, "SELECT count(*) FROM pg_indexes WHERE tablename = 'kept'") == 5


def test_per_inbox_grants_receive_and_process(db, roles):
    # open: without grants the role-level grants decide, as before
    assert as_role(db, roles["producer"], RECEIVE, ["o1"]) is True
    assert as_role(db, roles["consumer"], CLAIM) == 1
    # once the inbox has a grant, only grantees (and mailbox_admin) may use it that way
    other_producer, other_consumer = (
        make_role(db, "mailbox_producer"),
        make_role(db, "mailbox_consumer"),
    )
    db.execute("SELECT mailbox.grant_inbox('sec', %s, 'receive')", [roles["producer"]])
    db.execute("SELECT mailbox.grant_inbox('sec', %s, 'process')", [roles["consumer"]])
    assert as_role(db, roles["producer"], RECEIVE, ["o2"]) is True
    with raises("42501") as info:
        as_role(db, other_producer, RECEIVE, ["o3"])
    assert "receive inbox sec" in str(info.value)
    assert as_role(db, roles["consumer"], CLAIM) == 1
    for sql in (
        CLAIM,
        "SELECT mailbox.inbox_mark_processed('sec', 'o1')",
        "SELECT mailbox.inbox_mark_failed('sec', 'o1', 'boom')",
    ):
        with raises("42501") as info:
            as_role(db, other_consumer, sql)
        assert "process inbox sec" in str(info.value)
    # receive does not imply process, nor the other way round
    db.execute(f'GRANT mailbox_consumer TO "{roles["producer"]}"')
    with raises("42501"):
        as_role(db, roles["producer"], CLAIM)
    assert as_role(db, roles["admin"], CLAIM) == 0  # admins keep everything (nothing left)
    assert as_role(db, roles["admin"], RECEIVE, ["o4"]) is True
    assert as_role(db, roles["consumer"], "SELECT mailbox.inbox_mark_processed('sec', 'o1')")
    # dropping the inbox forgets its grants: a new inbox of that name starts open
    db.execute("SELECT mailbox.drop_inbox('sec', p_cascade => true)")
    db.execute("SELECT mailbox.create_inbox('sec')")
    assert as_role(db, other_producer, RECEIVE, ["o5"]) is True
    assert scalar(db, "SELECT count(*) FROM mailbox._object_grant") == 0
    for name in (other_producer, other_consumer):
        drop_role(db, name)
