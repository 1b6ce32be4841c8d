"""The per-inbox generated functions behind receive/claim/mark and the control plane's reads
(docs/inbox.md, part 35): made with the inbox, owned by its table's owner and run with its
rights, rebuilt on every configuration change (also for a session that already cached them),
dropped with it, private, and safe with any column names."""

import os
import re
from pathlib import Path

from mbx import drop_role, make_role, raises, rows, scalar

GENERATED = """
SELECT p.proname, p.prosecdef, p.proconfig, has_function_privilege('public', p.oid, 'EXECUTE'),
       pg_get_userbyid(p.proowner)
  FROM pg_proc p
 WHERE p.pronamespace = 'mailbox'::regnamespace
   AND p.proname LIKE '\\_inbox\\_' || %s || '\\_%%'
 ORDER BY 1
"""


def key(db, inbox):
    return scalar(db, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox])


def adopt_legacy(db, owner):
    """public.legacy, owned by ``owner``, adopted as inbox 'legacy'."""
    db.execute(
        "CREATE TABLE public.legacy (id text PRIMARY KEY, done timestamptz,"
        " tries int NOT NULL DEFAULT 0, got timestamptz)"
    )
    db.execute(f'ALTER TABLE public.legacy OWNER TO "{owner}"')
    db.execute(
        "SELECT mailbox.enable_inbox_tracking('legacy', 'public.legacy', 'id', 'done', 'tries',"
        " p_received_at_column => 'got')"
    )


def test_create_makes_private_functions_and_drop_removes_them(db):
    db.execute("SELECT mailbox.create_inbox('gen')")
    k = key(db, "gen")
    got = rows(db, GENERATED, [str(k)])
    assert [r[0] for r in got] == [
        f"_inbox_{k}_{kind}"
        for kind in (
            "claim",
            "failed",
            "processed",
            "processed_batch",
            "processed_count",
            "processed_named",  # a managed inbox's only (part 35, named receive)
            "query",
            "receive",
            "receive_batch",
            "receive_named",  # a managed inbox's only (part 35, named receive)
            "unsettled",
        )
    ]
    # a managed table's owner is the extension owner, whose pinned public functions call
    # them already as that owner: invoker functions with no SET clause of their own; but the
    # named receive and mark, which the callers of the inlined inbox_receive and
    # inbox_mark_processed call themselves (part 35, named receive): SECURITY DEFINER with a
    # pinned search_path (and the named mark's plans never sequential scans: docs/inbox.md,
    # "Plans made on an empty queue")
    extension_owner = scalar(
        db, "SELECT pg_get_userbyid(extowner) FROM pg_extension WHERE extname = 'pg_mailbox'"
    )
    for name, definer, config, public, owner in got:
        assert not public and owner == extension_owner
        if name.endswith("_receive_named"):
            assert definer and config == ["search_path=pg_catalog, mailbox, pg_temp"], name
        elif name.endswith("_processed_named"):
            assert definer and config == [
                "search_path=pg_catalog, mailbox, pg_temp",
                "enable_seqscan=off",
                "jit=off",
            ], name
        else:
            assert not definer and config is None, name
    # nobody else may call them, and a superuser that is not their owner is refused
    consumer = make_role(db, "mailbox_consumer")
    other = make_role(db)
    db.execute(f'ALTER ROLE "{other}" SUPERUSER')
    call = f"SELECT mailbox._inbox_{k}_processed(i, 'x') FROM mailbox._inbox i"
    for role in (consumer, other):
        db.execute(f'SET ROLE "{role}"')
        with raises("42501") as info:
            db.execute(call)
        db.execute("RESET ROLE")
        want = "permission denied" if role == consumer else "must run as"
        assert want in str(info.value), info.value
    drop_role(db, consumer)
    drop_role(db, other)
    db.execute("SELECT mailbox.drop_inbox('gen', p_cascade => true)")
    assert rows(db, GENERATED, [str(k)]) == []


