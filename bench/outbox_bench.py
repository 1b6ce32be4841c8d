"""Outbox and consumer-group benchmark (issue 8: measured honestly).

Everything runs against one server in one invocation; read the ratios, not the absolute
rates (the baselines ran minutes apart on the same machine). The rules every cell follows:

- A drain starts from a backlog no consumer has read: the clock covers pg_mailbox's
  numbering (polls number the rows they reach, under the outbox's sequencer lock).
- Every system gets the same preparation: the same rows (payload built by the same SQL
  expression), published in transactions of `batch` rows, then CHECKPOINT before the clock;
  no VACUUM or ANALYZE for anyone; autovacuum as the server has it.
- Every system returns the payload as text and makes one round trip per batch: psycopg's
  pipeline mode sends "acknowledge the previous batch, fetch the next, COMMIT" in one go.
- Each cell is the median of --repeat rounds; a round runs every system once, round-robin,
  so load from elsewhere on the machine hits all systems alike.

Sections (--sections, default all):

- drain: an unread backlog of --rows and of --big-drain rows (0: skip) drained by one
  consumer at batch 100 and 1000: pg_mailbox poll_outbox + commit_offset, the
  DELETE ... RETURNING floor, a SKIP LOCKED + UPDATE outbox, PgQ; ratios to the floor and PgQ.
- steady: producers at --rate msg/s for --steady-seconds while a relay keeps up (LISTEN
  mailbox_outbox_new, poll until empty, once more 5 ms later, then on a wake-up or after
  --fallback seconds): end-to-end msg/s,
  lag (consumer_lag sampled every second) and commit-to-consumer latency p50/p99.
- latency: the first poll_outbox on an unread backlog, later polls, at 10K and --big rows;
  the first consumer_lag (it numbers every row) and later ones; commit -> LISTENing
  consumer's poll when idle.
- retention: table + index bytes before and after draining --big rows and run_maintenance.
- producer: pgbench, 8 clients: a transaction that inserts an order and an event into a
  plain table (baseline), calls outbox_publish, or inserts into a captured table.
- idle: the steady state with a numberer (CALL mailbox.run_numberer()), without and with a
  second group's consumer idle in its poll transaction for --idle-seconds (30), and that idle
  consumer without a numberer: the other group's latency p50/p99 (issue 8: p99 within 2x).
- soak: the steady state for --soak-seconds (600) with run_maintenance every
  --maintain-interval seconds (60, as pg_cron would run it) on an outbox with retention 0;
  the outbox's bytes (table + indexes, sampled every 10 s) at the end against after the
  first minute (issue 8: at most 2x).

Usage: python bench/outbox_bench.py [--dsn DSN] [--rows 100000] [--big-drain 1000000]
       [--repeat 3] [--rate 5000] [--steady-seconds 120] [--pgbench-seconds 10]
       [--sections drain,steady,...] [--quick]
Without --dsn a throwaway cluster is started (pg_mailbox.cluster) and removed afterwards.
The server needs pg_mailbox and PgQ (Debian: postgresql-15-pgq3) installed.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psycopg

from pg_mailbox import api

PAYLOAD = "jsonb_build_object('order_id', g, 'amount', g * 10, 'customer', 'customer-' || g)"
SECTIONS = ("drain", "steady", "idle", "latency", "retention", "producer", "soak")


def progress(text):
    """One line per measured run on stderr, so a long run shows where it is."""
    print(f"  [{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def connect(dsn, autocommit=True):
    return psycopg.connect(dsn, autocommit=autocommit)


def median(values):
    return statistics.median(values) if values else float("nan")


def percentile(samples, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    samples = sorted(samples)
    return samples[max(0, min(len(samples) - 1, int(round(q / 100 * len(samples))) - 1))]


def drop_outbox(db, outbox):
    """drop_outbox raises 55P03 while any session, autovacuum included, holds a lock on any
    outbox's partition of the shared log (an autovacuum of a previous run's rows can outlast
    its two seconds of NOWAIT retries, and NOWAIT never cancels it): retry for up to two
    minutes, saying who was in the way. Always outside the clock."""
    deadline = time.monotonic() + 120
    while True:
        try:
            db.execute("SELECT mailbox.drop_outbox(%s, true)", [outbox])
            return
        except psycopg.errors.LockNotAvailable:
            if time.monotonic() > deadline:
                raise
            holders = db.execute(
                "SELECT string_agg(DISTINCT coalesce(a.backend_type, '?') || ': '"
                " || left(coalesce(a.query, ''), 60), '; ')"
                " FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
                " JOIN pg_class AS c ON c.oid = l.relation"
                " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'mailbox' AND l.pid <> pg_backend_pid()"
            ).fetchone()[0]
            progress(f"drop_outbox({outbox}) busy, retrying; lock holders: {holders}")
            time.sleep(1)


def reset_outbox(db, outbox, group=None, reset="earliest"):
    """A new, empty outbox (retention 0) and, if given, a consumer group on it."""
    drop_outbox(db, outbox)
    api.create_outbox(db, outbox, retention_hours=0)
    if group:
        api.create_consumer_group(db, group, outbox, reset)


def publish_in_transactions(db, rows, per_txn, statement, after=None):
    """Run `statement` (params: first, last) once per `per_txn` rows, each in its own
    transaction, then `after` (in a transaction of its own) if given."""
    with db.pipeline() as pipeline:
        for start in range(1, rows + 1, per_txn):
            db.execute(statement, [start, min(start + per_txn - 1, rows)])
            pipeline.sync()  # statements up to a Sync form one implicit transaction
            if after:
                db.execute(after)
                pipeline.sync()


# ================================================================ drain
# Each system is (prepare, drain): prepare(db, rows, batch) publishes the backlog; drain(dsn,
# batch) consumes it to the end and returns the number of rows it got. Only drain is timed.


def mailbox_prepare(db, rows, batch):
    reset_outbox(db, "bench", "bench_g")
    publish_in_transactions(
        db,
        rows,
        batch,
        f"SELECT count(*) FROM mailbox.outbox_publish_batch('bench', ARRAY("
        f"SELECT {PAYLOAD} FROM generate_series(%s::int, %s::int) g))",
    )


def mailbox_drain(dsn, batch):
    done = 0
    with connect(dsn, autocommit=False) as conn:
        last = None
        while True:
            # the relay pattern: acknowledge the previous batch, lease the next one and COMMIT
            # in one transaction and, with psycopg's pipeline mode, one network round trip
            with conn.pipeline():
                if last is not None:
                    conn.execute("SELECT mailbox.commit_offset('bench_g', 'c', %s)", [last])
                cur = conn.execute(
                    "SELECT outbox_id, payload::text"
                    " FROM mailbox.poll_outbox('bench_g', 'c', %s, 60)",
                    [batch],
                )
                conn.commit()
            got = cur.fetchall()
            if not got:
                return done
            done += len(got)
            last = got[-1][0]


def plain_prepare(table, with_processed):
    def prepare(db, rows, batch):
        extra = ", processed_at timestamptz" if with_processed else ""
        db.execute(f"DROP TABLE IF EXISTS {table}")
        db.execute(
            f"CREATE TABLE {table} (id bigserial PRIMARY KEY,"
            f" created_at timestamptz DEFAULT now(), payload jsonb NOT NULL{extra})"
        )
        if with_processed:
            db.execute(f"CREATE INDEX ON {table} (id) WHERE processed_at IS NULL")
        publish_in_transactions(
            db,
            rows,
            batch,
            f"INSERT INTO {table} (payload) SELECT {PAYLOAD}"
            f" FROM generate_series(%s::int, %s::int) g",
        )

    return prepare


def statement_drain(statement):
    def drain(dsn, batch):
        done = 0
        with connect(dsn) as conn:  # autocommit: one statement, one transaction per batch
            while got := conn.execute(statement, [batch]).fetchall():
                done += len(got)
        return done

    return drain


FLOOR_SQL = (
    "DELETE FROM bench_floor WHERE id IN (SELECT id FROM bench_floor ORDER BY id LIMIT %s"
    " FOR UPDATE SKIP LOCKED) RETURNING id, payload::text"
)
SKIP_SQL = (
    "UPDATE bench_skip SET processed_at = now() WHERE id IN (SELECT id FROM bench_skip"
    " WHERE processed_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
    " RETURNING id, payload::text"
)


def pgq_prepare(db, rows, batch):
    """PgQ's batches are the events between two ticks; pgqd ticks while producers publish,
    whether or not a consumer runs, so the ticks are part of the backlog (one per batch)."""
    db.execute("CREATE EXTENSION IF NOT EXISTS pgq")
    db.execute(
        "SELECT pgq.unregister_consumer('bench_q', 'c'), pgq.drop_queue('bench_q')"
        " WHERE EXISTS (SELECT 1 FROM pgq.queue WHERE queue_name = 'bench_q')"
    )
    db.execute("SELECT pgq.create_queue('bench_q')")
    db.execute("SELECT pgq.set_queue_config('bench_q', 'ticker_max_lag', '0')")
    db.execute("SELECT pgq.register_consumer('bench_q', 'c')")
    publish_in_transactions(
        db,
        rows,
        batch,
        f"SELECT count(pgq.insert_event('bench_q', 'e', ({PAYLOAD})::text))"
        f" FROM generate_series(%s::int, %s::int) g",
        after="SELECT pgq.ticker('bench_q')",
    )


def pgq_drain(dsn, batch):
    """finish_batch of the previous batch, next_batch + get_batch_events and COMMIT in one
    pipeline: the same single round trip per batch as pg_mailbox's relay loop."""
    done = 0
    with connect(dsn, autocommit=False) as conn:
        last = None
        while True:
            with conn.pipeline():
                if last is not None:
                    conn.execute("SELECT pgq.finish_batch(%s)", [last])
                cur = conn.execute(
                    "SELECT b.id, e.ev_id, e.ev_data FROM pgq.next_batch('bench_q', 'c') AS b (id)"
                    " LEFT JOIN LATERAL (SELECT ev_id, ev_data FROM pgq.get_batch_events(b.id)"
                    " WHERE b.id IS NOT NULL OFFSET 0) AS e ON true"
                )
                conn.commit()
            got = cur.fetchall()
            last = got[0][0]
            if last is None:
                return done
            done += sum(1 for r in got if r[1] is not None)


