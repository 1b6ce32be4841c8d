"""``nats://HOST:PORT?stream=S&subject=T&durable=D``: a JetStream durable pull consumer.
Event id: header ``Nats-Msg-Id``."""

from __future__ import annotations

from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout

from pg_mailbox.sinks import close_quietly
from pg_mailbox.sinks.nats import nats_connect, server_url
from pg_mailbox.sources import Incoming, Source, SourceError, SourceUnavailable, record


class NatsSource(Source):
    kind = "nats"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.stream = self.params.get("stream")
        self.durable = self.params.get("durable")
        if not self.stream or not self.durable:
            raise ValueError(f"nats source needs ?stream=S&durable=D: {url}")
        self.subject = self.params.get("subject", ">")
        self.nc = None
        self.sub = None

    async def _connect(self) -> None:
        if self.nc is not None and self.nc.is_connected and self.sub is not None:
            return
        await self.close()
        self.nc = await nats_connect(self)
        js = self.nc.jetstream()
        self.sub = await js.pull_subscribe(self.subject, durable=self.durable, stream=self.stream)

    async def start(self) -> None:
        try:
            await self._connect()
        except (TimeoutError, OSError, NatsError) as exc:
            raise SourceUnavailable(f"NATS at {server_url(self)}: {exc!r}") from exc

    async def fetch(self, max_messages: int, timeout: float) -> list[Incoming]:
        try:
            await self._connect()
        except (TimeoutError, OSError, NatsError) as exc:
            await self.close()
            raise SourceError(f"NATS fetch failed: {exc!r}") from exc
        try:
            msgs = await self.sub.fetch(max_messages, timeout=timeout)
        except (NatsTimeout, TimeoutError):  # nats-py raises either for an empty fetch
            return []
        except (OSError, NatsError) as exc:
            await self.close()
            raise SourceError(f"NATS fetch failed: {exc!r}") from exc
        out = []
        for m in msgs:
            headers = dict(m.headers or {})
            out.append(Incoming(record(headers.get("Nats-Msg-Id"), m.data, headers), m))
        return out

    async def ack(self, messages: list[Incoming]) -> None:
        try:
            for m in messages:
                await m.handle.ack()
            await self.nc.flush(timeout=5)
        except (TimeoutError, OSError, NatsError) as exc:
            await self.close()
            raise SourceError(f"NATS ack failed: {exc!r}") from exc

    async def close(self) -> None:
        nc, self.nc, self.sub = self.nc, None, None
        await close_quietly(nc)