def test_adopted_inbox_gets_them_owned_by_the_table_owner_and_drop_keeps_only_the_table(db):
    owner = make_role(db)
    db.execute(f'GRANT CREATE ON SCHEMA public TO "{owner}"')
    adopt_legacy(db, owner)
    k = key(db, "legacy")
    got = rows(db, GENERATED, [str(k)])
    # every kind but the two named ones, which only a managed inbox has
    assert [(r[1], r[3], r[4]) for r in got] == [(True, False, owner)] * 9
    # so are its views; the per-inbox state views stay the extension's, readable by the owner
    assert {
        r[0] for r in rows(db, "SELECT viewowner FROM pg_views WHERE viewname LIKE '%%legacy'")
    } == {owner}
    for kind in ("lease", "aggregate", "config"):
        assert scalar(
            db, f"SELECT has_table_privilege(%s, 'mailbox._inbox_{k}_{kind}', 'SELECT')", [owner]
        )
    db.execute("SELECT mailbox.drop_inbox('legacy')")
    assert rows(db, GENERATED, [str(k)]) == []
    assert scalar(db, f"SELECT to_regclass('mailbox._inbox_{k}_lease')") is None
    assert scalar(db, "SELECT to_regclass('public.legacy') IS NOT NULL")
    drop_role(db, owner)


def test_a_session_that_cached_the_functions_follows_ordering_and_priority_changes(db, connect):
    db.execute("SELECT mailbox.create_inbox('cfg')")
    worker = connect()
    # warm the worker's plan caches on the plain configuration
    assert worker.execute(
        "SELECT mailbox.inbox_receive('cfg', 'a', '{}', p_priority => 9)"
    ).fetchone()[0]
    assert worker.execute(
        "SELECT mailbox.inbox_receive('cfg', 'b', '{}', p_priority => 1)"
    ).fetchone()[0]
    assert rows(worker, "SELECT event_id FROM mailbox.inbox_claim('cfg', 'w', 1, 1)") == [("a",)]
    db.execute("UPDATE mailbox._inbox_lease SET lease_until = now() - interval '1 s'")

    db.execute("SELECT mailbox.enable_inbox_priority('cfg')")
    assert rows(worker, "SELECT event_id FROM mailbox.inbox_claim('cfg', 'w', 2)") == [
        ("b",),
        ("a",),
    ]
    worker.execute("SELECT mailbox.inbox_mark_processed('cfg', 'a')")
    worker.execute("SELECT mailbox.inbox_mark_processed('cfg', 'b')")

    db.execute("SELECT mailbox.disable_inbox_priority('cfg')")
    db.execute("SELECT mailbox.enable_inbox_ordering('cfg')")
    with raises("22004"):  # ordered now: aggregate and sequence are required
        worker.execute("SELECT mailbox.inbox_receive('cfg', 'c', '{}')")
    for event_id, seq in (("s2", 2), ("s1", 1)):
        worker.execute(
            "SELECT mailbox.inbox_receive('cfg', %s, '{}',"
            " p_aggregate_id => 'A', p_sequence_num => %s)",
            [event_id, seq],
        )
    assert rows(worker, "SELECT event_id FROM mailbox.inbox_claim('cfg', 'w', 10)") == [("s1",)]
    worker.execute("SELECT mailbox.inbox_mark_processed('cfg', 's1')")
    assert scalar(db, "SELECT last_seq FROM mailbox._inbox_aggregate") == 1

    db.execute("SELECT mailbox.disable_inbox_ordering('cfg')")
    assert worker.execute("SELECT mailbox.inbox_receive('cfg', 'c', '{}')").fetchone()[0]
    assert rows(worker, "SELECT event_id FROM mailbox.inbox_claim('cfg', 'w', 10)") == [
        ("s2",),
        ("c",),
    ]