DRAIN_SYSTEMS = {
    "DELETE ... RETURNING (floor)": (
        plain_prepare("bench_floor", False),
        statement_drain(FLOOR_SQL),
    ),
    "PgQ": (pgq_prepare, pgq_drain),
    "SKIP LOCKED + UPDATE": (plain_prepare("bench_skip", True), statement_drain(SKIP_SQL)),
    "pg_mailbox poll+commit": (mailbox_prepare, mailbox_drain),
}
FLOOR, PGQ, MAILBOX = "DELETE ... RETURNING (floor)", "PgQ", "pg_mailbox poll+commit"


def drain_once(dsn, system, rows, batch):
    prepare, drain = DRAIN_SYSTEMS[system]
    with connect(dsn) as db:
        prepare(db, rows, batch)
        db.execute("CHECKPOINT")  # the loader's dirty pages are not the consumer's cost
    started = time.perf_counter()
    done = drain(dsn, batch)
    elapsed = time.perf_counter() - started
    assert done == rows, f"{system}: drained {done} of {rows}"
    return rows / elapsed


def drain_section(dsn, args, out):
    backlogs = [args.rows] + ([args.big_drain] if args.big_drain else [])
    cells = [(rows, batch) for rows in backlogs for batch in (100, 1000)]
    rates = {(c, s): [] for c in cells for s in DRAIN_SYSTEMS}
    for _ in range(args.repeat):
        for cell in cells:
            for system in DRAIN_SYSTEMS:  # round-robin: every system once per round
                rate = drain_once(dsn, system, *cell)
                rates[(cell, system)].append(rate)
                progress(f"drain {cell[0]:,} batch {cell[1]}: {system} {rate:,.0f} msg/s")
    body = []
    for cell in cells:
        floor = median(rates[(cell, FLOOR)])
        pgq = median(rates[(cell, PGQ)])
        for system in DRAIN_SYSTEMS:
            runs = rates[(cell, system)]
            mid = median(runs)
            body.append(
                (
                    f"{cell[0]:,}",
                    cell[1],
                    system,
                    f"{mid:,.0f}",
                    f"{min(runs):,.0f}-{max(runs):,.0f}",
                    f"{mid / floor:.2f}",
                    f"{mid / pgq:.2f}",
                )
            )
    out.table(
        f"drain: one consumer, unread backlog, msg/s (median of {args.repeat} interleaved rounds)",
        ("backlog", "batch", "system", "msg/s", "range", "x floor", "x PgQ"),
        body,
        notes=[
            "all: backlog published in transactions of `batch` rows, CHECKPOINT, then the clock"
            " (caches as the loader left them);",
            "  payload returned as text; 1 round trip per batch (ack previous + fetch next +"
            " COMMIT); no VACUUM/ANALYZE",
            "pg_mailbox: the clock includes numbering the backlog (polls number the rows"
            " they reach), leases and offset commits",
            "PgQ: a tick after each `batch` events while publishing (pgqd's job, outside the"
            " clock); events stored as text, the others store jsonb",
            "floor / SKIP LOCKED: autocommit statement per batch; the floor deletes, SKIP LOCKED"
            " sets processed_at (a partial index on unprocessed ids)",
        ],
    )


