"""`pg-mailbox relay`: outbox -> broker, as a consumer of one consumer group (SPEC §5.2).

One loop: commit the previous batch and poll the next (one round trip), turn the rows
into messages (claim-check rows page by page), hand them to the sink, which returns only
when the broker acknowledged each, and commit up to the last acknowledged offset. An empty
poll waits for ``NOTIFY mailbox_outbox_new`` or ``--poll-interval``, whichever is first.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import socket
import time

import psycopg

from pg_mailbox import api
from pg_mailbox.config import (
    PoisonStop,
    StartupError,
    UsageError,
    add_common,
    option,
    positive_float,
    positive_int,
)
from pg_mailbox.runtime import Backoff, Log, Metrics, Stopper, connect, first_line
from pg_mailbox.sinks import (
    DUPLICATE,
    Message,
    PoisonMessage,
    SinkError,
    SinkUnavailable,
    open_sink,
)

PAGE_ROWS = 1000  # delta rows per claim-check message (SPEC §5.2)
CHUNK = 1000  # inline messages handed to the sink at once
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    option(parser, "--group", default=None, help="consumer group to consume through (required)")
    option(
        parser,
        "--sink",
        default=None,
        help="where to send: stdout:, nats://, amqp://, redis://, http(s)://,"
        " postgresql://...?inbox=I (required; see docs/relay.md)",
    )
    option(
        parser,
        "--outbox",
        default=None,
        help="outbox of the group; when given, a missing group is created with --start",
    )
    option(
        parser,
        "--start",
        default="latest",
        choices=("earliest", "latest"),
        help="where a group created by --outbox starts",
    )
    option(
        parser,
        "--consumer",
        default=None,
        help="consumer id in the group (default <hostname>-<pid>)",
    )
    option(parser, "--batch-size", default=100, type=positive_int, help="rows per poll")
    option(
        parser,
        "--visibility",
        default=30,
        type=positive_int,
        help="lease seconds; leases are extended every third of it while the sink works",
    )
    option(
        parser,
        "--poll-interval",
        default=1.0,
        type=positive_float,
        help="seconds between polls when no NOTIFY arrives",
    )
    option(
        parser,
        "--once",
        flag_only=True,
        default=False,
        help="drain until a poll returns nothing, then exit 0",
    )
    option(
        parser,
        "--max-attempts",
        default=10,
        type=positive_int,
        help="failed sends of one message (HTTP 5xx, timeouts) before it counts as poison",
    )
    option(
        parser,
        "--on-poison",
        default="stop",
        choices=("stop", "skip", "park"),
        help="a poison message: stop (exit 4), skip (log, count, commit past) or park"
        " (mailbox.outbox_park)",
    )


class Abandoned(Exception):
    """The sink did not answer within --visibility: the batch is left to lease expiry."""


class Relay:
    def __init__(
        self, args: argparse.Namespace, log: Log | None = None, metrics: Metrics | None = None
    ) -> None:
        self.args = args
        self.log = log or Log(args.log_format, "relay")
        self.metrics = metrics or Metrics()
        self.consumer = args.consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.group = args.group
        self.outbox: str | None = args.outbox
        self.conn: psycopg.AsyncConnection | None = None
        self.wake = asyncio.Event()
        self.db_down = False
        self.sink_down = False
        self.last_lag_at = 0.0

    # --- start-up --------------------------------------------------------------------

    async def start(self) -> None:
        args = self.args
        if not args.group:
            raise UsageError("--group is required (or PG_MAILBOX_GROUP, or group = in --config)")
        if not args.sink:
            raise UsageError(
                "--sink is required (or PG_MAILBOX_SINK, or sink = in --config)",
                "for example --sink stdout: or --sink nats://127.0.0.1:4222?stream=S",
            )
        try:
            self.sink = open_sink(args.sink)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self.stopper = Stopper()
        self.conn = await connect(args.dsn)
        self.conn.add_notice_handler(self._notice)
        outbox = await api.agroup_outbox(self.conn, self.group)
        if outbox is None:
            if not self.outbox:
                raise StartupError(
                    f"consumer group not found: {self.group}",
                    f"create it: SELECT mailbox.create_consumer_group('{self.group}', '<outbox>');"
                    " or pass --outbox to create it",
                )
            try:
                await api.acreate_consumer_group(self.conn, self.group, self.outbox, args.start)
            except psycopg.errors.DuplicateObject:
                pass  # another relay created it meanwhile
            except psycopg.Error as exc:
                raise StartupError(
                    f"cannot create consumer group {self.group}: {first_line(exc)}",
                    "check --outbox names an existing outbox (SELECT * FROM mailbox.outboxes)",
                ) from None
            outbox = await api.agroup_outbox(self.conn, self.group)
            self.log("group created", group=self.group, outbox=outbox, start=args.start)
        elif self.outbox and self.outbox != outbox:
            raise StartupError(
                f"consumer group {self.group} belongs to outbox {outbox}, not {self.outbox}",
                "drop --outbox or choose another --group",
            )
        self.outbox = outbox
        if args.on_poison == "park" and not await api.ahas_outbox_park(self.conn):
            raise StartupError(
                "--on-poison park needs mailbox.outbox_park(), which this pg_mailbox lacks",
                "use --on-poison stop or skip, or update the extension",
            )
        try:
            await self.sink.start()
        except SinkUnavailable as exc:
            raise StartupError(
                f"sink unreachable: {exc}",
                "start the broker or fix --sink; the relay retries only once it runs",
            ) from None
        self.metrics.serve(args.metrics_port)
        self.log(
            "started",
            group=self.group,
            outbox=self.outbox,
            consumer=self.consumer,
            sink=self.sink.describe(),
        )

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        msg = diag.message_primary or ""
        if msg.startswith("lease lost"):
            self.metrics.lease_lost.labels(self.group).inc()
        if diag.severity_nonlocalized == "WARNING":
            self.log("warning", message=msg)

    # --- main loop -------------------------------------------------------------------

    async def run(self) -> int:
        try:
            await self.start()
        except BaseException:
            if self.conn is not None:
                await self.conn.close()
            raise
        listener = asyncio.create_task(self._listen())
        try:
            return await self._loop()
        finally:
            listener.cancel()
            await self.sink.close()
            if self.conn is not None:
                await self.conn.close()

    async def _loop(self) -> int:
        args = self.args
        pending: int | None = None  # offset acknowledged by the sink, not yet committed
        backoff = Backoff()
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    await self._reconnect()
                if self.stopper.stopping:
                    if pending is not None:
                        await api.acommit_offset(self.conn, self.group, self.consumer, pending)
                    self.log("stopped", reason="signal")
                    return 0
                self.wake.clear()
                started = time.monotonic()
                _, rows = await api.acommit_and_poll(
                    self.conn,
                    self.group,
                    self.consumer,
                    pending,
                    args.batch_size,
                    args.visibility,
                    raw=True,
                )
                pending = None
                if self.db_down:
                    self.db_down = False
                    self.log("database reachable again")
                backoff.reset()
                await self._report_lag()
                if not rows:
                    if args.once:
                        self.log("drained", group=self.group)
                        return 0
                    await self._idle(args.poll_interval)
                    continue
                pending = await self._deliver(rows)
                self.metrics.batch_seconds.observe(time.monotonic() - started)
                self.log.progress(len(rows), "rows relayed", offset=pending)
            except DB_ERRORS as exc:
                if not self.db_down:
                    self.db_down = True
                    self.log("database unreachable, retrying", error=first_line(exc))
                if self.conn is not None:
                    await self.conn.close()
                self.conn = None
                if await self.stopper.sleep(backoff.next()):
                    self.log("stopped", reason="signal", uncommitted=pending)
                    return 0
            except psycopg.Error as exc:
                # not a lost connection: an API error (a dropped group, a revoked grant);
                # logged and retried, the batch in hand goes back by lease expiry
                pending = None
                self.log("database error, retrying", error=first_line(exc), sqlstate=exc.sqlstate)
                if await self.stopper.sleep(backoff.next()):
                    return 0
            except Abandoned as exc:
                pending = None
                self.log("batch abandoned to lease expiry", reason=str(exc))
                if self.stopper.stopping:
                    return 0
                # let the lease run out so another consumer of the group can take the rows
                if await self.stopper.sleep(args.visibility * 1.1):
                    return 0

    async def _reconnect(self) -> None:
        self.metrics.reconnects.labels("database").inc()
        self.conn = await psycopg.AsyncConnection.connect(
            self.args.dsn, autocommit=True, connect_timeout=10
        )
        self.conn.add_notice_handler(self._notice)

    async def _idle(self, seconds: float) -> None:
        waits = [
            asyncio.ensure_future(self.wake.wait()),
            asyncio.ensure_future(self.stopper.event.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _listen(self) -> None:
        """LISTEN mailbox_outbox_new on a connection of its own; re-LISTEN after a reconnect."""
        backoff = Backoff(cap=5.0)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.args.dsn, autocommit=True, connect_timeout=10
                ) as lconn:
                    await lconn.execute("LISTEN mailbox_outbox_new")
                    backoff.reset()
                    self.wake.set()  # anything committed while we were away
                    async for note in lconn.notifies():
                        if note.payload == self.outbox:
                            self.wake.set()
            except asyncio.CancelledError:
                raise
            except psycopg.Error:
                self.metrics.reconnects.labels("listen").inc()
                await asyncio.sleep(backoff.next())

    async def _report_lag(self) -> None:
        now = time.monotonic()
        if now - self.last_lag_at < 10:
            return
        self.last_lag_at = now
        lags = await api.aconsumer_lag(self.conn, self.group)
        if lags and lags[0].head_offset is not None and lags[0].group_offset is not None:
            self.metrics.lag.labels(self.group).set(lags[0].head_offset - lags[0].group_offset)

    # --- one batch -------------------------------------------------------------------

    async def _deliver(self, rows: list[api.OutboxRow]) -> int:
        """Send every row; return the offset to commit (the batch's last)."""
        extender = asyncio.create_task(self._extend())
        self.parked_keys: set[str] = set()
        try:
            chunk: list[tuple[api.OutboxRow, Message]] = []
            for row in rows:
                if row.is_claim_check:
                    await self._send(chunk, rows)
                    chunk = []
                    await self._send_claim_check(row, rows)
                else:
                    chunk.append((row, Message(str(row.event_id), self._envelope(row))))
                    if len(chunk) >= CHUNK:
                        await self._send(chunk, rows)
                        chunk = []
            await self._send(chunk, rows)
        finally:
            extender.cancel()
        return rows[-1].outbox_id

    async def _extend(self) -> None:
        every = max(0.2, self.args.visibility / 3)
        while True:
            await asyncio.sleep(every)
            try:
                await api.aextend_lease(self.conn, self.group, self.consumer, self.args.visibility)
            except psycopg.Error as exc:
                self.log("lease extension failed", error=first_line(exc))

    def _envelope(self, row: api.OutboxRow, payload: object = None) -> dict:
        env = {
            "event_id": str(row.event_id),
            "outbox": self.outbox,
            "offset": row.outbox_id,
            "event_type": row.event_type,
            "key": row.key,
            "source": row.source,
            "created_at": row.created_at.isoformat() if row.created_at else None,
            "headers": row.headers if row.headers is not None else {},
            "payload": row.payload if payload is None else payload,
        }
        if row.full_refresh:
            env["full_refresh"] = True
        return env

    async def _send_claim_check(self, row: api.OutboxRow, batch: list[api.OutboxRow]) -> None:
        """Page by page: at most PAGE_ROWS delta rows in memory at a time."""
        body = api.loads(row.payload) or {}
        total = (row.inserted_count or 0) + (row.deleted_count or 0)
        pages = max(1, math.ceil(total / PAGE_ROWS))
        after = 0
        for page in range(1, pages + 1):
            delta = await api.aoutbox_delta_rows(
                self.conn, self.outbox, row.outbox_id, after, PAGE_ROWS
            )
            if delta:
                after = delta[-1].row_num
            payload = {
                "v": body.get("v", 1),
                "source": body.get("source", row.source),
                "op": body.get("op"),
                "inserted": [d.payload for d in delta if d.op == "I"],
                "deleted": [d.payload for d in delta if d.op == "D"],
            }
            if row.full_refresh or body.get("full_refresh"):
                payload["full_refresh"] = True
            env = self._envelope(row, payload)
            env["page"], env["pages"] = page, pages
            del delta
            await self._send([(row, Message(f"{row.event_id}:{page}", env))], batch)
        await api.aoutbox_rows_consumed(self.conn, self.outbox, row.outbox_id, self.group)

    async def _send(
        self, msgs: list[tuple[api.OutboxRow, Message]], batch: list[api.OutboxRow]
    ) -> None:
        """Hand messages to the sink until each is acknowledged (or skipped/parked)."""
        msgs = await self._behind_parked(msgs, batch)
        i, attempts = 0, 0
        backoff = Backoff(cap=10.0)
        stop_at: float | None = None
        sink_label = self.sink.kind
        while i < len(msgs):
            try:
                results = await asyncio.wait_for(
                    self.sink.publish([m for _, m in msgs[i:]]), self.args.visibility
                )
                self._count(results, sink_label)
                i = len(msgs)
            except PoisonMessage as p:
                self._count(p.results, sink_label)
                bad = i + p.index
                await self._poison(msgs[bad][0], msgs[bad][1], p.reason, batch)
                # a parked key's later rows in this batch wait parked too (its order holds)
                msgs = msgs[: bad + 1] + await self._behind_parked(msgs[bad + 1 :], batch)
                i, attempts = bad + 1, 0
                continue
            except SinkError as exc:
                done = getattr(exc, "done", 0)
                i += done
                if done:
                    attempts = 0
                self.metrics.messages.labels(self.group, sink_label, "failed").inc()
                if not exc.outage:
                    attempts += 1
                    if attempts >= self.args.max_attempts:
                        await self._poison(
                            msgs[i][0], msgs[i][1], f"failed {attempts} times: {exc}", batch
                        )
                        i, attempts = i + 1, 0
                        continue
                if not self.sink_down:
                    self.sink_down = True
                    self.log("sink failing, retrying", error=str(exc))
                if self.stopper.stopping:
                    stop_at = stop_at or time.monotonic()
                    if time.monotonic() - stop_at > self.args.visibility:
                        raise Abandoned("stopping and the sink does not answer") from None
                await asyncio.sleep(backoff.next())
                self.metrics.reconnects.labels("sink").inc()
                continue
            except TimeoutError:
                raise Abandoned(
                    f"no acknowledgement within --visibility {self.args.visibility}s"
                ) from None
            if self.sink_down:
                self.sink_down = False
                self.log("sink reachable again")

    async def _behind_parked(
        self, msgs: list[tuple[api.OutboxRow, Message]], batch: list[api.OutboxRow]
    ) -> list[tuple[api.OutboxRow, Message]]:
        """Parks the messages whose key has a parked event (--on-poison park); the rest."""
        if not self.parked_keys:
            return msgs
        keep = []
        for row, m in msgs:
            if row.key is not None and row.key in self.parked_keys:
                await self._poison(row, m, "behind a parked event of its key", batch)
            else:
                keep.append((row, m))
        return keep

    def _count(self, results: list[str], sink_label: str) -> None:
        dup = sum(1 for r in results if r == DUPLICATE)
        if len(results) - dup:
            self.metrics.messages.labels(self.group, sink_label, "delivered").inc(
                len(results) - dup
            )
        if dup:
            self.metrics.messages.labels(self.group, sink_label, "duplicate").inc(dup)

    async def _poison(
        self, row: api.OutboxRow, m: Message, reason: str, batch: list[api.OutboxRow]
    ) -> None:
        mode = self.args.on_poison
        self.log("poison message", event_id=m.id, offset=row.outbox_id, reason=reason, action=mode)
        if mode == "stop":
            if row.outbox_id > batch[0].outbox_id:
                await api.acommit_offset(self.conn, self.group, self.consumer, row.outbox_id - 1)
            raise PoisonStop(
                f"poison message stopped the relay: event {m.id} (offset {row.outbox_id}"
                f" of outbox {self.outbox}): {reason}",
                "fix the receiver or the event, then restart; or run with --on-poison skip"
                " (or park) to get past it. The group resumes at this event.",
            )
        self.metrics.messages.labels(self.group, self.sink.kind, "skipped").inc()
        if mode == "park":
            await api.aoutbox_park(self.conn, self.group, self.consumer, row.outbox_id, reason)
            if row.key is not None:
                self.parked_keys.add(row.key)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(Relay(args).run())
