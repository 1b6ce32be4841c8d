"""Offsets follow commit visibility; nothing unrelated stalls delivery (SPEC §2.2 items 3, 4)."""

import threading
import time

import pytest
from groups import commit, poll, publish
from mbx import scalar


@pytest.fixture
def group(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    return db


def test_a_late_commit_is_still_delivered(group, connect):
    db = group
    t1 = connect(autocommit=False)
    t1.execute("SELECT mailbox.outbox_publish('e', '{\"who\": \"t1\"}')")  # stays open
    t2 = connect(autocommit=False)
    t2.execute("SELECT mailbox.outbox_publish('e', '{\"who\": \"t2\"}')")
    t2.commit()
    got = poll(db, "g", "c")
    assert [(o, p["who"]) for o, p in got] == [(1, "t2")]
    assert commit(db, "g", "c", 1) == 1
    t1.commit()
    got = poll(db, "g", "c")
    assert [(o, p["who"]) for o, p in got] == [(2, "t1")]


def test_a_late_commit_of_a_captured_statement_is_still_delivered(db, connect):
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t')")
    db.execute("SELECT mailbox.create_consumer_group('g', 't', 'earliest')")
    t1 = connect(autocommit=False)
    t1.execute("INSERT INTO t VALUES (1)")
    t2 = connect(autocommit=False)
    t2.execute("INSERT INTO t VALUES (2)")
    t2.commit()
    got = poll(db, "g", "c")
    assert [p["inserted"][0]["id"] for _, p in got] == [2]
    commit(db, "g", "c", got[-1][0])
    t1.commit()
    got = poll(db, "g", "c")
    assert [(o, p["inserted"][0]["id"]) for o, p in got] == [(2, 1)]


def test_unrelated_idle_transaction_and_long_query_do_not_delay_delivery(group, connect):
    db = group
    db.execute("CREATE TABLE other (id int)")
    idle = connect(autocommit=False)
    idle.execute("SELECT count(*) FROM other")  # idle in transaction, snapshot held
    writer = connect(autocommit=False)
    writer.execute("INSERT INTO other VALUES (1)")  # holds an xid, never touches the outbox
    long_query = connect()
    runner = threading.Thread(target=lambda: long_query.execute("SELECT pg_sleep(3)"))
    runner.start()
    time.sleep(0.2)
    try:
        for i in range(3):
            publish(db, "e", 5, tag=f"b{i}")
            started = time.monotonic()
            got = poll(db, "g", "c")
            assert len(got) == 5 and time.monotonic() - started < 2
            commit(db, "g", "c", got[-1][0])
    finally:
        runner.join()
        idle.rollback()
        writer.rollback()


def test_a_long_producer_transaction_delays_only_its_own_rows(group, connect):
    db = group
    slow = connect(autocommit=False)
    slow.execute("SELECT mailbox.outbox_publish('e', '{\"who\": \"slow\"}')")
    for i in range(3):
        db.execute("SELECT mailbox.outbox_publish('e', %s)", [f'{{"who": "fast{i}"}}'])
        (row,) = poll(db, "g", "c")
        assert row[1]["who"] == f"fast{i}"
        commit(db, "g", "c", row[0])
    slow.commit()
    (row,) = poll(db, "g", "c")
    assert row == (4, {"who": "slow"})


def test_rolled_back_publishes_leave_no_gap_and_lag_counts_rows(group, connect):
    db = group
    for i in range(10):
        conn = connect(autocommit=False)
        conn.execute("SELECT mailbox.outbox_publish('e', '{}')")
        conn.rollback() if i % 2 else conn.commit()
    poll(db, "g", "c", batch=2)
    assert scalar(db, "SELECT lag FROM mailbox.consumer_lag('g')") == 5
    commit(db, "g", "c", 2)
    lag = db.execute(
        "SELECT committed_offset, group_offset, head_offset, lag, in_flight"
        " FROM mailbox.consumer_lag('g')"
    ).fetchone()
    assert lag == (2, 2, 5, 3, 0)


def test_a_poll_inside_a_writing_transaction_loses_none_of_its_later_rows(group, connect):
    """pg_current_snapshot() shows the caller's own running transaction as visible once a
    later one has completed; the sequencer must still treat it as in progress, or the rows it
    writes after its poll would fall below the next window and never be delivered."""
    db = group
    a, b = connect(autocommit=False), connect(autocommit=False)
    a.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 1}')")  # a holds the older xid
    b.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 0}')")
    b.commit()  # a later transaction completes: xmax moves past a's xid
    got = [p["n"] for _, p in poll(a, "g", "in_a", batch=100)]
    a.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 2}')")
    a.commit()
    for _ in range(3):
        batch = poll(db, "g", "c", batch=100)
        got += [p["n"] for _, p in batch]
        if batch:
            commit(db, "g", "c", batch[-1][0])
    assert sorted(got) == [0, 1, 2]
