"""Inbox benchmark (issue 4): pg_mailbox's inbox against plain-SQL baselines, side by side.

Everything runs in one invocation against one server, in a scratch database created for the
run and dropped afterwards, so every number is read as a ratio to a baseline measured minutes
apart on the same machine:

- receive: inbox_receive() one call per message, 20% duplicates, versus a plain
  INSERT ... ON CONFLICT DO NOTHING into an equivalent table; and inbox_receive_batch()
  with 1000 messages per call versus 1000 rows per INSERT ... SELECT FROM unnest ... ON
  CONFLICT DO NOTHING (the documented plain-SQL writer) into the plain table;
- claim + mark, one transaction per batch, at 1/2/4 workers: inbox_claim(batch 100) + one
  inbox_mark_processed(text[]) versus SELECT ... FOR UPDATE SKIP LOCKED LIMIT 100 + one
  UPDATE per batch; inbox_claim(batch 10) + inbox_mark_processed() per message versus
  SKIP LOCKED LIMIT 10 + one UPDATE ... WHERE event_id = <the id> per message (the same
  round trips; each side passes one id, not an array); both sides fetch
  the same eleven message columns (inbox_claim's lease_until is not fetched); and both
  forms at 1 worker draining --messages out of a --backlog of pending messages (300,000 by
  default), loaded before the clock on both sides: a claim's plan is costed by the backlog;
- claim 10 + batch mark at 1 worker draining --messages / 4 behind --in-flight (4,000)
  messages in flight at the head of the queue, which every claim passes over: ours leased by
  another worker's committed claim (600 s), the baseline's locked by another worker's open
  SKIP LOCKED transaction, both set up before the clock;
- the ceiling of a function API: the baseline's statements, each through a SECURITY DEFINER
  PL/pgSQL function with a pinned search_path that runs only that statement
  (bench/inbox_ceiling.sql), against the statements: the single receive; claim 10 + a mark
  per message with the mark wrapped, and with the claim wrapped too; claim 100 + batch mark
  with both wrapped (1 worker): what no function API can pass;
- throughput cases run --rounds times, ours and the baseline interleaved;
- the same two receive cases on an ordered inbox (200 aggregates), against a plain table
  with the same ordering index: what ordering and its gap bookkeeping add to receiving;
- ordering at 1M messages across 10K aggregates: (a) 1M pending messages *received through
  inbox_receive_batch* (1000 per call, so the receive pays the gap bookkeeping, nothing is
  prepared before the clock): inbox_ordering_gaps() and inbox_health() on the first call
  after the load, then each after 1000 more messages arrived (the steady state of an inbox
  read every so often), then with nothing new; the gaps_<inbox> view (the scan of every
  unprocessed message) is the baseline; next_<inbox> next to the "lowest pending sequence
  per aggregate" view (DISTINCT ON) of the designs we compete with (which is wrong: it skips
  gaps and dead letters, see docs/inbox.md); (b) 1M processed rows of history and 10K
  pending, loaded by plain INSERTs;
- a verdict on the issue 11 target: inbox_ordering_gaps and inbox_health at 1M pending at
  most 100 ms (the steady-state medians; the first call after the load is printed beside).

Usage: python bench/inbox_bench.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
       [--messages 20000] [--backlog 300000] [--in-flight 4000] [--big 1000000]
       [--aggregates 10000]
       [--repeat 5] [--rounds 3]
       [--only throughput|latency] [--quick]
The DSN's user must be allowed to CREATE DATABASE; pg_mailbox must be installed
(`make install`). --quick shrinks every size (a smoke run, numbers not comparable).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb

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


# The baseline's per-call statements (the receive, and the per-message mark of a claim of 10).
PLAIN_RECEIVE = (
    "INSERT INTO public.plain_inbox (event_id, payload, event_type)"
    " VALUES (%s, '{\"n\": 1}', 'bench') ON CONFLICT (event_id) DO NOTHING"
)
PLAIN_MARK = "UPDATE public.plain_inbox SET processed_at = now() WHERE event_id = %s"
# pg_mailbox's: the inbox name, then the id.
MAILBOX_RECEIVE = "SELECT mailbox.inbox_receive(%s, %s, '{\"n\": 1}', 'bench')"


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
def rounds(cases, repeat):
    """Runs each (label, ours, baseline) case `repeat` times, interleaved (ours and baseline
    alternate, and which goes first alternates by round); each callable returns msgs/s.
    Returns (label, median ours, median baseline, median of the per-round ratios)."""
    got = {label: ([], []) for label, _, _ in cases}
    for r in range(repeat):
        for label, ours, base in cases:
            pair = [(0, ours), (1, base)] if r % 2 == 0 else [(1, base), (0, ours)]
            for slot, fn in pair:
                got[label][slot].append(fn())
    return [
        (
            label,
            statistics.median(o),
            statistics.median(b),
            statistics.median(x / y for x, y in zip(o, b, strict=True)),
        )
        for label, (o, b) in got.items()
    ]


def bench_receive(dsn, n, repeat):
    ids = message_ids(n)
    unique = len(set(ids))
    batches = [ids[i : i + 1000] for i in range(0, len(ids), 1000)]
    db = connect(dsn)
    db.execute("SELECT mailbox.drop_inbox('rcv', true, true)")
    db.execute("SELECT mailbox.create_inbox('rcv')")
    db.execute("DROP TABLE IF EXISTS public.plain_inbox")
    db.execute(PLAIN_TABLE)

    def fresh(table):
        db.execute(f"TRUNCATE {table}")
        db.execute(f"VACUUM ANALYZE {table}")

    def check(table):
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == unique

    def mailbox_calls():
        fresh("mailbox.rcv")
        with db.cursor() as cur:
            took = timed(lambda: [cur.execute(MAILBOX_RECEIVE, ["rcv", i]) for i in ids])
        check("mailbox.rcv")
        return n / took

    def plain_calls():
        fresh("public.plain_inbox")
        with db.cursor() as cur:
            took = timed(lambda: [cur.execute(PLAIN_RECEIVE, [i]) for i in ids])
        check("public.plain_inbox")
        return n / took

    # the batch form takes the messages as json (the relay's shape); the baseline ships the
    # same values as arrays, through the documented plain-SQL writer
    payloads = [
        [{"p_event_id": i, "p_payload": {"n": 1}, "p_event_type": "bench"} for i in b]
        for b in batches
    ]

    def mailbox_batch():
        fresh("mailbox.rcv")
        took = timed(
            lambda: [
                db.execute(
                    "SELECT count(*) FROM mailbox.inbox_receive_batch('rcv', %s)", [Jsonb(b)]
                )
                for b in payloads
            ]
        )
        check("mailbox.rcv")
        return n / took

    def plain_batch():
        fresh("public.plain_inbox")
        took = timed(
            lambda: [
                db.execute(
                    "INSERT INTO public.plain_inbox (event_id, payload, event_type)"
                    " SELECT DISTINCT ON (x.i) x.i, x.p, x.t"
                    " FROM unnest(%s::text[], %s::jsonb[], %s::text[]) AS x (i, p, t)"
                    " ON CONFLICT (event_id) DO NOTHING",
                    [b, [Jsonb({"n": 1})] * len(b), ["bench"] * len(b)],
                )
                for b in batches
            ]
        )
        check("public.plain_inbox")
        return n / took

    # the same on an ordered inbox (200 aggregates, each message the next sequence of its
    # aggregate), against a plain table with the same ordering index: what the ordering (and
    # its gap bookkeeping, docs/inbox.md#how-gaps-are-kept) adds to the receive path
    db.execute("SELECT mailbox.drop_inbox('rcvo', true, true)")
    db.execute("SELECT mailbox.create_inbox('rcvo')")
    db.execute("SELECT mailbox.enable_inbox_ordering('rcvo')")
    db.execute("DROP TABLE IF EXISTS public.plain_ordered")
    db.execute(PLAIN_TABLE.replace("plain_inbox", "plain_ordered").replace("plain_", "plain_o_"))
    db.execute(
        "CREATE INDEX plain_o_ordering_idx ON public.plain_o_ordered (aggregate_id, sequence_num)"
        " INCLUDE (received_at) WHERE processed_at IS NULL"
    )

    def agg_seq(i):
        k = int(i[2:])
        return f"a-{k % 200}", k // 200 + 1

    ordered_payloads = [
        [
            {
                "p_event_id": i,
                "p_payload": {"n": 1},
                "p_event_type": "bench",
                "p_aggregate_id": agg_seq(i)[0],
                "p_sequence_num": agg_seq(i)[1],
            }
            for i in b
        ]
        for b in batches
    ]

    def ordered_calls():
        fresh("mailbox.rcvo")
        with db.cursor() as cur:
            took = timed(
                lambda: [
                    cur.execute(
                        "SELECT mailbox.inbox_receive('rcvo', %s, '{\"n\": 1}', 'bench',"
                        " NULL, %s, %s)",
                        [i, *agg_seq(i)],
                    )
                    for i in ids
                ]
            )
        check("mailbox.rcvo")
        return n / took

    def plain_ordered_calls():
        fresh("public.plain_o_ordered")
        with db.cursor() as cur:
            took = timed(
                lambda: [
                    cur.execute(
                        "INSERT INTO public.plain_o_ordered (event_id, payload, event_type,"
                        " aggregate_id, sequence_num) VALUES (%s, '{\"n\": 1}', 'bench', %s, %s)"
                        " ON CONFLICT (event_id) DO NOTHING",
                        [i, *agg_seq(i)],
                    )
                    for i in ids
                ]
            )
        check("public.plain_o_ordered")
        return n / took

    def ordered_batch():
        fresh("mailbox.rcvo")
        took = timed(
            lambda: [
                db.execute(
                    "SELECT count(*) FROM mailbox.inbox_receive_batch('rcvo', %s)", [Jsonb(b)]
                )
                for b in ordered_payloads
            ]
        )
        check("mailbox.rcvo")
        return n / took

    def plain_ordered_batch():
        fresh("public.plain_o_ordered")
        took = timed(
            lambda: [
                db.execute(
                    "INSERT INTO public.plain_o_ordered (event_id, payload, event_type,"
                    " aggregate_id, sequence_num)"
                    " SELECT DISTINCT ON (x.i) x.i, x.p, x.t, x.a, x.s"
                    " FROM unnest(%s::text[], %s::jsonb[], %s::text[], %s::text[], %s::bigint[])"
                    " AS x (i, p, t, a, s) ON CONFLICT (event_id) DO NOTHING",
                    [
                        b,
                        [Jsonb({"n": 1})] * len(b),
                        ["bench"] * len(b),
                        [agg_seq(i)[0] for i in b],
                        [agg_seq(i)[1] for i in b],
                    ],
                )
                for b in batches
            ]
        )
        check("public.plain_o_ordered")
        return n / took

    results = rounds(
        [
            ("inbox_receive, 1 call/msg, 20% dup", mailbox_calls, plain_calls),
            ("inbox_receive_batch 1000/call, 20% dup", mailbox_batch, plain_batch),
            ("ordered: inbox_receive, 1 call/msg", ordered_calls, plain_ordered_calls),
            ("ordered: inbox_receive_batch 1000/call", ordered_batch, plain_ordered_batch),
        ],
        repeat,
    )
    db.execute("SELECT mailbox.drop_inbox('rcv', false, true)")
    db.execute("SELECT mailbox.drop_inbox('rcvo', false, true)")
    db.execute("DROP TABLE public.plain_inbox")
    db.execute("DROP TABLE public.plain_o_ordered")
    db.close()
    return results


# ---------------------------------------------------------------- claim + mark
def fill(db, table, n):
    db.execute(
        f"INSERT INTO {table} (event_id, payload, event_type)"
        " SELECT 'c-' || g, jsonb_build_object('n', g), 'bench' FROM generate_series(1, %s::int) g",
        [n],
    )
    db.execute(f"VACUUM ANALYZE {table}")


# The message columns both sides fetch: what inbox_claim returns per message but its
# lease_until, which the baseline has no counterpart for (a worker that marks in the claiming
# transaction, as these do, needs no lease end; decoding one timestamptz per row costs psycopg
# about 0.8 us). The server still computes lease_until; only the client does not read it.
MESSAGE_COLUMNS = (
    "event_id, event_type, source, aggregate_id, sequence_num, priority, payload, headers,"
    " trace_id, retry_count, received_at"
)


def drain_mailbox(conn, inbox, worker, batch, per_message, batches=None):
    """inbox_claim(batch) then inbox_mark_processed per message, or once for the batch (the
    text[] form); one transaction per batch, until nothing is left to claim (or after
    `batches` batches)."""
    while batches is None or batches > 0:
        if batches is not None:
            batches -= 1
        # the whole messages, as a consumer reads them (the baseline reads the same)
        got = conn.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM mailbox.inbox_claim(%s, %s, %s)",
            [inbox, worker, batch],
        ).fetchall()
        if not got:
            conn.commit()
            return
        if per_message:
            for row in got:
                conn.execute("SELECT mailbox.inbox_mark_processed(%s, %s)", [inbox, row[0]])
        else:
            conn.execute(
                "SELECT mailbox.inbox_mark_processed(%s, %s::text[])",
                [inbox, [r[0] for r in got]],
            )
        conn.commit()


def drain_plain(
    conn,
    batch,
    per_message,
    mark=PLAIN_MARK,
    batches=None,
    table="public.plain_inbox",
    claim=None,
    batch_mark=None,
):
    """SKIP LOCKED + UPDATE: one UPDATE per batch, or (per_message) one per message, which
    makes the same number of round trips as claim + one mark call per message (`mark`, the
    per-message statement, takes the id); until nothing is left (or after `batches`
    batches). `claim` (takes the batch size, returns MESSAGE_COLUMNS) and `batch_mark`
    (takes the ids) replace the claim and the per-batch UPDATE (the ceiling's wrappers)."""
    claim = claim or (
        f"SELECT {MESSAGE_COLUMNS} FROM {table} WHERE processed_at IS NULL"
        " ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    batch_mark = batch_mark or f"UPDATE {table} SET processed_at = now() WHERE event_id = ANY(%s)"
    while batches is None or batches > 0:
        if batches is not None:
            batches -= 1
        got = conn.execute(claim, [batch]).fetchall()
        if not got:
            conn.commit()
            return
        ids = [r[0] for r in got]
        if per_message:
            # one id, as a hand-written worker marks one message (and as
            # inbox_mark_processed takes it): a one-element array costs the client
            # an array adaptation per call, about a fifth of this loop's rate
            for i in ids:
                conn.execute(mark, [i])
        else:
            conn.execute(batch_mark, [ids])
        conn.commit()


def mailbox_worker(dsn, inbox, batch, per_message):
    def work(i):
        with connect(dsn, autocommit=False) as conn:
            drain_mailbox(conn, inbox, f"w{i}", batch, per_message)

    return work


def plain_worker(dsn, batch, per_message, mark=PLAIN_MARK, **statements):
    def work(_):
        with connect(dsn, autocommit=False) as conn:
            drain_plain(conn, batch, per_message, mark, **statements)

    return work


def bench_claim(dsn, n, repeat, backlog, in_flight):
    db = connect(dsn)
    db.execute("SELECT mailbox.drop_inbox('clm', true, true)")
    db.execute("SELECT mailbox.create_inbox('clm')")
    db.execute("DROP TABLE IF EXISTS public.plain_inbox")
    db.execute(PLAIN_TABLE)

    def ours(workers, batch, per_message):
        def run():
            db.execute("TRUNCATE mailbox.clm")
            db.execute("DELETE FROM mailbox._inbox_lease")
            fill(db, "mailbox.clm", n)
            took = run_threads(workers, mailbox_worker(dsn, "clm", batch, per_message))
            left = db.execute("SELECT count(*) FROM mailbox.pending_clm").fetchone()[0]
            assert left == 0, left
            return n / took

        return run

    def plain(workers, batch, per_message):
        def run():
            db.execute("TRUNCATE public.plain_inbox")
            fill(db, "public.plain_inbox", n)
            return n / run_threads(workers, plain_worker(dsn, batch, per_message))

        return run

    # n messages drained out of a backlog of `backlog` pending ones, which both sides load
    # before the clock (the claim's generic plan is costed by the pending rows: above some
    # 120,000 of them it passed jit_above_cost, and every claim was JIT-compiled again)
    def from_backlog(table, drain, batch):
        def run():
            db.execute(f"TRUNCATE {table}")
            db.execute("DELETE FROM mailbox._inbox_lease")
            fill(db, table, backlog)
            with connect(dsn, autocommit=False) as conn:
                took = timed(lambda: drain(conn, n // batch))
            done = db.execute(
                f"SELECT count(*) FROM {table} WHERE processed_at IS NOT NULL"
            ).fetchone()[0]
            assert done == n // batch * batch, done
            return done / took

        return run

    # Messages in flight at the head of the queue: another worker holds `in_flight` of the
    # oldest while one worker drains n / 4 behind them (claim 10 + batch mark), every claim
    # passing over them. Ours are leased (claimed with a 600 s lease, then committed: the
    # two-transaction pattern); the baseline's are locked by an open SKIP LOCKED transaction
    # (a plain table's only way to hold messages). Both are set up before the clock, alike.
    drained = n // 4

    def past_in_flight(table, hold, drain):
        def run():
            db.execute(f"TRUNCATE {table}")
            db.execute("DELETE FROM mailbox._inbox_lease")
            fill(db, table, in_flight + drained)
            with connect(dsn, autocommit=False) as holder:
                assert hold(holder) == in_flight
                with connect(dsn, autocommit=False) as conn:
                    took = timed(lambda: drain(conn, drained // 10))
                holder.rollback()
            done = db.execute(
                f"SELECT count(*) FROM {table} WHERE processed_at IS NOT NULL"
            ).fetchone()[0]
            assert done == drained // 10 * 10, done
            return done / took

        return run

    def lease(holder):
        got = holder.execute(
            "SELECT count(*) FROM mailbox.inbox_claim('clm', 'holder', %s, 600)", [in_flight]
        ).fetchone()[0]
        holder.commit()
        return got

    def lock(holder):
        return len(
            holder.execute(
                "SELECT event_id FROM public.plain_inbox WHERE processed_at IS NULL"
                " ORDER BY received_at LIMIT %s FOR UPDATE SKIP LOCKED",
                [in_flight],
            ).fetchall()
        )

    cases = []
    for workers in (1, 2, 4):
        cases.append(
            (
                f"claim 100 + batch mark, {workers} worker(s)",
                ours(workers, 100, False),
                plain(workers, 100, False),
            )
        )
    for workers in (1, 2, 4):
        cases.append(
            (
                f"claim 10 + mark per msg, {workers} worker(s)",
                ours(workers, 10, True),
                plain(workers, 10, True),
            )
        )
    for batch, per_message, label in ((100, False, "batch mark"), (10, True, "mark per msg")):
        cases.append(
            (
                f"claim {batch} + {label}, of {backlog:,} pending",
                from_backlog(
                    "mailbox.clm",
                    lambda c, k, b=batch, p=per_message: drain_mailbox(c, "clm", "w0", b, p, k),
                    batch,
                ),
                from_backlog(
                    "public.plain_inbox",
                    lambda c, k, b=batch, p=per_message: drain_plain(c, b, p, batches=k),
                    batch,
                ),
            )
        )
    cases.append(
        (
            f"claim 10 + batch mark, past {in_flight:,} in flight",
            past_in_flight(
                "mailbox.clm",
                lease,
                lambda c, k: drain_mailbox(c, "clm", "w0", 10, False, k),
            ),
            past_in_flight(
                "public.plain_inbox", lock, lambda c, k: drain_plain(c, 10, False, batches=k)
            ),
        )
    )
    results = rounds(cases, repeat)
    db.execute("SELECT mailbox.drop_inbox('clm', false, true)")
    db.execute("DROP TABLE public.plain_inbox")
    db.close()
    return results


# ---------------------------------------------------------------- ceiling of a function API
# The SECURITY DEFINER wrappers that run only the baseline's own statements (their file says
# why); bench/inbox_receive_pgbench.sh uses the same file.
CEILING_FUNCTIONS = (Path(__file__).resolve().parent / "inbox_ceiling.sql").read_text()


def bench_ceiling(dsn, n, repeat):
    ids = message_ids(n)
    db = connect(dsn)
    db.execute("DROP TABLE IF EXISTS public.plain_inbox")
    db.execute(PLAIN_TABLE)
    db.execute(CEILING_FUNCTIONS)

    def receives(sql):
        def run():
            db.execute("TRUNCATE public.plain_inbox")
            db.execute("VACUUM ANALYZE public.plain_inbox")
            with db.cursor() as cur:
                took = timed(lambda: [cur.execute(sql, [i]) for i in ids])
            return n / took

        return run

    def drains(batch, per_message, **statements):
        def run():
            db.execute("TRUNCATE public.plain_inbox")
            fill(db, "public.plain_inbox", n)
            took = run_threads(1, plain_worker(dsn, batch, per_message, **statements))
            left = db.execute(
                "SELECT count(*) FROM public.plain_inbox WHERE processed_at IS NULL"
            ).fetchone()[0]
            assert left == 0, left
            return n / took

        return run

    claim = f"SELECT {MESSAGE_COLUMNS} FROM public.ceiling_claim(%s)"
    results = rounds(
        [
            (
                "receive, 1 call/msg, 20% dup",
                receives("SELECT public.ceiling_receive(%s)"),
                receives(PLAIN_RECEIVE),
            ),
            # the mark wrapped, the claim the baseline's own statement (the bound of the
            # mark alone; earlier runs printed this row as "..., 1 worker(s)")
            (
                "claim 10 + mark per msg, mark wrapped",
                drains(10, True, mark="SELECT public.ceiling_mark(%s)"),
                drains(10, True),
            ),
            # both wrapped, as inbox_claim and inbox_mark_processed are both functions:
            # the bound of the API
            (
                "claim 10 + mark per msg, both wrapped",
                drains(10, True, mark="SELECT public.ceiling_mark(%s)", claim=claim),
                drains(10, True),
            ),
            (
                "claim 100 + batch mark, both wrapped",
                drains(100, False, claim=claim, batch_mark="SELECT public.ceiling_mark_batch(%s)"),
                drains(100, False),
            ),
        ],
        repeat,
    )
    db.execute(
        "DROP FUNCTION public.ceiling_receive(text), public.ceiling_mark(text),"
        " public.ceiling_claim(int), public.ceiling_mark_batch(text[])"
    )
    db.execute("DROP TABLE public.plain_inbox")
    db.close()
    return results


# ---------------------------------------------------------------- ordering and health at 1M
COMPETITOR_NEXT = """
SELECT count(*) FROM (SELECT DISTINCT ON (aggregate_id) event_id FROM mailbox.{inbox}
                       WHERE processed_at IS NULL AND retry_count < 3
                       ORDER BY aggregate_id, sequence_num) AS x
"""


def load_history(db, inbox, big, aggregates):
    """big processed messages over `aggregates` aggregates (state at the last processed one)
    and one more pending per aggregate, except every 10th aggregate whose next message is
    missing (a gap right after the last processed message). Loaded by plain INSERTs."""
    per = big // aggregates
    db.execute("SELECT mailbox.drop_inbox(%s, true, true)", [inbox])
    db.execute("SELECT mailbox.create_inbox(%s)", [inbox])
    db.execute("SELECT mailbox.enable_inbox_ordering(%s)", [inbox])
    for start in range(0, aggregates, 1000):
        db.execute(
            f"INSERT INTO mailbox.{inbox} (event_id, payload, aggregate_id, sequence_num,"
            " received_at, processed_at)"
            " SELECT a || '-' || s, '{}', 'agg-' || a, s, now() - interval '10 minutes', now()"
            " FROM generate_series(%s::int, %s::int) a, generate_series(1, %s::int) s",
            [start, min(start + 999, aggregates - 1), per],
        )
    key = db.execute(
        "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox]
    ).fetchone()[0]
    db.execute(
        "INSERT INTO mailbox._inbox_aggregate (inbox_key, aggregate_id, last_seq)"
        " SELECT %s, 'agg-' || a, %s FROM generate_series(0, %s::int) a",
        [key, per, aggregates - 1],
    )
    db.execute(
        f"INSERT INTO mailbox.{inbox} (event_id, payload, aggregate_id, sequence_num)"
        " SELECT a || '-n', '{}', 'agg-' || a,"
        " CASE WHEN a %% 10 = 0 THEN %s + 2 ELSE %s + 1 END FROM generate_series(0, %s::int) a",
        [per, per, aggregates - 1],
    )
    db.execute(f"VACUUM ANALYZE mailbox.{inbox}")


def ordered_batch(seqs):
    """One inbox_receive_batch argument: a message per (aggregate number, sequence)."""
    return Jsonb(
        [
            {
                "p_event_id": f"{a}-{s}",
                "p_payload": {},
                "p_aggregate_id": f"agg-{a}",
                "p_sequence_num": s,
            }
            for a, s in seqs
        ]
    )


def receive_backlog(db, inbox, big, aggregates):
    """big pending messages over `aggregates` aggregates, received the way users receive them:
    inbox_receive_batch, 1000 messages per call, in arrival order (sequence 1 of every
    aggregate, then sequence 2, ...), so every call touches 1000 aggregates. Every 10th
    aggregate never gets its middle message (a hole). Returns the receive rate (msgs/s)."""
    per = big // aggregates
    hole = per // 2
    db.execute("SELECT mailbox.drop_inbox(%s, true, true)", [inbox])
    db.execute("SELECT mailbox.create_inbox(%s)", [inbox])
    db.execute("SELECT mailbox.enable_inbox_ordering(%s)", [inbox])
    sent = 0
    started = time.perf_counter()
    for s in range(1, per + 1):
        for start in range(0, aggregates, 1000):
            seqs = [
                (a, s)
                for a in range(start, min(start + 1000, aggregates))
                if not (s == hole and a % 10 == 0)
            ]
            db.execute(
                "SELECT count(*) FROM mailbox.inbox_receive_batch(%s, %s)",
                [inbox, ordered_batch(seqs)],
            )
            sent += len(seqs)
    return sent / (time.perf_counter() - started)


def once_ms(db, sql):
    started = time.perf_counter()
    db.execute(sql).fetchall()
    return (time.perf_counter() - started) * 1000


def bench_ordering(dsn, big, aggregates, repeat):
    """Returns latency rows (case, ms, baseline ms or None) and the backlog receive rate."""
    results = []
    per = big // aggregates
    with connect(dsn) as db:
        # (a) the pending backlog, received through the API (its receive pays for the gap
        # bookkeeping); no VACUUM or ANALYZE before the clock: what autovacuum did is what
        # a user would have
        inbox = "ord_pending"
        rate = receive_backlog(db, inbox, big, aggregates)
        label = f"{big:,} pending"
        gaps_sql = f"SELECT count(*) FROM mailbox.inbox_ordering_gaps('{inbox}')"
        health_sql = f"SELECT mailbox.inbox_health('{inbox}')"
        scan_sql = f"SELECT count(*) FROM mailbox.gaps_{inbox}"  # the scan of every message
        first = once_ms(db, gaps_sql)  # folds the whole backlog
        gaps = db.execute(gaps_sql).fetchone()[0]
        results.append((f"inbox_ordering_gaps, {label}: first call after the load", first, None))
        # steady state: before each timed call, 1000 new messages (the next sequence of 1000
        # aggregates, one in ten skipping one: new holes) arrive through inbox_receive_batch
        after_gaps, after_health, nxt = [], [], {}
        for i in range(repeat * 2):
            chunk = range((i * 1000) % aggregates, (i * 1000) % aggregates + 1000)
            seqs = []
            for a in chunk:
                a %= aggregates
                nxt[a] = nxt.get(a, per + 1) + (1 if a % 10 == 3 else 0)
                seqs.append((a, nxt[a]))
                nxt[a] += 1
            db.execute(
                "SELECT count(*) FROM mailbox.inbox_receive_batch(%s, %s)",
                [inbox, ordered_batch(seqs)],
            )
            (after_gaps if i % 2 == 0 else after_health).append(
                once_ms(db, gaps_sql if i % 2 == 0 else health_sql)
            )
        gaps_now = db.execute(gaps_sql).fetchone()[0]
        scan = median_ms(db, scan_sql, repeat)
        results.append(
            (
                f"inbox_ordering_gaps, {label}, 1000 new msgs before each"
                f" ({gaps:,}->{gaps_now:,} gaps)",
                statistics.median(after_gaps),
                scan,
            )
        )
        results.append(
            (f"inbox_ordering_gaps, {label}, nothing new", median_ms(db, gaps_sql, repeat), scan)
        )
        results.append(
            (
                f"inbox_health, {label}, 1000 new msgs before each",
                statistics.median(after_health),
                None,
            )
        )
        results.append(
            (f"inbox_health, {label}, nothing new", median_ms(db, health_sql, repeat), None)
        )
        heads = db.execute(f"SELECT count(*) FROM mailbox.next_{inbox}").fetchone()[0]
        total = db.execute(f"SELECT count(*) FROM mailbox.{inbox}").fetchone()[0]
        results.append(
            (
                f"next_<i>, {label} ({heads:,} heads of {total:,} rows)",
                median_ms(db, f"SELECT count(*) FROM mailbox.next_{inbox}", repeat),
                median_ms(db, COMPETITOR_NEXT.format(inbox=inbox), repeat),
            )
        )
        db.execute("SELECT mailbox.drop_inbox(%s, false, true)", [inbox])

        # (b) 1M processed rows of history and 10K pending (loaded by plain INSERTs)
        inbox = "ord_history"
        label = f"{big:,} processed + {aggregates:,} pending"
        load_history(db, inbox, big, aggregates)
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
                median_ms(db, f"SELECT count(*) FROM mailbox.gaps_{inbox}", repeat),
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
    return results, rate


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
    parser.add_argument("--backlog", type=int, default=300000)
    parser.add_argument("--in-flight", type=int, default=4000)
    parser.add_argument("--aggregates", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("throughput", "latency"))
    args = parser.parse_args()
    if args.quick:
        args.messages, args.big, args.aggregates, args.repeat, args.rounds = 2000, 20000, 200, 2, 1
        args.backlog = 5000
        args.in_flight = 400
    name, dsn = scratch_database(args.dsn)
    started = time.perf_counter()
    try:
        throughput, ceiling, latency, backlog_rate = [], [], [], None
        if args.only != "latency":
            throughput = bench_receive(dsn, args.messages, args.rounds)
            throughput += bench_claim(dsn, args.messages, args.rounds, args.backlog, args.in_flight)
            ceiling = bench_ceiling(dsn, args.messages, args.rounds)
        if args.only != "throughput":
            latency, backlog_rate = bench_ordering(dsn, args.big, args.aggregates, args.repeat)
    finally:
        with connect(args.dsn) as db:
            db.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    if throughput:
        print(f"\nthroughput ({args.messages:,} messages; msgs/s, higher is better; medians of")
        print(f"{args.rounds} interleaved rounds, ratio = median of the per-round ratios)")
        print("baseline: INSERT ... ON CONFLICT DO NOTHING one row per statement, or 1000 rows per")
        print(
            "INSERT ... SELECT FROM unnest; SELECT ... FOR UPDATE SKIP LOCKED LIMIT <batch> + one"
        )
        print("UPDATE per batch (batch mark) or one UPDATE ... WHERE event_id = <id> per message")
        print(f"{'case':<44} {'pg_mailbox':>10} {'baseline':>10} {'ratio':>6}")
        for case, ours, base, ratio in throughput:
            print(f"{case:<44} {ours:>10,.0f} {base:>10,.0f} {ratio:>6.2f}")
    if ceiling:
        print("\nceiling of a function API (interleaved rounds of its own): a SECURITY DEFINER")
        print("PL/pgSQL function with a pinned search_path running only the baseline's statement")
        print("(bench/inbox_ceiling.sql), against that statement; no lookup, check or dispatch, so")
        print("inbox_receive, inbox_claim and inbox_mark_processed cannot pass it. 'mark wrapped':")
        print("the claim is the baseline's own statement; 'both wrapped': the claim too, as")
        print("inbox_claim is a function: the bound of the API")
        print(f"{'case':<40} {'wrapper':>10} {'baseline':>10} {'ratio':>6}")
        for case, ours, base, ratio in ceiling:
            print(f"{case:<40} {ours:>10,.0f} {base:>10,.0f} {ratio:>6.2f}")
    if latency:
        print(f"\nlatency at scale (median of {args.repeat}; ms, lower is better; baseline: for")
        print("next_<i> the competitors' 'lowest pending sequence per aggregate' view, which is")
        print("incorrect; for inbox_ordering_gaps the gaps_<i> view, which scans every message)")
        if backlog_rate is not None:
            print(
                f"backlog received with inbox_receive_batch 1000/call: {backlog_rate:,.0f} msgs/s"
            )
        print(f"{'case':<90} {'pg_mailbox':>10} {'baseline':>10}")
        for case, ours, base in latency:
            base_text = "-" if base is None else f"{base:,.1f}"
            print(f"{case:<90} {ours:>10,.1f} {base_text:>10}")
    verdicts = [(case, ms) for case, ms, _ in latency if "1000 new msgs before each" in case]
    if verdicts:
        print(
            "\ntarget (issue 11): at most 100 ms at 1,000,000 pending; this run:"
            f" {args.big:,} pending, 1000 new messages before each call"
        )
        for case, ms in verdicts:
            name = case.split(",")[0]
            print(f"{name:<22} {ms:>10,.1f} ms  {'met' if ms <= 100 else 'NOT MET'}")
    print(f"\ntotal run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
