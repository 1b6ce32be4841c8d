"""bench/inbox_receive_pgbench.sh runs its three cases in both commit modes and prints one
line per round and a summary with ratios.

A smoke run with tiny sizes (the numbers mean nothing) in the test's database; the script
cleans up what it made (the inbox, the plain table and the ceiling functions).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import psycopg

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "inbox_receive_pgbench.sh"


def test_every_case_prints_a_time_per_round_and_a_summary(pg_cluster, dsn: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    env = {**os.environ, **pg_cluster.env()}
    done = subprocess.run(
        ["bash", str(SCRIPT), "20", "2", dbname],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for sync in ("on", "off"):
        rounds = re.findall(
            rf"^round \d \(synchronous_commit {sync}\):"
            r"(?:\s+(?:plain|ceiling|receive) [\d.]+ us){3}$",
            out,
            re.MULTILINE,
        )
        assert len(rounds) == 2, out
        summary = re.search(
            rf"^synchronous_commit {sync}, medians:\s+plain ([\d.]+) us"
            r"\s+ceiling ([\d.]+) us \(ratio ([\d.]+)\)\s+receive ([\d.]+) us \(ratio ([\d.]+)\)$",
            out,
            re.MULTILINE,
        )
        assert summary and all(float(v) > 0 for v in summary.groups()), out
    with psycopg.connect(dsn) as conn:
        left = conn.execute(
            "SELECT to_regclass('public.plain_inbox'), to_regclass('mailbox.pgb'),"
            " to_regprocedure('public.ceiling_receive(text)'),"
            " to_regprocedure('public.ceiling_claim(int)'),"
            " to_regprocedure('public.ceiling_mark_batch(text[])')"
        ).fetchone()
        assert left == (None,) * 5


def test_a_wrong_call_prints_the_usage(pg_cluster) -> None:
    done = subprocess.run(["bash", str(SCRIPT), "20"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage:" in done.stderr, done.stderr