# ================================================================ steady state
def steady_producer(dsn, i, per_txn, interval, start_at, stop_at, results):
    """One producer process (no GIL shared with the relay): a transaction of per_txn rows
    every `interval` seconds from start_at to stop_at; sends back (event_id, commit time)."""
    try:
        ids, times = [], []
        with connect(dsn, autocommit=False) as conn:
            n = 0
            due = start_at
            while due < stop_at:
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                with conn.pipeline():
                    cur = conn.execute(
                        "SELECT mailbox.outbox_publish_batch('steady', ARRAY("
                        "SELECT jsonb_build_object('producer', %s::int, 'n', g, 'order_id', g)"
                        " FROM generate_series(%s::int, %s::int) g))",
                        [i, n, n + per_txn - 1],
                    )
                    conn.commit()
                now = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
                for (event_id,) in cur.fetchall():
                    ids.append(event_id)
                    times.append(now)
                n += per_txn
                due += interval  # fixed schedule: a late commit does not move the next one
        results.put((ids, times))
    except BaseException as exc:
        results.put(exc)


def steady_section(dsn, args, out, soak=False, numberer=False, idle=False, seconds=None):
    """Producers publish at --rate while one relay keeps up; all of it against the clock.
    soak: for --soak-seconds, with run_maintenance every --maintain-interval seconds (as
    pg_cron would run it) and the outbox's size sampled every 10 s.
    numberer: CALL mailbox.run_numberer() runs beside (SPEC §2.2.4).
    idle: a consumer of a second group polls and then sits idle in its poll transaction for
    --idle-seconds from 5 s into the run. Returns the latency figures."""
    if seconds is None:
        seconds = args.soak_seconds if soak else args.steady_seconds
    with connect(dsn) as db:
        reset_outbox(db, "steady", "steady_g")
        if idle:
            # 'latest' and a big batch: a caught-up relay, whose poll numbers the new rows it
            # asks for (without a numberer, under the outbox's sequencer lock)
            api.create_consumer_group(db, "idler_g", "steady", "latest")
    idle_held: list[float] = []
    size_samples: list[tuple[float, int, int]] = []  # (seconds since start, outbox, chunks)
    maintenance_runs: list[float] = []
    received_at: dict = {}  # event_id -> perf_counter right after the consumer's poll
    stop_consuming = threading.Event()
    lags: list[int] = []
    errors: list[BaseException] = []
    per_txn = args.txn_rows
    interval = per_txn * args.producers / args.rate  # seconds between one producer's commits

    # producers are processes forked before any thread starts here, so that the relay's
    # latency does not include waiting for the GIL behind a producer
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    start_at = time.perf_counter() + 1.0  # the relay is listening by then
    stop_at = start_at + seconds
    procs = [
        ctx.Process(
            target=steady_producer,
            args=(
                dsn,
                i,
                per_txn,
                interval,
                start_at + i * interval / args.producers,  # staggered
                stop_at,
                results,
            ),
        )
        for i in range(args.producers)
    ]
    for p in procs:
        p.start()

    def guarded(fn):
        def run(*a):
            try:
                fn(*a)
            except BaseException as exc:  # reported after the run
                errors.append(exc)
                stop_consuming.set()

        return run

    @guarded
    def consume():
        with connect(dsn, autocommit=False) as conn:
            conn.execute("LISTEN mailbox_outbox_new")
            conn.commit()
            last = None
            looked_again = False
            while not stop_consuming.is_set():
                # notifies that arrived before this poll are answered by it: drop them
                for _note in conn.notifies(timeout=0):
                    pass
                with conn.pipeline():
                    if last is not None:
                        conn.execute("SELECT mailbox.commit_offset('steady_g', 'c', %s)", [last])
                    cur = conn.execute(
                        "SELECT outbox_id, event_id, payload::text"
                        " FROM mailbox.poll_outbox('steady_g', 'c', %s, 60)",
                        [args.steady_batch],
                    )
                    conn.commit()
                got = cur.fetchall()
                now = time.perf_counter()
                if got:
                    for _offset, event_id, _payload in got:
                        received_at[event_id] = now
                    last = got[-1][0]
                    looked_again = False
                    continue
                last = None  # committed in the transaction that found nothing
                if not looked_again:
                    # the loop of docs/consumer-groups.md: the empty poll recorded us as
                    # waiting; a producer that checked just before it did not notify, so look
                    # once more in a moment
                    looked_again = True
                    time.sleep(0.005)
                    continue
                # psycopg keeps notifies that arrive during a query for the next notifies()
                # call, so one that came in during the empty poll wakes us at once
                for _note in conn.notifies(timeout=args.fallback, stop_after=1):
                    pass

    @guarded
    def sample():
        with connect(dsn) as conn:
            while not stop_consuming.wait(1.0):
                if start_at <= time.perf_counter() <= stop_at:
                    lags.append(
                        conn.execute(
                            "SELECT coalesce(max(lag), 0) FROM mailbox.consumer_lag('steady_g')"
                        ).fetchone()[0]
                    )

    @guarded
    def maintain():
        with connect(dsn) as conn:
            while not stop_consuming.wait(args.maintain_interval):
                began = time.perf_counter()
                conn.execute("SELECT mailbox.run_maintenance()")
                maintenance_runs.append(time.perf_counter() - began)

    @guarded
    def measure_size():
        with connect(dsn) as conn:
            while not stop_consuming.wait(10.0):
                if time.perf_counter() <= stop_at:
                    size_samples.append(
                        (
                            time.perf_counter() - start_at,
                            *conn.execute(
                                "SELECT (mailbox.outbox_status('steady')->>'total_bytes')::bigint,"
                                " pg_total_relation_size('mailbox._outbox_chunk')"
                            ).fetchone(),
                        )
                    )

    @guarded
    def number():
        with connect(dsn) as conn:
            while not stop_consuming.is_set():
                api.run_numberer(conn, 2)

    @guarded
    def sit_idle():
        if stop_consuming.wait(max(0.0, start_at + 5 - time.perf_counter())):
            return
        with connect(dsn, autocommit=False) as conn:
            # catch up first, like a relay that has been running: then its poll asks for rows
            # that are not numbered yet (without a numberer it numbers them itself)
            while got := conn.execute(
                "SELECT max(outbox_id) FROM mailbox.poll_outbox('idler_g', 'idler', 1000, 600)"
            ).fetchone()[0]:
                conn.execute("SELECT mailbox.commit_offset('idler_g', 'idler', %s)", [got])
                conn.commit()
            conn.commit()
            time.sleep(0.05)
            got = conn.execute(
                "SELECT max(outbox_id) FROM mailbox.poll_outbox('idler_g', 'idler', 1000, 600)"
            ).fetchone()[0]
            began = time.perf_counter()
            stop_consuming.wait(args.idle_seconds)  # idle in transaction, holding its rows
            if got is not None:
                conn.execute("SELECT mailbox.commit_offset('idler_g', 'idler', %s)", [got])
            conn.commit()
            idle_held.append(time.perf_counter() - began)

    threads = [threading.Thread(target=consume), threading.Thread(target=sample)]
    if soak:
        threads += [threading.Thread(target=maintain), threading.Thread(target=measure_size)]
    if numberer:
        threads.append(threading.Thread(target=number))
    if idle:
        threads.append(threading.Thread(target=sit_idle))
    for t in threads:
        t.start()
    committed_at: dict = {}  # event_id -> perf_counter right after the producer's COMMIT
    try:
        for _ in procs:
            got = results.get(timeout=2 * seconds + 120)  # producers late on a busy machine
            if isinstance(got, BaseException):
                raise got
            committed_at.update(zip(*got, strict=True))
        for p in procs:
            p.join()
        deadline = time.perf_counter() + 60
        while len(received_at) < len(committed_at) and time.perf_counter() < deadline:
            if errors:
                break
            time.sleep(0.05)
    finally:
        stop_consuming.set()
        for t in threads:
            t.join()
        for p in procs:
            p.join(timeout=5)
    if errors:
        raise errors[0]
    missing = len(committed_at) - len(received_at.keys() & committed_at.keys())
    assert missing == 0, f"steady: {missing} committed events never reached the consumer"
    latencies = [(received_at[e] - committed_at[e]) * 1000 for e in committed_at]
    published_for = max(committed_at.values()) - start_at
    end_to_end = len(committed_at) / (max(received_at.values()) - start_at)
    late = sum(1 for x in latencies if x > args.fallback * 1000 / 2)
    body = [
        ("offered rate (msg/s)", f"{args.rate:,}"),
        ("published (msg/s)", f"{len(committed_at) / published_for:,.0f}"),
        ("end-to-end (msg/s, first publish to last delivery)", f"{end_to_end:,.0f}"),
        ("messages", f"{len(committed_at):,}"),
        ("lag, rows: median / max of 1 s samples", f"{median(lags):,.0f} / {max(lags or [0]):,}"),
        (
            "commit -> consumer latency, ms: p50 / p99 / max",
            f"{percentile(latencies, 50):.2f} / {percentile(latencies, 99):.2f}"
            f" / {max(latencies):.2f}",
        ),
        (f"delivered later than {args.fallback / 2:g} s (missed wake-ups)", f"{late:,}"),
    ]
    if soak:
        first = next((x for x in size_samples if x[0] >= 60), None) or size_samples[0]
        last = size_samples[-1]
        body += [
            (
                f"outbox bytes (table + indexes) at {first[0]:.0f} s / at {last[0]:.0f} s / max",
                f"{first[1]:,} / {last[1]:,} / {max(x[1] for x in size_samples):,}",
            ),
            ("outbox bytes, end / first minute (target <= 2.0)", f"{last[1] / first[1]:.2f}"),
            (
                "offset chunks table bytes at first minute / at end",
                f"{first[2]:,} / {last[2]:,}",
            ),
            (
                f"run_maintenance every {args.maintain_interval:g} s: runs, median / max s",
                f"{len(maintenance_runs)}, {median(maintenance_runs):.2f}"
                f" / {max(maintenance_runs or [0]):.2f}",
            ),
        ]
    if idle:
        body.append(("second group's consumer idle in its poll transaction (s)", f"{idle_held}"))
    kind = "soak" if soak else "steady state"
    extras = ", numberer running" if numberer else ""
    extras += f", a second group's consumer idle {args.idle_seconds:g} s" if idle else ""
    out.table(
        f"{kind}: {args.producers} producers, {per_txn} rows per transaction, {seconds:g} s;"
        f" one relay (batch {args.steady_batch}){extras}",
        ("what", "value"),
        body,
        notes=[
            "producers (one process each): outbox_publish_batch + COMMIT (one round trip) on a"
            " fixed schedule; commit time taken when COMMIT returns",
            "relay (docs/consumer-groups.md's loop): LISTEN mailbox_outbox_new; commit_offset +"
            " poll_outbox + COMMIT pipelined until empty, once more 5 ms later, then wait for"
            f" a notify (fallback poll every {args.fallback:g} s)",
            "latency: consumer's poll returned minus producer's COMMIT returned, per event_id,"
            " same clock (may be slightly negative)",
            "no baseline runs here: read it against the offered rate",
        ],
    )
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


