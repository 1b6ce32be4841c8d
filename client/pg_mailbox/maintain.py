"""`pg-mailbox maintain`: run mailbox.run_maintenance() on an interval (when pg_cron is absent),
and with --numberer the background numberer (CALL mailbox.run_numberer(), SPEC §2.2.4)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

import psycopg

from pg_mailbox import api
from pg_mailbox.config import StartupError, add_common, option, positive_float
from pg_mailbox.runtime import describe_dsn, first_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser, metrics=False)
    option(parser, "--interval", default=60.0, type=positive_float, help="seconds between passes")
    option(parser, "--once", flag_only=True, default=False, help="run one pass and exit")
    option(
        parser,
        "--numberer",
        flag_only=True,
        default=False,
        help="also run the background numberer (CALL mailbox.run_numberer()) so that a"
        " consumer idle in its poll transaction holds back only its own rows (SPEC 2.2.4;"
        " docs/consumer-groups.md); one per database, a second one waits",
    )


def run_once(conn: psycopg.Connection) -> dict:
    """One maintenance pass in its own transaction; returns its counts."""
    with conn.transaction():
        return api.run_maintenance(conn)


def summary(result: dict) -> str:
    if result.get("skipped"):
        return "skipped: another pass is running"
    done = {k: v for k, v in sorted(result.items()) if k != "skipped" and v}
    return json.dumps(done) if done else "nothing to do"


def _check_start(dsn: str) -> None:
    """Exit 3 with advice when the database or the extension is missing at start."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            if api.extension_version(conn) is None:
                raise StartupError(
                    "maintenance failed: the pg_mailbox extension is not installed in this"
                    " database",
                    "run: CREATE EXTENSION pg_mailbox CASCADE;",
                )
    except psycopg.Error as exc:
        raise StartupError(
            f"maintenance failed: cannot connect to the database ({describe_dsn(dsn)}):"
            f" {first_line(exc)}",
            "check --dsn / PG_MAILBOX_DSN (or PGHOST, PGPORT, PGUSER)",
        ) from None


def _run_numberer(dsn: str, stop: threading.Event, held: list) -> None:
    """CALL mailbox.run_numberer() again and again on a connection of its own (autocommit: it
    commits each pass itself) until stop; reconnects after an error."""
    while not stop.is_set():
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                held[:] = [conn]
                print(f"{time.strftime('%H:%M:%S')} numberer running", flush=True)
                while not stop.is_set():
                    api.run_numberer(conn, 60)
        except psycopg.Error as exc:
            if stop.is_set():
                return
            print(
                f"{time.strftime('%H:%M:%S')} numberer failed: {first_line(exc)}", file=sys.stderr
            )
            stop.wait(5)
        finally:
            held.clear()


def run(args: argparse.Namespace) -> int:
    _check_start(args.dsn)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    numberer = None
    held: list = []
    if args.numberer and not args.once:
        numberer = threading.Thread(target=_run_numberer, args=(args.dsn, stop, held), daemon=True)
        numberer.start()
    try:
        return _maintain(args, stop)
    finally:
        stop.set()
        for conn in list(held):
            conn.cancel_safe()  # ends the CALL in progress; the thread then returns
        if numberer is not None:
            numberer.join(timeout=10)


def _maintain(args: argparse.Namespace, stop: threading.Event) -> int:
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
