"""`pg-mailbox ingest`: broker -> inbox (SPEC §5.3).

Fetch up to --batch-size messages, ``inbox_receive`` them in one transaction, and only
after it committed acknowledge them to the broker: a crash in between redelivers, and the
inbox's primary key drops the duplicate.
"""

from __future__ import annotations

import argparse
import asyncio

import psycopg

from pg_mailbox import api
from pg_mailbox.config import (
    StartupError,
    UsageError,
    add_common,
    option,
    positive_float,
    positive_int,
)
from pg_mailbox.runtime import Backoff, Log, Metrics, Stopper, connect, first_line
from pg_mailbox.sources import SourceError, SourceUnavailable, open_source

DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    option(parser, "--inbox", default=None, help="inbox to receive into (required)")
    option(
        parser,
        "--source",
        default=None,
        help="nats://H:P?stream=S&subject=T&durable=D, amqp://...?queue=Q or"
        " redis://H:P/DB?stream=K&group=G (required)",
    )
    option(
        parser,
        "--batch-size",
        default=100,
        type=positive_int,
        help="messages per inbox transaction (and AMQP prefetch)",
    )
    option(
        parser,
        "--poll-interval",
        default=1.0,
        type=positive_float,
        help="seconds one fetch waits for messages",
    )
    option(
        parser,
        "--once",
        flag_only=True,
        default=False,
        help="ingest until the source has nothing for one poll interval, then exit 0",
    )


async def _run(
    args: argparse.Namespace, metrics: Metrics | None = None, stopper: Stopper | None = None
) -> int:
    """``metrics`` and ``stopper`` let an embedding program (pg_mailbox.demo) read the
    counters and stop the loop; the command makes its own."""
    log = Log(args.log_format, "ingest")
    metrics = metrics or Metrics()
    if not args.inbox or not args.source:
        raise UsageError("--inbox and --source are required")
    try:
        source = open_source(args.source)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    stopper = stopper or Stopper()
    conn = await connect(args.dsn)
    try:
        if not await api.ainbox_exists(conn, args.inbox):
            raise StartupError(
                f"inbox not found: {args.inbox}",
                f"create it: SELECT mailbox.create_inbox('{args.inbox}');",
            )
        try:
            await source.start()
        except SourceUnavailable as exc:
            raise StartupError(
                f"source unreachable: {exc}", "start the broker or fix --source"
            ) from None
        metrics.serve(args.metrics_port)
        log("started", inbox=args.inbox, source=args.source.split("?")[0])
        backoff = Backoff()
        down: str | None = None
        while not stopper.stopping:
            try:
                if conn is None or conn.closed:
                    metrics.reconnects.labels("database").inc()
                    conn = await psycopg.AsyncConnection.connect(
                        args.dsn, autocommit=True, connect_timeout=10
                    )
                batch = await source.fetch(args.batch_size, args.poll_interval)
                if not batch:
                    if args.once:
                        log("drained", inbox=args.inbox)
                        return 0
                    continue
                flags = await api.ainbox_receive_many(conn, args.inbox, [m.record for m in batch])
                await source.ack(batch)
                new = sum(flags)
                log.progress(len(flags), "messages ingested")
                metrics.ingested.labels(args.inbox, "received").inc(new)
                if len(flags) - new:
                    metrics.ingested.labels(args.inbox, "duplicate").inc(len(flags) - new)
                if down:
                    log(f"{down} reachable again")
                    down = None
                backoff.reset()
            except DB_ERRORS as exc:
                if down != "database":
                    down = "database"
                    log("database unreachable, retrying", error=first_line(exc))
                if conn is not None:
                    await conn.close()
                conn = None
                await stopper.sleep(backoff.next())
            except psycopg.Error as exc:
                # inbox_receive refused the batch (nothing was acknowledged): say why, retry
                if down != "inbox":
                    down = "inbox"
                    log(
                        "inbox_receive failed, retrying",
                        error=first_line(exc),
                        sqlstate=exc.sqlstate,
                    )
                await stopper.sleep(backoff.next())
            except SourceError as exc:
                if down != "source":
                    down = "source"
                    log("source failing, retrying", error=str(exc))
                metrics.reconnects.labels("source").inc()
                await stopper.sleep(backoff.next())
        log("stopped", reason="signal")
        return 0
    finally:
        await source.close()
        if conn is not None:
            await conn.close()


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))
