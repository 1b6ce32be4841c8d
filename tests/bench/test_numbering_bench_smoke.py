"""bench/numbering_bench.py runs end to end at tiny sizes and prints a row per case, so the
benchmark does not rot between measurements (it did once: it altered outbox_<N>, which
became a view)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "numbering_bench.py"


def test_numbering_bench_prints_every_case(dsn: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--dsn",
            dsn,
            "--small",
            "800",  # conc1 splits the rows over 8 producers
            "--big",
            "1600",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for pattern in ("txn1000", "conc1", "one"):
        for autovacuum in ("off", "on"):
            for rows in ("800", "1600"):
                assert re.search(
                    rf"^{pattern}\s+{autovacuum}\s+{rows}\s+[\d.]+", done.stdout, re.M
                ), (
                    pattern,
                    autovacuum,
                    rows,
                    done.stdout,
                )
