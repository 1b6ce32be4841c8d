"""bench/inbox_variants.py runs both cases end to end at a tiny size and prints a backend CPU
figure per variant (the numbers mean nothing), against the test cluster, which runs on this
machine (the script reads its backends' /proc entries). Every variant checks what it did:
each mark returns true, each claim takes ten messages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "inbox_variants.py"

VARIANTS = {
    "mark": ("inbox_mark_processed", "old shape", "named mark, direct", "plain UPDATE"),
    "claim": ("SKIP LOCKED LIMIT 10", "inbox_claim", "generated claim, direct"),
}


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_inbox_variants_prints_every_variant(dsn: str, case: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--case", case, "--messages", "2400", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for n, variant in enumerate(VARIANTS[case]):
        row = re.search(
            rf"^{re.escape(variant)}\s+([\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+) \.\. (-?[\d.]+)$",
            done.stdout,
            re.MULTILINE,
        )
        assert row, f"no row {variant}:\n{done.stdout}"
        assert float(row.group(1)) > 0, done.stdout
        if n == 0:  # the first variant is what the others are compared with
            assert row.group(2) == "0.0", done.stdout
