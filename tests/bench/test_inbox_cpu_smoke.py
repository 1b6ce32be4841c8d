"""bench/inbox_cpu.py --quick runs end to end and prints a backend CPU figure per variant.

A smoke run with tiny sizes (the numbers mean nothing) against the test cluster, which runs
on this machine (the script reads its backends' /proc entries). Each claim variant checks
that it drained its table; the baseline of each case prints a ratio of exactly 1.00; every
row has a WAL figure.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "inbox_cpu.py"

ROWS = {
    "receive, 1 call/msg, 20% dup": ("INSERT ... ON CONFLICT", "ceiling wrapper", "inbox_receive"),
    "claim 10 + mark per msg, 1 worker": (
        "SKIP LOCKED + UPDATE",
        "ceiling wrapper",
        "ceiling, both wrapped",
        "inbox_claim + mark",
    ),
    "claim 100 + batch mark, 1 worker": (
        "SKIP LOCKED + UPDATE",
        "ceiling, both wrapped",
        "inbox_claim + mark",
    ),
}


def test_inbox_cpu_quick_prints_every_variant(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--functions", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for case, variants in ROWS.items():
        for n, variant in enumerate(variants):
            row = re.search(
                rf"^{re.escape(case)}\s+{re.escape(variant)}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
                out,
                re.MULTILINE,
            )
            assert row, f"no row {case} / {variant}:\n{out}"
            assert float(row.group(1)) > 0 and float(row.group(2)) > 0, out
            assert float(row.group(3)) > 0, out  # each variant writes WAL for what it stores
            if n == 0:
                assert row.group(2) == "1.00", out
    # --functions: the marks' and claims' own functions, with calls and time per message
    for fn in ("inbox_mark_processed", "inbox_claim"):
        row = re.search(rf"^{fn}\s+([\d,]+)\s+([\d.]+)$", out, re.MULTILINE)
        assert row and int(row.group(1).replace(",", "")) > 0, f"no function row {fn}:\n{out}"
