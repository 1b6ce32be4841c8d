"""inbox_receive and inbox_mark_processed(text, text) inlined into their caller's statement
(part 33; part 35, named receive): the named receive or named mark of a managed inbox without
grants (for the mark, not ordered) is the call's only function frame, so the caller executes
the router and the named function with its own rights. mailbox_producer may execute a named
receive, and mailbox_consumer a named mark, exactly while its router has the arm; the
caller's search_path, under which an inlined body is parsed, redirects nothing."""

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


# ------------------------------------------------------------------ the single mark

MARK = "SELECT mailbox.inbox_mark_processed(%s, %s)"
MARK_PUBLIC = "mailbox.inbox_mark_processed(text,text)"
MARK_FULL = "mailbox._inbox_mark_processed_full(text,text)"
MARK_GRANTED = "SELECT has_function_privilege('mailbox_consumer', %s::regprocedure, 'EXECUTE')"


def named_mark(db, inbox):
    return f"mailbox._inbox_{key(db, inbox)}_processed_named(mailbox._inbox, text)"


def receive(db, inbox, *ids):
    for i in ids:
        db.execute(RECEIVE, [inbox, i])


def processed(db, inbox):
    return [
        r[0]
        for r in rows(
            db, f"SELECT event_id FROM mailbox.{inbox} WHERE processed_at IS NOT NULL ORDER BY 1"
        )
    ]


@pytest.fixture
def consumer(db):
    role = make_role(db, "mailbox_consumer")
    yield role
    db.execute("RESET ROLE")
    drop_role(db, role)


def test_a_mark_runs_only_the_named_mark_and_any_other_inbox_the_full_path(db, consumer):
    db.execute("SELECT mailbox.create_inbox('open')")
    db.execute("SELECT mailbox.create_inbox('granted')")
    db.execute("SELECT mailbox.create_inbox('ordered')")
    db.execute("SELECT mailbox.enable_inbox_ordering('ordered')")
    db.execute("SELECT mailbox.grant_inbox('granted', %s, 'process')", [consumer])
    receive(db, "open", "a", "b")
    receive(db, "granted", "g")
    db.execute(
        "SELECT mailbox.inbox_receive('ordered', 'o', '{}', p_aggregate_id => 'k',"
        " p_sequence_num => 1)"
    )
    db.execute("SET track_functions = 'all'")
    fn = named_mark(db, "open")
    db.execute(f'SET ROLE "{consumer}"')
    # inlined: inbox_mark_processed itself is never called, nor the full path
    assert calls(db, MARK, ["open", "a"], [MARK_PUBLIC, fn, MARK_FULL]) == [0, 1, 0]
    # a message that is not there, or processed already: false, still the named mark only
    assert calls(db, MARK, ["open", "a"], [MARK_PUBLIC, fn, MARK_FULL]) == [0, 1, 0]
    assert scalar(db, MARK, ["open", "nope"]) is False
    # an inbox with grants of its own, and an ordered inbox, have no arm: the full path
    assert calls(db, MARK, ["granted", "g"], [MARK_PUBLIC, MARK_FULL]) == [0, 1]
    assert calls(db, MARK, ["ordered", "o"], [MARK_PUBLIC, MARK_FULL]) == [0, 1]
    # so does bad input, and the full path raises the error
    for inbox, event_id, sqlstate in (
        ("open", None, "22004"),
        (None, "b", "22004"),
        ("missing", "b", "42704"),
    ):
        with raises(sqlstate):
            db.execute(MARK, [inbox, event_id])
    db.execute("RESET ROLE")
    assert processed(db, "open") == ["a"]
    assert processed(db, "granted") == ["g"]
    assert processed(db, "ordered") == ["o"]
    # the ordered inbox's mark recorded the aggregate's position (the full path's work)
    assert (
        scalar(
            db,
            "SELECT last_seq FROM mailbox._inbox_aggregate"
            " WHERE inbox_key = %s AND aggregate_id = 'k'",
            [key(db, "ordered")],
        )
        == 1
    )