# ================================================================ latency and retention
def idle_section(dsn, args, out):
    """SPEC §2.2.4: a consumer idle in its poll transaction holds back only its own rows. The
    steady state of one group, with a numberer, without and with a second group's consumer
    idle in its poll transaction; then the same idle consumer without a numberer (polls number
    inline, so the open transaction holds the sequencer: that is the stall the numberer ends)."""
    seconds = args.idle_seconds + 10
    runs = [
        ("numberer, no idle consumer", dict(numberer=True)),
        ("numberer, idle consumer", dict(numberer=True, idle=True)),
        ("no numberer, idle consumer", dict(idle=True)),
    ]
    results = []
    for label, flags in runs:
        progress(f"idle: {label}")
        results.append((label, steady_section(dsn, args, out, seconds=seconds, **flags)))
    base = results[0][1]["p99"]
    out.table(
        f"idle poll transaction: other group's commit -> delivery latency, {seconds:g} s runs",
        ("run", "p50 ms", "p99 ms", "p99 x no idle consumer"),
        [
            (label, f"{r['p50']:.2f}", f"{r['p99']:.2f}", f"{r['p99'] / base:.2f}")
            for label, r in results
        ],
        notes=["target: the idle consumer leaves the other group's p99 within 2x (issue 8)"],
    )


