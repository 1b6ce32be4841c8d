"""Plans a worker keeps (issue 11): the inbox's claim and marks with and without sequential
scans turned off in their functions, and a hand-written SKIP LOCKED worker, where a plan made
earlier in the session decides the speed.

PL/pgSQL keeps each statement's plan for the session until a table it reads changes in the
catalog (VACUUM, ANALYZE, DDL), and a driver that prepares statements (psycopg 3 after five
executions, JDBC, asyncpg) keeps the plan of a hand-written worker's statements the same
way. The inbox's per-worker functions run with enable_seqscan = off (docs/inbox.md, "Plans
made on an empty queue"). Each case runs three variants, each in a scratch database of its
own, taking turns per round (the first of each round rotating), on one connection per
variant that is set up before the clock:

- "shipped": the installed pg_mailbox;
- "no setting": the same, with `ALTER FUNCTION ... RESET enable_seqscan` on each function
  that sets it (the inboxes' generated named marks too), in that database only. Not quite
  the code as it was before: its by-id statements keep the CASE test and the ordered claim
  its ORDER BY (docs/inbox.md), which the setting's absence does not undo;
- "plain SQL" (the burst cases only): bench/inbox_bench.py's baseline worker, SELECT ... FOR
  UPDATE SKIP LOCKED + UPDATE on an equivalent table, through psycopg's default prepared
  statements.

Both sides drain with bench/inbox_bench.py's drain_mailbox and drain_plain (the same
statements and round trips as that benchmark); the clock covers the drain alone, from the
worker's first claim after the setup (its first plans included), and the count of processed
rows checks it.

Cases (1 worker, one transaction per batch, the eleven message columns fetched):
- "burst after idle": every table vacuumed empty; the worker polls a trickle (two messages
  claimed and marked, 12 times: its plans are made then); then --burst messages arrive (no
  VACUUM, as between two autovacuum runs) and the clock times the worker draining --drain of
  them: claim 100 + batch mark, and claim 10 + a mark per message;
- "beside leases of another inbox": --leases messages of a second inbox claimed with a
  600 s lease and committed (the two-transaction pattern), its table and the lease table
  vacuumed and analyzed; a worker of the first inbox (--burst pending, vacuumed) starts after
  that and drains --drain: claim 10 + a mark per message;
- "ordered": an ordered inbox of --ordered pending messages over --aggregates aggregates,
  vacuumed and analyzed; a fresh worker drains --drain: claim 100 + batch mark, then claim
  10 + a mark per message. No plain-SQL variant (a hand-written ordered claim is not one
  statement).

Prints messages per second (the median of --rounds rounds) and the ratio of each variant to
"shipped" (the median of the per-round ratios; below 1: slower than shipped).

Usage: python bench/inbox_plans.py [--dsn ...] [--rounds 3] [--quick]
The DSN's user must be allowed to CREATE DATABASE; pg_mailbox must be installed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inbox_bench as ib  # noqa: E402
from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

# the functions that set enable_seqscan (their signatures as pg_proc prints them)
SETTERS = """
SELECT p.oid::regprocedure FROM pg_proc AS p
 WHERE p.pronamespace = 'mailbox'::regnamespace AND 'enable_seqscan=off' = ANY (p.proconfig)