def test_a_consumer_may_call_a_named_mark_only_while_its_router_has_the_arm(db, consumer):
    db.execute("SELECT mailbox.create_inbox('open')")
    other = make_role(db, "mailbox_consumer")
    producer = make_role(db, "mailbox_producer")
    receive(db, "open", "d1", "d2", "d3")
    fn = named_mark(db, "open")
    direct = f"SELECT mailbox._inbox_{key(db, 'open')}_processed_named(NULL, %s)"
    assert scalar(db, MARK_GRANTED, [fn]) is True
    # called directly it does what inbox_mark_processed does for that inbox, nothing more
    db.execute(f'SET ROLE "{consumer}"')
    assert scalar(db, direct, ["d1"]) is True
    assert scalar(db, direct, ["d1"]) is False
    assert scalar(db, direct, [None]) is None  # refused: inbox_mark_processed raises the error
    db.execute("RESET ROLE")
    # a role without mailbox_consumer may not
    db.execute(f'SET ROLE "{producer}"')
    with raises("42501"):
        db.execute(direct, ["d2"])
    db.execute("RESET ROLE")
    # the inbox's first grant (to another role) takes the arm away and the right with it
    db.execute("SELECT mailbox.grant_inbox('open', %s, 'process')", [other])
    assert scalar(db, MARK_GRANTED, [fn]) is False
    db.execute(f'SET ROLE "{consumer}"')
    with raises("42501"):
        db.execute(direct, ["d2"])
    with raises("42501"):
        db.execute(MARK, ["open", "d2"])  # the full path checks the grant
    db.execute("RESET ROLE")
    # the last revoke gives both back
    db.execute("SELECT mailbox.revoke_inbox('open', %s, 'process')", [other])
    assert scalar(db, MARK_GRANTED, [fn]) is True
    db.execute(f'SET ROLE "{consumer}"')
    assert scalar(db, direct, ["d2"]) is True
    assert scalar(db, MARK, ["open", "d3"]) is True
    db.execute("RESET ROLE")
    # ordering takes the mark's arm away (its marks record positions on the full path), not
    # the receive's; disabling it gives the mark back
    db.execute("SELECT mailbox.enable_inbox_ordering('open')")
    assert scalar(db, MARK_GRANTED, [fn]) is False
    receive_granted = (
        "SELECT has_function_privilege('mailbox_producer', %s::regprocedure, 'EXECUTE')"
    )
    assert scalar(db, receive_granted, [named(db, "open")]) is True
    db.execute(
        "SELECT mailbox.inbox_receive('open', 'o1', '{}', p_aggregate_id => 'k',"
        " p_sequence_num => 1)"
    )
    db.execute(f'SET ROLE "{consumer}"')
    with raises("42501"):
        db.execute(direct, ["o1"])
    assert scalar(db, MARK, ["open", "o1"]) is True  # the full path
    db.execute("RESET ROLE")
    db.execute("SELECT mailbox.disable_inbox_ordering('open')")
    assert scalar(db, MARK_GRANTED, [fn]) is True
    assert processed(db, "open") == ["d1", "d2", "d3", "o1"]
    # a drop takes the function
    db.execute("SELECT mailbox.drop_inbox('open', true)")
    assert scalar(db, "SELECT to_regprocedure(%s)", [fn]) is None
    drop_role(db, other)
    drop_role(db, producer)


