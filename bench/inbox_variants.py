"""Variants of one inbox call timed against each other by backend CPU (issue 11): what one
piece of the shipped code costs, measured beside the code without it.

bench/inbox_cpu.py compares the API with its plain-SQL baselines; when a change moves a
case by a few microseconds, that table's round-to-round spread hides it. Here every variant
runs on a connection of its own, in one scratch database on one server, the variants taking
turns (the first of each turn rotating), and each turn's backend CPU is read from
`/proc/<pid>/schedstat` around the measured calls only (client and backends pinned as in
inbox_cpu.py). The table gives each variant's median per call, and the median of the
per-turn differences from the first variant with their quartiles: a difference inside its
quartiles is noise.

Cases:
- mark: one inbox_mark_processed(text, text) per message, 195 a transaction, into a managed
  inbox whose messages nobody claimed (so the named mark's lease DELETE runs): the shipped,
  inlined function; "old shape", the PL/pgSQL SECURITY DEFINER wrapper it was before
  2026-12-07 (router, then the full path), made in the scratch database; the generated named
  mark called directly (the bound of the inlining); the plain UPDATE (what any function
  adds to);
- claim: a transaction of claim 10 (--batch), one UPDATE marking the claimed ids, COMMIT (the
  claim's settle at commit included): the plain SELECT ... FOR UPDATE SKIP LOCKED LIMIT 10
  with inbox_claim's columns; inbox_claim; the generated claim called directly with the
  inbox's catalog row (no lookup, no open claim, nothing settled at commit), on a connection
  with the settings inbox_claim's SET clauses give it (before 2026-12-07 it ran with the
  session's, so it planned its query at every call). With
  --batch-mark the API's variants mark with inbox_mark_processed(text[]) instead (which
  settles an open claim it marks in full, so the commit finds nothing to settle).

--also-in DATABASE runs the API's variant (inbox_mark_processed, inbox_claim) once more in a
database made earlier with another build of pg_mailbox (a database keeps the functions of
the build that created its extension): two builds side by side in one run.

Usage: python bench/inbox_variants.py [--dsn ...] [--case mark|claim] [--messages N]
       [--also-in DATABASE ...]
The DSN's user must be allowed to CREATE DATABASE; the server must run on this machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inbox_bench as ib  # noqa: E402
from inbox_cpu import CLIENT_CPU, Backend  # noqa: E402
from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

# inbox_mark_processed(text, text) as it was before it was inlined (2026-12-07)
OLD_MARK = """
CREATE FUNCTION public.mark_old_shape(p_inbox text, p_event_id text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, mailbox, pg_temp AS $$
DECLARE
    v_named boolean;
BEGIN
    v_named := mailbox._inbox_route_processed_named(p_inbox, p_event_id);
    IF v_named IS NOT NULL THEN
        RETURN v_named;
    END IF;
    RETURN mailbox._inbox_mark_processed_full(p_inbox, p_event_id);
END $$"""

TURN_MARKS, TURN_CLAIMS, CLAIM = 195, 20, 10
# each case's variant of the API itself (the one --also-in runs in other databases)
API = {"mark": "inbox_mark_processed", "claim": "inbox_claim"}


def fill(db, inbox, n):
    db.execute(f"SELECT mailbox.create_inbox('{inbox}')")
    db.execute(
        "SELECT count(*) FROM mailbox.inbox_receive_batch(%s, (SELECT jsonb_agg("
        "jsonb_build_object('p_event_id', 'm' || g, 'p_payload', '{\"a\": 1}'::jsonb))"
        " FROM generate_series(1, %s) g))",
        [inbox, n],
    )
    db.execute(f"VACUUM ANALYZE mailbox.{inbox}")
    return db.execute(
        "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox]
    ).fetchone()[0]


def build(db, dsn, n, pin, shapes, variant, others=(), api=None):
    """One inbox of n messages and one pinned connection per shape; variant(name, sql, inbox,
    backend) returns (name, turn), turn() the backend CPU of one turn in ns per unit. For each
    other database (--also-in: made with another build of pg_mailbox), the API's shape (api)
    once more, there."""
    out = []
    places = [(name, sql, db, dsn) for name, sql in shapes.items()]
    places += [
        (f"{api} in {o}", shapes[api], other_db, other_dsn) for o, other_db, other_dsn in others
    ]
    for i, (name, sql, where, where_dsn) in enumerate(places):
        inbox = f"v{i}"
        k = fill(where, inbox, n)
        backend = Backend(where_dsn, autocommit=True, pin=pin)
        out.append(variant(name, sql.format(k=k, inbox=inbox), inbox, backend))
    return out


def mark_case(db, dsn, n, pin, others):
    db.execute(OLD_MARK)
    shapes = {
        "inbox_mark_processed": "SELECT mailbox.inbox_mark_processed(%(inbox)s, %(id)s)",
        "old shape": "SELECT public.mark_old_shape(%(inbox)s, %(id)s)",
        "named mark, direct": "SELECT mailbox._inbox_{k}_processed_named(NULL, %(id)s)",
        "plain UPDATE": "UPDATE mailbox.{inbox} SET processed_at = clock_timestamp()"
        " WHERE event_id = %(id)s AND processed_at IS NULL RETURNING true",
    }

    def variant(name, sql, inbox, backend):
        ids = iter(range(1, n + 1))
        cur = backend.conn.cursor()

        def turn():
            with backend.conn.transaction():
                for _ in range(5):  # plans, before the clock
                    cur.execute(sql, {"inbox": inbox, "id": f"m{next(ids)}"})
                start = backend.cpu_ns()
                for _ in range(TURN_MARKS):
                    row = cur.execute(sql, {"inbox": inbox, "id": f"m{next(ids)}"}).fetchone()
                    assert row[0] is True, name
                return (backend.cpu_ns() - start) / TURN_MARKS

        return name, turn

    return (
        build(db, dsn, n, pin, shapes, variant, others, API["mark"]),
        n // (TURN_MARKS + 5),
        "us per mark",
    )


def claim_case(db, dsn, n, pin, others, batch=CLAIM, batch_mark=False):
    columns = ib.MESSAGE_COLUMNS
    shapes = {
        f"SKIP LOCKED LIMIT {batch}": f"SELECT {columns} FROM mailbox.{{inbox}}"
        f" WHERE processed_at IS NULL ORDER BY received_at LIMIT {batch} FOR UPDATE SKIP LOCKED",
        "inbox_claim": f"SELECT {columns} FROM mailbox.inbox_claim('{{inbox}}', 'w', {batch}, 30)",
        "generated claim, direct": f"SELECT {columns} FROM pg_catalog.unnest("
        "mailbox._inbox_{k}_claim((SELECT i FROM mailbox._inbox AS i"
        f" WHERE i.inbox_name = '{{inbox}}'), {batch}, clock_timestamp(), false))",
    }
    turns = max(1, TURN_CLAIMS * CLAIM // batch)

    def variant(name, sql, inbox, backend):
        mark = (
            f"UPDATE mailbox.{inbox} SET processed_at = clock_timestamp() WHERE event_id = ANY(%s)"
        )
        if batch_mark and not name.startswith("SKIP LOCKED"):
            mark = f"SELECT mailbox.inbox_mark_processed('{inbox}', %s::text[])"
        cur = backend.conn.cursor()
        if name.startswith("generated claim"):
            # the settings inbox_claim runs it with (its SET clauses): one generic plan, and
            # not a custom plan made again at every call, which read 100-150 us more
            for setting in (
                "plan_cache_mode = force_generic_plan",
                "jit = off",
                "enable_seqscan = off",
            ):
                cur.execute(f"SET {setting}")

        def turn():
            start = backend.cpu_ns()
            for _ in range(turns):
                with backend.conn.transaction():
                    ids = [r[0] for r in cur.execute(sql).fetchall()]
                    assert len(ids) == batch, name
                    cur.execute(mark, [ids])
            return (backend.cpu_ns() - start) / turns

        return name, turn

    return (
        build(db, dsn, n, pin, shapes, variant, others, API["claim"]),
        n // (turns * batch),
        "us per transaction"
        + (", API variants marking with inbox_mark_processed(text[])" if batch_mark else ""),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--case", choices=("mark", "claim"), default="mark")
    parser.add_argument("--messages", type=int, default=120000)
    parser.add_argument("--warm-turns", type=int, default=3)
    parser.add_argument("--batch", type=int, default=CLAIM, help="claim: messages per claim")
    parser.add_argument(
        "--batch-mark",
        action="store_true",
        help="claim: the API's variants mark with inbox_mark_processed(text[]), not an UPDATE",
    )
    parser.add_argument(
        "--also-in",
        action="append",
        default=[],
        metavar="DATABASE",
        help="an existing database with pg_mailbox made by another build: the API's variant runs"
        " there too (its inboxes are dropped at the end)",
    )
    args = parser.parse_args()
    pin = (os.cpu_count() or 1) >= 2
    if pin:
        os.sched_setaffinity(0, {CLIENT_CPU})
    name, dsn = ib.scratch_database(args.dsn)
    others = []
    for other in args.also_in:
        params = conninfo_to_dict(args.dsn)
        params["dbname"] = other
        other_dsn = make_conninfo(**params)
        others.append((other, ib.connect(other_dsn), other_dsn))
    try:
        with ib.connect(dsn) as db:
            if args.case == "mark":
                variants, turns, unit = mark_case(db, dsn, args.messages, pin, others)
            else:
                variants, turns, unit = claim_case(
                    db, dsn, args.messages, pin, others, args.batch, args.batch_mark
                )
            got = {v: [] for v, _ in variants}
            for t in range(turns):
                order = variants[t % len(variants) :] + variants[: t % len(variants)]
                for v, turn in order:
                    us = turn() / 1000
                    if t >= args.warm_turns:
                        got[v].append(us)
    finally:
        with ib.connect(args.dsn) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for _, other_db, _ in others:
            other_db.execute(
                "SELECT mailbox.drop_inbox(inbox_name, true, true) FROM mailbox._inbox"
                " WHERE inbox_name ~ '^v[0-9]+$'"
            )
            other_db.close()
    first = variants[0][0]
    print(f"\n{args.case}: backend CPU, {unit}; {len(got[first])} turns each, taking turns")
    print(f"{'variant':28s} {'median':>8s} {'minus ' + first[:14]:>22s}  quartiles")
    for v, _ in variants:
        d = [a - b for a, b in zip(got[v], got[first], strict=True)]
        q = statistics.quantiles(d) if len(d) > 1 else [0, 0, 0]
        median, diff = statistics.median(got[v]), statistics.median(d)
        print(f"{v:28s} {median:8.1f} {diff:22.1f}  {q[0]:.1f} .. {q[2]:.1f}")
    # the builds side by side: each other database's API variant minus this build's
    api = API[args.case]
    for v, _ in variants[len(variants) - len(others) :]:
        d = [a - b for a, b in zip(got[v], got[api], strict=True)]
        q = statistics.quantiles(d) if len(d) > 1 else [0, 0, 0]
        diff = statistics.median(d)
        print(f"{v} minus {api}: median {diff:.1f}, quartiles {q[0]:.1f} .. {q[2]:.1f}")


if __name__ == "__main__":
    main()
