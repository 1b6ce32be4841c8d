"""Outbox and consumer-group benchmark (issue: consumer groups).

Everything runs against one server in one invocation, so every number is read as a ratio
to a baseline measured minutes apart on the same machine:

Every drain returns the payload as text (what a relay forwards), so no system pays for
client-side JSON parsing that another does not.

- drain: poll_outbox + commit_offset (batch 100 / 1000, 1 / 2 / 4 consumers of one group)
  versus a raw DELETE ... RETURNING loop (the floor), a SKIP LOCKED + batched UPDATE outbox,
  and PgQ (insert_event / ticker / next_batch / get_batch_events / finish_batch);
- poll_outbox latency at a 10K and a 1M backlog, consumer_lag at 1M rows;
- retention: table + index size before and after draining the 1M rows;
- producer: pgbench, 8 clients, a transaction that inserts an order and (a) inserts an event
  into a plain table, (b) calls outbox_publish, (c) writes a captured table; with NOTIFY on/off;
- idle latency: commit -> LISTENing consumer's poll returns.

Usage: python bench/outbox_bench.py [--dsn DSN] [--rows 100000] [--big 1000000] [--repeat 3]
       [--pgbench-seconds 15] [--quick]
Without --dsn a throwaway cluster is started (pg_mailbox.cluster) and removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time

import psycopg

PAYLOAD = "jsonb_build_object('order_id', g, 'amount', g * 10, 'customer', 'customer-' || g)"


def connect(dsn, autocommit=True):
    return psycopg.connect(dsn, autocommit=autocommit)


def run_threads(n, target):
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


# ---------------------------------------------------------------- drain: pg_mailbox
def mailbox_drain(dsn, rows, batch, consumers):
    with connect(dsn) as db:
        db.execute("SELECT mailbox.drop_outbox('bench', true)")
        db.execute("SELECT mailbox.create_outbox('bench', 0)")
        db.execute("SELECT mailbox.create_consumer_group('bench_g', 'bench', 'earliest')")
        for start in range(1, rows + 1, 50000):
            db.execute(
                f"SELECT count(*) FROM mailbox.outbox_publish_batch('bench', ARRAY("
                f"SELECT {PAYLOAD} FROM generate_series(%s::int, %s::int) g))",
                [start, min(start + 49999, rows)],
            )
        # number the backlog first, as a running relay would have while rows arrived
        db.execute("SELECT * FROM mailbox.consumer_lag('bench_g')")
    counts = [0] * consumers

    def consume(i):
        with connect(dsn, autocommit=False) as conn:
            last = None
            while True:
                # the relay pattern: acknowledge the previous batch and lease the next one in
                # one transaction and, with psycopg's pipeline mode, one network round trip
                with conn.pipeline():
                    if last is not None:
                        conn.execute(
                            "SELECT mailbox.commit_offset('bench_g', %s, %s)", [f"c{i}", last]
                        )
                    cur = conn.execute(
                        "SELECT outbox_id, payload::text"
                        " FROM mailbox.poll_outbox('bench_g', %s, %s, 60)",
                        [f"c{i}", batch],
                    )
                    conn.commit()
                got = cur.fetchall()
                if not got:
                    if last is None:
                        return
                    last = None
                    continue
                counts[i] += len(got)
                last = got[-1][0]

    elapsed = run_threads(consumers, consume)
    assert sum(counts) == rows, (sum(counts), rows)
    return rows / elapsed


# ---------------------------------------------------------------- drain: baselines
def plain_queue_setup(db, table, rows, with_processed):
    extra = ", processed_at timestamptz" if with_processed else ""
    db.execute(f"DROP TABLE IF EXISTS {table}")
    db.execute(
        f"CREATE TABLE {table} (id bigserial PRIMARY KEY, created_at timestamptz DEFAULT now(),"
        f" payload jsonb NOT NULL{extra})"
    )
    if with_processed:
        db.execute(f"CREATE INDEX ON {table} (id) WHERE processed_at IS NULL")
    db.execute(
        f"INSERT INTO {table} (payload) SELECT {PAYLOAD} FROM generate_series(1, %s) g", [rows]
    )
    db.execute(f"VACUUM ANALYZE {table}")


def sql_drain(dsn, rows, batch, consumers, setup, statement):
    with connect(dsn) as db:
        setup(db)
    counts = [0] * consumers

    def consume(i):
        with connect(dsn) as conn:
            while True:
                got = conn.execute(statement, [batch]).fetchall()
                if not got:
                    return
                counts[i] += len(got)

    elapsed = run_threads(consumers, consume)
    assert sum(counts) == rows, (sum(counts), rows)
    return rows / elapsed


def delete_floor(dsn, rows, batch, consumers):
    return sql_drain(
        dsn,
        rows,
        batch,
        consumers,
        lambda db: plain_queue_setup(db, "bench_floor", rows, False),
        "DELETE FROM bench_floor WHERE id IN (SELECT id FROM bench_floor ORDER BY id LIMIT %s"
        " FOR UPDATE SKIP LOCKED) RETURNING id, payload::text",
    )


def skip_locked_outbox(dsn, rows, batch, consumers):
    return sql_drain(
        dsn,
        rows,
        batch,
        consumers,
        lambda db: plain_queue_setup(db, "bench_skip", rows, True),
        "UPDATE bench_skip SET processed_at = now() WHERE id IN (SELECT id FROM bench_skip"
        " WHERE processed_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
        " RETURNING id, payload::text",
    )


def pgq_drain(dsn, rows, batch, consumers):
    """PgQ with ticks every `batch` events: one consumer (PgQ has no competing consumers)."""
    with connect(dsn) as db:
        db.execute("CREATE EXTENSION IF NOT EXISTS pgq")
        db.execute(
            "SELECT pgq.unregister_consumer('bench_q', 'c')"
            " WHERE EXISTS (SELECT 1 FROM pgq.queue WHERE queue_name = 'bench_q')"
        )
        db.execute(
            "SELECT pgq.drop_queue('bench_q')"
            " WHERE EXISTS (SELECT 1 FROM pgq.queue WHERE queue_name = 'bench_q')"
        )
        db.execute("SELECT pgq.create_queue('bench_q')")
        db.execute("SELECT pgq.set_queue_config('bench_q', 'ticker_max_lag', '0')")
        db.execute("SELECT pgq.register_consumer('bench_q', 'c')")
        for start in range(1, rows + 1, batch):
            db.execute(
                f"SELECT count(pgq.insert_event('bench_q', 'e', ({PAYLOAD})::text))"
                f" FROM generate_series(%s::int, %s::int) g",
                [start, min(start + batch - 1, rows)],
            )
            db.execute("SELECT pgq.ticker('bench_q')")
    done = 0
    started = time.perf_counter()
    with connect(dsn, autocommit=False) as conn:
        while True:
            batch_id = conn.execute("SELECT pgq.next_batch('bench_q', 'c')").fetchone()[0]
            if batch_id is None:
                conn.commit()
                break
            got = conn.execute(
                "SELECT ev_id, ev_data FROM pgq.get_batch_events(%s)", [batch_id]
            ).fetchall()
            conn.execute("SELECT pgq.finish_batch(%s)", [batch_id])
            conn.commit()
            done += len(got)
    elapsed = time.perf_counter() - started
    assert done == rows, (done, rows)
    return rows / elapsed


# ---------------------------------------------------------------- latency and lag
def percentiles(samples):
    samples = sorted(samples)
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def backlog(dsn, rows):
    with connect(dsn) as db:
        db.execute("SELECT mailbox.drop_outbox('lat', true)")
        db.execute("SELECT mailbox.create_outbox('lat', 0)")
        db.execute("SELECT mailbox.create_consumer_group('lat_g', 'lat', 'earliest')")
        for start in range(1, rows + 1, 100000):
            db.execute(
                f"SELECT count(*) FROM mailbox.outbox_publish_batch('lat', ARRAY("
                f"SELECT {PAYLOAD} FROM generate_series(%s::int, %s::int) g))",
                [start, min(start + 99999, rows)],
            )
        db.execute(
            "SELECT * FROM mailbox.consumer_lag('lat_g')"
        )  # numbered once, like a live relay
        db.execute("VACUUM ANALYZE mailbox.outbox_lat")


def poll_latency(dsn, samples=300):
    poll_ms = []
    with connect(dsn) as conn:
        for _ in range(samples):
            started = time.perf_counter()
            got = conn.execute(
                "SELECT outbox_id FROM mailbox.poll_outbox('lat_g', 'c', 100)"
            ).fetchall()
            poll_ms.append((time.perf_counter() - started) * 1000)
            conn.execute("SELECT mailbox.commit_offset('lat_g', 'c', %s)", [got[-1][0]])
    return percentiles(poll_ms)


def lag_latency(dsn, samples=100):
    ms = []
    with connect(dsn) as conn:
        for _ in range(samples):
            started = time.perf_counter()
            conn.execute("SELECT * FROM mailbox.consumer_lag('lat_g')").fetchall()
            ms.append((time.perf_counter() - started) * 1000)
    return percentiles(ms)


def sizes(dsn):
    with connect(dsn) as db:
        return db.execute(
            "SELECT pg_relation_size('mailbox.outbox_lat'), pg_indexes_size('mailbox.outbox_lat')"
        ).fetchone()


def drain_and_shrink(dsn):
    with connect(dsn) as db:
        before = sizes(dsn)
        while got := db.execute(
            "SELECT max(outbox_id), count(*) FROM mailbox.poll_outbox('lat_g', 'c', 10000)"
        ).fetchone()[0]:
            db.execute("SELECT mailbox.commit_offset('lat_g', 'c', %s)", [got])
        started = time.perf_counter()
        result = db.execute("SELECT mailbox.run_maintenance()").fetchone()[0]
        elapsed = time.perf_counter() - started
        return before, sizes(dsn), result, elapsed


def idle_latency(dsn, samples=200):
    """Commit of a publish -> a LISTENing consumer's poll has returned the row."""
    with connect(dsn) as db:
        db.execute("SELECT mailbox.drop_outbox('idle', true)")
        db.execute("SELECT mailbox.create_outbox('idle', 0)")
        db.execute("SELECT mailbox.create_consumer_group('idle_g', 'idle', 'latest')")
    listener = connect(dsn)
    listener.execute("LISTEN mailbox_outbox_new")
    producer = connect(dsn, autocommit=False)
    ms = []
    for _ in range(samples):
        producer.execute("SELECT mailbox.outbox_publish('idle', '{}')")
        started = time.perf_counter()
        producer.commit()
        for _note in listener.notifies(timeout=5, stop_after=1):
            pass
        got = listener.execute(
            "SELECT outbox_id FROM mailbox.poll_outbox('idle_g', 'c', 100)"
        ).fetchall()
        ms.append((time.perf_counter() - started) * 1000)
        assert got, "notified but nothing to poll"
        listener.execute("SELECT mailbox.commit_offset('idle_g', 'c', %s)", [got[-1][0]])
    listener.close()
    producer.close()
    return percentiles(ms)


