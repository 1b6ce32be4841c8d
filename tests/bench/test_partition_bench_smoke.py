"""bench/partition_bench.py --quick runs end to end and prints its report.

Tiny sizes: the numbers mean nothing, but every cell must drain a fresh backlog that nothing
numbered before its clock started (the bench asserts it), find no per-key order violation and
no lost or duplicated row (the bench exits 1 otherwise), and print its tables, so the
benchmark does not rot between the times someone measures with it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "partition_bench.py"


def test_partition_bench_quick_prints_the_report(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for fact in ("command: ", "date: ", "machine: ", "server: PostgreSQL 15", "load average"):
        assert fact in out, fact
    assert "numbering inside the clock" in out
    cells = re.findall(
        r"^(16 partitions|1 partition)\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)x\s+(\d+)\s",
        out,
        re.MULTILINE,
    )
    assert [(c[0], c[1], float(c[2]) > 0) for c in cells] == [
        ("16 partitions", "1", True),
        ("16 partitions", "2", True),
        ("16 partitions", "4", True),
        ("16 partitions", "1", False),
        ("1 partition", "1", False),
    ], out
    assert all(c[6] == "0" for c in cells), out  # per-key order violations
    assert "PROBLEM" not in out, out
    assert re.search(r"^inline \(no numberer\)\s+[\d.]+\s+[\d.]+$", out, re.MULTILINE), out
    assert re.search(r"^run_numberer\s+[\d.]+\s+[\d.]+$", out, re.MULTILINE), out
