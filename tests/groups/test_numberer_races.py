"""Adversarial review of the background numberer (SPEC §2.2.4, sql/24_groups_numberer.sql)
and of partitioned outboxes (SPEC §2.3, sql/26_*, sql/27_*), on a real PostgreSQL.

Every test interleaves connections on purpose. A test that pins a bug is marked
``xfail(strict=True)`` with the finding's number; the others are regression tests for
properties that held under attack. Connections that must not wait run under a statement
timeout, so a hidden wait fails fast instead of passing late.
"""

import random
import threading
import time

import psycopg
import pytest
from groups import Bg, Notices, commit, poll, publish, wait_blocked
from mbx import drop_role, make_role, raises, rows, scalar

# --------------------------------------------------------------------------- helpers


def offsets(batch):
    return [r[0] for r in batch]


def head(db, outbox="e"):
    return scalar(db, "SELECT head_offset FROM mailbox._outbox WHERE outbox_name = %s", [outbox])


def wait_for(predicate, timeout=10, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def timed(connect, ms=3000, **kw):
    conn = connect(**kw)
    conn.execute(f"SET statement_timeout = {int(ms)}")
    if not conn.autocommit:
        conn.commit()
    return conn


def alive(db):
    return scalar(db, "SELECT mailbox._numberer_alive()")


class Numberer:
    """CALL mailbox.run_numberer() in a thread, on its own connection. stop() terminates the
    backend (as an operator or an OOM kill would), so its session-level lock goes with it."""

    def __init__(self, connect, db, seconds=120, slot_rows=None, wait=True):
        opts = f"-c mailbox.consumer_slot_rows={slot_rows}" if slot_rows else ""
        self.db = db
        self.conn = connect(autocommit=True, options=opts) if opts else connect(autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.notices = Notices(self.conn)
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(seconds,), daemon=True)
        self.thread.start()
        if wait:
            wait_for(lambda: self._holds_lock(), what="the numberer to start")

    def _holds_lock(self):
        return bool(
            scalar(
                self.db,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = 7168634 AND objid = 0 AND pid = %s",
                [self.pid],
            )
        )

    def _run(self, seconds):
        try:
            self.conn.execute("CALL mailbox.run_numberer(%s)", [seconds])
        except (psycopg.errors.QueryCanceled, psycopg.OperationalError):
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by kill()
            self.error = exc

    def kill(self):
        self.db.execute("SELECT pg_terminate_backend(%s)", [self.pid])
        self.thread.join(10)
        assert not self.thread.is_alive()
        wait_for(
            lambda: (
                not scalar(
                    self.db, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [self.pid]
                )
            ),
            what="the numberer's backend to exit",
        )
        if self.error is not None:
            raise self.error


@pytest.fixture
def box(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('h', 'e', 'earliest')")
    return db


@pytest.fixture
def numberer(box, connect):
    n = Numberer(connect, box, slot_rows=4)
    yield n
    if n.thread.is_alive():
        n.kill()


def ppoll(conn, group, consumer, batch=100, visibility=30):
    return conn.execute(
        "SELECT outbox_id, key, partition FROM mailbox.poll_outbox(%s, %s, %s, %s)",
        [group, consumer, batch, visibility],
    ).fetchall()


def publish_keys(conn, outbox, keys):
    for k in keys:
        conn.execute(
            "SELECT mailbox.outbox_publish(%s, jsonb_build_object('k', %s::text), '{}', %s)",
            [outbox, k, k],
        )


def part_of(db, key, parts):
    return scalar(db, "SELECT (abs(hashtext(coalesce(%s, ''))::bigint) %% %s)::int", [key, parts])


def finding(reason, raises=AssertionError, strict=True):
    """A pinned bug: the test states what SPEC requires and fails, with this exception,
    until the bug is fixed (then strict xfail turns it red so the mark goes). strict=False
    only for a bug whose failure depends on timing (the reason says so)."""
    return pytest.mark.xfail(strict=strict, raises=raises, reason=reason)


def assert_new_rows_delivered(db, connect):
    """Three rows published now reach a consumer of g (numbered inline or by a numberer)."""
    publish(db, "e", 3)
    c = timed(connect)
    assert offsets(poll(c, "g", "c")) == [1, 2, 3]


# ============================================================ findings (pinned bugs)


def test_finding1_a_numberer_that_errors_out_must_not_stall_delivery(box, connect):
    db = box
    # psycopg's default (non-autocommit) mode: CALL runs inside a transaction block, so the
    # procedure's first COMMIT fails (2D000) -- after it took its session-level lock
    admin = connect(autocommit=False)
    with raises("2D000"):
        admin.execute("CALL mailbox.run_numberer(5)")
    admin.rollback()
    # the session lives on (a pooled connection, a relay that logs and retries later)
    assert_new_rows_delivered(db, connect)


def test_finding1b_a_cancelled_numberer_must_not_stall_delivery(box, connect):
    db = box
    n = Numberer(connect, db)
    n.conn.cancel()  # what G's own test fixture does to stop it
    n.thread.join(10)
    assert not n.thread.is_alive()
    assert_new_rows_delivered(db, connect)


def test_finding2_a_role_without_privileges_cannot_fake_a_numberer(box, connect):
    db = box
    nobody = make_role(db)  # no mailbox role at all
    try:
        attacker = connect()
        attacker.execute(f'SET ROLE "{nobody}"')
        attacker.execute("SELECT pg_advisory_lock(7168634, 0)")
        assert_new_rows_delivered(db, connect)
    finally:
        attacker.close()
        drop_role(db, nobody)


def test_finding3_idle_small_batch_holds_back_only_its_own_rows(box, connect):
    db = box
    n = Numberer(connect, db)  # default slot size
    try:
        publish(db, "e", 20)
        wait_for(lambda: head(db) == 20, what="numbering")
        wait_for(
            lambda: scalar(db, "SELECT count(*) FROM mailbox._lease WHERE group_name = 'g'") > 0,
            what="slots",
        )
        idle = connect(autocommit=False)
        assert offsets(poll(idle, "g", "idle", batch=5)) == [1, 2, 3, 4, 5]
        other = timed(connect)
        # rows 6..20 are nobody's: another consumer of the group must get them
        assert offsets(poll(other, "g", "other", batch=100)) == list(range(6, 21))
    finally:
        idle.rollback()
        n.kill()


@finding(
    "finding 4: seek_offset numbers inline (_sequence_all) even while a numberer runs "
    "and then waits for an idle consumer's locked lease: the outbox's sequencer row stays "
    "locked, so numbering stops for every group of the outbox (SPEC 2.2.4); timing-dependent:"
    " the stall shows only when the seek takes the sequencer row before a numberer pass does",
    strict=False,
)
def test_finding4_a_seek_waiting_on_an_idle_consumer_stalls_no_other_group(numberer, connect):
    db = numberer.db
    publish(db, "e", 4)
    wait_for(lambda: head(db) == 4, what="numbering")
    idle = connect(autocommit=False)
    # a registered consumer that polls often: its heartbeat is younger than 100 ms, so its
    # poll writes nothing a seek waits for but the lease row it claimed
    assert offsets(poll(idle, "g", "idle", batch=1)) == [1]
    idle.commit()
    assert commit(idle, "g", "idle", 1) == 1
    idle.commit()
    for _ in range(20):
        idle.execute("SELECT mailbox.consumer_heartbeat('g', 'idle')")
        idle.commit()
        assert offsets(poll(idle, "g", "idle", batch=3)) == [2, 3, 4]
        # the heartbeat was fresh, so the poll left the consumer row alone (no xmax on the
        # version others see); else try again
        if scalar(db, "SELECT xmax::text = '0' FROM mailbox._consumer WHERE consumer_id = 'idle'"):
            break
        idle.rollback()
    else:
        pytest.fail("the idle consumer's poll always refreshed its heartbeat")
    seeker = connect()
    seek = Bg(lambda: seeker.execute("SELECT mailbox.seek_offset('g', 'ops', 0)"))
    try:
        assert wait_blocked(db, seeker, seek)  # waits for the idle consumer, as it may
        publish(connect(), "e", 3)
        # group h has nothing to do with either: its rows must be numbered and delivered
        h = timed(connect)
        deadline = time.monotonic() + 3
        got = []
        while time.monotonic() < deadline and len(got) < 7:
            batch = offsets(poll(h, "h", "hc", batch=100))
            if batch:
                got += batch
                commit(h, "h", "hc", batch[-1])
            time.sleep(0.02)
        assert got == list(range(1, 8))
    finally:
        idle.rollback()
        seek.result()


@finding(
    "finding 5: create_consumer_group(..., 'latest') reads a stale head when the "
    "outbox's sequencer row is locked (SKIP LOCKED returns 0 rows numbered): rows committed "
    "before the group was created are delivered to it",
)
def test_finding5_latest_group_skips_rows_committed_before_it(box, connect):
    db = box
    # no numberer: a consumer polls in psycopg's default mode, numbering inline, and its
    # transaction is still open (it works on its batch)
    busy = connect(autocommit=False)
    assert poll(busy, "g", "busy") == []
    publish(db, "e", 3)  # committed before the group below exists
    db.execute("SELECT mailbox.create_consumer_group('late', 'e', 'latest')")
    busy.commit()
    publish(db, "e", 1, tag="after")
    c = timed(connect)
    got = c.execute("SELECT payload->>'tag' FROM mailbox.poll_outbox('late', 'c', 100)").fetchall()
    assert [r[0] for r in got] == ["after"]


def test_finding6_views_agree_with_consumer_lag_on_partitioned_groups(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 4)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    publish_keys(db, "p", [f"k{i}" for i in range(12)])
    c = connect()
    got = ppoll(c, "pg", "c", batch=5)
    assert len(got) == 5
    lag = rows(db, "SELECT group_offset, lag, in_flight FROM mailbox.consumer_lag('pg')")
    assert lag == [(0, 12, 5)]
    status = rows(db, "SELECT group_offset, in_flight FROM mailbox.consumer_status")
    group = rows(db, "SELECT group_offset, lag, in_flight FROM mailbox.consumer_group_lag")
    assert status == [(0, 5)]
    assert group == [(0, 12, 5)]


def test_finding7_a_parked_row_is_not_redelivered_on_one_partition(box, connect):
    db = box
    publish(db, "e", 3)
    a = connect()
    assert offsets(poll(a, "g", "a", batch=3, visibility=1)) == [1, 2, 3]
    a.execute("SELECT mailbox.outbox_park('g', 'a', 2, 'poison')")
    a.close()  # crashes before committing 1 and 3
    time.sleep(1.2)
    b = timed(connect)
    assert offsets(poll(b, "g", "b", batch=10)) == [1, 3]


def test_finding8_p_partitions_errors_name_the_argument(db):
    for bad in (0, 257, -1):
        with raises("22023") as info:
            db.execute("SELECT mailbox.create_outbox('bad', p_partitions => %s)", [bad])
        assert "p_partitions" in (info.value.diag.message_hint or "")
    with raises("22004"):
        db.execute("SELECT mailbox.create_outbox('bad', p_partitions => NULL)")


def test_finding9_parked_rows_of_a_granted_outbox_are_hidden_from_strangers(db, connect):
    team = make_role(db)
    stranger = make_role(db, "mailbox_consumer")
    try:
        db.execute("SELECT mailbox.create_outbox('secret', p_partitions => 2)")
        db.execute("SELECT mailbox.create_consumer_group('sg', 'secret', 'earliest')")
        db.execute("SELECT mailbox.grant_outbox('secret', %s, 'consume')", [team])
        publish_keys(db, "secret", ["a"])
        got = ppoll(db, "sg", "c")
        db.execute(
            "SELECT mailbox.outbox_park('sg', 'c', %s, 'card 4111-1111 declined')", [got[0][0]]
        )
        s = connect()
        s.execute(f'SET ROLE "{stranger}"')
        with raises("42501"):  # the stranger may not poll it ...
            s.execute("SELECT * FROM mailbox.poll_outbox('sg', 'x')")
        # ... nor read what was parked in it
        assert rows(s, "SELECT reason FROM mailbox.outbox_parked") == []
        s.close()
    finally:
        drop_role(db, stranger)
        drop_role(db, team)


def two_partition_keys(db, parts=2):
    """A key of partition 0 and a key of partition 1."""
    found = {}
    i = 0
    while len(found) < 2:
        k = f"key{i}"
        found.setdefault(part_of(db, k, parts), k)
        i += 1
    return found[0], found[1]


def test_finding10_partitions_do_not_wait_for_each_other_without_a_numberer(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 2)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    k0, k1 = two_partition_keys(db)
    c, d = timed(connect), timed(connect)
    assert ppoll(c, "pg", "c") == []  # c alone: takes both partitions
    assert ppoll(d, "pg", "d") == []  # d joins: its share is one
    assert ppoll(c, "pg", "c") == []  # c gives up partition 1
    assert ppoll(d, "pg", "d") == []  # d takes it
    assert rows(db, "SELECT consumer_id, partitions FROM mailbox.consumer_status ORDER BY 1") == [
        ("c", [0]),
        ("d", [1]),
    ]
    db.execute(
        "SELECT count(*) FROM mailbox.outbox_publish_batch('p',"
        " ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 300)), '{}', %s)",
        [k1],
    )
    assert len(ppoll(d, "pg", "d", batch=100)) == 100  # d works on its backlog slowly
    publish_keys(db, "p", [k0])  # committed: c's partition has a row
    got = ppoll(c, "pg", "c", batch=100)
    assert [(r[1], r[2]) for r in got] == [(k0, 0)]


# ======================================================= regression tests (properties held)


def test_exactly_once_while_numberers_start_race_and_get_killed(box, connect):
    """3 + 2 consumers in psycopg's default mode, 2 producers, and a chaos thread that starts
    two numberers at once (one holds the lock, the other waits for it), kills both with
    pg_terminate_backend at random points, and runs without one for a while. No lease
    expires: every row exactly once per group."""
    db = box
    total = 2 * 30 * 10
    stop = threading.Event()
    got = {"g": [], "h": []}
    lock = threading.Lock()
    errors = []
    kills = []

    def produce(i):
        conn = connect()
        try:
            for k in range(30):
                publish(conn, "e", 10, tag=f"p{i}-{k}")
                time.sleep(random.random() * 0.03)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def consume(group, name):
        # the documented loop: the poll commits before the batch is processed (poll and
        # commit_offset in one transaction deadlock when the numberer stops: finding 14)
        conn = connect(autocommit=False)
        try:
            while not stop.is_set():
                batch = offsets(poll(conn, group, name, batch=random.choice([1, 3, 7, 20])))
                conn.commit()
                if batch:
                    with lock:
                        got[group].extend(batch)
                    commit(conn, group, name, batch[-1])
                conn.commit()
                if not batch:
                    time.sleep(0.003)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def chaos():
        try:
            while not stop.is_set():
                a = Numberer(connect, db, slot_rows=random.choice([1, 4, 100]), wait=False)
                b = Numberer(connect, db, wait=False)
                time.sleep(random.random() * 0.3)
                for n in (a, b):
                    n.kill()
                    kills.append(n)
                time.sleep(random.random() * 0.1)  # no numberer: polls number inline
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(2)]
    threads += [threading.Thread(target=consume, args=("g", f"g{i}")) for i in range(3)]
    threads += [threading.Thread(target=consume, args=("h", f"h{i}")) for i in range(2)]
    threads.append(threading.Thread(target=chaos))
    for t in threads:
        t.start()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not errors:
        with lock:
            if all(len(v) >= total for v in got.values()):
                break
        time.sleep(0.05)
    time.sleep(0.2)  # a duplicate would show up now
    stop.set()
    for t in threads:
        t.join(20)
    assert not errors, [str(e) for e in errors]
    assert len(kills) >= 2
    for group in ("g", "h"):
        assert sorted(got[group]) == list(range(1, total + 1)), group
    assert rows(
        db, "SELECT group_name, lag FROM mailbox.consumer_lag() GROUP BY 1, 2 ORDER BY 1"
    ) == [
        ("g", 0),
        ("h", 0),
    ]


def test_rows_numbered_but_not_slotted_when_the_numberer_dies_are_delivered(box, connect):
    """The numberer numbers the outbox and hands h its slots, but skips g, whose row a
    commit (no numberer when it started) holds; it is killed before any later pass. The
    numbered rows reach g through the inline path, once."""
    db = box
    publish(db, "e", 2)
    x = connect(autocommit=False)
    assert offsets(poll(x, "g", "x", batch=2)) == [1, 2]
    x.commit()
    assert commit(x, "g", "x", 2) == 2  # holds g's row until x commits
    n = Numberer(connect, db, slot_rows=2)
    publish(db, "e", 5)
    wait_for(lambda: head(db) == 7, what="numbering")
    hc = timed(connect)
    assert offsets(poll(hc, "h", "hc", batch=100))[:3] == [1, 2, 3]  # h was slotted
    assert (
        scalar(
            db, "SELECT count(*) FROM mailbox._lease WHERE group_name = 'g' AND consumer_id IS NULL"
        )
        == 0
    )  # no slot for g: numbered, not slotted
    n.kill()
    x.commit()
    gc = timed(connect)
    seen = []
    for _ in range(10):
        batch = offsets(poll(gc, "g", "gc", batch=3))
        if not batch:
            break
        seen += batch
        commit(gc, "g", "gc", batch[-1])
    assert seen == [3, 4, 5, 6, 7]


def test_idle_after_commit_and_after_several_polls_holds_back_only_its_rows(numberer, connect):
    db = numberer.db
    publish(db, "e", 12)
    wait_for(lambda: head(db) == 12, what="numbering")
    idle = connect(autocommit=False)
    assert offsets(poll(idle, "g", "idle", batch=4)) == [1, 2, 3, 4]
    assert commit(idle, "g", "idle", 4) == 4  # in the same, still open transaction
    assert offsets(poll(idle, "g", "idle", batch=4)) == [5, 6, 7, 8]
    assert offsets(poll(idle, "g", "idle", batch=4)) == [5, 6, 7, 8]  # one batch per id
    # ... idles now. Another consumer of g, a consumer of h, and the producers go on.
    other, hc, producer = timed(connect), timed(connect), timed(connect)
    assert offsets(poll(other, "g", "other", batch=100)) == [9, 10, 11, 12]
    assert commit(other, "g", "other", 12) == 4
    publish(producer, "e", 4, tag="later")
    wait_for(lambda: head(db) == 16, what="numbering while the idle transaction is open")
    assert offsets(poll(other, "g", "other", batch=100)) == [13, 14, 15, 16]
    assert commit(other, "g", "other", 16) == 4
    assert offsets(poll(hc, "h", "hc", batch=100)) == list(range(1, 17))
    assert commit(hc, "h", "hc", 16) == 16
    # the idle consumer's uncommitted work is invisible: 1..8 are still held back for g
    assert scalar(db, "SELECT lag FROM mailbox.consumer_group_lag WHERE group_name = 'g'") == 16
    idle.rollback()  # it crashes: its commit of 1..4 and its lease on 5..8 vanish
    seen = []
    while True:
        batch = offsets(poll(other, "g", "other", batch=3))
        if not batch:
            break
        seen += batch
        commit(other, "g", "other", batch[-1])
    assert seen == list(range(1, 9))
    wait_for(
        lambda: (
            scalar(db, "SELECT group_offset FROM mailbox._consumer_group WHERE group_name = 'g'")
            == 16
        ),
        what="the numberer to store g's offset",
    )


@finding(
    "finding 11: a consumer restarted under its id blocks behind its predecessor's "
    "open poll transaction: poll_outbox's heartbeat UPDATE (and commit_offset's FOR NO KEY "
    "UPDATE) wait for the predecessor's lock on the consumer row, not SKIP LOCKED",
    raises=psycopg.errors.QueryCanceled,
)
def test_finding11_restart_while_the_predecessors_poll_transaction_is_open(numberer, connect):
    db = numberer.db
    publish(db, "e", 12)
    wait_for(lambda: head(db) == 12, what="numbering")
    db.execute("SELECT mailbox.seek_offset('g', 'c', 0)")  # c is a known consumer
    time.sleep(0.15)  # its last heartbeat is older than 100 ms
    old = connect(autocommit=False)
    assert offsets(poll(old, "g", "c", batch=4)) == [1, 2, 3, 4]
    new = timed(connect)  # same id; the old process is stuck in its transaction
    assert offsets(poll(new, "g", "c", batch=4)) == [5, 6, 7, 8]
    assert commit(new, "g", "c", 8) == 4  # its own batch only
    old.rollback()  # the old process dies: 1..4 come back, to the same id first
    assert offsets(poll(new, "g", "c", batch=4)) == [1, 2, 3, 4]
    assert commit(new, "g", "c", 4) == 4
    assert offsets(poll(new, "g", "c", batch=4)) == [9, 10, 11, 12]


def test_fencing_with_a_numberer_after_a_split_takeover(numberer, connect):
    db = numberer.db
    publish(db, "e", 8)
    wait_for(lambda: head(db) == 8, what="numbering")
    a = connect()
    notices = Notices(a)
    assert offsets(poll(a, "g", "a", batch=8, visibility=1)) == list(range(1, 9))
    time.sleep(1.2)
    b = timed(connect)
    assert offsets(poll(b, "g", "b", batch=3)) == [1, 2, 3]  # takes the front of a's lease
    assert commit(a, "g", "a", 8) == 5  # a acknowledges what it still holds, 4..8
    assert any(w.startswith("lease lost") for w in notices.warnings())
    assert commit(b, "g", "b", 3) == 3
    assert poll(b, "g", "b") == []
    assert rows(
        db, "SELECT group_offset, lag FROM mailbox.consumer_lag('g') WHERE consumer_id = 'b'"
    ) == [(8, 0)]


def test_seek_while_a_numberer_runs_replays_exactly_once(numberer, connect):
    db = numberer.db
    publish(db, "e", 10)
    wait_for(lambda: head(db) == 10, what="numbering")
    c = timed(connect)
    assert offsets(poll(c, "g", "c", batch=100)) == list(range(1, 11))
    assert commit(c, "g", "c", 10) == 10
    c.execute("SELECT mailbox.seek_offset('g', 'c', 3)")
    publish(db, "e", 2)
    seen = []
    deadline = time.monotonic() + 5
    while len(seen) < 9 and time.monotonic() < deadline:
        batch = offsets(poll(c, "g", "c", batch=2))
        if batch:
            seen += batch
            commit(c, "g", "c", batch[-1])
        else:
            time.sleep(0.01)
    assert seen == list(range(4, 13))
    assert c.execute("SELECT mailbox.seek_offset('g', 'c', 100)") is not None  # clamped
    assert poll(c, "g", "c") == []
    assert scalar(db, "SELECT lag FROM mailbox.consumer_lag('g') WHERE consumer_id = 'c'") == 0


def test_drop_group_and_outbox_while_the_numberer_runs(numberer, connect):
    db = numberer.db
    c = timed(connect)
    for i in range(6):
        db.execute("SELECT mailbox.create_outbox(%s)", [f"tmp{i}"])
        db.execute(
            "SELECT mailbox.create_consumer_group(%s, %s, 'earliest')", [f"tg{i}", f"tmp{i}"]
        )
        publish(db, f"tmp{i}", 5)
        publish(db, "e", 1, tag=f"e{i}")
        wait_for(lambda i=i: head(db, f"tmp{i}") == 5, what="numbering")
        assert offsets(poll(c, f"tg{i}", "c", batch=2)) == [1, 2]  # leases in flight
        if i % 2:
            db.execute("SELECT mailbox.drop_consumer_group(%s)", [f"tg{i}"])
        db.execute("SELECT mailbox.drop_outbox(%s)", [f"tmp{i}"])
        with raises("42704"):
            c.execute("SELECT * FROM mailbox.poll_outbox(%s, 'c')", [f"tg{i}"])
    assert numberer.thread.is_alive() and numberer.error is None
    wait_for(lambda: head(db) == 6, what="numbering of e")
    assert offsets(poll(c, "g", "c", batch=100)) == [1, 2, 3, 4, 5, 6]


def test_create_groups_while_the_numberer_runs(numberer, connect):
    db = numberer.db
    publish(db, "e", 5)
    wait_for(lambda: head(db) == 5, what="numbering")
    db.execute("SELECT mailbox.create_consumer_group('new_latest', 'e', 'latest')")
    db.execute("SELECT mailbox.create_consumer_group('new_earliest', 'e', 'earliest')")
    publish(db, "e", 2, tag="after")
    wait_for(lambda: head(db) == 7, what="numbering")
    c = timed(connect)
    got = {}
    for group in ("new_latest", "new_earliest"):
        seen = []
        deadline = time.monotonic() + 5
        want = 2 if group == "new_latest" else 7
        while len(seen) < want and time.monotonic() < deadline:
            batch = poll(c, group, "c", batch=3)
            seen += [(r[0], r[1]["tag"]) for r in batch]
            if batch:
                commit(c, group, "c", batch[-1][0])
            else:
                time.sleep(0.01)
        got[group] = seen
    assert got["new_latest"] == [(6, "after"), (7, "after")]
    assert [o for o, _ in got["new_earliest"]] == list(range(1, 8))
    assert poll(c, "new_latest", "c") == [] and poll(c, "new_earliest", "c") == []


# ----------------------------------------------------------------- partitions (SPEC §2.3)


def test_per_key_order_across_expiry_crashes_and_redelivery(db, connect):
    """4 consumers of a 16-partition group with a numberer running; now and then one crashes
    (drops its batch, reconnects under its id or a new one, its leases expire). At every
    delivery, each earlier row of the row's key is acknowledged, earlier in the same batch,
    or held by the same consumer: never leased to another or waiting for redelivery."""
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 16)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    n = Numberer(connect, db)
    keys = [f"k{i}" for i in range(24)]
    rng = random.Random(7)
    wanted = [rng.choice(keys) for _ in range(600)]
    for i in range(0, 600, 50):
        publish_keys(db, "p", wanted[i : i + 50])
    wait_for(lambda: head(db, "p") == 600, what="numbering")
    db.execute("SELECT mailbox.create_consumer_group('map', 'p', 'earliest')")
    key_of = dict(rows(db, "SELECT outbox_id, key FROM mailbox.poll_outbox('map', 'm', 1000)"))
    by_key = {}
    for o in sorted(key_of):
        by_key.setdefault(key_of[o], []).append(o)
    lock = threading.Lock()
    acked, held = set(), {}
    violations, errors, crashes = [], [], []
    stop = threading.Event()

    def check(name, batch):
        mine = held.setdefault(name, set())
        seen = set()
        for o, k, _ in batch:
            assert k == key_of[o]
            for earlier in by_key[k]:
                if earlier >= o:
                    break
                if earlier not in acked and earlier not in seen and earlier not in mine:
                    violations.append((name, o, earlier))
            seen.add(o)
        mine.update(seen)

    def consume(i):
        name = f"c{i}"
        conn = connect()
        try:
            while not stop.is_set():
                with lock:
                    batch = ppoll(conn, "pg", name, batch=rng.choice([1, 5, 20]), visibility=1)
                    check(name, batch)
                if not batch:
                    time.sleep(0.01)
                    continue
                if rng.random() < 0.08:  # crash: nothing committed
                    crashes.append(name)
                    conn.close()
                    with lock:
                        held.pop(name, None)
                    time.sleep(rng.choice([0.05, 1.1]))
                    if rng.random() < 0.3:
                        name = f"c{i}-{rng.randrange(1000)}"
                    conn = connect()
                    continue
                with lock:
                    commit(conn, "pg", name, batch[-1][0])
                    acked.update(o for o, _, _ in batch if o in held.get(name, ()))
                    held[name].difference_update(o for o, _, _ in batch)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not errors:
        with lock:
            if len(acked) == 600:
                break
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(20)
    n.kill()
    assert not errors, errors
    assert not violations, violations[:5]
    assert acked == set(range(1, 601))
    assert len(crashes) >= 2
    assert rows(db, "SELECT DISTINCT lag FROM mailbox.consumer_lag('pg')") == [(0,)]


