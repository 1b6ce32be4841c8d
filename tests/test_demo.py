"""`pg-mailbox demo --dsn` runs end to end against a real database (the README's command)."""

import subprocess
import sys


def test_demo_runs_end_to_end(fresh_dsn):
    got = subprocess.run(
        [sys.executable, "-m", "pg_mailbox", "demo", "--dsn", fresh_dsn],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr
    assert "[12/12] outbox health" in got.stdout
    assert '"claim_check": true' in got.stdout and "page 4: row_num 15001..20000" in got.stdout
    assert got.stdout.rstrip().endswith("demo done")