# ---------------------------------------------------------------- producer (pgbench)
PGBENCH_SETUP = """
DROP TABLE IF EXISTS bench_orders, bench_orders_captured, bench_events CASCADE;
SELECT mailbox.drop_outbox('bench_orders_captured', true);
SELECT mailbox.drop_outbox('bench_pub', true);
CREATE TABLE bench_orders (id bigserial PRIMARY KEY, customer text, amount numeric);
CREATE TABLE bench_orders_captured (id bigserial PRIMARY KEY, customer text, amount numeric);
CREATE TABLE bench_events (id bigserial PRIMARY KEY, created_at timestamptz DEFAULT now(),
                           payload jsonb);
SELECT mailbox.create_outbox('bench_pub');
SELECT mailbox.enable_outbox('bench_orders_captured');
"""

SCRIPTS = {
    "baseline: order + INSERT event": (
        "BEGIN;\nINSERT INTO bench_orders (customer, amount) VALUES ('c', 1);\n"
        'INSERT INTO bench_events (payload) VALUES (\'{"order": 1, "amount": 1}\');\nEND;\n'
    ),
    "order + outbox_publish": (
        "BEGIN;\nINSERT INTO bench_orders (customer, amount) VALUES ('c', 1);\n"
        "SELECT mailbox.outbox_publish('bench_pub', '{\"order\": 1, \"amount\": 1}');\nEND;\n"
    ),
    "captured order insert": (
        "BEGIN;\nINSERT INTO bench_orders_captured (customer, amount) VALUES ('c', 1);\nEND;\n"
    ),
}