def latency_backlog(dsn, rows):
    with connect(dsn) as db:
        reset_outbox(db, "lat", "lat_g")
        publish_in_transactions(
            db,
            rows,
            1000,
            f"SELECT count(*) FROM mailbox.outbox_publish_batch('lat', ARRAY("
            f"SELECT {PAYLOAD} FROM generate_series(%s::int, %s::int) g))",
        )
        db.execute("CHECKPOINT")


def poll_latency(dsn, samples):
    """The first poll numbers the unread backlog; reported apart from the ones after it."""
    ms = []
    with connect(dsn) as conn:
        for _ in range(samples):
            started = time.perf_counter()
            got = conn.execute(
                "SELECT outbox_id, payload::text FROM mailbox.poll_outbox('lat_g', 'c', 100)"
            ).fetchall()
            ms.append((time.perf_counter() - started) * 1000)
            conn.execute("SELECT mailbox.commit_offset('lat_g', 'c', %s)", [got[-1][0]])
    return ms[0], ms[1:]


def lag_latency(dsn, samples=100):
    ms = []
    with connect(dsn) as conn:
        for _ in range(samples):
            started = time.perf_counter()
            conn.execute("SELECT * FROM mailbox.consumer_lag('lat_g')").fetchall()
            ms.append((time.perf_counter() - started) * 1000)
    return ms


