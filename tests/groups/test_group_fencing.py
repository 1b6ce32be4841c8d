"""Leases, extend_lease, fencing, commit and seek semantics (SPEC §2.2 items 2, 5, 6)."""

import time

import pytest
from groups import Notices, commit, poll, publish
from mbx import raises, rows, scalar


@pytest.fixture
def group(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    publish(db, "e", 10)
    return db


def test_an_expired_lease_is_redelivered_to_another_consumer(group, connect):
    a, b = connect(), connect()
    assert [r[0] for r in poll(a, "g", "a", batch=4, visibility=1)] == [1, 2, 3, 4]
    assert [r[0] for r in poll(b, "g", "b", batch=4)] == [5, 6, 7, 8]  # live lease: not given
    time.sleep(1.2)
    assert [r[0] for r in poll(b, "g", "b", batch=10)] == [1, 2, 3, 4]  # no maintenance needed


def test_extend_lease_prevents_redelivery(group, connect):
    a, b = connect(), connect()
    poll(a, "g", "a", batch=4, visibility=1)
    until = scalar(a, "SELECT mailbox.extend_lease('g', 'a', 30)")
    assert until is not None
    time.sleep(1.2)
    assert [r[0] for r in poll(b, "g", "b", batch=10)] == [5, 6, 7, 8, 9, 10]
    assert commit(a, "g", "a", 4) == 4


def test_extend_lease_may_shorten_and_returns_null_without_leases(group, connect):
    a, b = connect(), connect()
    poll(a, "g", "a", batch=3)
    scalar(a, "SELECT mailbox.extend_lease('g', 'a', 0)")  # expire now
    assert [r[0] for r in poll(b, "g", "b", batch=3)] == [1, 2, 3]
    assert scalar(a, "SELECT mailbox.extend_lease('g', 'a', 30)") is None


def test_stale_holder_cannot_acknowledge_the_new_holders_rows(group, connect):
    a, b = connect(), connect()
    notices = Notices(a)
    poll(a, "g", "a", batch=4, visibility=1)
    time.sleep(1.2)
    assert [r[0] for r in poll(b, "g", "b", batch=4)] == [1, 2, 3, 4]
    assert commit(a, "g", "a", 4) == 0  # the late commit acknowledges nothing
    assert any(w.startswith("lease lost") for w in notices.warnings())
    assert rows(
        group, "SELECT consumer_id, first_offset, last_offset FROM mailbox.consumer_active_leases"
    ) == [("b", 1, 4)]
    assert commit(b, "g", "b", 4) == 4
    assert scalar(group, "SELECT group_offset FROM mailbox.consumer_group_lag") == 4


def test_commit_returns_count_and_is_monotonic(group, connect):
    a = connect()
    notices = Notices(a)
    poll(a, "g", "a", batch=6)
    assert commit(a, "g", "a", 3) == 3
    assert commit(a, "g", "a", 3) == 0
    assert commit(a, "g", "a", 2) == 0
    assert any(w.startswith("commit below committed offset") for w in notices.warnings())
    assert scalar(group, "SELECT group_offset FROM mailbox.consumer_group_lag") == 3
    assert commit(a, "g", "a", 100) == 3  # only what it holds


def test_group_offset_waits_for_the_slowest_lease(group, connect):
    a, b = connect(), connect()
    poll(a, "g", "a", batch=3)
    poll(b, "g", "b", batch=3)
    assert commit(b, "g", "b", 6) == 3
    assert scalar(group, "SELECT group_offset FROM mailbox.consumer_group_lag") == 0
    assert commit(a, "g", "a", 3) == 3
    assert scalar(group, "SELECT group_offset FROM mailbox.consumer_group_lag") == 6


def test_unknown_group_or_consumer_is_42704(group):
    db = group
    for call in [
        "SELECT mailbox.commit_offset('nope', 'a', 1)",
        "SELECT mailbox.commit_offset('g', 'never_polled', 1)",
        "SELECT mailbox.extend_lease('nope', 'a')",
        "SELECT mailbox.extend_lease('g', 'never_polled')",
        "SELECT mailbox.consumer_heartbeat('nope', 'a')",
        "SELECT mailbox.consumer_heartbeat('g', 'never_polled')",
        "SELECT * FROM mailbox.consumer_lag('nope')",
        "SELECT mailbox.seek_offset('nope', 'a', 1)",
    ]:
        with raises("42704"):
            db.execute(call)
    with raises("22004"):
        db.execute("SELECT mailbox.commit_offset('g', NULL, 1)")
    poll(db, "g", "a", batch=1)
    with raises("22004"):
        db.execute("SELECT mailbox.commit_offset('g', 'a', NULL)")
    with raises("22023"):
        db.execute("SELECT mailbox.extend_lease('g', 'a', -1)")
    db.execute("SELECT mailbox.consumer_heartbeat('g', 'a')")


def test_seek_back_replays_forward_skips_null_jumps_to_head(group, connect):
    db = group
    listener = connect()
    listener.execute("LISTEN mailbox_alert")
    a = connect()
    poll(a, "g", "a", batch=10)
    commit(a, "g", "a", 10)
    db.execute("SELECT mailbox.seek_offset('g', 'a', 4)")
    assert [r[0] for r in poll(a, "g", "a", batch=100)] == list(range(5, 11))
    db.execute("SELECT mailbox.seek_offset('g', 'a', 8)")  # clears the lease just taken
    assert rows(db, "SELECT * FROM mailbox.consumer_active_leases") == []
    assert [r[0] for r in poll(a, "g", "a", batch=100)] == [9, 10]
    publish(db, "e", 3)
    db.execute("SELECT mailbox.seek_offset('g', 'a', NULL)")
    assert poll(a, "g", "a") == []
    publish(db, "e", 1)
    assert [r[0] for r in poll(a, "g", "a")] == [14]
    assert commit(a, "g", "a", 14) == 1  # seek reset the committed offset too
    got = [n.payload for n in listener.notifies(timeout=1, stop_after=3)]
    assert len(got) == 3 and all('"consumer_seeked"' in p for p in got)
    assert scalar(db, "SELECT count(*) FROM mailbox.alert_log WHERE event = 'consumer_seeked'") == 3
    with raises("22023"):
        db.execute("SELECT mailbox.seek_offset('g', 'a', -1)")


def test_seek_registers_an_unknown_consumer(group):
    group.execute("SELECT mailbox.seek_offset('g', 'newbie', 2)")
    assert (
        scalar(group, "SELECT count(*) FROM mailbox.consumer_status WHERE consumer_id = 'newbie'")
        == 1
    )


def test_takeover_does_not_wait_for_the_old_holders_open_transaction(group, connect):
    """The old holder may be inside a transaction that holds its consumer row (a poll or a
    heartbeat); taking over its expired lease must not wait for it (nor deadlock with it)."""
    a, b = connect(autocommit=False), connect()
    poll(a, "g", "a", batch=4, visibility=1)
    a.commit()
    time.sleep(1.2)
    a.execute("SELECT mailbox.consumer_heartbeat('g', 'a')")  # holds a's row, stays open
    b.execute("SET lock_timeout = '2s'")
    assert [r[0] for r in poll(b, "g", "b", batch=4)] == [1, 2, 3, 4]
    a.commit()
    notices = Notices(a)
    assert commit(a, "g", "a", 4) == 0
    a.commit()
    assert any(w.startswith("lease lost") for w in notices.warnings())


def test_a_consumer_can_acknowledge_rows_redelivered_below_its_committed_offset(group, connect):
    """Regression protection (commit below the committed offset is a no-op) must not stop a
    consumer from acknowledging rows it holds now: after a takeover and a second expiry the
    same rows can come back to it, and they would otherwise be redelivered forever."""
    c, d = connect(), connect()
    poll(c, "g", "c", batch=4, visibility=1)  # 1..4, short lease
    time.sleep(1.2)
    assert [r[0] for r in poll(d, "g", "d", batch=4, visibility=1)] == [1, 2, 3, 4]
    assert [r[0] for r in poll(c, "g", "c", batch=4, visibility=60)] == [5, 6, 7, 8]
    assert commit(c, "g", "c", 8) == 4  # 5..8; 1..4 belong to d now
    time.sleep(1.2)  # d's lease expires too
    assert [r[0] for r in poll(c, "g", "c", batch=4)] == [1, 2, 3, 4]
    assert commit(c, "g", "c", 4) == 4
    assert scalar(group, "SELECT group_offset FROM mailbox.consumer_group_lag") == 8


def test_seek_outside_the_retained_range_is_clamped_with_a_notice(group, connect):
    a = connect()
    notices = Notices(a)
    a.execute("SELECT mailbox.seek_offset('g', 'a', 99)")
    assert any(
        s == "NOTICE" and m.startswith("offset 99 is outside the retained range")
        for s, m in notices.items
    )
    lag = group.execute(
        "SELECT group_offset, head_offset FROM mailbox.consumer_group_lag"
    ).fetchone()
    assert lag == (10, 10)