def test_park_unpark_survives_retention(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', 0, NULL, 4)")  # retention: as soon as allowed
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    publish_keys(db, "p", ["a", "a", "a", "b"])
    c = timed(connect)
    got = ppoll(c, "pg", "c", batch=10)
    assert [(o, k) for o, k, _ in got] == [(1, "a"), (2, "a"), (3, "a"), (4, "b")]
    first = rows(c, "SELECT event_id, payload FROM mailbox.poll_outbox('pg', 'c', 1)")[0]
    c.execute("SELECT mailbox.outbox_park('pg', 'c', 1, 'poison')")
    commit(c, "pg", "c", 4)  # its count: finding 12
    assert rows(db, 'SELECT "group", outbox_id, partition, reason FROM mailbox.outbox_parked') == [
        ("pg", 1, part_of(db, "a", 4), "poison")
    ]
    assert scalar(db, "SELECT lag FROM mailbox.consumer_lag('pg')") == 0
    assert scalar(db, "SELECT mailbox.run_maintenance()->>'outbox_rows_drained'") == "4"
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_p") == 0
    assert ppoll(c, "pg", "c") == []
    c.execute("SELECT mailbox.outbox_unpark('pg', 1)")
    again = rows(
        c, "SELECT outbox_id, event_id, payload, key, partition FROM mailbox.poll_outbox('pg', 'c')"
    )
    assert again == [(1, first[0], first[1], "a", part_of(db, "a", 4))]
    assert rows(db, "SELECT * FROM mailbox.outbox_parked") == []  # unparked: not listed
    assert commit(c, "pg", "c", 1) == 1
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_parked") == 0
    assert ppoll(c, "pg", "c") == []
    with raises("42704"):
        c.execute("SELECT mailbox.outbox_unpark('pg', 1)")
    with raises("55000"):  # a row this consumer does not hold
        c.execute("SELECT mailbox.outbox_park('pg', 'c', 2, 'x')")


def test_finding12_commit_after_park_counts_only_what_it_acknowledges(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 4)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    publish_keys(db, "p", ["a", "a", "a"])
    c = timed(connect)
    assert [o for o, _, _ in ppoll(c, "pg", "c")] == [1, 2, 3]
    c.execute("SELECT mailbox.outbox_park('pg', 'c', 2, 'poison')")
    assert commit(c, "pg", "c", 3) == 2


def held_partitions(db, group="pg"):
    return dict(
        rows(
            db,
            "SELECT consumer_id, partitions FROM mailbox.consumer_status WHERE group_name = %s",
            [group],
        )
    )


def test_rebalance_when_consumers_join_and_leave(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 8)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    keys = [f"k{i}" for i in range(40)]
    publish_keys(db, "p", keys)
    a, b = timed(connect), timed(connect)
    got_a = ppoll(a, "pg", "a", batch=100, visibility=1)
    assert len(got_a) == 40  # alone: every partition
    assert held_partitions(db) == {"a": list(range(8))}
    assert ppoll(b, "pg", "b", batch=100, visibility=1) == []  # a's leases are live
    commit(a, "pg", "a", got_a[-1][0])
    assert ppoll(a, "pg", "a", visibility=1) == []  # a gives up its extra partitions
    assert ppoll(b, "pg", "b", visibility=1) == []  # b takes them (nothing new yet)
    held = held_partitions(db)
    assert sorted(held["a"] + held["b"]) == list(range(8)) and len(held["b"]) == 4
    publish_keys(db, "p", keys)
    ga = ppoll(a, "pg", "a", batch=100, visibility=1)
    gb = ppoll(b, "pg", "b", batch=100, visibility=1)
    assert {p for _, _, p in ga} <= set(held["a"]) and {p for _, _, p in gb} <= set(held["b"])
    assert sorted(o for o, _, _ in ga + gb) == list(range(41, 81))
    commit(b, "pg", "b", gb[-1][0])
    # a leaves without a word (its rows in flight); after its visibility b holds everything
    time.sleep(1.2)
    again = ppoll(b, "pg", "b", batch=100, visibility=1)
    assert sorted(o for o, _, _ in again) == sorted(o for o, _, _ in ga)  # a's rows, again
    assert held_partitions(db)["b"] == list(range(8))
    assert commit(b, "pg", "b", 80) == len(ga)
    assert rows(db, "SELECT DISTINCT lag FROM mailbox.consumer_lag('pg')") == [(0,)]


def test_one_partition_is_an_unpartitioned_outbox(db, connect):
    db.execute("SELECT mailbox.create_outbox('one', p_partitions => 1)")
    db.execute("SELECT mailbox.create_consumer_group('og', 'one', 'earliest')")
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_partitioning") == 0
    publish_keys(db, "one", ["a", "b", "a", "c", "a", "b"])
    a, b = timed(connect), timed(connect)
    ga, gb = ppoll(a, "og", "a", batch=2), ppoll(b, "og", "b", batch=2)
    assert [(o, p) for o, _, p in ga] == [(1, 0), (2, 0)]
    assert [(o, p) for o, _, p in gb] == [(3, 0), (4, 0)]  # competition, not key affinity
    assert ppoll(a, "og", "a", batch=2) == ga  # one batch in flight per id, as in §2.2
    assert commit(b, "og", "b", 4) == 2
    assert commit(a, "og", "a", 2) == 2
    assert rows(db, "SELECT * FROM mailbox.consumer_partition_lag") == []
    assert rows(db, "SELECT partitions FROM mailbox.consumer_status") == [([],), ([],)]
    assert scalar(db, "SELECT lag FROM mailbox.consumer_group_lag") == 2


def test_p_partitions_validation_on_create_and_enable(db):
    db.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
    for bad in (0, -1, 257, 2**31 - 1):
        with raises("22023"):
            db.execute("SELECT mailbox.create_outbox('bad', p_partitions => %s)", [bad])
        with raises("22023"):
            db.execute("SELECT mailbox.enable_outbox('public.t', p_partitions => %s)", [bad])
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox") == 0  # nothing half-made
    db.execute("SELECT mailbox.create_outbox('max', p_partitions => 256)")
    db.execute("SELECT mailbox.create_consumer_group('mg', 'max', 'earliest')")
    assert (
        scalar(db, "SELECT count(*) FROM mailbox._partition_lease WHERE group_name = 'mg'") == 256
    )


def test_idle_partitioned_consumer_after_commit_holds_back_only_its_partitions(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 2)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('ph', 'p', 'earliest')")
    n = Numberer(connect, db)
    try:
        k0, k1 = two_partition_keys(db)
        idle, other = connect(autocommit=False), timed(connect)
        assert ppoll(idle, "pg", "idle") == []
        idle.commit()
        assert ppoll(other, "pg", "other") == []
        assert ppoll(idle, "pg", "idle") == []
        idle.commit()  # idle gave up one partition
        assert ppoll(other, "pg", "other") == []  # other took it
        mine = held_partitions(db)["idle"]
        k_idle, k_other = (k0, k1) if mine == [0] else (k1, k0)
        publish_keys(db, "p", [k_idle, k_other, k_idle, k_other])
        wait_for(lambda: head(db, "p") == 4, what="numbering")
        got = ppoll(idle, "pg", "idle")
        assert [k for _, k, _ in got] == [k_idle, k_idle]
        commit(idle, "pg", "idle", got[-1][0])  # same transaction, still open
        assert ppoll(idle, "pg", "idle") == []
        # idles now, holding its partition row and g's row; everyone else goes on
        got = ppoll(other, "pg", "other")
        assert [k for _, k, _ in got] == [k_other, k_other]
        assert commit(other, "pg", "other", got[-1][0]) == 2
        h = timed(connect)
        assert len(ppoll(h, "ph", "h")) == 4
        assert commit(h, "ph", "h", 4) == 4
        publish_keys(db, "p", [k_other, k_idle])
        wait_for(lambda: head(db, "p") == 6, what="numbering while idle")
        assert [k for _, k, _ in ppoll(other, "pg", "other")] == [k_other]
        assert [k for _, k, _ in ppoll(h, "ph", "h")] == [k_other, k_idle]
        idle.commit()
        assert [o for o, _, _ in ppoll(idle, "pg", "idle")] == [6]
    finally:
        n.kill()


def test_lag_views_are_consistent_and_never_negative(db, connect):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 4)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    n = Numberer(connect, db, slot_rows=3)
    rng = random.Random(3)
    conns = {name: timed(connect) for name in ("a", "b", "c")}
    for name, conn in conns.items():
        poll(conn, "g", name)
        ppoll(conn, "pg", name)
    try:
        for step in range(40):
            action = rng.choice(["publish", "poll", "commit", "seek"] if step % 13 else ["seek"])
            name = rng.choice(list(conns))
            conn = conns[name]
            if action == "publish":
                publish(db, "e", rng.randint(1, 5))
                publish_keys(db, "p", [f"k{rng.randint(0, 9)}" for _ in range(rng.randint(1, 5))])
                time.sleep(0.03)
            elif action == "poll":
                poll(conn, "g", name, batch=rng.randint(1, 6))
                ppoll(conn, "pg", name, batch=rng.randint(1, 6))
            elif action == "commit":
                commit(conn, "g", name, rng.randint(0, 60))
                commit(conn, "pg", name, rng.randint(0, 60))
            else:
                conn.execute("SELECT mailbox.seek_offset('g', %s, %s)", [name, rng.randint(0, 10)])
            lag = rows(
                db,
                "SELECT group_name, consumer_id, group_offset, head_offset, lag, in_flight"
                " FROM mailbox.consumer_lag() WHERE consumer_id IS NOT NULL",
            )
            for group, consumer, offset, head_offset, lag_rows, in_flight in lag:
                assert lag_rows >= 0 and in_flight >= 0 and lag_rows == head_offset - offset
                if group == "g":
                    assert in_flight == scalar(
                        db,
                        "SELECT in_flight FROM mailbox.consumer_status"
                        " WHERE group_name = 'g' AND consumer_id = %s",
                        [consumer],
                    )
                else:
                    assert in_flight == scalar(
                        db,
                        "SELECT coalesce(sum(in_flight), 0) FROM mailbox.consumer_partition_lag"
                        " WHERE group_name = 'pg' AND consumer_id = %s AND leased",
                        [consumer],
                    )
            assert scalar(db, "SELECT count(*) FROM mailbox.consumer_group_lag WHERE lag < 0") == 0
            assert (
                scalar(
                    db,
                    "SELECT count(*) FROM mailbox.consumer_partition_lag"
                    " WHERE lag < 0 OR in_flight < 0",
                )
                == 0
            )
            assert (
                scalar(
                    db,
                    "SELECT count(*) FROM mailbox.consumer_partition_lag WHERE in_flight > lag",
                )
                == 0
            )
    finally:
        n.kill()