def idle_latency(dsn, samples):
    """Commit of a publish -> a LISTENing, idle consumer's poll has returned the row.
    Returns the times (ms) and how many samples got no notification within 5 s."""
    with connect(dsn) as db:
        reset_outbox(db, "idle", "idle_g", "latest")
    ms, unwoken = [], 0
    poll = "SELECT outbox_id, payload::text FROM mailbox.poll_outbox('idle_g', 'c', 100)"
    with connect(dsn) as listener, connect(dsn, autocommit=False) as producer:
        listener.execute("LISTEN mailbox_outbox_new")
        for _ in range(samples):
            # idle as a relay is: its last poll came back empty, which records it as waiting
            # (producers notify only while a consumer waits)
            assert not listener.execute(poll).fetchall()
            for _note in listener.notifies(timeout=0):
                pass
            producer.execute("SELECT mailbox.outbox_publish('idle', '{}')")
            started = time.perf_counter()
            producer.commit()
            woken = False
            for _note in listener.notifies(timeout=5, stop_after=1):
                woken = True
            got = listener.execute(poll).fetchall()
            ms.append((time.perf_counter() - started) * 1000)
            unwoken += not woken
            assert got, "notified but nothing to poll"
            listener.execute("SELECT mailbox.commit_offset('idle_g', 'c', %s)", [got[-1][0]])
    return ms, unwoken


def sizes(db):
    return db.execute(
        "SELECT pg_relation_size('mailbox._outbox_log_lat'),"
        " pg_indexes_size('mailbox._outbox_log_lat')"
    ).fetchone()


