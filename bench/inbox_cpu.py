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
  baseline), the same with the ceiling wrapper's UPDATE, and inbox_claim +
  inbox_mark_processed per message; the CPU of the whole drain (claims, marks, commits) per
  message;
- claim 100 + batch mark, one worker: SKIP LOCKED LIMIT 100 + one UPDATE per batch against
  inbox_claim + inbox_mark_processed(text[]).

Each round truncates and refills the tables (not counted), runs a CHECKPOINT, then measures
every variant; the order of the variants rotates by round. The table gives the median
microseconds per message and the ratio baseline / variant (1.00 = as cheap as the baseline).

--functions adds where the server time of claim 10 + mark per message goes: one worker drains
--messages messages with track_functions = 'all', and the table lists each PL/pgSQL function's
self time per message from pg_stat_user_functions (timing every call adds its own overhead:
read the shares, not the sums).

Usage: python bench/inbox_cpu.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
       [--messages 4000] [--rounds 9] [--functions] [--quick]
The DSN's user must be allowed to CREATE DATABASE; pg_mailbox must be installed. --quick is
a smoke run (tiny sizes; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inbox_bench as ib  # noqa: E402  (the statements, tables and workers it measures)

INBOX = "cpu"
WARM_UP = 50


class Backend:
    """One connection and the CPU its server backend has used so far."""

    def __init__(self, dsn, autocommit):
        self.conn = ib.connect(dsn, autocommit=autocommit)
        self.conn.execute("SET synchronous_commit = off")
        pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        if not autocommit:
            self.conn.commit()
        self.stat = Path(f"/proc/{pid}/schedstat")
        if not self.stat.exists():
            sys.exit(f"backend {pid} is not on this machine: inbox_cpu.py reads its /proc entry")

    def cpu_ns(self):
        return int(self.stat.read_text().split()[0])

    def close(self):
        self.conn.close()


def per_message_us(backend, n, work):
    before = backend.cpu_ns()
    work()
    return (backend.cpu_ns() - before) / n / 1000


def receive_variants(dsn, ids):
    def variant(sql, params):
        backend = Backend(dsn, autocommit=True)

        def run():
            with backend.conn.cursor() as cur:
                for i in range(WARM_UP):  # plans and caches, on ids the round never uses
                    cur.execute(sql, params(f"warm-{i}"))
                return per_message_us(
                    backend, len(ids), lambda: [cur.execute(sql, params(i)) for i in ids]
                )

        return backend, run

    return [
        ("INSERT ... ON CONFLICT", *variant(ib.PLAIN_RECEIVE, lambda i: [i])),
        ("ceiling wrapper", *variant("SELECT public.ceiling_receive(%s)", lambda i: [i])),
        ("inbox_receive", *variant(ib.MAILBOX_RECEIVE, lambda i: [INBOX, i])),
    ]


def claim_variants(dsn, n, batch, per_message):
    def variant(drain, table):
        backend = Backend(dsn, autocommit=False)

        def run():
            took = per_message_us(backend, n, lambda: drain(backend.conn))
            left = backend.conn.execute(
                f"SELECT count(*) FROM {table} WHERE processed_at IS NULL"
            ).fetchone()[0]
            backend.conn.commit()
            assert left == 0, f"{left} messages left unprocessed in {table}"
            return took

        return backend, run

    plain = (
        "SKIP LOCKED + UPDATE",
        *variant(lambda c: ib.drain_plain(c, batch, per_message), "public.plain_inbox"),
    )
    ours = (
        "inbox_claim + mark",
        *variant(lambda c: ib.drain_mailbox(c, INBOX, "w", batch, per_message), f"mailbox.{INBOX}"),
    )
    if not per_message:
        return [plain, ours]
    wrapper = (
        "ceiling wrapper",
        *variant(
            lambda c: ib.drain_plain(c, batch, True, "SELECT public.ceiling_mark(%s)"),
            "public.plain_inbox",
        ),
    )
    return [plain, wrapper, ours]


def measure(db, label, variants, rounds, prepare):
    """{variant: [µs per message per round]}, the variants' order rotating by round."""
    got = {name: [] for name, _, _ in variants}
    for r in range(rounds):
        shift = r % len(variants)
        for name, _, run in variants[shift:] + variants[:shift]:
            prepare()
            db.execute("CHECKPOINT")
            got[name].append(run())
    for _, backend, _ in variants:
        backend.close()
    return label, got


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--functions", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.rounds = 400, 2
    n = args.messages
    name, dsn = ib.scratch_database(args.dsn)
    started = time.perf_counter()
    results = []
    try:
        db = ib.connect(dsn)
        db.execute(f"SELECT mailbox.create_inbox('{INBOX}')")
        db.execute(ib.PLAIN_TABLE)
        db.execute(ib.CEILING_FUNCTIONS)
        ids = ib.message_ids(n)

        def empty():
            db.execute(f"TRUNCATE public.plain_inbox, mailbox.{INBOX}")

        def full():
            empty()
            db.execute("DELETE FROM mailbox._inbox_lease")
            ib.fill(db, "public.plain_inbox", n)
            ib.fill(db, f"mailbox.{INBOX}", n)

        results.append(
            measure(
                db, "receive, 1 call/msg, 20% dup", receive_variants(dsn, ids), args.rounds, empty
            )
        )
        results.append(
            measure(
                db,
                "claim 10 + mark per msg, 1 worker",
                claim_variants(dsn, n, 10, True),
                args.rounds,
                full,
            )
        )
        results.append(
            measure(
                db,
                "claim 100 + batch mark, 1 worker",
                claim_variants(dsn, n, 100, False),
                args.rounds,
                full,
            )
        )
        functions = function_times(db, dsn, n) if args.functions else []
        db.close()
    finally:
        with ib.connect(args.dsn) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    print(f"\nbackend CPU per message ({n:,} messages per round, medians of {args.rounds}")
    print("interleaved rounds; us, lower is better; ratio = baseline / variant, the median of")
    print("the per-round ratios; synchronous_commit = off on every connection)")
    print(f"{'case':<36} {'variant':<24} {'us/msg':>8} {'ratio':>6}")
    for label, got in results:
        base = next(iter(got.values()))
        for variant, values in got.items():
            ratio = statistics.median(b / v for b, v in zip(base, values, strict=True))
            print(f"{label:<36} {variant:<24} {statistics.median(values):>8.1f} {ratio:>6.2f}")
    if functions:
        print(f"\nclaim 10 + mark per msg: self time per message ({n:,} messages, one drain,")
        print("track_functions = 'all', which adds its own overhead; PL/pgSQL and SQL functions")
        print("that were not inlined)")
        print(f"{'function':<36} {'calls':>8} {'us/msg':>8}")
        for name, calls, per in functions:
            print(f"{name:<36} {calls:>8,} {per:>8.2f}")
    print(f"\ntotal run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
