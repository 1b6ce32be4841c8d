"""Bounded stress run: 4 producers with random commit delays, 4 consumers, 3 groups."""

import collections
import random
import threading
import time

import pytest
from groups import commit

PRODUCERS, CONSUMERS, GROUPS, ROWS = 4, 4, ("g1", "g2", "g3"), 50000


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_group_sees_every_row_exactly_once(db, connect):
    db.execute("SELECT mailbox.create_outbox('e')")
    for g in GROUPS:
        db.execute("SELECT mailbox.create_consumer_group(%s, 'e', 'earliest')", [g])
    per_producer = ROWS // PRODUCERS
    produced = threading.Event()
    seen = {g: collections.Counter() for g in GROUPS}
    lock = threading.Lock()
    errors = []

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
        try:
            conn = connect()
            idle_rounds = 0
            while idle_rounds < 20:
                got_any = False
                for g in GROUPS:
                    batch = conn.execute(
                        "SELECT outbox_id, payload FROM mailbox.poll_outbox(%s, %s, 200, 300)",
                        [g, f"c{c}"],
                    ).fetchall()
                    if batch:
                        got_any = True
                        with lock:
                            seen[g].update((r[1]["p"], r[1]["n"]) for r in batch)
                        commit(conn, g, f"c{c}", batch[-1][0])
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
    assert not errors, errors
    expected = {(p, n) for p in range(PRODUCERS) for n in range(per_producer)}
    for g in GROUPS:
        assert set(seen[g]) == expected, f"group {g} missed rows"
        assert max(seen[g].values()) == 1, f"group {g} got duplicates without any lease expiring"
    lag = db.execute(
        "SELECT group_name, group_offset, lag FROM mailbox.consumer_group_lag ORDER BY 1"
    ).fetchall()
    assert lag == [(g, ROWS, 0) for g in GROUPS]
    print(f"stress: {ROWS} rows x {len(GROUPS)} groups in {time.monotonic() - started:.1f}s")