def test_column_names_that_look_like_variables_are_columns(db):
    # the generated bodies have unnamed parameters and use_column, so an adopted table whose
    # columns are named like PL/pgSQL variables (found, v_id, ...) still works
    db.execute(
        'CREATE TABLE public.odd ("found" text PRIMARY KEY, v_id timestamptz,'
        " v_retries int NOT NULL DEFAULT 0, v_rows timestamptz, v_processed text, p_inbox jsonb)"
    )
    db.execute(
        "SELECT mailbox.enable_inbox_tracking('odd', 'public.odd', 'found', 'v_id', 'v_retries',"
        " 'v_processed', 'v_rows', p_payload_column => 'p_inbox',"
        " p_max_retries => 2)"
    )
    assert scalar(db, "SELECT mailbox.inbox_receive('odd', 'x', '{\"n\": 1}')") is True
    assert scalar(db, "SELECT mailbox.inbox_receive('odd', 'x', '{}')") is False
    got = rows(db, "SELECT event_id, payload FROM mailbox.inbox_claim('odd', 'w')")
    assert got == [("x", {"n": 1})]
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('odd', 'x', 'boom')") == "retry"
    assert scalar(db, "SELECT v_processed FROM public.odd") == "boom"
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('odd', 'x', 'boom')") == "dead_letter"
    with raises("42704"):
        db.execute("SELECT mailbox.inbox_mark_failed('odd', 'nope', 'boom')")
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('odd', 'x')") is True
    with raises("55000"):
        db.execute("SELECT mailbox.inbox_mark_failed('odd', 'x', 'boom')")


EXPECTED = Path(__file__).resolve().parents[1] / "expected"


def generated_text(db, inbox, owner=None):
    """Every generated function and view of an inbox, as PostgreSQL prints them back."""
    k = key(db, inbox)
    parts = [
        r[0]
        for r in rows(
            db,
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc AS p"
            " WHERE p.pronamespace = 'mailbox'::regnamespace"
            "   AND p.proname LIKE '\\_inbox\\_' || %s || '\\_%%' ORDER BY p.proname",
            [str(k)],
        )
    ]
    parts += [
        f"CREATE VIEW {r[0]}.{r[1]} AS\n{r[2]}"
        for r in rows(
            db,
            "SELECT schemaname, viewname, definition FROM pg_views"
            " WHERE viewname LIKE '%%' || %s OR viewname LIKE '\\_inbox\\_' || %s || '\\_%%'"
            " ORDER BY 1, 2",
            [inbox, str(k)],
        )
    ]
    text = "\n\n".join(p.strip() for p in parts) + "\n"
    # the named receive holds its table's oid and a digest of itself (part 35, named receive)
    text = re.sub(r"\b\d+::pg_catalog\.regclass", "<oid>::pg_catalog.regclass", text)
    text = re.sub(r"'\d+/[0-9a-f]{32}'", "'<version>'", text)
    return text.replace(f'"{owner}"', "<owner>").replace(owner, "<owner>") if owner else text


def check_expected(name, text):
    path = EXPECTED / name
    if os.environ.get("MAILBOX_UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert path.read_text() == text, (
        f"the generated inbox code differs from tests/expected/{name}: review the change, then"
        " regenerate with MAILBOX_UPDATE_SNAPSHOTS=1 .venv/bin/pytest -k generated_code tests"
    )


def test_generated_code_of_a_managed_ordered_inbox_is_the_expected_one(db):
    """What a managed inbox runs (with ordering, the richest bodies), committed so a change to
    the builders shows up in review as a diff of the code they generate."""
    db.execute("SELECT mailbox.create_inbox('gen')")
    db.execute("SELECT mailbox.enable_inbox_ordering('gen')")
    check_expected("inbox_generated_managed.sql", generated_text(db, "gen"))


def test_generated_code_of_a_managed_unordered_inbox_is_the_expected_one(db):
    """The common case: no ordering, so the named mark marks (an ordered inbox's only hands
    the call to the full path) and the claim is the plain SKIP LOCKED scan."""
    db.execute("SELECT mailbox.create_inbox('gen')")
    check_expected("inbox_generated_managed_unordered.sql", generated_text(db, "gen"))


def test_generated_code_of_an_adopted_inbox_is_the_expected_one(db):
    owner = make_role(db)
    adopt_legacy(db, owner)
    check_expected("inbox_generated_adopted.sql", generated_text(db, "legacy", owner))
    db.execute("SELECT mailbox.drop_inbox('legacy')")
    drop_role(db, owner)


# ---------------------------------------------------------------- routers (part 35, routes)
ROUTER_SRC = "SELECT prosrc FROM pg_proc WHERE oid = %s::regproc"
KINDS = (
    "receive",
    "claim",
    "processed",
    "failed",
    "receive_batch",
    "processed_batch",
    "processed_count",
    "unsettled",
)
ROUTERS = tuple(f"mailbox._inbox_route_{kind}" for kind in KINDS)


