"""``amqp://USER:PASS@HOST:PORT/VHOST?queue=Q``: manual ack, prefetch = batch size.
Event id: AMQP ``message_id``. The queue must exist (declare it with its bindings)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlunsplit

import aio_pika

from pg_mailbox.sinks import close_quietly
from pg_mailbox.sinks.amqp import ERRORS
from pg_mailbox.sources import Incoming, Source, SourceError, SourceUnavailable, record


class AmqpSource(Source):
    kind = "amqp"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.queue_name = self.params.get("queue")
        if not self.queue_name:
            raise ValueError(f"amqp source needs ?queue=Q: {url}")
        p = self.parts
        self.broker = urlunsplit((p.scheme, p.netloc, p.path, "", ""))
        self.conn = None
        self.prefetch = 100
        self.inbox: asyncio.Queue = asyncio.Queue()

    async def _connect(self) -> None:
        if self.conn is not None and not self.conn.is_closed:
            return
        await self.close()
        self.inbox = asyncio.Queue()
        self.conn = await aio_pika.connect(self.broker, timeout=5)
        channel = await self.conn.channel()
        await channel.set_qos(prefetch_count=self.prefetch)
        queue = await channel.get_queue(self.queue_name, ensure=True)
        await queue.consume(self.inbox.put)

    async def start(self) -> None:
        try:
            await self._connect()
        except ERRORS as exc:
            raise SourceUnavailable(f"RabbitMQ queue {self.queue_name}: {exc!r}") from exc

    async def fetch(self, max_messages: int, timeout: float) -> list[Incoming]:
        if max_messages != self.prefetch:
            self.prefetch = max_messages
        try:
            await self._connect()
        except ERRORS as exc:
            raise SourceError(f"RabbitMQ: {exc!r}") from exc
        out: list[Incoming] = []
        try:
            first = await asyncio.wait_for(self.inbox.get(), timeout)
        except TimeoutError:
            if self.conn is None or self.conn.is_closed:
                raise SourceError("RabbitMQ connection closed") from None
            return out
        for m in [first] + [
            self.inbox.get_nowait() for _ in range(min(max_messages - 1, self.inbox.qsize()))
        ]:
            out.append(Incoming(record(m.message_id, m.body, dict(m.headers or {})), m))
        return out

    async def ack(self, messages: list[Incoming]) -> None:
        try:
            for m in messages:
                await m.handle.ack()
        except ERRORS as exc:
            await self.close()
            raise SourceError(f"RabbitMQ ack failed: {exc!r}") from exc

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        await close_quietly(conn)
