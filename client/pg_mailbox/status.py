"""`pg-mailbox status`: outboxes, consumer groups, inboxes and recent alerts (SPEC §5.4)."""

from __future__ import annotations

import argparse
import json
import sys
import time

import psycopg

from pg_mailbox import api
from pg_mailbox.config import EXIT_DEGRADED, StartupError, add_common, option, positive_float
from pg_mailbox.runtime import describe_dsn, first_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser, metrics=False)
    option(parser, "--json", flag_only=True, default=False, help="one JSON document on stdout")
    option(
        parser,
        "--watch",
        default=None,
        type=positive_float,
        help="refresh every SECONDS until interrupted",
    )
    option(
        parser,
        "--check",
        flag_only=True,
        default=False,
        help="exit 1 when anything is degraded or critical (for monitoring scripts)",
    )
    option(parser, "--alerts", default=10, type=int, help="how many recent alerts to show")


def collect(conn: psycopg.Connection, alerts: int = 10) -> dict:
    """Everything status shows, as plain JSON-able data, plus a list of problems."""
    problems: list[str] = []
    outboxes = []
    for name in api.outboxes(conn):
        st = api.outbox_status(conn, name)
        outboxes.append(st)
        if st.get("storage_status") not in (None, "ok"):
            problems.append(f"outbox {name}: storage {st.get('storage_status')}")
    lag_by_group: dict[str, list] = {}
    for lag in api.consumer_lag(conn):
        lag_by_group.setdefault(lag.group_name, []).append(lag)
    groups = []
    for g in api.groups(conn):
        consumers = [c for c in lag_by_group.get(g["group_name"], []) if c.consumer_id]
        unhealthy = [c.consumer_id for c in consumers if c.healthy is False]
        groups.append(
            {
                "group": g["group_name"],
                "outbox": g["outbox_name"],
                "group_offset": g["group_offset"],
                "head_offset": g["head_offset"],
                "lag": g["lag"],
                "in_flight": g["in_flight"],
                "consumers": len(consumers),
                "unhealthy_consumers": unhealthy,
                "healthy": not unhealthy,
            }
        )
        if unhealthy:
            problems.append(f"group {g['group_name']}: unhealthy consumers {', '.join(unhealthy)}")
    inboxes = []
    for name in api.inboxes(conn):
        h = api.inbox_health(conn, name)
        inboxes.append(h)
        if h.get("health_status") not in (None, "healthy"):
            problems.append(f"inbox {name}: {h.get('health_status')}")
    recent: list = []
    if alerts > 0:
        try:
            recent = api.recent_alerts(conn, alerts)
        except psycopg.errors.InsufficientPrivilege:
            problems_note = "alerts need mailbox_admin (SELECT on mailbox.alert_log)"
            recent = [{"note": problems_note}]
    return {
        "outboxes": outboxes,
        "groups": groups,
        "inboxes": inboxes,
        "alerts": recent,
        "problems": problems,
        "healthy": not problems,
    }


def render(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title="outboxes")
    for col in ("outbox", "rows", "head", "bytes", "storage", "groups"):
        t.add_column(col)
    for o in data["outboxes"]:
        t.add_row(
            str(o.get("outbox")),
            str(o.get("row_count")),
            str(o.get("head_offset")),
            str(o.get("total_bytes")),
            _color(o.get("storage_status")),
            str(len(o.get("consumer_groups") or [])),
        )
    console.print(t)
    t = Table(title="consumer groups")
    for col in ("group", "outbox", "offset", "head", "lag", "in flight", "consumers", "healthy"):
        t.add_column(col)
    for g in data["groups"]:
        t.add_row(
            g["group"],
            g["outbox"],
            str(g["group_offset"]),
            str(g["head_offset"]),
            str(g["lag"]),
            str(g["in_flight"]),
            str(g["consumers"]),
            _color(
                "ok" if g["healthy"] else "critical",
                "yes" if g["healthy"] else "no: " + ", ".join(g["unhealthy_consumers"]),
            ),
        )
    console.print(t)
    t = Table(title="inboxes")
    for col in (
        "inbox",
        "health",
        "pending",
        "in flight",
        "dead letters",
        "processed",
        "oldest pending s",
    ):
        t.add_column(col)
    for h in data["inboxes"]:
        t.add_row(
            str(h.get("inbox_name")),
            _color(h.get("health_status")),
            str(h.get("pending_count")),
            str(h.get("in_flight_count")),
            str(h.get("dead_letter_count")),
            str(h.get("processed_count")),
            str(h.get("oldest_pending_age_sec")),
        )
    console.print(t)
    if data["alerts"]:
        t = Table(title="recent alerts")
        keys = list(data["alerts"][0].keys())
        for col in keys:
            t.add_column(col)
        for a in data["alerts"]:
            t.add_row(*[str(a.get(k)) for k in keys])
        console.print(t)
    if data["problems"]:
        console.print("[bold red]degraded:[/] " + "; ".join(data["problems"]))
    else:
        console.print("[green]all healthy[/]")


def _color(status: object, text: str | None = None) -> str:
    text = text if text is not None else str(status)
    color = {
        "ok": "green",
        "healthy": "green",
        "warning": "yellow",
        "degraded": "yellow",
        "critical": "red",
    }.get(str(status))
    return f"[{color}]{text}[/]" if color else text


def run(args: argparse.Namespace) -> int:
    try:
        conn = psycopg.connect(args.dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StartupError(
            f"cannot connect to the database ({describe_dsn(args.dsn)}): {first_line(exc)}",
            "check --dsn / PG_MAILBOX_DSN (or PGHOST, PGPORT, PGUSER)",
        ) from None
    with conn:
        if api.extension_version(conn) is None:
            raise StartupError(
                "the pg_mailbox extension is not installed in this database",
                "run: CREATE EXTENSION pg_mailbox CASCADE;",
            )
        while True:
            data = collect(conn, args.alerts)
            if args.json:
                print(json.dumps(data, default=str, indent=None if args.watch else 2), flush=True)
            else:
                render(data)
            if not args.watch:
                break
            try:
                time.sleep(args.watch)
            except KeyboardInterrupt:
                break
            if not args.json and sys.stdout.isatty():
                print("\033[2J\033[H", end="")
    return EXIT_DEGRADED if args.check and not data["healthy"] else 0
