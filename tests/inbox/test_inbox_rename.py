"""An inbox is its table (mailbox._inbox.table_rel), not the name it was created under
(docs/inbox.md, "Renaming an inbox table"); plus the lease-holder rule of a late
inbox_mark_failed and the per-aggregate state that ordering starts from (SPEC §3.2)."""

import time

import pytest
from mbx import raises, rows, scalar


def receive(conn, inbox, event_id, aggregate=None, seq=None):
    return scalar(
        conn,
        "SELECT mailbox.inbox_receive(%s, %s, '{}', p_aggregate_id => %s, p_sequence_num => %s)",
        [inbox, event_id, aggregate, seq],
    )


def claimed(conn, inbox, worker="w", visibility=30):
    return sorted(
        r[0]
        for r in rows(
            conn,
            "SELECT event_id FROM mailbox.inbox_claim(%s, %s, 10, %s)",
            [inbox, worker, visibility],
        )
    )


def heads(conn, inbox):
    return sorted(
        (r[0], r[1])
        for r in rows(conn, f"SELECT aggregate_id, sequence_num FROM mailbox.next_{inbox}")
    )


@pytest.fixture
def renamed(db):
    """app.t was renamed to app.t_old (one message in it) and a stranger took app.t."""
    db.execute("CREATE SCHEMA app")
    db.execute("SELECT mailbox.create_inbox('t', 'app', p_retention_hours => 0)")
    assert receive(db, "t", "before") is True
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('t', 'before')") is True
    db.execute("ALTER TABLE app.t RENAME TO t_old")
    db.execute("CREATE TABLE app.t (LIKE app.t_old INCLUDING ALL)")
    db.execute(
        "INSERT INTO app.t (event_id, processed_at) VALUES ('stranger', now() - interval '1 day')"
    )
    return db


CALLS = [
    "SELECT mailbox.inbox_receive('t', 'x', '{}')",
    "SELECT * FROM mailbox.inbox_claim('t', 'w')",
    "SELECT mailbox.inbox_mark_processed('t', 'before')",
    "SELECT mailbox.inbox_mark_failed('t', 'before', 'e')",
    "SELECT mailbox.replay_inbox_messages('t', ARRAY['before'])",
    "SELECT mailbox.enable_inbox_ordering('t')",
    "SELECT mailbox.enable_inbox_priority('t')",
]


@pytest.mark.parametrize("sql", CALLS)
def test_every_function_that_would_use_the_stored_name_refuses_loudly(renamed, sql):
    with raises("55000") as info:
        renamed.execute(sql)
    assert "inbox table of inbox t was renamed" in str(info.value)
    assert "app.t_old" in info.value.diag.message_detail
    assert "enable_inbox_tracking" in info.value.diag.message_hint
    assert scalar(renamed, "SELECT count(*) FROM app.t") == 1  # the stranger's row only


STALE_CALLS = {
    "mark": ("SELECT mailbox.inbox_mark_processed('s', 'a')", "processed_at IS NOT NULL"),
    "receive": ("SELECT mailbox.inbox_receive('s', 'new', '{}')", "event_id = 'new'"),
}


@pytest.mark.parametrize("call", sorted(STALE_CALLS))
@pytest.mark.parametrize("ddl", ["swap", "rename", "drop"])
def test_a_session_that_began_before_a_table_swap_does_not_write_the_new_table(
    db, connect, call, ddl
):
    """A single receive or mark of a managed inbox goes by name (part 35, named receive) and
    first checks that its table still has the name. A warm session whose transaction began
    before the table was renamed, dropped or replaced by another of the same name must not
    trust its cached answer (found by a review: the mark then wrote the stranger's row): the
    named function opens its table by oid first, which brings the session's catalog up to
    date, and hands the call to the full path, which refuses as a fresh session does."""
    db.execute("SELECT mailbox.create_inbox('s')")
    worker = connect(autocommit=False)
    for event_id in ("w1", "w2"):  # plans and caches the named functions
        assert receive(worker, "s", event_id) is True
        assert scalar(worker, "SELECT mailbox.inbox_mark_processed('s', %s)", [event_id])
    worker.commit()
    assert scalar(worker, "SELECT 1") == 1  # a transaction open before the DDL, no lock of s
    if ddl == "drop":
        db.execute("DROP TABLE mailbox.s CASCADE")
    else:
        db.execute("ALTER TABLE mailbox.s RENAME TO s_old")
    if ddl == "swap":
        db.execute("CREATE TABLE mailbox.s (LIKE mailbox.s_old INCLUDING ALL)")
        db.execute("INSERT INTO mailbox.s (event_id, payload) VALUES ('a', '{}')")
    sql, written = STALE_CALLS[call]
    with raises("55000") as info:
        worker.execute(sql)
    worker.rollback()
    assert ("was dropped" if ddl == "drop" else "was renamed") in str(info.value)
    if ddl == "swap":
        assert scalar(db, f"SELECT count(*) FROM mailbox.s WHERE {written}") == 0
        db.execute("DROP TABLE mailbox.s")
    if ddl != "drop":
        db.execute("ALTER TABLE mailbox.s_old RENAME TO s")
        assert receive(worker, "s", "back") is True
        worker.commit()
    db.execute("SELECT mailbox.drop_inbox('s', p_cascade => true)")