def test_the_callers_search_path_redirects_no_mark(db, consumer):
    db.execute("SELECT mailbox.create_inbox('open')")
    db.execute("SELECT mailbox.create_inbox('granted')")
    db.execute("SELECT mailbox.grant_inbox('granted', %s, 'process')", [consumer])
    receive(db, "open", "a")
    receive(db, "granted", "b")
    # a schema of decoys with every name inbox_mark_processed's body uses, first in the path
    db.execute(f'CREATE SCHEMA decoy AUTHORIZATION "{consumer}"')
    for fn in ("_inbox_route_processed_named", "_inbox_mark_processed_full", "coalesce"):
        db.execute(
            f"CREATE FUNCTION decoy.{fn}(text, text) RETURNS boolean LANGUAGE plpgsql AS"
            " $$BEGIN RAISE EXCEPTION 'decoy called' USING ERRCODE = 'P0099'; END$$"
        )
    db.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA decoy TO PUBLIC")
    db.execute(f'SET ROLE "{consumer}"')
    db.execute("SET search_path = decoy, public")
    assert scalar(db, MARK, ["open", "a"]) is True
    assert scalar(db, MARK, ["granted", "b"]) is True
    db.execute("RESET ROLE")
    db.execute("RESET search_path")
    # the body: one COALESCE of the two schema-qualified calls, both arguments passed through
    # in the default collation
    body = scalar(db, "SELECT prosrc FROM pg_proc WHERE oid = %s::regprocedure", [MARK_PUBLIC])
    args = '$1COLLATEpg_catalog."default",$2COLLATEpg_catalog."default"'
    assert "".join(body.split()) == (
        f"SELECTCOALESCE(mailbox._inbox_route_processed_named({args}),"
        f"mailbox._inbox_mark_processed_full({args}));"
    )
    db.execute("DROP SCHEMA decoy CASCADE")


def test_a_callers_collation_matches_no_other_id(db, consumer):
    """A review found the named mark comparing the id in the collation of the caller's
    argument: a nondeterministic one marked every id equal to it under that collation (the
    full path raised P0003). Both paths compare in the default collation, a managed table's."""
    db.execute(
        "CREATE COLLATION public.t_ci (provider = icu, locale = 'und-u-ks-level2',"
        " deterministic = false)"
    )
    db.execute("SELECT mailbox.create_inbox('open')")
    db.execute("SELECT mailbox.create_inbox('granted')")
    db.execute("SELECT mailbox.grant_inbox('granted', %s, 'process')", [consumer])
    for inbox in ("open", "granted"):
        receive(db, inbox, "CaseX", "casex")
    direct = (
        f"SELECT mailbox._inbox_{key(db, 'open')}_processed_named(NULL, %s COLLATE public.t_ci)"
    )
    ci = "SELECT mailbox.inbox_mark_processed(%s, %s COLLATE public.t_ci)"
    db.execute(f'SET ROLE "{consumer}"')
    for inbox in ("open", "granted"):
        assert scalar(db, ci, [inbox, "CASEX"]) is False  # no id is 'CASEX'
        assert scalar(db, ci, [inbox, "CaseX"]) is True
    assert scalar(db, direct, ["CASEX"]) is False
    assert scalar(db, direct, ["casex"]) is True
    db.execute("RESET ROLE")
    assert processed(db, "open") == ["CaseX", "casex"]
    assert processed(db, "granted") == ["CaseX"]
    db.execute("SELECT mailbox.drop_inbox('open', true)")
    db.execute("SELECT mailbox.drop_inbox('granted', true)")
    db.execute("DROP COLLATION public.t_ci")


def test_maintenance_gives_the_named_functions_back_the_rights_of_their_arms(db):
    """A review: the rights followed the arms only when the routers were rebuilt, so a right
    changed by hand stayed; maintenance now compares them as it compares the routers."""
    db.execute("SELECT mailbox.create_inbox('open')")
    db.execute("SELECT mailbox.create_inbox('granted')")
    db.execute("SELECT mailbox.grant_inbox('granted', 'mailbox_consumer', 'process')")
    armed, unarmed = named_mark(db, "open"), named_mark(db, "granted")
    db.execute(f"REVOKE EXECUTE ON FUNCTION {armed} FROM mailbox_consumer")
    db.execute(f"GRANT EXECUTE ON FUNCTION {unarmed} TO mailbox_consumer")
    db.execute(f"REVOKE EXECUTE ON FUNCTION {named(db, 'open')} FROM mailbox_producer")
    db.execute("SELECT mailbox.run_maintenance()")
    assert scalar(db, MARK_GRANTED, [armed]) is True
    assert scalar(db, MARK_GRANTED, [unarmed]) is False
    assert (
        scalar(
            db,
            "SELECT has_function_privilege('mailbox_producer', %s::regprocedure, 'EXECUTE')",
            [named(db, "open")],
        )
        is True
    )