"""
COLUMNS = ib.MESSAGE_COLUMNS


def database(dsn, suffix):
    name = f"inbox_plans_{suffix}"
    with ib.connect(dsn) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(dsn)
    params["dbname"] = name
    out = make_conninfo(**params)
    with ib.connect(out) as db:
        db.execute("CREATE EXTENSION pg_mailbox CASCADE")
        db.execute(ib.PLAIN_TABLE)
    return name, out


def without_setting(db):
    """The code as it was: every function that sets enable_seqscan, without it."""
    for (fn,) in db.execute(SETTERS).fetchall():
        db.execute(f"ALTER FUNCTION {fn} RESET enable_seqscan")
    assert not db.execute(SETTERS).fetchall()


def vacuum(db, *tables):
    for t in tables:
        db.execute(f"VACUUM ANALYZE {t}")


SIDE = ("mailbox._inbox_lease", "mailbox._inbox_open_claim", "mailbox._inbox_aggregate")


class Inbox:
    """pg_mailbox's worker on one inbox: bench/inbox_bench.py's drain_mailbox."""

    def __init__(self, name):
        self.name, self.table = name, f"mailbox.{name}"

    def drain(self, conn, batch, per_message, batches):
        ib.drain_mailbox(conn, self.name, "w", batch, per_message, batches)


class Plain:
    """The hand-written worker on public.plain_inbox: bench/inbox_bench.py's drain_plain."""

    table = "public.plain_inbox"

    def drain(self, conn, batch, per_message, batches):
        ib.drain_plain(conn, batch, per_message, batches=batches)


