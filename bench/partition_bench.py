"""Partitioned consumer groups: parallel drain and per-key order (issue 9, SPEC §2.3).

Publishes an unread backlog of --rows rows over --keys keys (1,000-row transactions) into an
outbox of --partitions partitions and into one of a single partition, numbers it (so the
timings are the consumers' alone), then drains it with a fresh 'earliest' group each time:

- work:    1, 2 and 4 consumers over the partitioned outbox, each spending --work-ms per
           message (one sleep per batch, so the threads do not hold the GIL);
- no work: 1 consumer over the partitioned outbox vs 1 consumer over the single-partition one;
- latency: an idle consumer (LISTEN, empty poll, woken by the notification) receiving a row
  committed by a producer, --samples times, without and with CALL mailbox.run_numberer()
  running (SPEC §2.2.4 moves numbering out of the poll; this is what that costs an idle
  consumer). Printed as p50/p95 milliseconds from the producer's commit to the row in hand.

Consumers are threads with a connection each, in psycopg's default mode (poll, work,
commit_offset, commit). Every drain checks per-key order (each key's rows must arrive in
offset order across the group's consumers) and that every row arrived; violations are
counted and printed. Each cell is the median of --repeat rounds; rounds interleave cells.

Usage: python bench/partition_bench.py [--dsn DSN] [--rows 100000] [--keys 500]
       [--partitions 16] [--batch 500] [--work-ms 0.2] [--repeat 1]
Without --dsn a throwaway cluster is started (pg_mailbox.cluster) and removed afterwards.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time

import psycopg

_group_ids = itertools.count(1)


def setup(dsn, name, partitions, rows, keys):
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SELECT mailbox.drop_outbox(%s, true)", [name])
        db.execute("SELECT mailbox.create_outbox(%s, 24, NULL, %s)", [name, partitions])
        for start in range(0, rows, 1000):
            db.execute(
                "SELECT count(mailbox.outbox_publish(%s, jsonb_build_object('n', g),"
                " '{}', 'key-' || (g %% %s)))"
                " FROM generate_series(%s::int, %s::int) AS g",
                [name, keys, start, min(start + 999, rows - 1)],
            )
        # number the backlog now: the drains below time the consumers only
        db.execute(
            "SELECT mailbox._sequence_all(o.outbox_key) FROM mailbox._outbox AS o"
            " WHERE outbox_name = %s",
            [name],
        )


def drain(dsn, outbox, consumers, batch, work_ms, rows):
    """Seconds to drain the outbox with a new group, and the per-key order violations."""
    group = f"pb_g{next(_group_ids)}"
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SELECT mailbox.create_consumer_group(%s, %s, 'earliest')", [group, outbox])
    lock = threading.Lock()
    received = []
    errors = []
    stop = threading.Event()

    def consume(i):
        try:
            with psycopg.connect(dsn) as conn:
                while not stop.is_set():
                    got = conn.execute(
                        "SELECT outbox_id, key FROM mailbox.poll_outbox(%s, %s, %s, 30)",
                        [group, f"c{i}", batch],
                    ).fetchall()
                    if not got:
                        conn.commit()
                        time.sleep(0.002)
                        continue
                    if work_ms:
                        time.sleep(work_ms / 1000 * len(got))
                    with lock:
                        received.extend(got)
                    conn.execute(
                        "SELECT mailbox.commit_offset(%s, %s, %s)", [group, f"c{i}", got[-1][0]]
                    )
                    conn.commit()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    while not stop.is_set():
        with lock:
            if len(received) >= rows:
                break
        time.sleep(0.005)
    seconds = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SELECT mailbox.drop_consumer_group(%s)", [group])
    violations = 0
    last = {}
    for offset, key in received:
        if last.get(key, 0) >= offset:
            violations += 1
        last[key] = offset
    missing = rows - len({o for o, _ in received})
    return seconds, violations, missing, len(received) - rows


def idle_latency(dsn, samples, numberer):
    """Milliseconds from a producer's commit to an idle consumer holding the row."""
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SELECT mailbox.drop_outbox('pb_lat', true)")
        db.execute("SELECT mailbox.create_outbox('pb_lat')")
        db.execute("SELECT mailbox.create_consumer_group('pb_lat_g', 'pb_lat', 'latest')")
    runner = None
    if numberer:
        runner = psycopg.connect(dsn, autocommit=True)
        thread = threading.Thread(
            target=lambda: _quiet(runner.execute, "CALL mailbox.run_numberer(3600)"), daemon=True
        )
        thread.start()
        with psycopg.connect(dsn, autocommit=True) as db:
            while not db.execute("SELECT mailbox._numberer_alive()").fetchone()[0]:
                time.sleep(0.01)
    out = []
    try:
        with (
            psycopg.connect(dsn, autocommit=True) as consumer,
            psycopg.connect(dsn, autocommit=True) as producer,
        ):
            consumer.execute("LISTEN mailbox_outbox_new")
            poll = "SELECT outbox_id FROM mailbox.poll_outbox('pb_lat_g', 'c', 10)"
            ack = "SELECT mailbox.commit_offset('pb_lat_g', 'c', %s)"

            def drained():
                got = consumer.execute(poll).fetchall()
                if got:
                    consumer.execute(ack, [got[-1][0]])
                return got

            for _ in range(samples):
                while drained():
                    pass  # the consumer is now idle and waiting
                list(consumer.notifies(timeout=0.001))  # drop stale wake-ups
                time.sleep(0.02)
                producer.execute("SELECT mailbox.outbox_publish('pb_lat', '{}')")
                t0 = time.perf_counter()  # autocommit: the statement has committed
                while True:
                    for _ in consumer.notifies(timeout=1, stop_after=1):
                        pass
                    got = consumer.execute(poll).fetchall()
                    if got:
                        break
                out.append((time.perf_counter() - t0) * 1000)
                consumer.execute(ack, [got[-1][0]])
    finally:
        if runner is not None:
            runner.cancel()
            runner.close()
    out.sort()
    return out[len(out) // 2], out[int(len(out) * 0.95)]


def _quiet(fn, *args):
    try:
        fn(*args)
    except psycopg.Error:
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="database with pg_mailbox (default: throwaway cluster)")
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--work-ms", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--samples", type=int, default=200, help="latency samples per cell")
    args = parser.parse_args()
    cluster = None
    dsn = args.dsn
    if dsn is None:
        from pg_mailbox.cluster import Cluster

        cluster = Cluster()
        cluster.init()
        cluster.start()
        dsn = cluster.dsn("postgres")
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_mailbox CASCADE")
    try:
        setup(dsn, "pb_parts", args.partitions, args.rows, args.keys)
        setup(dsn, "pb_one", 1, args.rows, args.keys)
        cells = [("pb_parts", n, args.work_ms) for n in (1, 2, 4)]
        cells += [("pb_parts", 1, 0.0), ("pb_one", 1, 0.0)]
        times = {c: [] for c in cells}
        violations = {c: 0 for c in cells}
        problems = []
        for _ in range(args.repeat):
            for cell in cells:
                outbox, consumers, work = cell
                seconds, bad, missing, extra = drain(
                    dsn, outbox, consumers, args.batch, work, args.rows
                )
                times[cell].append(seconds)
                violations[cell] += bad
                if missing or extra:
                    problems.append(f"{cell}: {missing} rows missing, {extra} delivered twice")
        print(
            f"{args.rows} rows, {args.keys} keys, batch {args.batch};"
            f" medians of {args.repeat} interleaved round(s)"
        )
        print(
            f"{'outbox':<22} {'consumers':>9} {'work ms':>8} {'seconds':>8} {'rows/s':>9}"
            f" {'ratio':>7} {'order violations':>17}"
        )
        base_work = statistics.median(times[("pb_parts", 1, args.work_ms)])
        base_none = statistics.median(times[("pb_one", 1, 0.0)])
        for cell in cells:
            outbox, consumers, work = cell
            med = statistics.median(times[cell])
            label = f"{args.partitions} partitions" if outbox == "pb_parts" else "1 partition"
            if work:
                ratio = f"{base_work / med:.2f}x"
            else:
                ratio = f"{base_none / med:.2f}x"
            print(
                f"{label:<22} {consumers:>9} {work:>8} {med:>8.2f} {args.rows / med:>9.0f}"
                f" {ratio:>7} {violations[cell]:>17}"
            )
        print(
            "ratio: with work, against 1 consumer over the partitions (targets 2: >= 1.7x,"
            " 4: >= 2.5x); without work, against 1 consumer over 1 partition (target >= 0.9x)"
        )
        for p in problems:
            print("PROBLEM:", p)
        print()
        print("idle consumer, commit to row in hand (ms):")
        print(f"{'numbering':<24} {'p50':>6} {'p95':>6}")
        for label, numberer in (("inline (no numberer)", False), ("run_numberer", True)):
            p50, p95 = idle_latency(dsn, args.samples, numberer)
            print(f"{label:<24} {p50:>6.2f} {p95:>6.2f}")
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    main()
