"""Numbering cost against backlog size (issue 8, deliverable 1).

A consumer that falls behind (an outage, a deploy) meets a backlog nobody has numbered; its
first poll (or consumer_lag) numbers all of it, holding the sequencer lock. This times that
first consumer_lag on a backlog no consumer has read, for backlogs of --small and --big rows
published three ways:

- txn1000: 1,000-row transactions (outbox_publish_batch), one producer;
- conc1:   1-row transactions from 8 concurrent producers (so windows see in-progress xids);
- one:     a single transaction of all the rows (one outbox_publish_batch);

with autovacuum on and off. Numbering is linear when big/small stays near big_rows/small_rows
(10 for the defaults); the target is at most 10x for 10x the rows.

Usage: python bench/numbering_bench.py [--dsn DSN] [--small 100000] [--big 1000000]
       [--repeat 3] [--quick]
Without --dsn a throwaway cluster is started (pg_mailbox.cluster) and removed afterwards.
Each cell is the median of --repeat rounds; rounds interleave the cells.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import psycopg

from pg_mailbox import api

PAYLOAD = "jsonb_build_object('order_id', g, 'amount', g * 10, 'customer', 'customer-' || g)"


def setup(db, autovacuum):
    db.execute("SELECT mailbox.drop_outbox('nb', true)")
    api.create_outbox(db, "nb", retention_hours=0)
    api.create_consumer_group(db, "nb_g", "nb", "earliest")
    db.execute(f"ALTER TABLE mailbox._outbox_log_nb SET (autovacuum_enabled = {autovacuum})")


def publish(dsn, pattern, rows):
    if pattern == "txn1000":
        with psycopg.connect(dsn, autocommit=True) as db:
            for start in range(1, rows + 1, 1000):
                db.execute(
                    f"SELECT count(*) FROM mailbox.outbox_publish_batch('nb', ARRAY("
                    f"SELECT {PAYLOAD} FROM generate_series(%s::int, %s::int) g))",
                    [start, min(start + 999, rows)],
                )
    elif pattern == "one":
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(
                f"SELECT count(*) FROM mailbox.outbox_publish_batch('nb', ARRAY("
                f"SELECT {PAYLOAD} FROM generate_series(1, %s::int) g))",
                [rows],
            )
    else:  # conc1: 8 producers, one row per transaction, pipelined to keep it fast
        per = rows // 8

        def produce(i):
            with psycopg.connect(dsn, autocommit=True) as conn, conn.pipeline() as pipeline:
                for n in range(per):
                    conn.execute(
                        "SELECT mailbox.outbox_publish('nb', jsonb_build_object('p', %s, 'n', %s))",
                        [i, n],
                    )
                    # a Sync after each statement ends its implicit transaction: without it the
                    # pipelined statements of one producer form one transaction
                    pipeline.sync()

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def number(dsn):
    """Seconds for the first consumer_lag on the unread backlog, and the lag it reports."""
    with psycopg.connect(dsn, autocommit=True) as db:
        started = time.perf_counter()
        lag = db.execute("SELECT lag FROM mailbox.consumer_lag('nb_g')").fetchone()[0]
        return time.perf_counter() - started, lag


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn")
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10k / 100k rows, one round")
    parser.add_argument(
        "--patterns", default="txn1000,conc1,one", help="comma-separated subset of the patterns"
    )
    args = parser.parse_args()
    if args.quick:
        args.small, args.big, args.repeat = 10_000, 100_000, 1

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
        cells = [
            (pattern, autovacuum, rows)
            for pattern in args.patterns.split(",")
            for autovacuum in ("off", "on")
            for rows in (args.small, args.big)
        ]
        times: dict[tuple, list[float]] = {c: [] for c in cells}
        for _ in range(args.repeat):
            for cell in cells:
                pattern, autovacuum, rows = cell
                with psycopg.connect(dsn, autocommit=True) as db:
                    setup(db, autovacuum)
                publish(dsn, pattern, rows)
                seconds, lag = number(dsn)
                assert lag == rows, f"{cell}: lag {lag}, expected {rows}"
                times[cell].append(seconds)
        print(
            f"{'publishing':<10} {'autovac':<8} {'rows':>9} {'seconds':>9}"
            f" {'us/row':>8} {'big/small':>10}"
        )
        for pattern, autovacuum, rows in cells:
            med = statistics.median(times[(pattern, autovacuum, rows)])
            ratio = ""
            if rows == args.big:
                ratio = f"{med / statistics.median(times[(pattern, autovacuum, args.small)]):.1f}x"
            print(
                f"{pattern:<10} {autovacuum:<8} {rows:>9} {med:>9.3f}"
                f" {med / rows * 1e6:>8.1f} {ratio:>10}"
            )
        print(
            f"(medians of {args.repeat} interleaved rounds;"
            f" target big/small <= {args.big // args.small}x)"
        )
    finally:
        if cluster is not None:
            cluster.destroy()


if __name__ == "__main__":
    main()
