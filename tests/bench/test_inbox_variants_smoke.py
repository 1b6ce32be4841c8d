"""bench/inbox_variants.py runs both cases end to end at a tiny size and prints a backend CPU
figure per variant (the numbers mean nothing), against the test cluster, which runs on this
machine (the script reads its backends' /proc entries). Every variant checks what it did:
each mark returns true, each claim takes its batch. --also-in runs the API's variant in a
second database too and prints the paired difference; its inboxes are dropped at the end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

BENCH = Path(__file__).resolve().parents[2] / "bench" / "inbox_variants.py"

VARIANTS = {
    "mark": ("inbox_mark_processed", "old shape", "named mark, direct", "plain UPDATE"),
    "claim": ("SKIP LOCKED LIMIT 10", "inbox_claim", "generated claim, direct"),
    "claim --batch 100 --batch-mark": (
        "SKIP LOCKED LIMIT 100",
        "inbox_claim",
        "generated claim, direct",
    ),
}


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_inbox_variants_prints_every_variant(dsn: str, case: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--case", *case.split(), "--messages", "2400", "--dsn", dsn],
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


def test_inbox_variants_runs_the_api_in_another_database_too(dsn: str) -> None:
    other = "inbox_variants_other"
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(f"DROP DATABASE IF EXISTS {other}")
        db.execute(f"CREATE DATABASE {other}")
    params = conninfo_to_dict(dsn)
    params["dbname"] = other
    try:
        with psycopg.connect(make_conninfo(**params), autocommit=True) as db:
            db.execute("CREATE EXTENSION pg_mailbox CASCADE")
        done = subprocess.run(
            [sys.executable, str(BENCH), "--case", "mark", "--messages", "2400"]
            + ["--also-in", other, "--dsn", dsn],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert re.search(
            rf"^inbox_mark_processed in {other}\s+[\d.]+\s", done.stdout, re.MULTILINE
        ), done.stdout
        assert re.search(
            rf"^inbox_mark_processed in {other} minus inbox_mark_processed: median -?[\d.]+,",
            done.stdout,
            re.MULTILINE,
        ), done.stdout
        with psycopg.connect(make_conninfo(**params), autocommit=True) as db:
            left = db.execute("SELECT count(*) FROM mailbox._inbox").fetchone()[0]
            tables = db.execute(
                "SELECT count(*) FROM pg_tables"
                " WHERE schemaname = 'mailbox' AND tablename ~ '^v[0-9]+$'"
            ).fetchone()[0]
        assert (left, tables) == (0, 0)
    finally:
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")
