"""inbox_receive inlined into its caller's statement (part 33; part 35, named receive): the
named receive of a managed inbox without grants is the call's only function frame, so the
caller executes the router and the named receive with its own rights. mailbox_producer may
execute a named receive exactly while the router has its arm; the caller's search_path, under
which an inlined body is parsed, redirects nothing."""

import pytest
from mbx import drop_role, make_role, raises, rows, scalar

RECEIVE = "SELECT mailbox.inbox_receive(%s, %s, '{}')"


def key(db, inbox):
    return scalar(db, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox])


def calls(db, sql, args, functions):
    """Runs sql in a transaction of its own; how often it called each function (the
    difference inside the transaction: PostgreSQL 15's xact function counters are not reset
    when a transaction ends, only when the backend next reports its statistics)."""
    count = "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regprocedure), 0)"
    with db.transaction():
        before = [scalar(db, count, [f]) for f in functions]
        db.execute(sql, args)
        return [scalar(db, count, [f]) - b for f, b in zip(functions, before, strict=True)]


def named(db, inbox):
    return (
        f"mailbox._inbox_{key(db, inbox)}_receive_named(mailbox._inbox, text, jsonb, text, text,"
        " text, bigint, jsonb, text, integer)"
    )


PUBLIC = "mailbox.inbox_receive(text,text,jsonb,text,text,text,bigint,jsonb,text,integer)"
FULL = "mailbox._inbox_receive_full(text,text,jsonb,text,text,text,bigint,jsonb,text,integer)"


@pytest.fixture
def producer(db):
    role = make_role(db, "mailbox_producer")
    yield role
    db.execute("RESET ROLE")
    drop_role(db, role)


def test_a_receive_runs_only_the_named_receive_and_a_granted_inbox_the_full_path(db, producer):
    db.execute("SELECT mailbox.create_inbox('open')")
    db.execute("SELECT mailbox.create_inbox('granted')")
    db.execute("SELECT mailbox.grant_inbox('granted', %s, 'receive')", [producer])
    db.execute("SET track_functions = 'all'")
    fn = named(db, "open")
    db.execute(f'SET ROLE "{producer}"')
    # inlined: inbox_receive itself is never called, nor the full path
    assert calls(db, RECEIVE, ["open", "a"], [PUBLIC, fn, FULL]) == [0, 1, 0]
    # an inbox with grants of its own has no arm: the full path, which checks them
    assert calls(db, RECEIVE, ["granted", "b"], [PUBLIC, FULL]) == [0, 1]
    # so does bad input, and the full path raises the error
    with raises("22004"):
        db.execute(RECEIVE, ["open", None])
    db.execute("RESET ROLE")
    assert rows(db, "SELECT event_id FROM mailbox.open") == [("a",)]
    assert rows(db, "SELECT event_id FROM mailbox.granted") == [("b",)]


def test_a_producer_may_call_a_named_receive_only_while_its_router_has_the_arm(db, producer):
    db.execute("SELECT mailbox.create_inbox('open')")
    other = make_role(db, "mailbox_producer")
    consumer = make_role(db, "mailbox_consumer")
    fn = named(db, "open")
    direct = (
        f"SELECT mailbox._inbox_{key(db, 'open')}_receive_named("
        "NULL, %s, '{}', NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
    granted = "SELECT has_function_privilege('mailbox_producer', %s::regprocedure, 'EXECUTE')"
    assert scalar(db, granted, [fn]) is True
    # called directly it does what inbox_receive does for that inbox, nothing more
    db.execute(f'SET ROLE "{producer}"')
    assert scalar(db, direct, ["d1"]) is True
    assert scalar(db, direct, ["d1"]) is False
    assert scalar(db, direct, [None]) is None  # refused: inbox_receive raises the error
    db.execute("RESET ROLE")
    # a role without mailbox_producer may not
    db.execute(f'SET ROLE "{consumer}"')
    with raises("42501"):
        db.execute(direct, ["c1"])
    db.execute("RESET ROLE")
    # the inbox's first grant (to another role) takes the arm away and the right with it
    db.execute("SELECT mailbox.grant_inbox('open', %s, 'receive')", [other])
    assert scalar(db, granted, [fn]) is False
    db.execute(f'SET ROLE "{producer}"')
    with raises("42501"):
        db.execute(direct, ["d2"])
    with raises("42501"):
        db.execute(RECEIVE, ["open", "d2"])  # the full path checks the grant
    db.execute("RESET ROLE")
    # the last revoke gives both back
    db.execute("SELECT mailbox.revoke_inbox('open', %s, 'receive')", [other])
    assert scalar(db, granted, [fn]) is True
    db.execute(f'SET ROLE "{producer}"')
    assert scalar(db, direct, ["d3"]) is True
    assert scalar(db, RECEIVE, ["open", "d4"]) is True
    db.execute("RESET ROLE")
    assert [r[0] for r in rows(db, "SELECT event_id FROM mailbox.open ORDER BY 1")] == [
        "d1",
        "d3",
        "d4",
    ]
    # a regeneration keeps the right of an inbox without grants; a drop takes the function
    db.execute("SELECT mailbox.enable_inbox_priority('open')")
    assert scalar(db, granted, [fn]) is True
    db.execute("SELECT mailbox.drop_inbox('open', true)")
    assert scalar(db, "SELECT to_regprocedure(%s)", [fn]) is None
    drop_role(db, other)
    drop_role(db, consumer)


def test_the_callers_search_path_redirects_nothing(db, producer):
    db.execute("SELECT mailbox.create_inbox('open')")
    db.execute("SELECT mailbox.create_inbox('granted')")
    db.execute("SELECT mailbox.grant_inbox('granted', %s, 'receive')", [producer])
    # a schema of decoys with every name inbox_receive's body uses, first in the path
    db.execute(f'CREATE SCHEMA decoy AUTHORIZATION "{producer}"')
    for fn in ("_inbox_route_receive_named", "_inbox_receive_full", "coalesce"):
        db.execute(
            f"CREATE FUNCTION decoy.{fn}(text, text, jsonb, text, text, text, bigint, jsonb,"
            " text, int) RETURNS boolean LANGUAGE plpgsql AS"
            " $$BEGIN RAISE EXCEPTION 'decoy called' USING ERRCODE = 'P0099'; END$$"
        )
    db.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA decoy TO PUBLIC")
    db.execute(f'SET ROLE "{producer}"')
    db.execute("SET search_path = decoy, public")
    assert scalar(db, RECEIVE, ["open", "a"]) is True
    assert scalar(db, RECEIVE, ["granted", "b"]) is True
    db.execute("RESET ROLE")
    db.execute("RESET search_path")
    # the body: one COALESCE of the two schema-qualified calls, every argument passed through
    body = scalar(db, "SELECT prosrc FROM pg_proc WHERE oid = %s::regprocedure", [PUBLIC])
    args = ", ".join(f"${i}" for i in range(1, 11))
    assert " ".join(body.split()) == (
        f"SELECT COALESCE(mailbox._inbox_route_receive_named({args}),"
        f" mailbox._inbox_receive_full({args}));"
    )
    db.execute("DROP SCHEMA decoy CASCADE")
