"""`pg-mailbox demo`: the outbox end to end, on a throwaway cluster or an existing database.

Every step prints the SQL it runs and what came back, so the output doubles as a tour.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pg_mailbox.cluster import Cluster, ClusterError

DEMO_DB = "demo"
DEMO_TABLE_COMMENT = "pg_mailbox demo table"
BULK_ROWS = 20000
PAGE_SIZE = 5000
POLL_COLUMNS = (
    "outbox_id, event_id, created_at, source, event_type, key, headers, payload,"
    " inserted_count, deleted_count, is_claim_check, full_refresh"
)


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        help="use this existing database (superuser) instead of a throwaway cluster; the demo"
        " creates public.orders and the outboxes 'orders' and 'events' there",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="with --dsn: drop an existing public.orders and outboxes 'orders'/'events' first",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(".demo"),
        help="where the throwaway cluster lives (default: ./.demo, recreated on every run)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the throwaway cluster running and print its DSN"
    )
    parser.add_argument(
        "--stop", action="store_true", help="stop and remove a cluster left by --keep, then exit"
    )


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def step(self, text: str) -> None:
        self.done += 1
        print(f"\n[{self.done:>2}/{self.total}] {text}", flush=True)

    @staticmethod
    def say(text: str = "") -> None:
        for line in text.splitlines() or [""]:
            print(f"        {line}", flush=True)


def _short(value: object, width: int = 40) -> str:
    if isinstance(value, dict | list):
        text = json.dumps(value, default=str)
    elif isinstance(value, datetime):
        text = value.strftime("%H:%M:%S.%f")[:-3]
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = "" if value is None else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(rows: list[dict], columns: list[str]) -> str:
    """psql-like aligned output; uuids cut to 8 characters to keep lines short."""
    cells = [[_short(r[c], 9 if c == "event_id" else 40) for c in columns] for r in rows]
    sizes = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = [" | ".join(c.ljust(n) for c, n in zip(columns, sizes, strict=True))]
    lines.append("-+-".join("-" * n for n in sizes))
    lines += [" | ".join(v.ljust(n) for v, n in zip(row, sizes, strict=True)) for row in cells]
    return "\n".join(lines)


def _run(p: Progress, conn: psycopg.Connection, query: str, params: object = None) -> list[dict]:
    p.say(f"sql> {query}")
    cur = conn.cursor(row_factory=dict_row).execute(query, params)
    return cur.fetchall() if cur.description else []


def _prepare_existing(p: Progress, conn: psycopg.Connection, replace: bool) -> None:
    """Refuse to touch a user's objects unless --replace says so."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_mailbox CASCADE")
    table = conn.execute("SELECT to_regclass('public.orders')").fetchone()[0]
    outboxes = [
        name
        for (name,) in conn.execute(
            "SELECT outbox_name FROM mailbox.outboxes WHERE outbox_name IN ('orders', 'events')"
        )
    ]
    if (table or outboxes) and not replace:
        found = ", ".join([*(["table public.orders"] if table else []), *outboxes])
        raise DemoError(f"already in this database: {found}; rerun with --replace to drop them")
    for name in outboxes:
        _run(p, conn, "SELECT mailbox.drop_outbox(%s)", [name])
    if table:
        _run(p, conn, "DROP TABLE public.orders")


