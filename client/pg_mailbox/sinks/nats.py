"""``nats://HOST:PORT?stream=S&subject=T``: JetStream publish, waits for each PubAck.

Idempotency: header ``Nats-Msg-Id`` = message id, deduplicated by the stream within its
duplicate window. A missing stream is created (subjects from the template with ``*`` for
each placeholder, ``duplicate_window`` from ``dedup_seconds``, default 120).
"""

from __future__ import annotations

import asyncio
import re

import nats
from nats.errors import Error as NatsError
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from pg_mailbox.api import dumps
from pg_mailbox.sinks import (
    DELIVERED,
    DUPLICATE,
    Message,
    Sink,
    SinkError,
    SinkUnavailable,
    close_quietly,
    render,
)
from pg_mailbox.sinks._meta import to_headers


def server_url(sink: Sink) -> str:
    p = sink.parts
    auth = ""
    if p.username:
        auth = p.username + (f":{p.password}" if p.password else "") + "@"
    return f"nats://{auth}{p.hostname or '127.0.0.1'}:{p.port or 4222}"


async def _quiet(exc: Exception) -> None:
    """nats-py prints tracebacks by default; the caller reports the failure instead."""


async def nats_connect(sink: Sink):
    """One connection, no automatic reconnects (callers retry with their own backoff)."""
    return await asyncio.wait_for(
        nats.connect(
            server_url(sink),
            connect_timeout=2,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            error_cb=_quiet,
            disconnected_cb=None,
        ),
        5,
    )


class NatsSink(Sink):
    kind = "nats"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.stream = self.params.get("stream")
        if not self.stream:
            raise ValueError(f"nats sink needs ?stream=NAME: {url}")
        self.subject = self.params.get("subject", "mailbox.{outbox}")
        self.dedup_seconds = float(self.params.get("dedup_seconds", 120))
        self.timeout = float(self.params.get("timeout", 10))
        self.nc = None

    async def _connect(self) -> None:
        if self.nc is not None and self.nc.is_connected:
            return
        await self.close()
        self.nc = await nats_connect(self)
        self.js = self.nc.jetstream(timeout=self.timeout)

    async def start(self) -> None:
        try:
            await self._connect()
            try:
                await self.js.stream_info(self.stream)
            except NotFoundError:
                wildcard = re.sub(r"\{[a-z_]+\}", "*", self.subject)
                await self.js.add_stream(
                    StreamConfig(
                        name=self.stream,
                        subjects=[wildcard],
                        duplicate_window=self.dedup_seconds,
                    )
                )
        except (TimeoutError, OSError, NatsError) as exc:
            raise SinkUnavailable(f"NATS at {server_url(self)}: {exc!r}") from exc

    async def publish(self, messages: list[Message]) -> list[str]:
        try:
            await self._connect()
            futures = []
            for m in messages:
                headers = to_headers(m.meta())
                headers["Nats-Msg-Id"] = m.id
                body = _body(m)
                futures.append(
                    await self.js.publish_async(
                        render(self.subject, m.envelope),
                        body,
                        stream=self.stream,
                        headers=headers,
                    )
                )
            acks = await asyncio.wait_for(asyncio.gather(*futures), self.timeout)
        except (TimeoutError, OSError, NatsError) as exc:
            await self.close()
            raise SinkError(f"NATS publish failed: {exc!r}") from exc
        return [DUPLICATE if a.duplicate else DELIVERED for a in acks]

    async def close(self) -> None:
        nc, self.nc = self.nc, None
        await close_quietly(nc)


def _body(m: Message) -> bytes:
    return dumps(m.envelope.get("payload")).encode()
