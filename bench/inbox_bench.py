"""Inbox benchmark (issue 4): pg_mailbox's inbox against plain-SQL baselines, side by side.

Everything runs in one invocation against one server, in a scratch database created for the
run and dropped afterwards, so every number is read as a ratio to a baseline measured minutes
apart on the same machine:

- receive: inbox_receive() one call per message, 20% duplicates, versus a plain
  INSERT ... ON CONFLICT DO NOTHING into an equivalent table; and batched inserts
  (1000 rows per INSERT ... SELECT FROM unnest, the documented plain-SQL writer) into the
  inbox table versus the same into the plain table;
- claim + mark: inbox_claim(batch 10) + inbox_mark_processed() per message, one transaction
  per batch, at 1/2/4 workers, versus SELECT ... FOR UPDATE SKIP LOCKED LIMIT 10 + one
  UPDATE per batch on the plain table;
- ordering at 1M messages across 10K aggregates: next_<inbox> and inbox_ordering_gaps()
  (a) with 1M pending messages, (b) with 1M processed rows of history and 10K pending, next
  to the "lowest pending sequence per aggregate" view (DISTINCT ON) of the designs we
  compete with (which is wrong: it skips gaps and dead letters, see docs/inbox.md);
- inbox_health at 1M rows, both shapes.

Usage: python bench/inbox_bench.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
       [--messages 20000] [--big 1000000] [--aggregates 10000] [--repeat 5] [--quick]
The DSN's user must be allowed to CREATE DATABASE; pg_mailbox must be installed
(`make install`). --quick shrinks every size (a smoke run, numbers not comparable).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

PLAIN_TABLE = """
CREATE TABLE public.plain_inbox (
    event_id text PRIMARY KEY, event_type text, source text, aggregate_id text,
    sequence_num bigint, priority smallint, payload jsonb, headers jsonb, trace_id text,
    received_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz, error text,
    retry_count int NOT NULL DEFAULT 0
);
CREATE INDEX plain_pending_idx ON public.plain_inbox (received_at) WHERE processed_at IS NULL;
CREATE INDEX plain_processed_idx ON public.plain_inbox (processed_at)
    WHERE processed_at IS NOT NULL
