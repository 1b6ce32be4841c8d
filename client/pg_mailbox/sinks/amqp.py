"""``amqp://USER:PASS@HOST:PORT/VHOST?exchange=X&routing_key=T``: persistent messages with
publisher confirms; returns when RabbitMQ confirmed each one.

Idempotency: AMQP ``message_id`` = message id (RabbitMQ does not deduplicate by itself;
consumers such as ``pg-mailbox ingest`` do, through the inbox's primary key). An empty
``exchange`` means the default exchange (routing key = queue name). Unroutable messages
(``mandatory``) are failures, retried and then poison.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlunsplit

import aio_pika
from aio_pika.exceptions import AMQPError, DeliveryError, PublishError
from aiormq.exceptions import AMQPError as AiormqError

from pg_mailbox.api import dumps
from pg_mailbox.sinks import (
    DELIVERED,
    Message,
    Sink,
    SinkError,
    SinkUnavailable,
    close_quietly,
    render,
)
from pg_mailbox.sinks._meta import to_headers

ERRORS = (OSError, AMQPError, AiormqError, asyncio.TimeoutError, ConnectionError)


def broker_url(sink: Sink) -> str:
    p = sink.parts
    return urlunsplit((p.scheme, p.netloc, p.path, "", ""))


class AmqpSink(Sink):
    kind = "amqp"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.exchange_name = self.params.get("exchange", "")
        self.routing_key = self.params.get("routing_key", "{event_type}")
        self.timeout = float(self.params.get("timeout", 10))
        self.conn = None

    async def _connect(self) -> None:
        if self.conn is not None and not self.conn.is_closed:
            return
        await self.close()
        self.conn = await aio_pika.connect(broker_url(self), timeout=5)
        self.channel = await self.conn.channel(publisher_confirms=True, on_return_raises=True)
        if self.exchange_name:
            self.exchange = await self.channel.get_exchange(self.exchange_name, ensure=True)
        else:
            self.exchange = self.channel.default_exchange

    async def start(self) -> None:
        try:
            await self._connect()
        except ERRORS as exc:
            raise SinkUnavailable(f"RabbitMQ at {self.describe()}: {exc!r}") from exc

    async def publish(self, messages: list[Message]) -> list[str]:
        try:
            await self._connect()
            pending = []
            for m in messages:
                meta = m.meta()
                msg = aio_pika.Message(
                    dumps(m.envelope.get("payload")).encode(),
                    message_id=m.id,
                    type=meta.get("event_type"),
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    headers=to_headers(meta),
                )
                pending.append(
                    asyncio.ensure_future(
                        self.exchange.publish(
                            msg,
                            routing_key=render(self.routing_key, m.envelope),
                            mandatory=True,
                            timeout=self.timeout,
                        )
                    )
                )
            results = await asyncio.gather(*pending, return_exceptions=True)
        except ERRORS as exc:
            await self.close()
            raise SinkError(f"RabbitMQ publish failed: {exc!r}") from exc
        for r in results:
            if isinstance(r, DeliveryError | PublishError):
                raise SinkError(f"RabbitMQ did not take a message: {r!r}", outage=False)
            if isinstance(r, BaseException):
                await self.close()
                raise SinkError(f"RabbitMQ publish failed: {r!r}")
        return [DELIVERED] * len(messages)

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        await close_quietly(conn)