def routed_keys(db, kind):
    src = scalar(db, ROUTER_SRC, [f"mailbox._inbox_route_{kind}"])
    return sorted(int(k) for k in re.findall(rf"mailbox\._inbox_(\d+)_{kind}\(", src))


def round_trip(conn, inbox, event_id):
    """receive, claim and mark one message, then the batch forms and a failure: every kind
    goes through its router (the claims' commits settle through unsettled; a batch mark of the
    batch its transaction claimed, through processed_count)"""
    assert conn.execute("SELECT mailbox.inbox_receive(%s, %s, '{}')", [inbox, event_id]).fetchone()[
        0
    ]
    got = rows(conn, "SELECT event_id FROM mailbox.inbox_claim(%s, 'w', 10)", [inbox])
    assert got == [(event_id,)], (inbox, got)
    assert conn.execute(
        "SELECT mailbox.inbox_mark_processed(%s, %s)", [inbox, event_id]
    ).fetchone()[0]
    batch = event_id + "-b"
    assert rows(
        conn,
        "SELECT * FROM mailbox.inbox_receive_batch(%s, jsonb_build_array("
        " jsonb_build_object('p_event_id', %s::text, 'p_payload', '{}'::jsonb)))",
        [inbox, batch],
    ) == [(batch, True)]
    assert rows(conn, "SELECT event_id FROM mailbox.inbox_claim(%s, 'w', 10)", [inbox]) == [
        (batch,)
    ]
    assert rows(
        conn, "SELECT * FROM mailbox.inbox_mark_failed(%s, ARRAY[%s], 'e', 0)", [inbox, batch]
    ) == [(batch, "retry")]
    assert rows(conn, "SELECT event_id FROM mailbox.inbox_claim(%s, 'w', 10)", [inbox]) == [
        (batch,)
    ]
    assert scalar(conn, "SELECT mailbox.inbox_mark_processed(%s, ARRAY[%s])", [inbox, batch]) == 1
    # a batch mark of exactly what its transaction claimed: the count-only mark
    last = event_id + "-c"
    assert scalar(conn, "SELECT mailbox.inbox_receive(%s, %s, '{}')", [inbox, last]) is True
    with conn.transaction():
        got = rows(conn, "SELECT event_id FROM mailbox.inbox_claim(%s, 'w', 10)", [inbox])
        assert got == [(last,)]
        marked = scalar(conn, "SELECT mailbox.inbox_mark_processed(%s, ARRAY[%s])", [inbox, last])
        assert marked == 1


def test_routers_name_every_inbox_and_split_past_eight(db):
    names = [f"r{i}" for i in range(11)]
    for name in names:
        db.execute("SELECT mailbox.create_inbox(%s)", [name])
    keys = sorted(key(db, n) for n in names)
    for kind in KINDS:
        assert routed_keys(db, kind) == keys, kind
    # 11 keys: one split on the middle key, then two CASEs of arms
    assert "OPERATOR(pg_catalog.<)" in scalar(db, ROUTER_SRC, [ROUTERS[0]])
    for name in names:
        round_trip(db, name, "m-" + name)
    db.execute("SELECT mailbox.drop_inbox('r3', false, true)")
    db.execute("SELECT mailbox.drop_inbox('r9', false, true)")
    left = sorted(key(db, n) for n in names if n not in ("r3", "r9"))
    for kind in KINDS:
        assert routed_keys(db, kind) == left, kind
    for name in names:
        if name not in ("r3", "r9"):
            round_trip(db, name, "n-" + name)


def test_a_session_that_inlined_a_router_follows_creates_and_drops(db, connect):
    db.execute("SELECT mailbox.create_inbox('old')")
    worker = connect()
    round_trip(worker, "old", "a")  # the worker's plans have the router inlined
    db.execute("SELECT mailbox.create_inbox('new')")
    db.execute("SELECT mailbox.drop_inbox('old', false, true)")
    round_trip(worker, "new", "b")
    with raises("42704"):
        worker.execute("SELECT mailbox.inbox_receive('old', 'c', '{}')")