"""


def connect(dsn, autocommit=True):
    return psycopg.connect(dsn, autocommit=autocommit)


def timed(fn):
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run_threads(n, target):
    barrier = threading.Barrier(n)
    errors = []

    def wrapped(i):
        try:
            barrier.wait()
            target(i)
        except Exception as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def median_ms(db, sql, repeat):
    db.execute(sql)  # warm the cache and the plan
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        db.execute(sql).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def message_ids(n, duplicates=0.2):
    """n ids of which a fraction repeat an earlier one (a redelivering broker)."""
    unique = int(n * (1 - duplicates))
    ids = [f"m-{i}" for i in range(unique)]
    ids += [f"m-{i * 7 % unique}" for i in range(n - unique)]
    # interleave the duplicates with new ids
    ids.sort(key=lambda x: hash(x) % 1000)
    return ids


# ---------------------------------------------------------------- receive
def bench_receive(dsn, n):
    ids = message_ids(n)
    results = []
    with connect(dsn) as db:
        db.execute("SELECT mailbox.drop_inbox('rcv', true, true)")
        db.execute("SELECT mailbox.create_inbox('rcv')")
        db.execute("DROP TABLE IF EXISTS public.plain_inbox")
        db.execute(PLAIN_TABLE)

        def mailbox_calls():
            with db.cursor() as cur:
                for i in ids:
                    cur.execute(
                        "SELECT mailbox.inbox_receive('rcv', %s, '{\"n\": 1}', 'bench')", [i]
                    )

        def plain_calls():
            with db.cursor() as cur:
                for i in ids:
                    cur.execute(
                        "INSERT INTO public.plain_inbox (event_id, payload, event_type)"
                        " VALUES (%s, '{\"n\": 1}', 'bench') ON CONFLICT (event_id) DO NOTHING",
                        [i],
                    )

        base = timed(plain_calls)
        ours = timed(mailbox_calls)
        assert db.execute("SELECT count(*) FROM mailbox.rcv").fetchone()[0] == len(set(ids))
        results.append(("receive, 1 call/msg, 20% dup", n / ours, n / base, None))

        db.execute("TRUNCATE mailbox.rcv, public.plain_inbox")
        batches = [ids[i : i + 1000] for i in range(0, len(ids), 1000)]

        def batched(table):
            def run():
                for batch in batches:
                    db.execute(
                        f"INSERT INTO {table} (event_id, payload, event_type)"
                        " SELECT DISTINCT ON (x) x, '{\"n\": 1}', 'bench' FROM unnest(%s::text[]) x"
                        " ON CONFLICT (event_id) DO NOTHING",
                        [batch],
                    )

            return run

        base = timed(batched("public.plain_inbox"))
        ours = timed(batched("mailbox.rcv"))
        results.append(("batched INSERT 1000/stmt, 20% dup", n / ours, n / base, None))
        db.execute("SELECT mailbox.drop_inbox('rcv', false, true)")
        db.execute("DROP TABLE public.plain_inbox")
    return results


# ---------------------------------------------------------------- claim + mark
def fill(db, table, n):
    db.execute(
        f"INSERT INTO {table} (event_id, payload, event_type)"
        " SELECT 'c-' || g, jsonb_build_object('n', g), 'bench' FROM generate_series(1, %s::int) g",
        [n],
    )
    db.execute(f"VACUUM ANALYZE {table}")


def mailbox_worker(dsn, inbox):
    def work(i):
        with connect(dsn, autocommit=False) as conn:
            while True:
                got = conn.execute(
                    "SELECT event_id FROM mailbox.inbox_claim(%s, %s, 10)", [inbox, f"w{i}"]
                ).fetchall()
                if not got:
                    conn.commit()
                    return
                for (event_id,) in got:
                    conn.execute("SELECT mailbox.inbox_mark_processed(%s, %s)", [inbox, event_id])
                conn.commit()

    return work


def plain_worker(dsn, per_message):
    """SKIP LOCKED + UPDATE: one UPDATE per batch, or (per_message) one per message, which
    makes the same number of round trips as claim + one mark call per message."""

    def work(_):
        with connect(dsn, autocommit=False) as conn:
            while True:
                got = conn.execute(
                    "SELECT event_id FROM public.plain_inbox WHERE processed_at IS NULL"
                    " ORDER BY received_at LIMIT 10 FOR UPDATE SKIP LOCKED"
                ).fetchall()
                if not got:
                    conn.commit()
                    return
                ids = [r[0] for r in got]
                for part in [[i] for i in ids] if per_message else [ids]:
                    conn.execute(
                        "UPDATE public.plain_inbox SET processed_at = now()"
                        " WHERE event_id = ANY(%s)",
                        [part],
                    )
                conn.commit()

    return work


def bench_claim(dsn, n):
    results = []
    with connect(dsn) as db:
        for workers in (1, 2, 4):
            base = {}
            for per_message in (False, True):
                db.execute("DROP TABLE IF EXISTS public.plain_inbox")
                db.execute(PLAIN_TABLE)
                fill(db, "public.plain_inbox", n)
                base[per_message] = run_threads(workers, plain_worker(dsn, per_message))
            db.execute("SELECT mailbox.drop_inbox('clm', true, true)")
            db.execute("SELECT mailbox.create_inbox('clm')")
            fill(db, "mailbox.clm", n)
            ours = run_threads(workers, mailbox_worker(dsn, "clm"))
            left = db.execute("SELECT count(*) FROM mailbox.pending_clm").fetchone()[0]
            assert left == 0, left
            results.append(
                (f"claim+mark, {workers} worker(s)", n / ours, n / base[False], n / base[True])
            )
        db.execute("SELECT mailbox.drop_inbox('clm', false, true)")
        db.execute("DROP TABLE public.plain_inbox")
    return results


# ---------------------------------------------------------------- ordering and health at 1M
COMPETITOR_NEXT = """
SELECT count(*) FROM (SELECT DISTINCT ON (aggregate_id) event_id FROM mailbox.{inbox}
                       WHERE processed_at IS NULL AND retry_count < 3
                       ORDER BY aggregate_id, sequence_num) AS x
