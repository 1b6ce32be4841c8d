"""Backend CPU per message (issue 11): the inbox's per-call API against its plain-SQL
baselines, counted in the server backend's CPU time instead of wall-clock time.

Why a second inbox benchmark: with synchronous_commit on, a single-statement transaction
waits for a WAL fsync, and on a machine whose fsync takes 300-700 us and varies by the
minute (docs/benchmarks.md) that wait decides the wall-clock ratios of bench/inbox_bench.py.
This benchmark reads what the backend itself spends, which the disk does not blur:
`/proc/<backend pid>/schedstat` (nanoseconds on a CPU) before and after each round, so the
server must run on this machine. Every connection sets synchronous_commit = off (the commit
record is still written, the backend does not wait for its flush); both sides pay it alike.

Cases, each variant on a connection of its own, the same statements and round trips as
bench/inbox_bench.py:
- receive, one autocommit call per message, 20% duplicates: INSERT ... ON CONFLICT DO
  NOTHING (the baseline), the ceiling wrapper (bench/inbox_ceiling.sql: a SECURITY DEFINER
  function running only that INSERT, what no function API can beat) and inbox_receive into a
  managed inbox;
- claim 10 + mark per message, one worker, one transaction per batch, starting from rows no
  one has claimed: SELECT ... FOR UPDATE SKIP LOCKED LIMIT 10 + one UPDATE per message (the
  baseline), the same with the ceiling wrapper's UPDATE, the same with the claim wrapped too
  ("ceiling, both wrapped": the bound of an API whose claim is a function as well), and
  inbox_claim + inbox_mark_processed per message; the CPU of the whole drain (claims, marks,
  commits) per message;
- claim 100 + batch mark, one worker: SKIP LOCKED LIMIT 100 + one UPDATE per batch against
  both wrapped (bench/inbox_ceiling.sql's ceiling_claim and ceiling_mark_batch) and
  inbox_claim + inbox_mark_processed(text[]).

Each round truncates and refills the tables (not counted), runs a CHECKPOINT and warms every
variant up (plans and caches, not counted); then the variants take turns every 100 messages
(200 for claim 100), the first of each turn rotating, each variant on its own table, so that
a slow minute of the machine falls on all of them alike (whole-round turns moved a variant by
up to 60% between rounds). With --pin (the default on two or more cores) the client runs on
the first core and the backends on the last. The table gives the median microseconds per
message and the median of the per-round ratios baseline / variant (1.00 = as cheap as the
baseline). Ratios depend on the CPU: on the AMD EPYC machines of earlier sessions they were
higher than on the Intel Xeon of 2026-11-28's second session (docs/benchmarks.md).

--functions adds where the server time of claim 10 + mark per message goes: one worker drains
--messages messages with track_functions = 'all', and the table lists each PL/pgSQL function's
self time per message from pg_stat_user_functions (timing every call adds its own overhead:
read the shares, not the sums).

--statements adds where the server time of both claim cases goes, statement by statement, on
both sides: in a private cluster of its own (pg_stat_statements needs shared_preload_libraries,
which a running server cannot take), one worker drains --messages messages per case and side
with pg_stat_statements.track = 'all', and the table lists each statement that ran at least once
per batch: its execution time per message, its calls per message and whether the client sent
it or the commit's deferred trigger ran it (top) or a function ran it (nested; a nested
statement's time is also in its caller's). The
worker's own backend CPU per message heads each side; the difference between a side's top-level
times and that CPU is what no statement counts (parse, bind, the protocol, the commit).

Usage: python bench/inbox_cpu.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
       [--messages 4000] [--rounds 9] [--functions] [--statements] [--no-pin] [--quick]
The DSN's user must be allowed to CREATE DATABASE; pg_mailbox must be installed. --quick is
a smoke run (tiny sizes; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inbox_bench as ib  # noqa: E402  (the statements, tables and workers it measures)

INBOX = "cpu"
WARM_UP = 50
WARM_BATCHES = 5
# the ceiling wrappers' own table (bench/inbox_ceiling.sql names public.plain_inbox): the
# variants take turns, so each needs a table of its own
CEILING_TABLE = "public.ceiling_inbox"
# a second copy of the wrappers and their table, for the variant that wraps the claim too
WRAPPED = "wrapped"
WRAPPED_TABLE = f"{WRAPPED}.plain_inbox"


# Where the processes run. With the client and the backends free to move between the
# machine's cores, a backend's CPU per message moved by up to 60% from round to round (when
# it shares a core with the client, each switch evicts the other's caches), more than the
# differences measured. With --pin (the default on 2 or more cores) the client runs on the
# first core and every backend on the last one, so each measured backend runs alone on its
# core, only while the client waits for it, alike for every variant.
CLIENT_CPU, BACKEND_CPU = 0, (os.cpu_count() or 1) - 1


class Backend:
    """One connection and the CPU its server backend has used so far."""

    def __init__(self, dsn, autocommit, pin):
        self.conn = ib.connect(dsn, autocommit=autocommit)
        self.conn.execute("SET synchronous_commit = off")
        pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        if not autocommit:
            self.conn.commit()
        self.stat = Path(f"/proc/{pid}/schedstat")
        if not self.stat.exists():
            sys.exit(f"backend {pid} is not on this machine: inbox_cpu.py reads its /proc entry")
        if pin:
            os.sched_setaffinity(pid, {BACKEND_CPU})

    def cpu_ns(self):
        return int(self.stat.read_text().split()[0])

    def close(self):
        self.conn.close()


class Variant:
    """A variant of a case: its backend, a warm-up (plans and caches, before the clock) and
    step(k, count), which handles messages k .. k + count - 1 of the round."""

    def __init__(self, name, backend, warm, step, check=None):
        self.name, self.backend, self.warm, self.step, self.check = name, backend, warm, step, check


def receive_variants(dsn, ids, pin):
    def variant(name, sql, params, table):
        backend = Backend(dsn, autocommit=True, pin=pin)
        cur = backend.conn.cursor()

        def warm():
            for i in range(WARM_UP):  # on ids the round never uses
                cur.execute(sql, params(f"warm-{i}"))

        def step(k, count):
            for i in ids[k : k + count]:
                cur.execute(sql, params(i))

        def check():  # every variant stored the same messages, each once
            stored = backend.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            assert stored == len(set(ids)) + WARM_UP, f"{stored} rows in {table}"

        return Variant(name, backend, warm, step, check)

    return [
        variant("INSERT ... ON CONFLICT", ib.PLAIN_RECEIVE, lambda i: [i], "public.plain_inbox"),
        variant(
            "ceiling wrapper", "SELECT public.ceiling_receive(%s)", lambda i: [i], CEILING_TABLE
        ),
        variant("inbox_receive", ib.MAILBOX_RECEIVE, lambda i: [INBOX, i], f"mailbox.{INBOX}"),
    ]


def claim_variants(dsn, batch, per_message, pin):
    def variant(name, drain, table):
        backend = Backend(dsn, autocommit=False, pin=pin)

        def warm():
            drain(backend.conn, WARM_BATCHES)

        def step(_k, count):
            drain(backend.conn, count // batch)

        def check():
            left = backend.conn.execute(
                f"SELECT count(*) FROM {table} WHERE processed_at IS NULL"
            ).fetchone()[0]
            backend.conn.commit()
            assert left == 0, f"{left} messages left unprocessed in {table}"

        return Variant(name, backend, warm, step, check)

    plain = variant(
        "SKIP LOCKED + UPDATE",
        lambda c, b: ib.drain_plain(c, batch, per_message, batches=b),
        "public.plain_inbox",
    )
    ours = variant(
        "inbox_claim + mark",
        lambda c, b: ib.drain_mailbox(c, INBOX, "w", batch, per_message, batches=b),
        f"mailbox.{INBOX}",
    )
    # the claim and the mark both wrapped (inbox_claim is a function too): the bound of the API
    both = variant(
        "ceiling, both wrapped",
        lambda c, b: ib.drain_plain(
            c,
            batch,
            per_message,
            f"SELECT {WRAPPED}.ceiling_mark(%s)",
            batches=b,
            table=WRAPPED_TABLE,
            claim=f"SELECT {ib.MESSAGE_COLUMNS} FROM {WRAPPED}.ceiling_claim(%s)",
            batch_mark=f"SELECT {WRAPPED}.ceiling_mark_batch(%s)",
        ),
        WRAPPED_TABLE,
    )
    if not per_message:
        return [plain, both, ours]
    wrapper = variant(
        "ceiling wrapper",
        lambda c, b: ib.drain_plain(
            c, batch, True, "SELECT public.ceiling_mark(%s)", batches=b, table=CEILING_TABLE
        ),
        CEILING_TABLE,
    )
    return [plain, wrapper, both, ours]


def wal_lsn(db):
    return db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]


def measure(db, label, variants, rounds, prepare, n, chunk):
    """({variant: [µs per message per round]}, {variant: [WAL bytes per message per round]}).
    In each round the variants take turns every `chunk` messages, the first of each turn
    rotating, so that a slow minute of the machine falls on every variant alike. The WAL
    of a turn is what the server wrote during it (only that variant ran; a background
    process's WAL would count too, on whichever variant it fell)."""
    got = {v.name: [] for v in variants}
    wal = {v.name: [] for v in variants}
    for _ in range(rounds):
        prepare()
        db.execute("CHECKPOINT")
        for v in variants:
            v.warm()
        used = {v.name: 0 for v in variants}
        wrote = {v.name: 0 for v in variants}
        for turn, k in enumerate(range(0, n, chunk)):
            shift = turn % len(variants)
            for v in variants[shift:] + variants[:shift]:
                lsn = wal_lsn(db)
                before = v.backend.cpu_ns()
                v.step(k, chunk)
                used[v.name] += v.backend.cpu_ns() - before
                wrote[v.name] += wal_lsn(db) - lsn
        for v in variants:
            if v.check:
                v.check()
            got[v.name].append(used[v.name] / n / 1000)
            wal[v.name].append(float(wrote[v.name]) / n)
    for v in variants:
        v.backend.close()
    return label, got, wal


def function_times(db, dsn, n):
    """(function, calls, self µs per message) of one claim 10 + mark-per-message drain."""
    db.execute(f"TRUNCATE mailbox.{INBOX}")
    db.execute("DELETE FROM mailbox._inbox_lease")
    ib.fill(db, f"mailbox.{INBOX}", n)
    db.execute("SELECT pg_stat_reset()")
    with ib.connect(dsn, autocommit=False) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SET track_functions = 'all'")
        conn.commit()
        ib.drain_mailbox(conn, INBOX, "w", 10, True)
    db.execute("SELECT pg_stat_force_next_flush()")
    for _ in range(50):  # the worker's statistics reach the shared ones when it exits
        got = db.execute(
            "SELECT funcname, calls, self_time * 1000 / %s FROM pg_stat_user_functions"
            " WHERE self_time > 0 ORDER BY self_time DESC",
            [n],
        ).fetchall()
        if got:
            return got
        time.sleep(0.1)
    raise RuntimeError("no function statistics arrived")


def statement_times(n, pin):
    """[(case, side, backend CPU µs per message, [(µs per message, calls per message, top,
    statement)])] of one drain per case and side, in a private cluster that preloads
    pg_stat_statements (track = 'all': statements that functions run are counted too)."""
    from pg_mailbox.cluster import Cluster  # the client package (pip install -e .)

    settings = {
        "shared_preload_libraries": "pg_stat_statements",
        "pg_stat_statements.track": "all",
        "pg_stat_statements.max": "1000",
        "autovacuum": "off",
    }
    out = []
    with Cluster(settings=settings) as cluster:
        dsn = cluster.dsn()
        with ib.connect(dsn) as db:
            db.execute("CREATE EXTENSION pg_stat_statements")
            db.execute("CREATE EXTENSION pg_mailbox CASCADE")
            db.execute(f"SELECT mailbox.create_inbox('{INBOX}')")
            db.execute(ib.PLAIN_TABLE)
            for label, batch, per_message in (
                ("claim 10 + mark per msg", 10, True),
                ("claim 100 + batch mark", 100, False),
            ):
                sides = (
                    (
                        "SKIP LOCKED + UPDATE",
                        "public.plain_inbox",
                        lambda c, b, batch=batch, pm=per_message: ib.drain_plain(
                            c, batch, pm, batches=b
                        ),
                    ),
                    (
                        "inbox_claim + mark",
                        f"mailbox.{INBOX}",
                        lambda c, b, batch=batch, pm=per_message: ib.drain_mailbox(
                            c, INBOX, "w", batch, pm, batches=b
                        ),
                    ),
                )
                for side, table, drain in sides:
                    db.execute(f"TRUNCATE {table}")
                    db.execute("DELETE FROM mailbox._inbox_lease")
                    ib.fill(db, table, n + WARM_BATCHES * batch)
                    db.execute("CHECKPOINT")
                    backend = Backend(dsn, autocommit=False, pin=pin)
                    drain(backend.conn, WARM_BATCHES)  # plans and caches, not counted
                    db.execute("SELECT pg_stat_statements_reset()")
                    before = backend.cpu_ns()
                    drain(backend.conn, n // batch)
                    cpu = (backend.cpu_ns() - before) / n / 1000
                    backend.close()
                    rows = db.execute(
                        "SELECT total_exec_time * 1000 / %s, calls::float8 / %s, toplevel,"
                        " regexp_replace(query, '\\s+', ' ', 'g')"
                        " FROM pg_stat_statements"
                        " WHERE dbid = (SELECT oid FROM pg_database"
                        "               WHERE datname = current_database())"
                        "   AND calls >= %s AND query !~* '^(BEGIN|COMMIT)'"
                        " ORDER BY total_exec_time DESC",
                        [n, n, n // batch],
                    ).fetchall()
                    out.append((label, side, cpu, rows))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--functions", action="store_true")
    parser.add_argument("--statements", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave the client and the backends where the scheduler puts them",
    )
    args = parser.parse_args()
    if args.quick:
        args.messages, args.rounds = 400, 2
    pin = args.pin and (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {CLIENT_CPU})
    n = -(-args.messages // 200) * 200  # whole turns of every case (chunks of 100 and 200)
    name, dsn = ib.scratch_database(args.dsn)
    started = time.perf_counter()
    results = []
    try:
        db = ib.connect(dsn)
        db.execute(f"SELECT mailbox.create_inbox('{INBOX}')")
        db.execute(ib.PLAIN_TABLE)
        db.execute(f"CREATE TABLE {CEILING_TABLE} (LIKE public.plain_inbox INCLUDING ALL)")
        db.execute(ib.CEILING_FUNCTIONS.replace("public.plain_inbox", CEILING_TABLE))
        db.execute(f"CREATE SCHEMA {WRAPPED}")
        db.execute(f"CREATE TABLE {WRAPPED_TABLE} (LIKE public.plain_inbox INCLUDING ALL)")
        db.execute(ib.CEILING_FUNCTIONS.replace("public.", f"{WRAPPED}."))
        ids = ib.message_ids(n)
        tables = ("public.plain_inbox", CEILING_TABLE, WRAPPED_TABLE, f"mailbox.{INBOX}")

        def empty():
            db.execute(f"TRUNCATE {', '.join(tables)}")

        def full(batch):
            def prepare():
                empty()
                db.execute("DELETE FROM mailbox._inbox_lease")
                for table in tables:  # the round's messages and the warm-up's
                    ib.fill(db, table, n + WARM_BATCHES * batch)

            return prepare

        results.append(
            measure(
                db,
                "receive, 1 call/msg, 20% dup",
                receive_variants(dsn, ids, pin),
                args.rounds,
                empty,
                n,
                100,
            )
        )
        results.append(
            measure(
                db,
                "claim 10 + mark per msg, 1 worker",
                claim_variants(dsn, 10, True, pin),
                args.rounds,
                full(10),
                n,
                100,
            )
        )
        results.append(
            measure(
                db,
                "claim 100 + batch mark, 1 worker",
                claim_variants(dsn, 100, False, pin),
                args.rounds,
                full(100),
                n,
                200,
            )
        )
        functions = function_times(db, dsn, n) if args.functions else []
        db.close()
        statements = statement_times(n, pin) if args.statements else []
    finally:
        with ib.connect(args.dsn) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    print(f"\nbackend CPU per message ({n:,} messages per round, medians of {args.rounds} rounds")
    print("in which the variants take turns every 100 messages (200 for claim 100); us, lower")
    print("is better; ratio = baseline / variant, the median of the per-round ratios;")
    print(
        "synchronous_commit = off on every connection; "
        + (
            f"client and backends pinned to cores {CLIENT_CPU} and {BACKEND_CPU})"
            if pin
            else "not pinned)"
        )
    )
    print("WAL B/msg: bytes of WAL the server wrote per message during the variant's turns")
    print("(the median of the rounds; the first turns after each round's CHECKPOINT include")
    print("full-page images, alike for every variant)")
    print(f"{'case':<36} {'variant':<24} {'us/msg':>8} {'ratio':>6} {'WAL B/msg':>10}")
    for label, got, wal in results:
        base = next(iter(got.values()))
        for variant, values in got.items():
            ratio = statistics.median(b / v for b, v in zip(base, values, strict=True))
            print(
                f"{label:<36} {variant:<24} {statistics.median(values):>8.1f} {ratio:>6.2f}"
                f" {statistics.median(wal[variant]):>10.1f}"
            )
    if functions:
        print(f"\nclaim 10 + mark per msg: self time per message ({n:,} messages, one drain,")
        print("track_functions = 'all', which adds its own overhead; PL/pgSQL and SQL functions")
        print("that were not inlined)")
        print(f"{'function':<36} {'calls':>8} {'us/msg':>8}")
        for name, calls, per in functions:
            print(f"{name:<36} {calls:>8,} {per:>8.2f}")
    if statements:
        print(f"\nstatements, one drain of {n:,} messages per case and side (a private cluster,")
        print("pg_stat_statements.track = 'all'; us and calls per message; top: sent by the")
        print("client, or run by the commit's deferred trigger; nested: run by a function, its")
        print("time also counted in its caller's; BEGIN and COMMIT left out)")
        for label, side, cpu, rows in statements:
            print(f"{label} / {side}: backend CPU {cpu:.1f} us/msg")
            print(f"  {'us/msg':>8} {'calls/msg':>9} {'level':<6} statement")
            for per, calls, top, query in rows:
                level = "top" if top else "nested"
                print(f"  {per:>8.2f} {calls:>9.2f} {level:<6} {query[:100]}")
    print(f"\ntotal run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