def test_finding13_an_expired_partition_lease_is_delivered_again(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 2)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    k0, k1 = two_partition_keys(db)
    a, b = timed(connect), timed(connect)
    assert ppoll(a, "pg", "a") == []
    assert ppoll(b, "pg", "b") == []
    assert ppoll(a, "pg", "a") == []  # a gives up one partition
    assert ppoll(b, "pg", "b") == []  # b takes it: one each
    publish_keys(db, "p", [k0, k1])
    got_a = ppoll(a, "pg", "a", visibility=1)
    assert len(got_a) == 1
    # a's worker hangs; its heartbeat thread goes on (or it just committed something else)
    deadline = time.monotonic() + 1.3
    while time.monotonic() < deadline:
        a.execute("SELECT mailbox.consumer_heartbeat('pg', 'a')")
        time.sleep(0.1)
    got_b = ppoll(b, "pg", "b", batch=10, visibility=30)
    assert got_a[0] in got_b  # a's lease expired: its row is delivered again


# -------------------------------------------------------------------------------- security


def test_numberer_and_park_privileges(db):
    def can(role, sig):
        return scalar(db, "SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, sig])

    nobody = make_role(db)
    try:
        for sig in (
            "mailbox.run_numberer(int)",
            "mailbox.schedule_numberer()",
            "mailbox.unschedule_numberer()",
            "mailbox._numberer_pass()",
            "mailbox._numberer_start(int)",
            "mailbox.outbox_park(text, text, bigint, text)",
            "mailbox.outbox_unpark(text, bigint)",
        ):
            assert not can(nobody, sig), sig
            assert not scalar(
                db,
                "SELECT bool_or(a.grantee = 0) FROM pg_proc p, aclexplode(p.proacl) a"
                " WHERE p.oid = %s::regprocedure AND a.privilege_type = 'EXECUTE'",
                [sig],
            ), f"{sig} executable by PUBLIC"
        for sig in ("mailbox.run_numberer(int)", "mailbox.schedule_numberer()"):
            assert can("mailbox_admin", sig)
            assert not can("mailbox_consumer", sig) and not can("mailbox_producer", sig)
        assert can("mailbox_consumer", "mailbox.outbox_park(text, text, bigint, text)")
        assert not can("mailbox_producer", "mailbox.outbox_park(text, text, bigint, text)")
    finally:
        drop_role(db, nobody)


def test_a_consumer_cannot_run_the_numberer_nor_touch_a_granted_group(db, connect):
    team = make_role(db)
    stranger = make_role(db, "mailbox_consumer", "mailbox_producer")
    try:
        db.execute("SELECT mailbox.create_outbox('secret', p_partitions => 2)")
        db.execute("SELECT mailbox.create_consumer_group('sg', 'secret', 'earliest')")
        db.execute("SELECT mailbox.create_outbox('plain')")
        db.execute("SELECT mailbox.create_consumer_group('plg', 'plain', 'earliest')")
        for box in ("secret", "plain"):
            db.execute("SELECT mailbox.grant_outbox(%s, %s, 'consume')", [box, team])
        publish_keys(db, "secret", ["a", "b"])
        publish(db, "plain", 2)
        assert len(ppoll(db, "sg", "owner", visibility=1)) == 2
        assert len(poll(db, "plg", "owner", visibility=1)) == 2
        db.execute("SELECT mailbox.outbox_park('sg', 'owner', 1, 'x')")
        s = connect()
        s.execute(f'SET ROLE "{stranger}"')
        with raises("42501"):
            s.execute("CALL mailbox.run_numberer(1)")
        with raises("42501"):
            s.execute("SELECT mailbox._numberer_pass()")
        with raises("42501"):
            s.execute("SELECT mailbox.schedule_numberer()")
        time.sleep(1.1)  # the owner's leases expired: a takeover would hand them out
        for group in ("sg", "plg"):
            for stmt, args in (
                ("SELECT * FROM mailbox.poll_outbox(%s, 'owner')", [group]),
                ("SELECT mailbox.commit_offset(%s, 'owner', 2)", [group]),
                ("SELECT mailbox.outbox_park(%s, 'owner', 2, 'x')", [group]),
                ("SELECT mailbox.outbox_unpark(%s, 1)", [group]),
                ("SELECT mailbox.seek_offset(%s, 'owner', 0)", [group]),
                ("SELECT * FROM mailbox.consumer_lag(%s)", [group]),
            ):
                with raises("42501"):
                    s.execute(stmt, args)
        assert rows(s, "SELECT * FROM mailbox.consumer_lag()") == []
        s.execute("RESET ROLE")
        # nothing the stranger did moved anything
        assert rows(db, "SELECT outbox_id FROM mailbox.outbox_parked") == [(1,)]
        assert [o for o, _, _ in ppoll(db, "sg", "owner")] == [2]
        assert offsets(poll(db, "plg", "owner")) == [1, 2]
        s.close()
    finally:
        drop_role(db, stranger)
        drop_role(db, team)


def test_the_numberer_runs_as_a_plain_mailbox_admin(box, connect):
    db = box
    admin = make_role(db, "mailbox_admin")
    try:
        conn = connect()
        conn.execute(f'SET ROLE "{admin}"')
        n = Numberer.__new__(Numberer)
        n.db, n.conn, n.pid, n.error = db, conn, conn.info.backend_pid, None
        n.notices = Notices(conn)
        n.thread = threading.Thread(target=n._run, args=(30,), daemon=True)
        n.thread.start()
        wait_for(n._holds_lock, what="the admin's numberer to start")
        publish(db, "e", 3)
        wait_for(lambda: head(db) == 3, what="numbering by the admin's numberer")
        c = timed(connect)
        assert offsets(poll(c, "g", "c")) == [1, 2, 3]
        assert n.error is None and n.thread.is_alive()
        n.kill()
    finally:
        drop_role(db, admin)


def test_finding14_numberer_stopping_between_poll_and_commit_deadlocks_no_one(box, connect):
    db = box
    n = Numberer(connect, db, slot_rows=2)
    publish(db, "e", 4)
    wait_for(
        lambda: scalar(db, "SELECT count(*) FROM mailbox._lease WHERE group_name = 'g'") == 2,
        what="slots",
    )
    a, b = timed(connect, 5000, autocommit=False), timed(connect, 5000, autocommit=False)
    assert offsets(poll(a, "g", "a", batch=1)) == [1]  # splits slot 1..2
    assert offsets(poll(b, "g", "b", batch=1)) == [3]  # splits slot 3..4
    n.kill()  # its run ends (run_numberer(59) from pg_cron ends every minute)
    # without a numberer, commits of a group take turns on its row: the first one goes
    # through (the group row lock, FOR NO KEY UPDATE, does not conflict with the polls'
    # KEY SHARE), the second waits for the first's transaction -- and nobody deadlocks
    try:
        assert commit(a, "g", "a", 1) == 1
        second = Bg(lambda: commit(b, "g", "b", 3))
        assert wait_blocked(db, b, second)
        a.commit()
        assert second.result() == 1
        b.commit()
    finally:
        a.rollback()
        b.rollback()


def test_long_producer_and_idle_sessions_delay_only_their_own_rows_with_a_numberer(
    numberer, connect
):
    db = numberer.db
    bystander = connect(autocommit=False)
    bystander.execute("SELECT txid_current()")  # idle in transaction, never wrote to an outbox
    slow = connect(autocommit=False)
    publish(slow, "e", 1, tag="slow")  # its transaction stays open
    publish(db, "e", 3, tag="fast")
    wait_for(lambda: head(db) == 3, what="numbering past the open producer")
    c = timed(connect)
    got = poll(c, "g", "c", batch=100)
    assert [(o, p["tag"]) for o, p in got] == [(1, "fast"), (2, "fast"), (3, "fast")]
    assert commit(c, "g", "c", 3) == 3
    slow.commit()  # late: it still gets an offset, after the others
    wait_for(lambda: head(db) == 4, what="numbering of the late row")
    deadline = time.monotonic() + 5
    late = []
    while not late and time.monotonic() < deadline:
        late = poll(c, "g", "c")
    assert [(o, p["tag"]) for o, p in late] == [(4, "slow")]
    assert commit(c, "g", "c", 4) == 1
    bystander.rollback()


def test_park_unpark_after_retention_on_one_partition(db, connect):
    db.execute("SELECT mailbox.create_outbox('one', 0)")
    db.execute("SELECT mailbox.create_consumer_group('og', 'one', 'earliest')")
    publish(db, "one", 3)
    c = timed(connect)
    got = rows(c, "SELECT outbox_id, event_id, payload FROM mailbox.poll_outbox('og', 'c', 10)")
    assert [r[0] for r in got] == [1, 2, 3]
    c.execute("SELECT mailbox.outbox_park('og', 'c', 2, 'poison')")
    commit(c, "og", "c", 3)
    assert scalar(db, "SELECT mailbox.run_maintenance()->>'outbox_rows_drained'") == "3"
    assert rows(db, "SELECT outbox_id, reason FROM mailbox.outbox_parked") == [(2, "poison")]
    assert poll(c, "og", "c") == []
    c.execute("SELECT mailbox.outbox_unpark('og', 2)")
    again = rows(c, "SELECT outbox_id, event_id, payload FROM mailbox.poll_outbox('og', 'c', 10)")
    assert again == [got[1]]
    assert commit(c, "og", "c", 2) == 1
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_parked") == 0
    assert poll(c, "og", "c") == []


@finding(
    "finding 15: SPEC 2.2.4 holds only while a numberer runs, and nothing starts one "
    "(the relay and CLI do not call run_numberer yet): on a plain install an open poll "
    "transaction holds the outbox's sequencer and every other group stops receiving new rows",
)
def test_finding15_without_a_numberer_an_idle_poll_stalls_no_other_group(box, connect):
    db = box
    publish(db, "e", 2)
    idle = connect(autocommit=False)  # psycopg's default: poll, work, commit
    assert offsets(poll(idle, "g", "idle", batch=10)) == [1, 2]
    try:
        publish(db, "e", 3)  # committed while the consumer of g works
        h = timed(connect)
        assert offsets(poll(h, "h", "hc", batch=10)) == [1, 2, 3, 4, 5]
    finally:
        idle.rollback()


def test_a_parked_row_is_not_redelivered_after_a_crash_partitioned(db, connect):
    db.execute("SELECT mailbox.create_outbox('p', p_partitions => 4)")
    db.execute("SELECT mailbox.create_consumer_group('pg', 'p', 'earliest')")
    publish_keys(db, "p", ["a", "a", "a"])
    a = connect()
    assert [o for o, _, _ in ppoll(a, "pg", "a", visibility=1)] == [1, 2, 3]
    a.execute("SELECT mailbox.outbox_park('pg', 'a', 2, 'poison')")
    a.close()  # crashes before committing 1 and 3
    time.sleep(1.2)
    b = timed(connect)
    assert [o for o, _, _ in ppoll(b, "pg", "b")] == [1, 3]
    commit(b, "pg", "b", 3)  # returns 3, counting a's parked row 2: finding 12
    assert rows(db, "SELECT outbox_id FROM mailbox.outbox_parked") == [(2,)]
    assert scalar(db, "SELECT lag FROM mailbox.consumer_lag('pg')") == 0