"""


def load_ordered(db, inbox, big, aggregates, history):
    """big messages over `aggregates` aggregates; with history, all but the last per
    aggregate are processed (state at the last processed one) and one more is pending."""
    per = big // aggregates
    db.execute("SELECT mailbox.drop_inbox(%s, true, true)", [inbox])
    db.execute("SELECT mailbox.create_inbox(%s)", [inbox])
    db.execute("SELECT mailbox.enable_inbox_ordering(%s)", [inbox])
    done = "now()" if history else "NULL"
    for start in range(0, aggregates, 1000):
        db.execute(
            f"INSERT INTO mailbox.{inbox} (event_id, payload, aggregate_id, sequence_num,"
            " received_at, processed_at)"
            " SELECT a || '-' || s, '{}', 'agg-' || a, s, now() - interval '10 minutes', "
            f"{done} FROM generate_series(%s::int, %s::int) a, generate_series(1, %s::int) s",
            [start, min(start + 999, aggregates - 1), per],
        )
    if history:
        key = db.execute(
            "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox]
        ).fetchone()[0]
        db.execute(
            "INSERT INTO mailbox._inbox_aggregate (inbox_key, aggregate_id, last_seq)"
            " SELECT %s, 'agg-' || a, %s FROM generate_series(0, %s::int) a",
            [key, per, aggregates - 1],
        )
        # one pending message per aggregate: the next one, except every 10th aggregate
        # whose next message is missing (a gap right after the last processed message)
        db.execute(
            f"INSERT INTO mailbox.{inbox} (event_id, payload, aggregate_id, sequence_num)"
            " SELECT a || '-n', '{}', 'agg-' || a,"
            " CASE WHEN a %% 10 = 0 THEN %s + 2 ELSE %s + 1 END FROM generate_series(0, %s::int) a",
            [per, per, aggregates - 1],
        )
    else:
        # a hole in every 10th aggregate
        db.execute(
            f"DELETE FROM mailbox.{inbox} WHERE sequence_num = %s"
            " AND substr(aggregate_id, 5)::int %% 10 = 0",
            [per // 2],
        )
    db.execute(f"VACUUM ANALYZE mailbox.{inbox}")


def bench_ordering(dsn, big, aggregates, repeat):
    results = []
    with connect(dsn) as db:
        for inbox, history, label in (
            ("ord_pending", False, f"{big:,} pending"),
            ("ord_history", True, f"{big:,} processed + {aggregates:,} pending"),
        ):
            load_ordered(db, inbox, big, aggregates, history)
            total = db.execute(f"SELECT count(*) FROM mailbox.{inbox}").fetchone()[0]
            heads = db.execute(f"SELECT count(*) FROM mailbox.next_{inbox}").fetchone()[0]
            gaps = db.execute(
                "SELECT count(*) FROM mailbox.inbox_ordering_gaps(%s)", [inbox]
            ).fetchone()[0]
            results.append(
                (
                    f"next_<i>, {label} ({heads:,} heads of {total:,} rows)",
                    median_ms(db, f"SELECT count(*) FROM mailbox.next_{inbox}", repeat),
                    median_ms(db, COMPETITOR_NEXT.format(inbox=inbox), repeat),
                )
            )
            results.append(
                (
                    f"inbox_ordering_gaps, {label} ({gaps:,} gaps)",
                    median_ms(
                        db, f"SELECT count(*) FROM mailbox.inbox_ordering_gaps('{inbox}')", repeat
                    ),
                    None,
                )
            )
            results.append(
                (
                    f"inbox_health, {label}",
                    median_ms(db, f"SELECT mailbox.inbox_health('{inbox}')", repeat),
                    None,
                )
            )
            db.execute("SELECT mailbox.drop_inbox(%s, false, true)", [inbox])
    return results


# ---------------------------------------------------------------- main
def scratch_database(dsn):
    name = f"inbox_bench_{os.getpid()}"
    with connect(dsn) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    bench_dsn = make_conninfo(**params)
    with connect(bench_dsn) as db:
        db.execute("CREATE EXTENSION pg_mailbox CASCADE")
    return name, bench_dsn


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--big", type=int, default=1000000)
    parser.add_argument("--aggregates", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.big, args.aggregates, args.repeat = 2000, 20000, 200, 2
    name, dsn = scratch_database(args.dsn)
    started = time.perf_counter()
    try:
        throughput = bench_receive(dsn, args.messages) + bench_claim(dsn, args.messages)
        latency = bench_ordering(dsn, args.big, args.aggregates, args.repeat)
    finally:
        with connect(args.dsn) as db:
            db.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    print(f"\nthroughput ({args.messages:,} messages; msgs/s, higher is better)")
    print("baseline = plain table, INSERT ... ON CONFLICT / SKIP LOCKED + one UPDATE per batch;")
    print("baseline 2 = SKIP LOCKED + one UPDATE per message (the same round trips as ours)")
    head = f"{'case':<36} {'pg_mailbox':>10} {'baseline':>10} {'ratio':>6}"
    print(head + f" {'baseline 2':>10} {'ratio':>6}")
    for case, ours, base, base2 in throughput:
        line = f"{case:<36} {ours:>10,.0f} {base:>10,.0f} {ours / base:>6.2f}"
        if base2 is not None:
            line += f" {base2:>10,.0f} {ours / base2:>6.2f}"
        print(line)
    print(f"\nlatency at scale (median of {args.repeat}; ms, lower is better; baseline = the")
    print("competitors' 'lowest pending sequence per aggregate' view, which is incorrect)")
    print(f"{'case':<70} {'pg_mailbox':>10} {'baseline':>10}")
    for case, ours, base in latency:
        base_text = "-" if base is None else f"{base:,.1f}"
        print(f"{case:<70} {ours:>10,.1f} {base_text:>10}")
    print(f"\ntotal run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
