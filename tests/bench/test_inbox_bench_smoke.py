"""bench/inbox_bench.py --quick runs end to end and prints its report.

A smoke run with tiny sizes (the numbers mean nothing): every section must run against a real
server and print its rows, including the ceiling of a function API (a SECURITY DEFINER
wrapper of each per-call baseline), the gaps and health section, whose backlog is received
through inbox_receive_batch, and the verdict on the issue 11 target.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "inbox_bench.py"
ROW = r"\s+([\d,]+\.\d)\s+(\S+)$"


def test_inbox_bench_quick_prints_the_report(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for case in (
        "inbox_receive, 1 call/msg",
        "inbox_receive_batch 1000/call",
        "ordered: inbox_receive, 1 call/msg",
        "ordered: inbox_receive_batch 1000/call",
        "claim 100 + batch mark, 4 worker(s)",
        # drained out of a backlog (--quick: 5,000 pending)
        "claim 100 + batch mark, of 5,000 pending",
        "claim 10 + mark per msg, of 5,000 pending",
        # behind messages in flight (--quick: 400), leased on our side, locked on the other
        "claim 10 + batch mark, past 400 in flight",
    ):
        row = re.search(rf"^{re.escape(case)}.*\s([\d.]+)$", out, re.MULTILINE)
        assert row and float(row.group(1)) > 0, f"no throughput row {case}:\n{out}"
    # the ceiling of a function API: a SECURITY DEFINER wrapper of each baseline statement
    ceiling = out.split("ceiling of a function API", 1)[1]
    for case in (
        "receive, 1 call/msg, 20% dup",
        "claim 10 + mark per msg, mark wrapped",
        "claim 10 + mark per msg, both wrapped",
        "claim 100 + batch mark, both wrapped",
    ):
        row = re.search(
            rf"^{re.escape(case)}\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)$", ceiling, re.MULTILINE
        )
        assert row and all(float(g.replace(",", "")) > 0 for g in row.groups()), (
            f"no ceiling row {case}:\n{out}"
        )
    assert re.search(r"backlog received with inbox_receive_batch 1000/call: [\d,]+ msgs/s", out)
    for case in (
        "inbox_ordering_gaps, 20,000 pending: first call after the load",
        "inbox_ordering_gaps, 20,000 pending, 1000 new msgs before each",
        "inbox_ordering_gaps, 20,000 pending, nothing new",
        "inbox_health, 20,000 pending, 1000 new msgs before each",
        "inbox_health, 20,000 pending, nothing new",
        "inbox_ordering_gaps, 20,000 processed + 200 pending",
    ):
        row = re.search(rf"^{re.escape(case)}.*{ROW}", out, re.MULTILINE)
        assert row and float(row.group(1).replace(",", "")) > 0, f"no row {case}:\n{out}"
    # the scan (gaps_<inbox>) is printed as the gaps baseline
    row = re.search(rf"^inbox_ordering_gaps, 20,000 pending, nothing new{ROW}", out, re.MULTILINE)
    assert row.group(2) != "-"
    # the verdict names both functions, met or not
    for name in ("inbox_ordering_gaps", "inbox_health"):
        assert re.search(rf"^{name}\s+[\d,.]+ ms  (met|NOT MET)$", out, re.MULTILINE), out