def tour(p: Progress, conn: psycopg.Connection) -> None:
    p.step("create the table to capture")
    _run(
        p,
        conn,
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, customer text, amount numeric)",
    )
    conn.execute(sql.SQL("COMMENT ON TABLE public.orders IS {}").format(DEMO_TABLE_COMMENT))

    p.step("capture it: every statement that changes rows writes one outbox row")
    name = _run(p, conn, "SELECT mailbox.enable_outbox('public.orders')")[0]["enable_outbox"]
    p.say(f"-> outbox {name!r}: table mailbox.outbox_{name}")

    p.step("write to it as usual")
    _run(
        p,
        conn,
        "INSERT INTO public.orders (customer, amount) VALUES ('ann', 10), ('bob', 20), ('cy', 30)",
    )
    _run(p, conn, "UPDATE public.orders SET amount = 25 WHERE customer = 'bob'")
    _run(p, conn, "DELETE FROM public.orders WHERE customer = 'cy'")

    p.step(f"a big statement: {BULK_ROWS} rows become one claim-check row")
    threshold = conn.execute(
        "SELECT current_setting('mailbox.outbox_inline_threshold_rows', true)"
    ).fetchone()[0]
    if threshold and threshold.isdigit() and int(threshold) >= BULK_ROWS:
        _run(p, conn, "SET mailbox.outbox_inline_threshold_rows = 10000")
    p.say(f"(inline up to mailbox.outbox_inline_threshold_rows = {threshold or '10000'} rows)")
    _run(
        p,
        conn,
        "INSERT INTO public.orders (customer, amount)"
        f" SELECT 'bulk-' || g, g FROM generate_series(1, {BULK_ROWS}) AS g",
    )

    p.step("TRUNCATE is captured too (a full refresh)")
    _run(p, conn, "TRUNCATE public.orders")

    p.step("publish an event directly, no table involved")
    _run(p, conn, "SELECT mailbox.create_outbox('events')")
    event = _run(
        p,
        conn,
        "SELECT mailbox.outbox_publish('events', '{\"hello\":\"world\"}',"
        " p_event_type => 'greeting')",
    )[0]["outbox_publish"]
    p.say(f"-> event id {event}")

    p.step("read both outboxes as consumer group 'demo' (earliest: every retained row)")
    for outbox in ("orders", "events"):
        _run(
            p,
            conn,
            f"SELECT mailbox.create_consumer_group('demo_{outbox}', '{outbox}', 'earliest')",
        )

    columns = [
        "outbox_id",
        "event_id",
        "created_at",
        "source",
        "event_type",
        "key",
        "headers",
        "inserted_count",
        "deleted_count",
        "is_claim_check",
        "full_refresh",
    ]
    claim = None
    for outbox in ("orders", "events"):
        p.step(f"what arrived in outbox {outbox!r}: poll, then acknowledge")
        rows = _run(
            p,
            conn,
            f"SELECT {POLL_COLUMNS} FROM mailbox.poll_outbox('demo_{outbox}', 'demo-1', 100)",
        )
        p.say(_table(rows, columns))
        for row in rows:
            p.say(f"payload of outbox_id {row['outbox_id']}: {_short(row['payload'], 150)}")
            if row["is_claim_check"] and claim is None and outbox == "orders":
                claim = row["outbox_id"]
        if rows:
            _run(
                p,
                conn,
                "SELECT mailbox.commit_offset(%s, 'demo-1', %s)",
                [f"demo_{outbox}", rows[-1]["outbox_id"]],
            )

    p.step("read the claim-check row page by page (bounded memory, any size)")
    if claim is None:
        raise DemoError("no claim-check row arrived: is the inline threshold above 20000?")
    query = "SELECT row_num, op, payload FROM mailbox.outbox_delta_rows('orders', %s, %s, %s)"
    p.say(f"sql> {query}  -- outbox_id {claim}, after row_num, page size {PAGE_SIZE}")
    after, page_no = 0, 0
    while page := conn.execute(query, [claim, after, PAGE_SIZE]).fetchall():
        page_no += 1
        ops = Counter(op for _, op, _ in page)
        p.say(
            f"page {page_no}: row_num {page[0][0]}..{page[-1][0]}"
            f" ({', '.join(f'{n} {op}' for op, n in sorted(ops.items()))})"
            f"  first: {_short(page[0][2], 60)}"
        )
        after = page[-1][0]

    _run(p, conn, "SELECT mailbox.outbox_rows_consumed('orders', %s, 'demo_orders')", [claim])

    p.step("outbox health")
    status = _run(p, conn, "SELECT mailbox.outbox_status('orders')")[0]["outbox_status"]
    p.say(json.dumps(status, indent=2, default=str))


def run(args: argparse.Namespace) -> int:
    progress = Progress(12 if args.dsn else 13)
    cluster: Cluster | None = None
    try:
        if args.stop:
            Cluster(args.dir).destroy()
            print(f"stopped and removed the demo cluster at {args.dir}")
            return 0
        if args.dsn:
            progress.step("use the existing database and install pg_mailbox")
            conn = psycopg.connect(args.dsn, autocommit=True)
            _prepare_existing(progress, conn, args.replace)
        else:
            progress.step(f"start a throwaway PostgreSQL cluster in {args.dir}")
            Cluster(args.dir).destroy()  # rerunnable: a kept cluster from last time goes
            cluster = Cluster(args.dir).init().start()
            if args.dir.is_symlink():
                progress.say(f"{args.dir} -> {cluster.base_dir} (the postgres user cannot reach")
                progress.say("the original directory, so the data lives under /tmp)")
            with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DB)))
            conn = psycopg.connect(cluster.dsn(DEMO_DB), autocommit=True)
            progress.say(f"dsn: {cluster.dsn(DEMO_DB)}")
            progress.step("install the extension")
            _run(progress, conn, "CREATE EXTENSION pg_mailbox CASCADE")
        with conn:
            tour(progress, conn)
    except (psycopg.Error, ClusterError, DemoError) as exc:
        state = getattr(getattr(exc, "diag", None), "sqlstate", None)
        print(f"\ndemo failed{f' (SQLSTATE {state})' if state else ''}: {exc}", file=sys.stderr)
        if cluster is not None:
            if args.keep:
                print(f'cluster kept running: psql "{cluster.dsn(DEMO_DB)}"', file=sys.stderr)
            else:
                cluster.destroy()
        return 1
    if cluster is not None:
        if args.keep:
            print(f'\ncluster kept running: psql "{cluster.dsn(DEMO_DB)}"')
            print(f"stop it with: pg-mailbox demo --stop --dir {args.dir}")
        else:
            cluster.destroy()
            print("\ndemo done; cluster stopped and removed (use --keep to explore it)")
    else:
        print("\ndemo done")
    return 0
