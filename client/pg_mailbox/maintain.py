"""`pg-mailbox maintain`: run mailbox.run_maintenance() on an interval (when pg_cron is absent)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import psycopg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", required=True, help="libpq connection string of the database")
    parser.add_argument(
        "--interval", type=float, default=60.0, help="seconds between passes (default 60)"
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")


def run_once(conn: psycopg.Connection) -> dict:
    """One maintenance pass in its own transaction; returns its counts."""
    with conn.transaction():
        return conn.execute("SELECT mailbox.run_maintenance()").fetchone()[0]


def summary(result: dict) -> str:
    if result.get("skipped"):
        return "skipped: another pass is running"
    done = {k: v for k, v in sorted(result.items()) if k != "skipped" and v}
    return json.dumps(done) if done else "nothing to do"


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set():
        started = time.monotonic()
        try:
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                print(f"{time.strftime('%H:%M:%S')} {summary(run_once(conn))}", flush=True)
        except psycopg.Error as exc:
            # keep going: the database may be restarting; the next pass reconnects
            print(f"{time.strftime('%H:%M:%S')} maintenance failed: {exc}", file=sys.stderr)
            if args.once:
                return 1
        if args.once:
            return 0
        stop.wait(max(0.0, args.interval - (time.monotonic() - started)))
    return 0
