"""SPEC §2.3: per-key order with parallel consumers (partitioned outboxes), on a real
PostgreSQL with deliberate interleavings."""

import threading
import time
from collections import defaultdict

import pytest
from groups import Notices, Numberer, commit, holders, ppoll, produce_keyed, wait_for
from mbx import raises, rows, scalar


def publish_key_rows(conn, outbox, keys):
    """One row per key, each with its key set (outbox_publish(p_outbox, payload, headers, key))."""
    for k in keys:
        conn.execute("SELECT mailbox.outbox_publish(%s, '{}', '{}', %s)", [outbox, k])


def partition_of(db, key, parts):
    return scalar(db, "SELECT (abs(hashtext(coalesce(%s, ''))::bigint) %% %s)::int", [key, parts])


def test_p_partitions_is_checked_and_recorded(db):
    for bad in (0, 257):
        with raises("22023"):
            db.execute("SELECT mailbox.create_outbox('bad', 24, NULL, %s)", [bad])
    with raises("22004"):  # NULL, as for every other argument
        db.execute("SELECT mailbox.create_outbox('bad', 24, NULL, %s)", [None])
    db.execute("SELECT mailbox.create_outbox('p4', p_partitions => 4)")
    db.execute("SELECT mailbox.create_outbox('p1')")
    db.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    db.execute("SELECT mailbox.enable_outbox('public.t', p_partitions => 8)")
    got = dict(
        rows(
            db,
            "SELECT o.outbox_name, mailbox._outbox_partitions(o.outbox_key)"
            " FROM mailbox._outbox AS o",
        )
    )
    assert got["p4"] == 4 and got["p1"] == 1 and sorted(got.values()) == [1, 4, 8]