def timed_drain(db, side, conn, batch, per_message, n, exact=True):
    """msgs/s of `side` draining n messages (n / batch claims) on conn, checked by the count of
    processed rows; nothing before the clock. (An ordered claim may take fewer than its batch:
    one head per aggregate; exact=False.)"""
    before = processed(db, side.table)
    started = time.perf_counter()
    side.drain(conn, batch, per_message, n // batch)
    took = time.perf_counter() - started
    done = processed(db, side.table) - before
    assert done == n // batch * batch if exact else 0 < done <= n // batch * batch, done
    return done / took


def processed(db, table):
    return db.execute(f"SELECT count(*) FROM {table} WHERE processed_at IS NOT NULL").fetchone()[0]


def fill(db, table, first, n):
    db.execute(
        f"INSERT INTO {table} (event_id, payload, event_type) SELECT 'c-' || g,"
        " jsonb_build_object('n', g), 'bench' FROM generate_series(%s::int, %s::int) g",
        [first, first + n - 1],
    )


def burst_after_idle(args, batch, per_message):
    def run(dsn, side):
        with ib.connect(dsn) as db:
            db.execute(f"TRUNCATE {side.table}")
            db.execute("DELETE FROM mailbox._inbox_lease")
            vacuum(db, side.table, *SIDE)
            with ib.connect(dsn, autocommit=False) as w:
                for i in range(12):  # the idle worker's trickle: its plans are made here
                    fill(db, side.table, 1_000_000 + 2 * i, 2)
                    side.drain(w, batch, per_message, 1)
                fill(db, side.table, 1, args.burst)
                return timed_drain(db, side, w, batch, per_message, args.drain)

    return run


def beside_leases(args):
    def run(dsn, side):
        with ib.connect(dsn) as db:
            db.execute("DELETE FROM mailbox._inbox_lease")
            db.execute("TRUNCATE mailbox.held, mailbox.work")
            fill(db, "mailbox.held", 1, args.leases)
            fill(db, "mailbox.work", 1, args.burst)
            n = 0
            while n < args.leases:  # (10,000 a claim at most)
                n += db.execute(
                    "SELECT count(*) FROM mailbox.inbox_claim('held', 'holder', %s, 600)",
                    [min(10_000, args.leases - n)],
                ).fetchone()[0]
            vacuum(db, "mailbox.held", "mailbox.work", *SIDE)
            with ib.connect(dsn, autocommit=False) as w:  # (it plans after the leases)
                return timed_drain(db, side, w, 10, True, args.drain)

    return run


def ordered(args, batch, per_message):
    def run(dsn, side):
        with ib.connect(dsn) as db:
            db.execute("DELETE FROM mailbox._inbox_lease")
            db.execute("DELETE FROM mailbox._inbox_aggregate")
            db.execute("TRUNCATE mailbox.ord")
            db.execute(
                "INSERT INTO mailbox.ord (event_id, payload, aggregate_id, sequence_num)"
                " SELECT 'o-' || g, '{}', 'a' || (g %% %s), g / %s + 1"
                " FROM generate_series(1, %s) g",
                [args.aggregates, args.aggregates, args.ordered],
            )
            vacuum(db, "mailbox.ord", *SIDE)
            with ib.connect(dsn, autocommit=False) as w:
                return timed_drain(db, side, w, batch, per_message, args.drain, exact=False)

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--burst", type=int, default=100_000)
    parser.add_argument("--drain", type=int, default=1_000)
    parser.add_argument("--leases", type=int, default=50_000)
    parser.add_argument("--ordered", type=int, default=100_000)
    parser.add_argument("--aggregates", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    args = parser.parse_args()
    if args.quick:
        args.burst, args.drain, args.leases, args.ordered = 2_000, 200, 500, 2_000
        args.aggregates, args.rounds = 100, 1
    started = time.perf_counter()
    made = []
    try:
        shipped = database(args.dsn, "shipped")
        unset = database(args.dsn, "unset")
        made = [shipped[0], unset[0]]
        for _, dsn in (shipped, unset):
            with ib.connect(dsn) as db:
                for name in ("clm", "held", "work", "ord"):
                    db.execute("SELECT mailbox.create_inbox(%s)", [name])
                db.execute("SELECT mailbox.enable_inbox_ordering('ord')")
                for t in ("clm", "held", "work", "ord"):
                    db.execute(f"ALTER TABLE mailbox.{t} SET (autovacuum_enabled = false)")
                for t in ("public.plain_inbox", *SIDE):
                    db.execute(f"ALTER TABLE {t} SET (autovacuum_enabled = false)")
        with ib.connect(unset[1]) as db:
            without_setting(db)
        clm, work = Inbox("clm"), Inbox("work")
        cases = [
            (
                "burst after idle: claim 100 + batch mark",
                burst_after_idle(args, 100, False),
                clm,
                True,
            ),
            (
                "burst after idle: claim 10 + mark per msg",
                burst_after_idle(args, 10, True),
                clm,
                True,
            ),
            (
                "beside leases of another inbox: claim 10 + mark per msg",
                beside_leases(args),
                work,
                False,
            ),
            ("ordered: claim 100 + batch mark", ordered(args, 100, False), Inbox("ord"), False),
            ("ordered: claim 10 + mark per msg", ordered(args, 10, True), Inbox("ord"), False),
        ]
        table = []
        for label, run, side, with_plain in cases:
            variants = [("shipped", shipped[1], side), ("no setting", unset[1], side)]
            if with_plain:
                variants.append(("plain SQL", shipped[1], Plain()))
            got = {v: [] for v, _, _ in variants}
            for r in range(args.rounds):
                order = variants[r % len(variants) :] + variants[: r % len(variants)]
                for v, dsn, s in order:
                    got[v].append(run(dsn, s))
            for v, _, _ in variants:
                ratio = statistics.median(
                    a / b for a, b in zip(got[v], got["shipped"], strict=True)
                )
                table.append((label, v, statistics.median(got[v]), ratio))
                print(f"{label:58s} {v:11s} {table[-1][2]:9,.0f} {ratio:6.2f}", flush=True)
    finally:
        with ib.connect(args.dsn) as db:
            for name in made:
                db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"\nplans a worker keeps (msgs/s, medians of {args.rounds} rounds taking turns;"
        " ratio = median of the per-round ratios to shipped)"
    )
    print(
        f"burst {args.burst:,}, drain {args.drain:,}, leases {args.leases:,},"
        f" ordered {args.ordered:,} over {args.aggregates:,} aggregates"
    )
    print(f"{'case':58s} {'variant':11s} {'msgs/s':>9s} {'ratio':>6s}")
    for label, v, rate, ratio in table:
        print(f"{label:58s} {v:11s} {rate:9,.0f} {ratio:6.2f}")
    print(f"\ntotal run time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
