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
            lambda: not scalar(
                self.db, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [self.pid]
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


# ============================================================ findings (pinned bugs)


@pytest.mark.xfail(
    strict=True,
    reason="finding 1: run_numberer keeps its session advisory lock after an error "
    "(cancel, statement_timeout, CALL inside a transaction block): polls then believe a "
    "numberer runs, never number inline, and delivery stops for every outbox",
)
def test_finding1_a_numberer_that_errors_out_must_not_stall_delivery(box, connect):
    db = box
    # psycopg's default (non-autocommit) mode: CALL runs inside a transaction block, so the
    # procedure's first COMMIT fails (2D000) -- after it took its session-level lock
    admin = connect(autocommit=False)
    with raises("2D000"):
        admin.execute("CALL mailbox.run_numberer(5)")
    admin.rollback()
    # the session lives on (a pooled connection, a relay that logs and retries later)
    publish(db, "e", 3)
    c = timed(connect)
    assert offsets(poll(c, "g", "c")) == [1, 2, 3]


@pytest.mark.xfail(
    strict=True,
    reason="finding 1b: a numberer cancelled (pg_cancel_backend / statement_timeout) keeps "
    "the lock in its session; polls stop numbering inline",
)
def test_finding1b_a_cancelled_numberer_must_not_stall_delivery(box, connect):
    db = box
    n = Numberer(connect, db)
    n.conn.cancel()  # what G's own test fixture does to stop it
    n.thread.join(10)
    assert not n.thread.is_alive()
    publish(db, "e", 3)
    c = timed(connect)
    assert offsets(poll(c, "g", "c")) == [1, 2, 3]


@pytest.mark.xfail(
    strict=True,
    reason="finding 2: numberer liveness is a plain advisory lock (7168634, 0) that any role "
    "able to connect may take: a role with no pg_mailbox privilege stops all delivery",
)
def test_finding2_a_role_without_privileges_cannot_fake_a_numberer(box, connect):
    db = box
    nobody = make_role(db)  # no mailbox role at all
    try:
        attacker = connect()
        attacker.execute(f'SET ROLE "{nobody}"')
        attacker.execute("SELECT pg_advisory_lock(7168634, 0)")
        publish(db, "e", 3)
        c = timed(connect)
        assert offsets(poll(c, "g", "c")) == [1, 2, 3]
    finally:
        attacker.close()
        drop_role(db, nobody)


@pytest.mark.xfail(
    strict=True,
    reason="finding 3: with the default consumer_slot_rows (100) an idle poll transaction "
    "with a batch smaller than a slot hides the slot's remainder (rows not leased to it) "
    "from the other consumers of its group until it ends (SPEC 2.2.4)",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="finding 4: seek_offset numbers inline (_sequence_all) even while a numberer runs "
    "and then waits for an idle consumer's locked lease: the outbox's sequencer row stays "
    "locked, so numbering stops for every group of the outbox (SPEC 2.2.4)",
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
    assert offsets(poll(idle, "g", "idle", batch=3)) == [2, 3, 4]
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


@pytest.mark.xfail(
    strict=True,
    reason="finding 5: create_consumer_group(..., 'latest') reads a stale head when the "
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
    got = c.execute(
        "SELECT payload->>'tag' FROM mailbox.poll_outbox('late', 'c', 100)"
    ).fetchall()
    assert [r[0] for r in got] == ["after"]


@pytest.mark.xfail(
    strict=True,
    reason="finding 6: consumer_status.in_flight and consumer_group_lag.in_flight/group_offset "
    "ignore partition leases: a partitioned consumer holding rows shows 0 in flight and the "
    "views disagree with consumer_lag()",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="finding 7: on an unpartitioned outbox outbox_park does not acknowledge the row: "
    "after the parking consumer crashes its lease expires and the parked row is delivered "
    "again to another consumer (SPEC 2.3: park acknowledges the row for this group)",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="finding 8: the p_partitions HINT does not name the argument (every other "
    "argument check's HINT does: 'Pass p_batch_size from 1 to ...'); NULL gives 22023 where "
    "every other NULL argument gives 22004",
)
def test_finding8_p_partitions_errors_name_the_argument(db):
    for bad in (0, 257, -1):
        with raises("22023") as info:
            db.execute("SELECT mailbox.create_outbox('bad', p_partitions => %s)", [bad])
        assert "p_partitions" in (info.value.diag.message_hint or "")
    with raises("22004"):
        db.execute("SELECT mailbox.create_outbox('bad', p_partitions => NULL)")


@pytest.mark.xfail(
    strict=True,
    reason="finding 9: mailbox.outbox_parked (SELECT granted to mailbox_consumer) lists the "
    "parked rows -- event ids and free-text reasons -- of outboxes with per-object grants "
    "to everybody, also to consumers without a consume grant",
)
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