@pytest.mark.parametrize("cascade", [True, False], ids=["table_dropped", "table_kept"])
@pytest.mark.parametrize("call", sorted(STALE_CALLS))
def test_a_session_that_began_before_drop_inbox_gets_inbox_not_found(db, connect, call, cascade):
    """The same warm session after drop_inbox committed. With its table dropped, the named
    function's table check fails and the full path finds no inbox: 42704, as a fresh session
    gets (the review saw 42P01 before the fix). With the table kept, the check passes, the
    statement runs, and the version check refuses it (40001, nothing stays); the retry gets
    42704 (docs/inbox.md, drop_inbox)."""
    db.execute("SELECT mailbox.create_inbox('s')")
    worker = connect(autocommit=False)
    for event_id in ("w1", "w2"):
        assert receive(worker, "s", event_id) is True
        assert scalar(worker, "SELECT mailbox.inbox_mark_processed('s', %s)", [event_id])
    assert receive(worker, "s", "a") is True  # what the stale mark would mark
    worker.commit()
    assert scalar(worker, "SELECT 1") == 1
    db.execute("SELECT mailbox.drop_inbox('s', p_cascade => %s)", [cascade])
    sql, written = STALE_CALLS[call]
    if not cascade:
        with raises("40001"):
            worker.execute(sql)
        worker.rollback()
        # nothing stayed: 'a' is not processed, 'new' not stored
        assert (
            scalar(
                db, f"SELECT count(*) FROM mailbox.s WHERE {written} AND event_id IN ('a', 'new')"
            )
            == 0
        )
    with raises("42704"):
        worker.execute(sql)
    worker.rollback()
    if not cascade:
        db.execute("DROP TABLE mailbox.s")


def test_status_health_and_maintenance_use_the_inbox_s_own_table(renamed):
    db = renamed
    got = rows(
        db, "SELECT table_name, pending_count, processed_count FROM mailbox.inbox_status('t')"
    )
    assert got == [("t_old", 0, 1)]
    health = scalar(db, "SELECT mailbox.inbox_health('t')")
    assert health["health_status"] == "critical" and health["processed_count"] == 1
    db.execute("UPDATE app.t_old SET processed_at = now() - interval '1 hour'")
    result = scalar(db, "SELECT mailbox.run_maintenance()")
    assert result["inbox_processed_drained"] == 1
    assert scalar(db, "SELECT count(*) FROM app.t_old") == 0
    assert scalar(db, "SELECT event_id FROM app.t") == "stranger"  # never drained


def test_renaming_back_or_readopting_resolves_it(renamed):
    db = renamed
    db.execute("DROP TABLE app.t")
    db.execute("ALTER TABLE app.t_old RENAME TO t")
    assert receive(db, "t", "again") is True
    assert scalar(db, "SELECT mailbox.inbox_health('t')")["health_status"] == "healthy"
    # the other way out: keep the table, adopt it under its new name
    db.execute("ALTER TABLE app.t RENAME TO t_new")
    with raises("55000"):
        receive(db, "t", "refused")
    db.execute("SELECT mailbox.drop_inbox('t')")
    db.execute("SELECT mailbox.enable_inbox_tracking('t', 'app.t_new')")
    assert receive(db, "t", "adopted") is True
    assert claimed(db, "t") == ["adopted", "again"]


def test_a_schema_rename_and_a_dropped_table_are_refused_too(db):
    db.execute("CREATE SCHEMA s1")
    db.execute("SELECT mailbox.create_inbox('m', 's1')")
    db.execute("ALTER SCHEMA s1 RENAME TO s2")
    with raises("55000") as info:
        receive(db, "m", "x")
    assert "s2.m" in info.value.diag.message_detail
    db.execute("ALTER SCHEMA s2 RENAME TO s1")
    assert receive(db, "m", "x") is True
    db.execute("SELECT mailbox.create_inbox('gone')")
    db.execute("DROP TABLE mailbox.gone CASCADE")
    with raises("55000") as info:
        receive(db, "gone", "x")
    assert "was dropped" in str(info.value)
    assert scalar(db, "SELECT pending_count FROM mailbox.inbox_status('gone')") is None
    scalar(db, "SELECT mailbox.run_maintenance()")  # skips it
    db.execute("SELECT mailbox.drop_inbox('gone', p_cascade => true)")


# --------------------------------------------------------------------------- late mark_failed


