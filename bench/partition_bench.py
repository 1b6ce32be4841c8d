"""Partitioned consumer groups: parallel drain and per-key order (issue 9, SPEC §2.3).

Every cell drains a backlog no consumer has read and nothing has numbered: before each drain
a fresh outbox (--partitions partitions, or 1 for the baseline) gets --rows rows over --keys
keys, published in 1,000-row transactions, and a fresh 'earliest' group; the clock then runs
from the consumers' first poll to the last row in hand, so numbering (done by the polls
themselves, no numberer runs) is inside it for every cell, baseline included. Cells:

- work:    1, 2 and 4 consumers over the partitioned outbox, each spending --work-ms per
           message (one sleep per batch, so the threads do not hold the GIL);
- no work: 1 consumer over the partitioned outbox vs 1 consumer over a single-partition one;
- latency: an idle consumer (LISTEN, empty poll, woken by the notification) receiving a row
  committed by a producer, --samples times, without and with CALL mailbox.run_numberer()
  running (SPEC §2.2.4 moves numbering out of the poll; this is what that costs an idle
  consumer). Printed as p50/p95 milliseconds from the producer's commit to the row in hand.

Consumers are threads with a connection each, in psycopg's default mode (poll, work,
commit_offset, commit). Every drain checks per-key order (each key's rows must arrive in
offset order across the group's consumers) and that every row arrived exactly once (no lease
expires in a drain); violations and lost or duplicated rows are counted and printed, and
make the exit status 1. Each cell is the median of --rounds rounds; every round runs every
cell, in an order rotated from round to round.

Usage: python bench/partition_bench.py [--dsn DSN] [--rows 100000] [--keys 500]
       [--partitions 16] [--batch 500] [--work-ms 0.2] [--rounds 3] [--quick]
Without --dsn a throwaway cluster is started (pg_mailbox.cluster) and removed afterwards.
--quick: tiny sizes, one round (tests/bench/test_partition_bench_smoke.py); numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time

import psycopg

from pg_mailbox import api

_ids = itertools.count(1)


def fresh_backlog(dsn, partitions, rows, keys):
    """A new outbox of `partitions` partitions holding `rows` unread, unnumbered rows, and a
    new 'earliest' group on it. Returns (outbox, group)."""
    n = next(_ids)
    outbox, group = f"pb_o{n}", f"pb_g{n}"
    with psycopg.connect(dsn, autocommit=True) as db:
        api.create_outbox(db, outbox, partitions=partitions)
        api.create_consumer_group(db, group, outbox, "earliest")
        for start in range(0, rows, 1000):
            db.execute(
                "SELECT count(mailbox.outbox_publish(%s, jsonb_build_object('n', g),"
                " '{}', 'key-' || (g %% %s)))"
                " FROM generate_series(%s::int, %s::int) AS g",
                [outbox, keys, start, min(start + 999, rows - 1)],
            )
        # the clock must include numbering: nothing may have numbered these rows yet
        head = db.execute(
            "SELECT head_offset FROM mailbox._outbox WHERE outbox_name = %s", [outbox]
        ).fetchone()[0]
        assert head == 0, f"{outbox}: {head} rows numbered before the drain"
        assert not db.execute("SELECT mailbox._numberer_alive()").fetchone()[0], "a numberer runs"
        db.execute("CHECKPOINT")  # the drain does not pay for the publishers' dirty pages
    return outbox, group


def drop_backlog(dsn, outbox, group):
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SELECT mailbox.drop_consumer_group(%s)", [group])
        db.execute("SELECT mailbox.drop_outbox(%s)", [outbox])


def backend_cpu(pids):
    """CPU seconds (user + system) the server processes `pids` used so far, read from /proc
    (the server runs on this host); None where it cannot be read."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def drain(dsn, group, consumers, batch, work_ms, rows):
    """Seconds to drain the group's backlog, the consumers' backend CPU seconds, per-key order
    violations, rows missing, rows delivered more than once."""
    lock = threading.Lock()
    received = []
    seen = set()
    errors = []
    stop = threading.Event()
    # connections are opened before the clock starts; the consumers start together
    conns = [psycopg.connect(dsn) for _ in range(consumers)]
    start = threading.Barrier(consumers + 1)

    def consume(i, conn):
        try:
            start.wait()
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
                    seen.update(o for o, _ in got)
                conn.execute(
                    "SELECT mailbox.commit_offset(%s, %s, %s)", [group, f"c{i}", got[-1][0]]
                )
                conn.commit()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=consume, args=(i, conn)) for i, conn in enumerate(conns)]
    for t in threads:
        t.start()
    start.wait()
    pids = [conn.info.backend_pid for conn in conns]
    cpu0 = backend_cpu(pids)
    t0 = time.perf_counter()
    progress, progress_at = 0, t0
    while not stop.is_set():
        with lock:
            done = len(seen)
        if done >= rows:
            break
        now = time.perf_counter()
        if done > progress:
            progress, progress_at = done, now
        elif now - progress_at > 60:
            errors.append(RuntimeError(f"{group}: no row for 60 s at {done} of {rows}"))
            break
        time.sleep(0.002)
    seconds = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    cpu1 = backend_cpu(pids)
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    for conn in conns:
        conn.close()
    if errors:
        raise errors[0]
    violations = 0
    last = {}
    for offset, key in received:
        if last.get(key, 0) >= offset:
            violations += 1
        last[key] = offset
    distinct = len({o for o, _ in received})
    return seconds, cpu, violations, rows - distinct, len(received) - distinct


