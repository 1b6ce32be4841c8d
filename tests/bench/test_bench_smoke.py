"""bench/outbox_bench.py --quick runs end to end and prints its report.

A smoke run with tiny sizes: the numbers mean nothing, but every section must run against a
real server (PgQ included) and print its table, so the benchmark does not rot between the
times someone measures with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "outbox_bench.py"
DRAIN_SYSTEMS = (
    "DELETE ... RETURNING (floor)",
    "PgQ",
    "SKIP LOCKED + UPDATE",
    "pg_mailbox poll+commit",
)


def test_outbox_bench_quick_prints_the_report(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "RuntimeWarning" not in done.stderr, done.stderr

    # the header: the command line and the machine facts the numbers depend on
    assert "command: " in out and "--quick" in out
    for fact in ("machine: ", "server: PostgreSQL 15", "settings: ", "load average at start"):
        assert fact in out, fact

    # drain: every system at both batch sizes, with ratios to the floor and to PgQ
    assert "drain: one consumer, unread backlog" in out
    assert re.search(r"msg/s\s+range\s+x floor\s+x PgQ", out), out
    for batch in (100, 1000):
        for system in DRAIN_SYSTEMS:
            row = re.search(
                rf"^2,000\s+{batch}\s+{re.escape(system)}\s+([\d,]+)\s+\S+\s+([\d.]+)\s+([\d.]+)$",
                out,
                re.MULTILINE,
            )
            assert row, f"no drain row for {system} at batch {batch}:\n{out}"
            assert float(row.group(2)) > 0 and float(row.group(3)) > 0
            if system == "DELETE ... RETURNING (floor)":
                assert row.group(2) == "1.00"
            if system == "PgQ":
                assert row.group(3) == "1.00"

    # steady state: throughput, lag and commit-to-consumer latency, nothing lost
    assert "steady state:" in out
    assert re.search(r"end-to-end \(msg/s.*\)\s+[\d,]+$", out, re.MULTILINE), out
    assert re.search(r"lag, rows: median / max of 1 s samples\s+[\d,]+ / [\d,]+$", out, re.M)
    assert re.search(
        r"commit -> consumer latency, ms: p50 / p99 / max\s+-?[\d.]+ / -?[\d.]+ / -?[\d.]+$",
        out,
        re.MULTILINE,
    ), out

    # the other sections
    assert "first poll_outbox, unread backlog" in out
    # an idle consumer (its last poll was empty) is woken by the producer's notify every time
    idle = re.search(r"^idle: commit -> LISTENing consumer's poll returned(.*)$", out, re.M)
    assert idle and "not woken" not in idle.group(1), out
    assert re.search(r"^after\s+0\s+", out, re.MULTILINE), out  # retention emptied the table
    assert "producer: pgbench" in out and "order + outbox_publish" in out
    assert "wall time" in out
