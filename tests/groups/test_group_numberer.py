"""SPEC §2.2.4 with a background numberer: a consumer that keeps its poll transaction open
(or idles in it) holds back only the rows leased to it. Connections are interleaved on
purpose: the idle consumer's transaction stays open across the other consumers' polls,
commits and the producers' commits, and every other connection runs under a statement
timeout, so a wait on the idle one fails the test instead of passing late."""

import random
import threading
import time

import pytest
from groups import Bg, Notices, Numberer, commit, poll, publish, wait_blocked, wait_for
from mbx import raises, rows, scalar


@pytest.fixture
def numberer(db, connect):
    n = Numberer(connect)
    deadline = time.monotonic() + 10
    while not scalar(db, "SELECT mailbox._numberer_alive()"):
        assert time.monotonic() < deadline, "the numberer never started"
        time.sleep(0.01)
    yield n
    n.stop()


def head(db, outbox="e"):
    return scalar(db, "SELECT head_offset FROM mailbox._outbox WHERE outbox_name = %s", [outbox])


def timed(connect, ms=3000):
    """An autocommit connection that fails any statement waiting longer than ms."""
    conn = connect()
    conn.execute(f"SET statement_timeout = {int(ms)}")
    return conn


def offsets(batch):
    return [r[0] for r in batch]