def idle_latency(dsn, samples, numberer):
    """Milliseconds from a producer's commit to an idle consumer holding the row."""
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SELECT mailbox.drop_outbox('pb_lat', true)")
        api.create_outbox(db, "pb_lat")
        api.create_consumer_group(db, "pb_lat_g", "pb_lat", "latest")
    runner = None
    if numberer:
        runner = psycopg.connect(dsn, autocommit=True)
        thread = threading.Thread(
            target=lambda: _quiet(api.run_numberer, runner, 3600), daemon=True
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


def header(dsn):
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        check=False,
    ).stdout.strip()
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    with psycopg.connect(dsn, autocommit=True) as db:
        server = db.execute("SELECT version()").fetchone()[0].split(" on ")[0]
    return [
        f"command: {shlex.join([os.path.basename(sys.executable), *sys.argv])}",
        f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; code: {commit or '?'}",
        f"machine: {os.cpu_count()} cores ({model}), {platform.system()} {platform.release()}",
        f"server: {server}",
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="database with pg_mailbox (default: throwaway cluster)")
    parser.add_argument("--rows", type=int, default=100000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--work-ms", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell")
    parser.add_argument("--samples", type=int, default=200, help="latency samples per cell")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round (smoke)")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.keys, args.rounds, args.samples = 3000, 50, 1, 10
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
    failed = False
    try:
        for line in header(dsn):
            print(line)
        parts = args.partitions
        cells = [(parts, n, args.work_ms) for n in (1, 2, 4)]
        cells += [(parts, 1, 0.0), (1, 1, 0.0)]
        times = {c: [] for c in cells}
        cpus = {c: [] for c in cells}
        violations = {c: 0 for c in cells}
        problems = []
        for r in range(args.rounds):
            shift = r % len(cells)
            for cell in cells[shift:] + cells[:shift]:
                partitions, consumers, work = cell
                outbox, group = fresh_backlog(dsn, partitions, args.rows, args.keys)
                seconds, cpu, bad, missing, extra = drain(
                    dsn, group, consumers, args.batch, work, args.rows
                )
                drop_backlog(dsn, outbox, group)
                times[cell].append(seconds)
                cpus[cell].append(cpu)
                violations[cell] += bad
                if missing or extra:
                    problems.append(f"{cell}: {missing} rows missing, {extra} delivered twice")
        print(
            f"{args.rows} rows, {args.keys} keys, batch {args.batch}; every cell drains a fresh"
            f" unread, unnumbered backlog (numbering inside the clock);"
            f" medians of {args.rounds} interleaved round(s)"
        )
        print(
            f"{'outbox':<16} {'consumers':>9} {'work ms':>8} {'seconds':>8} {'rows/s':>9}"
            f" {'ratio':>7} {'order violations':>17}  rounds (s)"
        )
        base_work = statistics.median(times[(parts, 1, args.work_ms)])
        base_none = statistics.median(times[(1, 1, 0.0)])
        for cell in cells:
            partitions, consumers, work = cell
            med = statistics.median(times[cell])
            label = f"{partitions} partition" + ("s" if partitions > 1 else "")
            ratio = (base_work if work else base_none) / med
            each = " ".join(f"{t:.2f}" for t in times[cell])
            print(
                f"{label:<16} {consumers:>9} {work:>8} {med:>8.2f} {args.rows / med:>9.0f}"
                f" {ratio:>6.2f}x {violations[cell]:>17}  {each}"
            )
            failed = failed or violations[cell] > 0
        print(
            "ratio: with work, against 1 consumer over the partitions (targets 2: >= 1.7x,"
            " 4: >= 2.5x); without work, against 1 consumer over 1 partition (target >= 0.9x)"
        )
        if all(c is not None for cell in cells for c in cpus[cell]):
            # CPU time of the consumers' server processes moves far less with other load on
            # the machine than wall time does
            print("consumers' backend CPU seconds (server processes, from /proc), medians:")
            base_cpu = statistics.median(cpus[(1, 1, 0.0)])
            for cell in cells:
                partitions, consumers, work = cell
                med = statistics.median(cpus[cell])
                label = f"{partitions} partition" + ("s" if partitions > 1 else "")
                ratio = f"{base_cpu / med:.2f}x" if not work and med else ""
                print(f"{label:<16} {consumers:>9} {work:>8} {med:>8.2f} {ratio:>7}")
            print("ratio: CPU of 1 consumer over 1 partition / CPU of the cell (no-work cells)")
        for p in problems:
            print("PROBLEM:", p)
        failed = failed or bool(problems)
        print(f"load average after the drains: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print()
        print("idle consumer, commit to row in hand (ms):")
        print(f"{'numbering':<24} {'p50':>6} {'p95':>6}")
        for label, numberer in (("inline (no numberer)", False), ("run_numberer", True)):
            p50, p95 = idle_latency(dsn, args.samples, numberer)
            print(f"{label:<24} {p50:>6.2f} {p95:>6.2f}")
    finally:
        if cluster is not None:
            cluster.destroy()
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