def latency_section(dsn, args, out):
    body = []
    for size in (min(10000, args.big // 10), args.big):
        latency_backlog(dsn, size)
        polls = min(301, size // 100)
        first, later = poll_latency(dsn, samples=polls)
        body.append((f"first poll_outbox, unread backlog {size:,}", f"{first:.2f}"))
        body.append(
            (
                f"later poll_outbox, batch 100, backlog {size:,}",
                f"{percentile(later, 50):.2f}",
                f"{percentile(later, 95):.2f}",
            )
        )
    ms = lag_latency(dsn)
    body.append(
        (
            f"first consumer_lag, {args.big:,} rows, {polls} x 100 polled (numbers the rest)",
            f"{ms[0]:.2f}",
        )
    )
    body.append(
        (
            f"later consumer_lag, {args.big:,} rows",
            f"{percentile(ms[1:], 50):.2f}",
            f"{percentile(ms[1:], 95):.2f}",
        )
    )
    ms, unwoken = idle_latency(dsn, args.idle_samples)
    body.append(
        (
            "idle: commit -> LISTENing consumer's poll returned"
            + (f" ({unwoken} of {len(ms)} not woken)" if unwoken else ""),
            f"{percentile(ms, 50):.2f}",
            f"{percentile(ms, 95):.2f}",
        )
    )
    out.table(
        "latency (ms; a single value is one call)",
        ("what", "p50", "p95"),
        [row + ("",) * (3 - len(row)) for row in body],
        notes=[
            "backlogs published in 1,000-row transactions, CHECKPOINT, no VACUUM/ANALYZE;",
            "  a poll numbers the rows it needs (at least 1,000), consumer_lag numbers them all",
        ],
    )


def retention_section(dsn, args, out):
    if "latency" not in args.sections:
        latency_backlog(dsn, args.big)
    with connect(dsn) as db:
        before = sizes(db)
        while got := db.execute(
            "SELECT max(outbox_id) FROM mailbox.poll_outbox('lat_g', 'c', 10000)"
        ).fetchone()[0]:
            db.execute("SELECT mailbox.commit_offset('lat_g', 'c', %s)", [got])
        started = time.perf_counter()
        result = db.execute("SELECT mailbox.run_maintenance()").fetchone()[0]
        elapsed = time.perf_counter() - started
        after = sizes(db)
    assert result["outbox_tables_truncated"] >= 1, result
    assert before[0] > 0, "retention: the 'before' size measured an empty relation"
    out.table(
        f"retention: {args.big:,} rows drained, then one run_maintenance ({elapsed:.1f} s)",
        ("", "table bytes", "index bytes"),
        [
            ("before", f"{before[0]:,}", f"{before[1]:,}"),
            ("after", f"{after[0]:,}", f"{after[1]:,}"),
        ],
    )


# ================================================================ producer (pgbench)
PGBENCH_SETUP = """
DROP TABLE IF EXISTS bench_orders, bench_orders_captured, bench_events CASCADE;
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


def pgbench_bin():
    found = shutil.which("pgbench")
    if os.environ.get("PG_CONFIG"):
        bindir = subprocess.run(
            [os.environ["PG_CONFIG"], "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        found = os.path.join(bindir, "pgbench")
    return found or "/usr/lib/postgresql/15/bin/pgbench"


def pgbench(dsn, script, seconds, options):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    env = dict(os.environ, PGOPTIONS=options)
    try:
        out = subprocess.run(
            [pgbench_bin(), "-n", "-c", "8", "-j", "2", "-T", str(seconds), "-f", f.name, dsn],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    finally:
        os.unlink(f.name)
    for line in out.splitlines():
        if line.startswith("tps ="):
            return float(line.split()[2])
    raise RuntimeError(out)


def producer_section(dsn, args, out):
    modes = [("synchronous_commit on", "")]
    if not args.quick:
        modes.append(("synchronous_commit off", "-c synchronous_commit=off"))
    cases = [(name, script, "") for name, script in SCRIPTS.items()] + [
        (f"{name}, NOTIFY off", SCRIPTS[name], " -c mailbox.outbox_notify=off")
        for name in ("order + outbox_publish", "captured order insert")
    ]
    for label, options in modes:
        with connect(dsn) as db:
            drop_outbox(db, "bench_orders_captured")
            drop_outbox(db, "bench_pub")
            db.execute(PGBENCH_SETUP)
        tps = {name: [] for name, _s, _o in cases}
        for _ in range(args.pgbench_repeat):  # interleaved rounds, like the drains
            for name, script, extra in cases:
                with connect(dsn) as db:
                    db.execute("CHECKPOINT")  # no run pays for the previous run's dirty pages
                tps[name].append(pgbench(dsn, script, args.pgbench_seconds, options + extra))
                progress(f"producer, {label}: {name} {tps[name][-1]:,.0f} tps")
        base = median(tps[cases[0][0]])
        out.table(
            f"producer: pgbench, 8 clients, {args.pgbench_seconds} s per run, {label}"
            f" (TPS, median of {args.pgbench_repeat} interleaved rounds)",
            ("transaction", "tps", "x baseline"),
            [(n, f"{median(v):,.0f}", f"{median(v) / base:.2f}") for n, v in tps.items()],
            notes=["each run: CHECKPOINT, then pgbench -n -c 8 -j 2; the tables keep growing"],
        )


# ================================================================ report
class Report:
    def __init__(self):
        self.started = time.perf_counter()

    def line(self, text=""):
        print(text, flush=True)

    def table(self, title, header, body, notes=()):
        self.line(f"\n{title}")
        widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
        self.line("  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
        for row in body:
            self.line("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        for note in notes:
            self.line(f"  {note}")


def machine_facts(db):
    def first(path, key):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(key):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "?"

    settings = db.execute(
        "SELECT string_agg(name || '=' || setting || coalesce(unit, ''), ', ' ORDER BY name)"
        " FROM pg_settings WHERE name IN ('shared_buffers', 'synchronous_commit', 'fsync',"
        " 'autovacuum', 'max_wal_size', 'wal_level')"
    ).fetchone()[0]
    versions = db.execute(
        "SELECT string_agg(extname || ' ' || extversion, ', ' ORDER BY extname) FROM pg_extension"
        " WHERE extname IN ('pg_mailbox', 'pgq')"
    ).fetchone()[0]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip()
    except OSError:
        commit = ""
    return [
        f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}",
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; code: {commit or '?'}",
        f"machine: {os.cpu_count()} cores ({first('/proc/cpuinfo', 'model name')}),"
        f" {first('/proc/meminfo', 'MemTotal')} RAM, {platform.system()} {platform.release()}",
        f"server: {db.execute('SELECT version()').fetchone()[0].split(' on ')[0]}; {versions}",
        f"settings: {settings}",
        f"client: Python {platform.python_version()}, psycopg {psycopg.__version__}, same host",
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="database with pg_mailbox (default: throwaway cluster)")
    parser.add_argument("--rows", type=int, default=100_000, help="drain backlog")
    parser.add_argument(
        "--big-drain", type=int, default=1_000_000, help="second drain backlog (0: skip it)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds per drain cell")
    parser.add_argument("--big", type=int, default=1_000_000, help="latency/retention backlog")
    parser.add_argument("--rate", type=int, default=5000, help="steady state: offered msg/s")
    parser.add_argument("--steady-seconds", type=float, default=120)
    parser.add_argument("--soak-seconds", type=float, default=600, help="soak duration")
    parser.add_argument(
        "--idle-seconds", type=float, default=30, help="idle: how long the consumer idles"
    )
    parser.add_argument(
        "--maintain-interval", type=float, default=60, help="soak: seconds between maintenance"
    )
    parser.add_argument("--producers", type=int, default=4, help="steady state producers")
    parser.add_argument("--txn-rows", type=int, default=10, help="rows per producer transaction")
    parser.add_argument("--steady-batch", type=int, default=1000, help="relay poll batch size")
    parser.add_argument("--fallback", type=float, default=1.0, help="relay poll without a notify")
    parser.add_argument("--idle-samples", type=int, default=200)
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--pgbench-repeat", type=int, default=3, help="interleaved rounds")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    if parser.parse_known_args()[0].quick:  # smaller defaults; explicit options still win
        parser.set_defaults(
            rows=2000,
            big_drain=0,
            big=5000,
            rate=500,
            steady_seconds=2,
            soak_seconds=12,
            idle_seconds=3,
            maintain_interval=3,
            txn_rows=5,
            producers=2,
            idle_samples=10,
            pgbench_seconds=1,
            pgbench_repeat=1,
        )
    args = parser.parse_args()
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")

    # a TERM (a timeout, kill) unwinds like an exception, so the throwaway cluster is removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
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
    out = Report()
    with connect(dsn) as db:
        db.execute("CREATE EXTENSION IF NOT EXISTS pgq")
        out.line("pg_mailbox outbox benchmark")
        for fact in machine_facts(db):
            out.line(f"  {fact}")
    sections = {
        "drain": drain_section,
        "steady": steady_section,
        "latency": latency_section,
        "retention": retention_section,
        "producer": producer_section,
        "soak": lambda dsn, args, out: steady_section(dsn, args, out, soak=True),
        "idle": idle_section,
    }
    for name in SECTIONS:
        if name in args.sections:
            progress(f"section {name}")
            sections[name](dsn, args, out)
    out.line(
        f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())};"
        f" wall time {time.perf_counter() - out.started:.0f} s"
    )


if __name__ == "__main__":
    main()