@pytest.fixture
def outbox(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('h', 'e', 'earliest')")
    return db


def test_an_idle_poll_transaction_holds_back_only_its_own_rows(outbox, numberer, connect):
    db = outbox
    publish(db, "e", 10)
    wait_for(lambda: head(db) == 10, what="numbering")
    idle = connect(autocommit=False)  # psycopg's default: poll, work, commit_offset, commit
    assert offsets(poll(idle, "g", "idle", batch=4)) == [1, 2, 3, 4]
    # ... and now it idles in its transaction while everything else goes on
    other, third = timed(connect), timed(connect)
    assert offsets(poll(other, "g", "other", batch=100)) == [5, 6, 7, 8, 9, 10]
    assert commit(other, "g", "other", 10) == 6
    assert offsets(poll(third, "h", "third", batch=100)) == list(range(1, 11))
    assert commit(third, "h", "third", 10) == 10
    producer = timed(connect)
    publish(producer, "e", 5, tag="later")
    wait_for(lambda: head(db) == 15, what="numbering while a poll transaction is open")
    assert offsets(poll(other, "g", "other", batch=100)) == [11, 12, 13, 14, 15]
    assert commit(other, "g", "other", 15) == 5
    assert offsets(poll(third, "h", "third", batch=100)) == [11, 12, 13, 14, 15]
    lag = rows(
        db, "SELECT group_name, group_offset, lag FROM mailbox.consumer_group_lag ORDER BY 1"
    )
    assert lag == [("g", 0, 15), ("h", 10, 5)]  # g waits for the idle consumer's rows only
    # the idle consumer finishes normally: its commit acknowledges exactly its batch
    assert commit(idle, "g", "idle", 4) == 4
    idle.commit()
    assert (
        scalar(db, "SELECT group_offset FROM mailbox.consumer_group_lag WHERE group_name = 'g'")
        == 15
    )


def test_rows_of_an_idle_transaction_that_rolls_back_are_delivered_again(outbox, numberer, connect):
    db = outbox
    publish(db, "e", 8)
    wait_for(lambda: head(db) == 8, what="numbering")
    idle = connect(autocommit=False)
    assert offsets(poll(idle, "g", "idle", batch=4, visibility=1)) == [1, 2, 3, 4]
    other = timed(connect)
    assert offsets(poll(other, "g", "other", batch=4)) == [5, 6, 7, 8]
    commit(other, "g", "other", 8)
    time.sleep(1.3)
    # its lease expired, but the row is locked by its open transaction: not taken over (a
    # takeover would wait for it), and the poll does not wait either
    assert poll(other, "g", "other", batch=10) == []
    idle.rollback()  # e.g. the consumer crashed mid-batch and its session ended
    assert offsets(poll(other, "g", "other", batch=10)) == [1, 2, 3, 4]
    assert commit(other, "g", "other", 4) == 4
    assert (
        scalar(db, "SELECT group_offset FROM mailbox.consumer_group_lag WHERE group_name = 'g'")
        == 8
    )


def test_an_idle_consumers_expired_lease_is_fenced_after_its_transaction(outbox, numberer, connect):
    db = outbox
    publish(db, "e", 4)
    wait_for(lambda: head(db) == 4, what="numbering")
    a = connect(autocommit=False)
    notices = Notices(a)
    assert offsets(poll(a, "g", "a", batch=4, visibility=1)) == [1, 2, 3, 4]
    a.commit()  # the lease is committed; the consumer then works longer than its visibility
    time.sleep(1.3)
    b = timed(connect)
    assert offsets(poll(b, "g", "b", batch=10)) == [1, 2, 3, 4]
    assert commit(a, "g", "a", 4) == 0  # lease lost: the late commit acknowledges nothing
    a.commit()
    assert any(w.startswith("lease lost") for w in notices.warnings())
    assert commit(b, "g", "b", 4) == 4


def test_a_takeover_racing_the_old_holders_commit_warns_lease_lost(outbox, numberer, connect):
    """Without the group lock nothing serialises a takeover and the old holder's commit: the
    commit waits for the row, skips it once it belongs to the new holder, and warns."""
    db = outbox
    publish(db, "e", 4)
    wait_for(lambda: head(db) == 4, what="numbering")
    a = connect()
    notices = Notices(a)
    poll(a, "g", "a", batch=4, visibility=1)
    time.sleep(1.2)
    b = connect(autocommit=False)
    assert offsets(poll(b, "g", "b", batch=4)) == [1, 2, 3, 4]  # locked until b commits
    late = Bg(lambda: commit(a, "g", "a", 4))
    assert wait_blocked(db, a, late)
    b.commit()
    assert late.result() == 0
    assert any(w.startswith("lease lost") for w in notices.warnings())


def test_restart_under_the_same_id_gets_the_predecessors_rows_first(outbox, numberer, connect):
    db = outbox
    publish(db, "e", 20)
    wait_for(lambda: head(db) == 20, what="numbering")
    old = connect()
    assert offsets(poll(old, "g", "c", batch=4)) == [1, 2, 3, 4]
    new = connect()  # same id, never saw 1..4: they come again, and only they
    assert offsets(poll(new, "g", "c", batch=4)) == [1, 2, 3, 4]
    assert commit(new, "g", "c", 4) == 4
    assert offsets(poll(new, "g", "c", batch=4)) == [5, 6, 7, 8]


def test_seek_and_lag_with_a_numberer(outbox, numberer, connect):
    db = outbox
    publish(db, "e", 30)
    wait_for(lambda: head(db) == 30, what="numbering")
    c = connect()
    got = []
    while len(got) < 30:
        batch = offsets(poll(c, "g", "c", batch=7))
        assert batch
        got += batch
        commit(c, "g", "c", batch[-1])
    assert got == list(range(1, 31))
    c.execute("SELECT mailbox.seek_offset('g', 'c', 25)")
    wait_for(
        lambda: scalar(db, "SELECT count(*) FROM mailbox._lease WHERE group_name = 'g'") > 0,
        what="slots after the seek",
    )
    assert offsets(poll(c, "g", "c", batch=100)) == [26, 27, 28, 29, 30]
    assert rows(db, "SELECT group_offset, lag FROM mailbox.consumer_lag('g')") == [(25, 5)]


def test_a_waiting_consumer_is_woken_after_numbering(outbox, numberer, connect):
    db = outbox
    listener = connect()
    listener.execute("LISTEN mailbox_outbox_new")
    c = connect()
    assert poll(c, "g", "c") == []  # now waiting
    gen = listener.notifies(timeout=5, stop_after=1)
    t0 = time.monotonic()
    publish(connect(), "e", 1)
    got = list(gen)
    assert got and got[0].payload == "e"
    # the producer's own wake-up may come before the numberer's: poll until the row is there
    wait_for(lambda: head(db) == 1, what="numbering")
    assert offsets(poll(c, "g", "c")) == [1]
    assert time.monotonic() - t0 < 5


def test_only_one_numberer_runs(numberer, connect):
    second = connect()
    notices = Notices(second)
    t0 = time.monotonic()
    second.execute("CALL mailbox.run_numberer(30)")
    assert time.monotonic() - t0 < 10
    assert any("already running" in m for _, m in notices.items)


def test_run_numberer_checks_its_argument(db):
    with raises("22023"):
        db.execute("CALL mailbox.run_numberer(0)")


def test_every_row_once_with_idle_transactions_and_concurrent_producers(outbox, numberer, connect):
    """4 consumers per group in psycopg's default mode (poll, work, commit_offset, commit)
    while one of them regularly idles in its open poll transaction far longer than the
    others' polls; 3 producers commit meanwhile. No lease expires: every row exactly once
    per group, and the others keep receiving rows while the idle one sleeps."""
    db = outbox
    total = 3 * 400
    stop = threading.Event()
    received = {"g": [], "h": []}
    lock = threading.Lock()
    errors = []
    progress_during_idle = []

    def produce(i):
        conn = connect()
        try:
            for k in range(40):
                publish(conn, "e", 10, tag=f"p{i}-{k}")
                time.sleep(random.random() * 0.01)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def consume(group, name, idler):
        conn = connect(autocommit=False)
        conn.execute("SET statement_timeout = 5000")
        conn.commit()
        try:
            while not stop.is_set():
                batch = offsets(poll(conn, group, name, batch=25))
                if not batch:
                    conn.commit()
                    time.sleep(0.005)
                    continue
                if idler and len(received[group]) < total // 2:
                    before = len(received[group])
                    time.sleep(0.8)  # idle in the open poll transaction
                    progress_during_idle.append(len(received[group]) - before)
                with lock:
                    received[group].extend(batch)
                commit(conn, group, name, batch[-1])
                conn.commit()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
    for group in ("g", "h"):
        threads += [
            threading.Thread(target=consume, args=(group, f"{group}{i}", i == 0)) for i in range(4)
        ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not errors:
        with lock:
            if all(len(v) >= total for v in received.values()):
                break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for group in ("g", "h"):
        assert sorted(received[group]) == list(range(1, total + 1)), group
    assert progress_during_idle and max(progress_during_idle) > 0
    lag = rows(db, "SELECT group_offset, lag FROM mailbox.consumer_group_lag ORDER BY group_name")
    assert lag == [(total, 0), (total, 0)]