def pgbench(dsn, script, seconds, options):
    pgbench_bin = shutil.which("pgbench") or "/usr/lib/postgresql/15/bin/pgbench"
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    env = dict(os.environ, PGOPTIONS=options)
    out = subprocess.run(
        [pgbench_bin, "-n", "-c", "8", "-j", "2", "-T", str(seconds), "-f", f.name, dsn],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    os.unlink(f.name)
    for line in out.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(out)


def producer(dsn, seconds, options):
    with connect(dsn) as db:
        db.execute(PGBENCH_SETUP)
    results = {}
    for name, script in SCRIPTS.items():
        results[name] = pgbench(dsn, script, seconds, options)
    results["order + outbox_publish, NOTIFY off"] = pgbench(
        dsn, SCRIPTS["order + outbox_publish"], seconds, options + " -c mailbox.outbox_notify=off"
    )
    results["captured order insert, NOTIFY off"] = pgbench(
        dsn, SCRIPTS["captured order insert"], seconds, options + " -c mailbox.outbox_notify=off"
    )
    return results


# ---------------------------------------------------------------- main
def table(title, header, body):
    print(f"\n{title}")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    print("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in body:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="database with pg_mailbox (default: throwaway cluster)")
    parser.add_argument("--rows", type=int, default=100000, help="rows per drain run")
    parser.add_argument("--big", type=int, default=1000000, help="backlog for latency/lag")
    parser.add_argument("--pgbench-seconds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=3, help="runs per drain cell (median)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.big, args.pgbench_seconds, args.repeat = 5000, 20000, 3, 1

    cluster = None
    dsn = args.dsn
    if dsn is None:
        from pg_mailbox.cluster import Cluster

        cluster = Cluster()
        cluster.init()
        cluster.start()
        dsn = cluster.dsn("postgres")
        with connect(dsn) as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_mailbox CASCADE")
    try:
        run(dsn, args)
    finally:
        if cluster is not None:
            cluster.destroy()


def run(dsn, args):
    with connect(dsn) as db:
        version = db.execute("SELECT version()").fetchone()[0].split(" on ")[0]
    print(
        f"pg_mailbox outbox benchmark: {version}, {os.cpu_count()} cores,"
        f" rows per drain run {args.rows}"
    )

    # Each cell is the median of --repeat runs, the systems interleaved within each round, so
    # a burst of load from elsewhere on the (shared) machine hits all of them alike.
    def median_of(fn, *a):
        return statistics.median(fn(*a) for _ in range(args.repeat))

    drain_rows = []
    for batch in (100, 1000):
        floor1 = median_of(delete_floor, dsn, args.rows, batch, 1)
        pgq = median_of(pgq_drain, dsn, args.rows, batch, 1)
        skip1 = median_of(skip_locked_outbox, dsn, args.rows, batch, 1)
        drain_rows.append((batch, 1, "DELETE ... RETURNING (floor)", f"{floor1:,.0f}", "1.00"))
        drain_rows.append((batch, 1, "PgQ", f"{pgq:,.0f}", f"{pgq / floor1:.2f}"))
        drain_rows.append(
            (batch, 1, "SKIP LOCKED + UPDATE", f"{skip1:,.0f}", f"{skip1 / floor1:.2f}")
        )
        for consumers in (1, 2, 4):
            floors, ours = [], []
            for _ in range(args.repeat):
                floors.append(delete_floor(dsn, args.rows, batch, consumers))
                ours.append(mailbox_drain(dsn, args.rows, batch, consumers))
            floor, mine = statistics.median(floors), statistics.median(ours)
            drain_rows.append(
                (batch, consumers, "floor, same rounds as the next row", f"{floor:,.0f}", "1.00")
            )
            drain_rows.append(
                (
                    batch,
                    consumers,
                    "pg_mailbox poll+commit",
                    f"{mine:,.0f}",
                    f"{mine / floor:.2f} (PgQ {mine / pgq:.2f})",
                )
            )
    table(
        "drain throughput (msg/s; ratio to the floor with the same batch and consumers)",
        ("batch", "consumers", "system", "msg/s", "ratio"),
        drain_rows,
    )

    lat_rows = []
    for size in (10000, args.big):
        backlog(dsn, size)
        p50, p95 = poll_latency(dsn, samples=min(300, size // 100 - 1))
        lat_rows.append((f"poll_outbox, batch 100, backlog {size:,}", f"{p50:.2f}", f"{p95:.2f}"))
        if size == args.big:
            p50, p95 = lag_latency(dsn)
            lat_rows.append((f"consumer_lag, {size:,} rows", f"{p50:.2f}", f"{p95:.2f}"))
    p50, p95 = idle_latency(dsn)
    lat_rows.append(("commit -> LISTENing consumer's poll", f"{p50:.2f}", f"{p95:.2f}"))
    table("latency (ms)", ("what", "p50", "p95"), lat_rows)

    before, after, result, elapsed = drain_and_shrink(dsn)
    table(
        f"retention after draining {args.big:,} rows (one run_maintenance, {elapsed:.1f} s)",
        ("", "table bytes", "index bytes"),
        [
            ("before", f"{before[0]:,}", f"{before[1]:,}"),
            ("after", f"{after[0]:,}", f"{after[1]:,}"),
        ],
    )
    assert result["outbox_tables_truncated"] >= 1, result

    for label, options in (
        ("synchronous_commit on", ""),
        ("synchronous_commit off", "-c synchronous_commit=off"),
    ):
        tps = producer(dsn, args.pgbench_seconds, options)
        base = tps["baseline: order + INSERT event"]
        table(
            f"producer, pgbench 8 clients, {args.pgbench_seconds} s each, {label} (TPS)",
            ("transaction", "tps", "ratio"),
            [(name, f"{v:,.0f}", f"{v / base:.2f}") for name, v in tps.items()],
        )


if __name__ == "__main__":
    main()
