"""bench/inbox_plans.py --quick runs end to end at a tiny size (the numbers mean nothing) and
prints every case and variant; every drain checks, by the count of processed rows, that it
did what it timed; its two scratch databases are dropped at the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg

BENCH = Path(__file__).resolve().parents[2] / "bench" / "inbox_plans.py"


def test_inbox_plans_quick_prints_every_case(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for case, variants in (
        ("burst after idle: claim 100 + batch mark", ("shipped", "no setting", "plain SQL")),
        ("burst after idle: claim 10 + mark per msg", ("shipped", "no setting", "plain SQL")),
        ("beside leases of another inbox: claim 10 + mark per msg", ("shipped", "no setting")),
        ("ordered: claim 100 + batch mark", ("shipped", "no setting")),
        ("ordered: claim 10 + mark per msg", ("shipped", "no setting")),
    ):
        for variant in variants:
            assert f"{case:58s} {variant:11s}" in out, (case, variant, out)
    with psycopg.connect(dsn, autocommit=True) as db:
        left = db.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'inbox_plans_%'"
        ).fetchone()[0]
    assert left == 0