def test_an_inbox_without_an_arm_takes_the_dynamic_call(db):
    db.execute("SELECT mailbox.create_inbox('plain')")
    # the routers as the extension script makes them (as after a restore): ELSE only
    kinds = rows(db, "SELECT kind, args, nargs, returns FROM mailbox._inbox_route_kinds()")
    for kind, args, nargs, returns in kinds:
        params = ", ".join(f"${i}" for i in range(1, nargs + 1))
        db.execute(
            f"CREATE OR REPLACE FUNCTION mailbox._inbox_route_{kind}(mailbox._inbox, {args})"
            f" RETURNS {returns} LANGUAGE sql VOLATILE"
            f" AS $$SELECT mailbox._inbox_dispatch_{kind}({params})$$"
        )
        assert routed_keys(db, kind) == []
    round_trip(db, "plain", "x")
    # maintenance puts the arms back, once
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_routes_rebuilt'") == 8
    assert routed_keys(db, "receive") == [key(db, "plain")]
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_routes_rebuilt'") == 0
    round_trip(db, "plain", "y")


def test_maintenance_regenerates_nothing_when_nothing_changed(db, connect):
    """A review found every pass regenerating every managed inbox once its named receive
    became SECURITY DEFINER (the check of the functions' rights expected invoker): each pass
    rewrote the functions, invalidated every session's plans and held a SHARE lock on each
    table until it committed, which made receivers wait."""
    db.execute("SELECT mailbox.create_inbox('calm')")
    db.execute("SELECT mailbox.create_inbox('granted')")
    db.execute("SELECT mailbox.grant_inbox('granted', 'mailbox_producer', 'receive')")
    versions = (
        "SELECT array_agg(proname || ':' || xmin ORDER BY proname) FROM pg_proc"
        " WHERE pronamespace = 'mailbox'::regnamespace AND proname ~ '^_inbox_[0-9]+_'"
    )
    before = scalar(db, versions)
    db.execute("SELECT mailbox.run_maintenance()")
    assert scalar(db, versions) == before
    # and it takes no lock a receiver would wait for
    maintenance = connect(autocommit=False)
    maintenance.execute("SELECT mailbox.run_maintenance()")
    receiver = connect()
    receiver.execute("SET lock_timeout = '2s'")
    assert scalar(receiver, "SELECT mailbox.inbox_receive('calm', 'r1', '{}')") is True
    maintenance.rollback()


def test_maintenance_leaves_the_routers_while_ddl_holds_its_lock(db, connect):
    db.execute("SELECT mailbox.create_inbox('busy')")
    db.execute(
        "CREATE OR REPLACE FUNCTION mailbox._inbox_route_processed(mailbox._inbox, text)"
        " RETURNS mailbox._inbox_done LANGUAGE sql VOLATILE"
        " AS $$SELECT mailbox._inbox_dispatch_processed($1, $2)$$"
    )
    ddl = connect(autocommit=False)
    ddl.execute("SELECT mailbox._ddl_lock()")
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_routes_rebuilt'") == 0
    ddl.rollback()
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_routes_rebuilt'") == 1


def test_a_tenant_dropping_its_own_generated_functions_breaks_only_its_inbox(db, connect):
    """An adopted table's owner owns that inbox's generated functions and may drop them: no
    router names them, so every other inbox keeps working."""
    tenant = make_role(db, "mailbox_admin")
    try:
        adopt_legacy(db, tenant)
        db.execute("SELECT mailbox.create_inbox('mine')")
        k = key(db, "legacy")
        for kind in KINDS:
            assert k not in routed_keys(db, kind), kind
        assert key(db, "mine") in routed_keys(db, "receive")
        db.execute(f'GRANT USAGE ON SCHEMA mailbox TO "{tenant}"')
        hostile = connect()
        hostile.execute(f'SET ROLE "{tenant}"')
        hostile.execute(f"DROP FUNCTION mailbox._inbox_{k}_receive")
        hostile.execute(f"DROP FUNCTION mailbox._inbox_{k}_processed")
        with raises("42883"):
            db.execute("SELECT mailbox.inbox_receive('legacy', 'x', '{}')")
        round_trip(connect(), "mine", "still")
    finally:
        db.execute("SELECT mailbox.drop_inbox('legacy', true)")
        db.execute("DROP TABLE IF EXISTS public.legacy")
        drop_role(db, tenant)
