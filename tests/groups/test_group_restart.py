"""A consumer restarted under the same id (SPEC §2.2.5 Restarts) and the lease clock.

Stable consumer ids (host or pod names) are the normal deployment, so a crashed consumer's
successor polls under its predecessor's id while the predecessor's lease is still live. It
must never acknowledge rows only the predecessor received: a poll hands the consumer's own
unacknowledged leases back first, so its commit covers only rows it was given.
"""

import time

import pytest
from groups import Bg, Notices, commit, poll, publish, wait_blocked
from mbx import raises, rows, scalar


def offsets(got):
    return [r[0] for r in got]


@pytest.fixture
def group(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    publish(db, "e", 20)
    return db


def group_offset(db):
    return scalar(db, "SELECT group_offset FROM mailbox.consumer_group_lag WHERE group_name = 'g'")


def test_a_restarted_consumer_gets_its_predecessors_batch_again_first(group, connect):
    """pod-0 leases 1-10 and crashes; restarted as pod-0 while that lease is live, it is
    handed 1-10 again (not 11-20), so its commit acknowledges only rows it received."""
    first = connect()
    assert offsets(poll(first, "g", "pod-0", 10)) == list(range(1, 11))
    first.close()  # crash: nothing processed, nothing committed

    second = connect()
    got = offsets(poll(second, "g", "pod-0", 10))
    assert got == list(range(1, 11))
    assert commit(second, "g", "pod-0", got[-1]) == len(got)
    assert offsets(poll(second, "g", "pod-0", 10)) == list(range(11, 21))
    assert commit(second, "g", "pod-0", 20) == 10
    assert group_offset(group) == 20


def test_a_restarted_consumer_never_acknowledges_rows_it_did_not_receive(group, connect):
    """Whatever a restarted consumer is given, committing the last offset it received
    acknowledges exactly the rows it received: a smaller batch than the predecessor's
    lease is cut from that lease, the rest comes next."""
    first = connect()
    assert offsets(poll(first, "g", "pod-0", 10)) == list(range(1, 11))
    first.close()

    second = connect()
    processed = []
    while got := offsets(poll(second, "g", "pod-0", 4)):
        assert commit(second, "g", "pod-0", got[-1]) == len(got)
        processed += got
    assert processed == list(range(1, 21))
    assert group_offset(group) == 20


def test_a_restart_after_the_lease_expired_gets_the_batch_again(group, connect):
    first = connect()
    assert offsets(poll(first, "g", "pod-0", 10, visibility=1)) == list(range(1, 11))
    first.close()
    time.sleep(1.2)
    second = connect()
    notices = Notices(second)
    assert offsets(poll(second, "g", "pod-0", 10)) == list(range(1, 11))
    assert commit(second, "g", "pod-0", 10) == 10
    assert notices.warnings() == []


def test_a_second_poll_without_a_commit_returns_the_same_batch(group, connect):
    """The other side of the rule: one consumer id has one batch in flight. Polling again
    before committing hands the same rows back (lease refreshed), not new ones; other
    consumers of the group are not affected."""
    a, b = connect(), connect()
    assert offsets(poll(a, "g", "a", 5, visibility=1)) == [1, 2, 3, 4, 5]
    assert offsets(poll(a, "g", "a", 5, visibility=60)) == [1, 2, 3, 4, 5]
    time.sleep(1.2)  # the first lease time has passed: the refresh counts
    assert offsets(poll(b, "g", "b", 5)) == [6, 7, 8, 9, 10]
    assert rows(
        group,
        "SELECT consumer_id, first_offset, last_offset FROM mailbox.consumer_active_leases"
        " ORDER BY first_offset",
    ) == [("a", 1, 5), ("b", 6, 10)]


# ------------------------------------------------------------------------ lease clock


def test_a_poll_that_waited_for_the_group_returns_a_lease_that_is_live(group, connect):
    """The lease runs from when it is written, not from the start of the poll's
    transaction: a poll queued behind another poll for longer than its visibility still
    returns a lease that is live, so nobody else receives the same rows at once."""
    h = connect(autocommit=False)
    assert offsets(poll(h, "g", "h", 1)) == [1]  # holds the group until h commits
    a = connect()
    waiting = Bg(lambda: offsets(poll(a, "g", "a", 4, visibility=2)))
    assert wait_blocked(group, a, waiting)
    time.sleep(2.5)
    h.commit()
    assert waiting.result() == [2, 3, 4, 5]
    assert offsets(poll(connect(), "g", "b", 4)) == [6, 7, 8, 9]
    live = scalar(
        group,
        "SELECT lease_until > clock_timestamp() FROM mailbox.consumer_active_leases"
        " WHERE consumer_id = 'a'",
    )
    assert live is True


def test_extend_lease_counts_from_when_it_runs(group, connect):
    a = connect(autocommit=False)
    poll(a, "g", "a", 3)
    a.commit()
    a.execute("SELECT now()")  # the transaction starts here
    time.sleep(1.2)
    until = scalar(a, "SELECT mailbox.extend_lease('g', 'a', 1)")
    assert until > scalar(a, "SELECT now() + interval '1.1 second'")
    a.commit()


# ------------------------------------------------------------------- commit arguments


def test_a_negative_offset_is_rejected_naming_the_argument(group, connect):
    a = connect()
    poll(a, "g", "a", 3)
    with raises("22023") as info:
        commit(a, "g", "a", -1)
    assert "p_last_offset" in info.value.diag.message_primary
    assert info.value.diag.message_hint
    assert commit(a, "g", "a", 0) == 0  # 0 is before the first row: nothing to acknowledge
    assert commit(a, "g", "a", 3) == 3


def test_committed_offset_never_passes_what_the_group_delivered(group, connect):
    """A commit past everything delivered acknowledges what the consumer holds and records
    the group's delivered offset as the consumer's committed offset, never the argument."""
    a = connect()
    assert offsets(poll(a, "g", "a", 3)) == [1, 2, 3]
    assert commit(a, "g", "a", 1000) == 3
    assert commit(a, "g", "a", 10**15) == 0
    assert rows(
        group, "SELECT committed_offset, group_offset, head_offset FROM mailbox.consumer_lag('g')"
    ) == [(3, 3, 20)]
    assert offsets(poll(a, "g", "a", 2)) == [4, 5]
    assert commit(a, "g", "a", 5) == 2


# ------------------------------------------------------------------ lease-lost warning


def test_no_lease_lost_warning_after_taking_the_lost_lease_back(group, connect):
    """a loses 1-4 to b, b's lease expires too and a takes 1-4 back: a's commit of 4
    acknowledges all four rows and must not warn 'lease lost'. b, whose rows really went
    to another consumer, is warned."""
    a, b = connect(), connect()
    notices_a, notices_b = Notices(a), Notices(b)
    assert offsets(poll(a, "g", "a", 4, visibility=1)) == [1, 2, 3, 4]
    time.sleep(1.2)
    assert offsets(poll(b, "g", "b", 4, visibility=1)) == [1, 2, 3, 4]
    time.sleep(1.2)
    assert offsets(poll(a, "g", "a", 4)) == [1, 2, 3, 4]
    assert commit(a, "g", "a", 4) == 4
    assert notices_a.warnings() == []
    assert commit(b, "g", "b", 4) == 0
    assert [w for w in notices_b.warnings() if w.startswith("lease lost")]


@pytest.mark.parametrize("a_takes_front", [True, False])
def test_a_lost_lease_partly_taken_back_still_warns(group, connect, a_takes_front):
    """a loses 1-6 to b; b's lease expires and a takes back only half of it (its batch),
    c the other half: a's commit of 6 acknowledges its half and warns, since the other half
    went to c."""
    a, b, c = connect(), connect(), connect()
    notices_a = Notices(a)
    assert offsets(poll(a, "g", "a", 6, visibility=1)) == [1, 2, 3, 4, 5, 6]
    time.sleep(1.2)
    assert offsets(poll(b, "g", "b", 6, visibility=1)) == [1, 2, 3, 4, 5, 6]
    time.sleep(1.2)
    first, second = (a, c) if a_takes_front else (c, a)
    assert offsets(poll(first, "g", "a" if a_takes_front else "c", 3)) == [1, 2, 3]
    assert offsets(poll(second, "g", "c" if a_takes_front else "a", 3)) == [4, 5, 6]
    assert commit(a, "g", "a", 6) == 3
    assert [w for w in notices_a.warnings() if w.startswith("lease lost")]
    assert commit(c, "g", "c", 6) == 3
    assert group_offset(group) == 6
