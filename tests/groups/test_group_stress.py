"""Bounded stress run: 4 producers with random commit delays, 4 consumers that crash and
restart under their own ids, 3 groups."""

import collections
import random
import threading
import time

import pytest
from groups import commit

PRODUCERS, CONSUMERS, GROUPS, ROWS = 4, 4, ("g1", "g2", "g3"), 50000
CRASH_RATE = 0.03


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_group_processes_every_row_exactly_once_across_restarts(db, connect):
    db.execute("SELECT mailbox.create_outbox('e')")
    for g in GROUPS:
        db.execute("SELECT mailbox.create_consumer_group(%s, 'e', 'earliest')", [g])
    per_producer = ROWS // PRODUCERS
    produced = threading.Event()
    seen = {g: collections.Counter() for g in GROUPS}
    lock = threading.Lock()
    errors = []
    restarts = [0]

    def produce(p):
        try:
            rnd = random.Random(p)
            conn = connect(autocommit=False)
            n = 0
            while n < per_producer:
                size = min(rnd.randint(1, 60), per_producer - n)
                conn.execute(
                    "SELECT count(*) FROM mailbox.outbox_publish_batch('e', ARRAY("
                    " SELECT jsonb_build_object('p', %s::int, 'n', g)"
                    " FROM generate_series(%s::int, %s::int) g))",
                    [p, n, n + size - 1],
                )
                time.sleep(rnd.random() * 0.01)  # commit late, out of order with the others
                conn.commit()
                n += size
        except Exception as exc:
            errors.append(exc)

    def consume(c):
        # Each consumer crashes now and then: it drops a polled batch unprocessed and
        # restarts on a new connection under the SAME id (a pod keeps its name). An
        # incarnation processes a row when it receives it; its commit must acknowledge
        # exactly the rows it received and has not acknowledged yet, never a predecessor's.
        try:
            rnd = random.Random(100 + c)
            consumer = f"c{c}"
            conn = connect()
            pending = {g: {} for g in GROUPS}  # this incarnation's unacknowledged rows
            idle_rounds = 0
            while idle_rounds < 20:
                got_any = False
                for g in GROUPS:
                    batch = conn.execute(
                        "SELECT outbox_id, payload FROM mailbox.poll_outbox(%s, %s, 200, 300)",
                        [g, consumer],
                    ).fetchall()
                    if not batch:
                        continue
                    got_any = True
                    if rnd.random() < CRASH_RATE:
                        conn.close()  # crash: the lease stays live, nothing is committed
                        conn = connect()
                        pending = {g: {} for g in GROUPS}
                        with lock:
                            restarts[0] += 1
                        break
                    pending[g].update((r[0], (r[1]["p"], r[1]["n"])) for r in batch)
                    last = batch[-1][0]
                    acked = commit(conn, g, consumer, last)
                    mine = [o for o in pending[g] if o <= last]
                    if acked != len(mine):
                        errors.append(
                            f"{consumer} committed {last} in {g}: acknowledged {acked} rows,"
                            f" received {len(mine)}"
                        )
                    with lock:
                        seen[g].update(pending[g].pop(o) for o in mine)
                idle_rounds = 0 if got_any or not produced.is_set() else idle_rounds + 1
                if not got_any:
                    time.sleep(0.02)
        except Exception as exc:
            errors.append(exc)

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(PRODUCERS)]
    consumers = [threading.Thread(target=consume, args=(c,)) for c in range(CONSUMERS)]
    started = time.monotonic()
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join()
    produced.set()
    for t in consumers:
        t.join()
    assert not errors, errors[:5]
    assert restarts[0] >= 5, "the run must include same-id restarts"
    expected = {(p, n) for p in range(PRODUCERS) for n in range(per_producer)}
    for g in GROUPS:
        # processed = received by an incarnation that then committed past it
        assert set(seen[g]) == expected, f"group {g}: {len(expected - set(seen[g]))} rows lost"
        assert max(seen[g].values()) == 1, f"group {g} processed rows twice (no lease expired)"
    lag = db.execute(
        "SELECT group_name, group_offset, lag FROM mailbox.consumer_group_lag ORDER BY 1"
    ).fetchall()
    assert lag == [(g, ROWS, 0) for g in GROUPS]
    print(
        f"stress: {ROWS} rows x {len(GROUPS)} groups, {restarts[0]} restarts,"
        f" in {time.monotonic() - started:.1f}s"
    )