def test_partition_column_follows_the_key(db, connect):
    db.execute("SELECT mailbox.create_outbox('e', p_partitions => 16)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    keys = [f"k{i}" for i in range(50)] + [None]
    for k in keys:
        db.execute("SELECT mailbox.outbox_publish('e', '{}', '{}', %s)", [k])
    got = ppoll(connect(), "g", "c", batch=1000)
    assert [r[0] for r in got] == list(range(1, 52))
    for _, key, part in got:
        assert part == partition_of(db, key, 16)
    # one partition: partition 0 always
    db.execute("SELECT mailbox.create_outbox('one')")
    db.execute("SELECT mailbox.create_consumer_group('g1', 'one', 'earliest')")
    db.execute("SELECT mailbox.outbox_publish('one', '{}', '{}', 'x')")
    assert [r[2] for r in ppoll(connect(), "g1", "c")] == [0]


@pytest.fixture
def pbox(db):
    db.execute("SELECT mailbox.create_outbox('e', p_partitions => 16)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('h', 'e', 'earliest')")
    return db


def test_four_consumers_sixteen_partitions_per_key_order_exactly_once(pbox, connect):
    """20,000 rows over 500 keys from 4 producers with random commit delays; 4 consumers
    per group. Every key's rows arrive in offset order in every group, each row once."""
    db = pbox
    numberer = Numberer(connect)
    try:
        wait_for(lambda: scalar(db, "SELECT mailbox._numberer_alive()"), what="numberer")
        total = 20000
        keys = [f"key-{i}" for i in range(500)]
        errors = []
        received = {"g": [], "h": []}
        lock = threading.Lock()
        stop = threading.Event()

        def consume(group, name):
            conn = connect(autocommit=False)
            try:
                while not stop.is_set():
                    got = ppoll(conn, group, name, batch=200)
                    if not got:
                        conn.commit()
                        time.sleep(0.005)
                        continue
                    with lock:
                        received[group].extend((o, k) for o, k, _ in got)
                    commit(conn, group, name, got[-1][0])
                    conn.commit()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [
            threading.Thread(target=produce_keyed, args=(connect, i, keys, total // 4, errors))
            for i in range(4)
        ]
        for group in ("g", "h"):
            threads += [
                threading.Thread(target=consume, args=(group, f"{group}{i}")) for i in range(4)
            ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not errors:
            with lock:
                if all(len(v) >= total for v in received.values()):
                    break
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, errors
        for group, got in received.items():
            offsets = [o for o, _ in got]
            assert sorted(offsets) == list(range(1, total + 1)), (
                f"{group}: not every row exactly once"
            )
            last = {}
            for o, k in got:  # receive order, across the group's consumers
                assert last.get(k, 0) < o, f"{group}: key {k} row {o} after {last.get(k)}"
                last[k] = o
            assert len(last) > 400
        assert rows(db, "SELECT group_offset, lag FROM mailbox.consumer_lag('g') LIMIT 1") == [
            (total, 0)
        ]
    finally:
        numberer.stop()


def test_killed_holder_partition_is_taken_over_in_order(pbox, connect):
    """A consumer holding partition p is killed mid-batch; after its lease another consumer
    takes p over and its first rows of p are the unacknowledged ones, in order."""
    db = pbox
    keys = [f"k{i}" for i in range(40)]
    publish_key_rows(db, "e", keys * 3)  # 120 rows, every key three times
    a = connect(autocommit=False)
    got_a = ppoll(a, "g", "a", batch=30, visibility=1)
    a.commit()  # leases committed; a works on them ...
    by_part = defaultdict(list)
    for o, _, p in got_a:
        by_part[p].append(o)
    acked = got_a[9][0]
    assert commit(a, "g", "a", acked) == 10  # acknowledges its first ten rows
    a.commit()
    a_pid = a.info.backend_pid
    db.execute("SELECT pg_terminate_backend(%s)", [a_pid])  # ... and is killed mid-batch
    time.sleep(1.2)
    b = connect()
    got_b = ppoll(b, "g", "b", batch=1000, visibility=1)  # a (silent for 1.2 s) is not live
    # b holds every partition now; for each partition a held, b's first rows of it are the
    # ones a did not acknowledge, in offset order, before any later row of those keys
    assert [o for o, _, _ in got_b] == list(range(acked + 1, 121))
    per_part_b = defaultdict(list)
    for o, _, p in got_b:
        per_part_b[p].append(o)
    for p, offs in by_part.items():
        pending = [o for o in offs if o > acked]
        assert per_part_b[p][: len(pending)] == pending
    assert commit(b, "g", "b", 120) == 120 - acked


def test_stale_holder_commit_on_a_moved_partition_acknowledges_nothing(pbox, connect):
    db = pbox
    publish_key_rows(db, "e", [f"k{i}" for i in range(20)])
    a = connect()
    notices = Notices(a)
    got_a = ppoll(a, "g", "a", batch=100, visibility=1)
    assert len(got_a) == 20
    time.sleep(1.2)
    b = connect()
    got_b = ppoll(b, "g", "b", batch=100, visibility=1)
    assert [r[0] for r in got_b] == [r[0] for r in got_a]  # all moved to b, from the start
    assert commit(a, "g", "a", 20) == 0
    assert any(w.startswith("lease lost") for w in notices.warnings())
    assert commit(b, "g", "b", 20) == 20
    assert scalar(db, "SELECT group_offset FROM mailbox.consumer_lag('g') LIMIT 1") == 20


def test_rebalance_while_rows_flow(pbox, connect):
    """Consumers join and one goes silent while rows flow: no partition is ever held by two
    live consumers (one holder column), and none stays unassigned longer than the
    visibility timeout while a consumer polls."""
    db = pbox
    vis = 2
    stop = threading.Event()
    errors = []
    samples = []

    def produce():
        conn = connect()
        try:
            i = 0
            while not stop.is_set():
                publish_key_rows(conn, "e", [f"k{(i * 7 + j) % 100}" for j in range(5)])
                i += 1
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def consume(name, until):
        conn = connect()
        try:
            while not stop.is_set() and time.monotonic() < until:
                got = ppoll(conn, "g", name, batch=50, visibility=vis)
                if got:
                    commit(conn, "g", name, got[-1][0])
                time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t0 = time.monotonic()
    threads = [threading.Thread(target=produce)]
    threads.append(threading.Thread(target=consume, args=("c1", t0 + 12)))
    threads.append(threading.Thread(target=consume, args=("c2", t0 + 4)))  # goes silent at 4 s
    for t in threads:
        t.start()
    time.sleep(1.5)
    late = threading.Thread(target=consume, args=("c3", t0 + 12))  # joins at 1.5 s
    late.start()
    threads.append(late)
    unassigned_since = {}
    while time.monotonic() < t0 + 11:
        now = time.monotonic()
        h = holders(db)
        samples.append(h)
        for p in range(16):
            if p in h:
                unassigned_since.pop(p, None)
            else:
                unassigned_since.setdefault(p, now)
                assert now - unassigned_since[p] < vis + 1.5, f"partition {p} unassigned too long"
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    # after c2 went silent, c1 and c3 share all 16 partitions
    final = samples[-1]
    assert sorted(final) == list(range(16))
    assert set(final.values()) == {"c1", "c3"}
    counts = defaultdict(int)
    for c in final.values():
        counts[c] += 1
    assert sorted(counts.values()) == [8, 8]
    # while three were live, each held its share at some point
    assert any(len(set(s.values())) == 3 for s in samples)
    status = dict(
        rows(
            db,
            "SELECT consumer_id, cardinality(partitions) FROM mailbox.consumer_status"
            " WHERE group_name = 'g'",
        )
    )
    assert status["c1"] + status["c3"] == 16


def test_park_and_unpark(pbox, connect):
    db = pbox
    poison = "poison"
    p = partition_of(db, poison, 16)
    other_same_part = next(
        k for k in (f"x{i}" for i in range(1000)) if partition_of(db, k, 16) == p and k != poison
    )
    publish_key_rows(db, "e", [poison, other_same_part, poison, "zz"])
    c = connect()
    got = ppoll(c, "g", "c")
    assert [r[1] for r in got] == [poison, other_same_part, poison, "zz"]
    # the relay cannot process row 1: it parks it, processes the rest, commits
    c.execute("SELECT mailbox.outbox_park('g', 'c', 1, 'bad payload')")
    assert rows(db, 'SELECT "group", outbox_id, partition, reason FROM mailbox.outbox_parked') == [
        ("g", 1, p, "bad payload")
    ]
    # the park acknowledged row 1; the commit counts the 3 rows it acknowledges (finding 12)
    assert commit(c, "g", "c", 4) == 3
    assert ppoll(c, "g", "c") == []
    # a crash between park and commit: the parked row is not delivered again
    publish_key_rows(db, "e", [poison])
    got = ppoll(c, "g", "c", visibility=1)
    assert [r[0] for r in got] == [5]
    c.execute("SELECT mailbox.outbox_park('g', 'c', 5, 'again')")
    time.sleep(1.2)
    d = connect()  # polls with visibility 1, so c (silent for 1.2 s) no longer counts
    assert ppoll(d, "g", "d", visibility=1) == []  # 5 parked: nothing else is pending
    assert (
        scalar(db, "SELECT group_offset FROM mailbox.consumer_lag('g') WHERE consumer_id = 'd'")
        == 5
    )
    # unpark: delivered again (to the holder of its partition), acknowledged by its commit
    db.execute("SELECT mailbox.outbox_unpark('g', 1)")
    assert rows(db, "SELECT outbox_id FROM mailbox.outbox_parked") == [(5,)]
    again = ppoll(d, "g", "d", visibility=1)
    assert [(r[0], r[1], r[2]) for r in again] == [(1, poison, p)]
    assert commit(d, "g", "d", 1) == 1
    assert ppoll(d, "g", "d", visibility=1) == []
    with raises("42704"):
        db.execute("SELECT mailbox.outbox_unpark('g', 1)")
    with raises("55000"):
        db.execute("SELECT mailbox.outbox_park('g', 'd', 2, 'not leased')")
    # the other group never saw any of this
    assert [r[0] for r in ppoll(connect(), "h", "x")] == [1, 2, 3, 4, 5]


def test_idle_in_transaction_holder_of_one_partition_delays_no_other(db, connect):
    db.execute("SELECT mailbox.create_outbox('e', p_partitions => 2)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    numberer = Numberer(connect)
    try:
        wait_for(lambda: scalar(db, "SELECT mailbox._numberer_alive()"), what="numberer")
        k0 = next(k for k in (f"a{i}" for i in range(100)) if partition_of(db, k, 2) == 0)
        k1 = next(k for k in (f"b{i}" for i in range(100)) if partition_of(db, k, 2) == 1)
        # two consumers, one partition each
        a, b = connect(autocommit=False), connect()
        b.execute("SET statement_timeout = 3000")
        ppoll(b, "g", "b")  # alone: takes both
        ppoll(a, "g", "a")  # joins: gets none yet
        a.commit()
        ppoll(b, "g", "b")  # gives one up
        ppoll(a, "g", "a")
        a.commit()
        h = holders(db)
        assert sorted(h.values()) == ["a", "b"], h
        pa = next(p for p, c in h.items() if c == "a")
        ka, kb = (k0, k1) if pa == 0 else (k1, k0)
        publish_key_rows(db, "e", [ka, kb])
        wait_for(
            lambda: (
                scalar(db, "SELECT head_offset FROM mailbox._outbox WHERE outbox_name = 'e'") == 2
            )
        )
        got_a = ppoll(a, "g", "a")
        assert [r[1] for r in got_a] == [ka]
        # a now idles in its poll transaction; b's partition keeps flowing
        for i in range(3):
            publish_key_rows(db, "e", [kb, ka])
            wait_for(
                lambda: (
                    scalar(db, "SELECT head_offset FROM mailbox._outbox WHERE outbox_name = 'e'")
                    == 4 + 2 * i  # noqa: B023 - called within the iteration
                )
            )
            got_b = ppoll(b, "g", "b")
            assert [r[1] for r in got_b] == [kb] * (2 if i == 0 else 1)
            assert commit(b, "g", "b", got_b[-1][0]) == len(got_b)
        # a finishes: its rows were only delayed, and come in order
        assert commit(a, "g", "a", got_a[-1][0]) == 1
        a.commit()
        rest = ppoll(a, "g", "a")
        assert [r[1] for r in rest] == [ka, ka, ka]
        assert [r[0] for r in rest] == sorted(r[0] for r in rest)
    finally:
        numberer.stop()