def test_the_holder_s_own_failure_ends_its_lease_a_late_one_does_not(db, connect):
    db.execute("SELECT mailbox.create_inbox('q', p_max_retries => 3)")
    receive(db, "q", "m")
    a, b = connect(), connect()
    assert claimed(a, "q", "A", visibility=1) == ["m"]
    time.sleep(1.15)
    assert claimed(b, "q", "B", visibility=30) == ["m"]
    assert scalar(a, "SELECT mailbox.inbox_mark_failed('q', 'm', 'late', 0)") == "retry"
    lease = rows(
        db,
        "SELECT leased_by, next_attempt_at >= lease_until, lease_until > now()"
        " FROM mailbox._inbox_lease WHERE event_id = 'm'",
    )
    assert lease == [("B", True, True)]
    assert scalar(db, "SELECT retry_count FROM mailbox.q WHERE event_id = 'm'") == 1
    # the holder's own failure ends the lease: claimable at once
    assert scalar(b, "SELECT mailbox.inbox_mark_failed('q', 'm', 'mine', 0)") == "retry"
    assert claimed(connect(), "q", "C") == ["m"]


def test_a_late_failure_that_dead_letters_keeps_the_holders_live_lease(db, connect):
    db.execute("SELECT mailbox.create_inbox('q', p_max_retries => 1)")
    receive(db, "q", "m")
    a, b = connect(), connect()
    assert claimed(a, "q", "A", visibility=1) == ["m"]
    time.sleep(1.15)
    assert claimed(b, "q", "B", visibility=30) == ["m"]
    assert scalar(a, "SELECT mailbox.inbox_mark_failed('q', 'm', 'late')") == "dead_letter"
    assert scalar(db, "SELECT leased_by FROM mailbox._inbox_lease WHERE event_id = 'm'") == "B"
    assert scalar(b, "SELECT mailbox.inbox_mark_processed('q', 'm')") is True
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease") == 0


# --------------------------------------------------------------------------- ordering state


def test_enabling_on_history_with_holes_starts_after_the_highest_processed(db):
    db.execute("SELECT mailbox.create_inbox('h')")
    for s in (1, 2, 5, 6):
        receive(db, "h", f"a{s}", "A", s)
    for s in (1, 2, 5):
        scalar(db, "SELECT mailbox.inbox_mark_processed('h', %s)", [f"a{s}"])
    receive(db, "h", "b9", "B", 9)  # no history: a new aggregate, starts at 1
    db.execute("SELECT mailbox.enable_inbox_ordering('h')")
    assert scalar(db, "SELECT last_seq FROM mailbox._inbox_aggregate WHERE aggregate_id = 'A'") == 5
    assert heads(db, "h") == [("A", 6)]
    assert rows(
        db, "SELECT aggregate_id, expected_seq, found_seq FROM mailbox.inbox_ordering_gaps('h')"
    ) == [("B", 1, 9)]
    # a late 3 is a head again (like a replayed message), once 6 is settled
    assert claimed(db, "h") == ["a6"]
    receive(db, "h", "a3", "A", 3)
    assert claimed(db, "h", "w2") == []
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('h', 'a6')") is True
    assert claimed(db, "h", "w2") == ["a3"]


def test_disable_keeps_positions_even_after_retention_and_new_columns_start_over(db):
    db.execute("SELECT mailbox.create_inbox('k', p_retention_hours => 0)")
    db.execute("SELECT mailbox.enable_inbox_ordering('k')")
    for s in (1, 2, 3):
        receive(db, "k", f"a{s}", "A", s)
    for s in (1, 2):
        scalar(db, "SELECT mailbox.inbox_mark_processed('k', %s)", [f"a{s}"])
    db.execute("SELECT mailbox.disable_inbox_ordering('k')")
    db.execute(
        "UPDATE mailbox.k SET processed_at = now() - interval '1 hour'"
        " WHERE processed_at IS NOT NULL"
    )
    assert scalar(db, "SELECT mailbox.run_maintenance()")["inbox_processed_drained"] == 2
    db.execute("SELECT mailbox.enable_inbox_ordering('k')")
    assert heads(db, "k") == [("A", 3)]
    # other columns: the old positions mean nothing for them
    db.execute("ALTER TABLE mailbox.k ADD COLUMN stream text, ADD COLUMN pos bigint")
    db.execute("UPDATE mailbox.k SET stream = 'A', pos = 1")
    db.execute("SELECT mailbox.enable_inbox_ordering('k', 'stream', 'pos')")
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_aggregate") == 0
    assert rows(db, "SELECT stream, pos FROM mailbox.next_k") == [("A", 1)]


def test_first_sequence_floors_new_aggregates_only(db):
    db.execute("SELECT mailbox.create_inbox('f')")
    receive(db, "f", "a2", "A", 2)
    scalar(db, "SELECT mailbox.inbox_mark_processed('f', 'a2')")
    receive(db, "f", "a3", "A", 3)
    receive(db, "f", "b5", "B", 5)
    db.execute("SELECT mailbox.enable_inbox_ordering('f', p_first_sequence => 5)")
    assert heads(db, "f") == [("A", 3), ("B", 5)]  # A has history: 2 + 1
    receive(db, "f", "c1", "C", 1)
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('f', 'c1')") is True
    assert scalar(db, "SELECT last_seq FROM mailbox._inbox_aggregate WHERE aggregate_id = 'C'") == 4
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('f', 'a3')") is True
    assert scalar(db, "SELECT last_seq FROM mailbox._inbox_aggregate WHERE aggregate_id = 'A'") == 3
