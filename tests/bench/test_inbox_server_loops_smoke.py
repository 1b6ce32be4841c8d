"""bench/inbox_server_loops.sh runs every mode and prints one time per round.

A smoke run with tiny sizes (the numbers mean nothing) in the test's database: the claim
loops per message and per batch with their plain-SQL baselines, the marks alone, the
committed receives, and
the ordered claims, which must take one message per aggregate per claim and leave no
aggregate's lower sequence unprocessed behind a processed higher one (also with each
aggregate's messages received together, BURSTS=1).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import psycopg

LOOPS = Path(__file__).resolve().parents[2] / "bench" / "inbox_server_loops.sh"


def run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        ["bash", str(LOOPS), *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


# Unprocessed messages of ordered inbox 'ordc' with a processed higher sequence behind them.
OUT_OF_ORDER = (
    "SELECT count(*) FROM mailbox.ordc AS a JOIN mailbox.ordc AS b"
    " ON a.aggregate_id = b.aggregate_id AND a.sequence_num < b.sequence_num"
    " WHERE a.processed_at IS NULL AND b.processed_at IS NOT NULL"
)


def out_of_order(conn: psycopg.Connection) -> int:
    return conn.execute(OUT_OF_ORDER).fetchone()[0]


def test_every_mode_prints_a_time_per_round(pg_cluster, dsn: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    env = {**os.environ, **pg_cluster.env()}
    for mode, batch, baseline in (
        ("per_message", "5", "0"),
        ("batch", "10", "0"),
        ("batch", "10", "1"),
        ("marks", "5", "0"),
        ("marks", "5", "1"),
        ("receive", "1", "0"),
        ("receive", "1", "1"),
        ("ordered", "10", "0"),
    ):
        out = run({**env, "BASELINE": baseline, "AGGS": "7"}, "4", batch, mode, "2", dbname)
        times = re.findall(rf"^round \d:\s+{re.escape(dbname)} ([\d.]+) us/msg$", out, re.MULTILINE)
        assert len(times) == 2 and all(float(t) > 0 for t in times), (mode, baseline, out)
    with psycopg.connect(dsn) as conn:
        # 4 claims of at most 10 over 7 aggregates took 7 + 7 + 7 + 7 of the 40 messages
        # loaded (one per aggregate per claim), in sequence order per aggregate
        left = conn.execute(
            "SELECT count(*) FROM mailbox.ordc WHERE processed_at IS NULL"
        ).fetchone()
        assert left == (40 - 28,)
        assert out_of_order(conn) == 0
    # each aggregate's messages received together (BURSTS=1): still in sequence order
    out = run({**env, "AGGS": "7", "BURSTS": "1"}, "4", "10", "ordered", "1", dbname)
    assert re.search(rf"^round 1:\s+{re.escape(dbname)} [\d.]+ us/msg$", out, re.MULTILINE), out
    with psycopg.connect(dsn) as conn:
        assert (
            conn.execute(
                "SELECT count(*) FROM mailbox.ordc WHERE processed_at IS NOT NULL"
            ).fetchone()[0]
            > 0
        )
        assert out_of_order(conn) == 0
