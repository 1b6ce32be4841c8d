"""bench/inbox_cpu.py --quick runs end to end and prints a backend CPU figure per variant.

A smoke run with tiny sizes (the numbers mean nothing) against the test cluster, which runs
on this machine (the script reads its backends' /proc entries). Each claim variant checks
that it drained its table; the baseline of each case prints a ratio of exactly 1.00; every
row has a WAL figure. --statements starts a private cluster with pg_stat_statements and lists,
for both claim cases and both sides, the statements each ran (the marks' UPDATE nested in
pg_mailbox's functions).
"""

from __future__ import annotations

import itertools
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
        [sys.executable, str(BENCH), "--quick", "--functions", "--statements", "--dsn", dsn],
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
    # --functions: the marks' and claims' own functions, with calls and time per message (the
    # single mark is inlined into the client's statement: its named mark is what runs)
    for fn in (r"_inbox_\d+_processed_named", "inbox_claim"):
        row = re.search(rf"^{fn}\s+([\d,]+)\s+([\d.]+)$", out, re.MULTILINE)
        assert row and int(row.group(1).replace(",", "")) > 0, f"no function row {fn}:\n{out}"
    # --statements: each side of each claim case, with its backend CPU and its statements
    for case in ("claim 10 + mark per msg", "claim 100 + batch mark"):
        for side in ("SKIP LOCKED + UPDATE", "inbox_claim + mark"):
            head = re.search(
                rf"^{re.escape(case)} / {re.escape(side)}: backend CPU ([\d.]+) us/msg$",
                out,
                re.MULTILINE,
            )
            assert head and float(head.group(1)) > 0, f"no statements for {case} / {side}:\n{out}"
        # the lines of pg_mailbox's side of this case: indented, up to the next heading
        after = out.split(f"{case} / inbox_claim + mark:")[1].splitlines()[1:]
        section = "\n".join(
            line for line in itertools.takewhile(lambda x: x.startswith(" "), after)
        )
        assert re.search(
            r"^\s+[\d.]+\s+[\d.]+ top\s+SELECT mailbox.inbox_mark_processed", section, re.M
        )
        assert re.search(
            r"^\s+[\d.]+\s+[\d.]+ nested UPDATE mailbox\.cpu|nested WITH d AS \( UPDATE",
            section,
            re.M,
        ), section
