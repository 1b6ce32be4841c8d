"""``redis://HOST:PORT/DB?stream=K&group=G``: ``XREADGROUP`` then ``XACK`` after the inbox
commit. Pending entries of this consumer (a crash before XACK) are read again first.
Event id: field ``event_id``."""

from __future__ import annotations

import os
import socket

import redis.asyncio as aredis
from redis.exceptions import RedisError, ResponseError

from pg_mailbox.sources import Incoming, Source, SourceError, SourceUnavailable, record


class RedisSource(Source):
    kind = "redis"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.stream = self.params.get("stream")
        self.group = self.params.get("group")
        if not self.stream or not self.group:
            raise ValueError(f"redis source needs ?stream=K&group=G: {url}")
        self.consumer = self.params.get("consumer", f"{socket.gethostname()}-{os.getpid()}")
        self.client = aredis.from_url(url.split("?", 1)[0], socket_connect_timeout=3)
        self.backlog = True  # read our own pending entries first

    async def start(self) -> None:
        try:
            await self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise SourceUnavailable(f"Redis stream {self.stream}: {exc}") from exc
        except (RedisError, OSError) as exc:
            raise SourceUnavailable(f"Redis: {exc!r}") from exc

    async def fetch(self, max_messages: int, timeout: float) -> list[Incoming]:
        try:
            got = await self.client.xreadgroup(
                self.group,
                self.consumer,
                {self.stream: "0" if self.backlog else ">"},
                count=max_messages,
                block=None if self.backlog else int(timeout * 1000),
            )
        except (RedisError, OSError) as exc:
            self.backlog = True
            raise SourceError(f"Redis XREADGROUP failed: {exc!r}") from exc
        entries = got[0][1] if got else []
        if self.backlog and not entries:
            self.backlog = False
            return await self.fetch(max_messages, timeout)
        out = []
        for entry_id, fields in entries:
            fields = {k.decode(): v.decode() for k, v in fields.items()}
            body = fields.pop("payload", "").encode()
            out.append(Incoming(record(fields.get("event_id"), body, fields), entry_id))
        return out

    async def ack(self, messages: list[Incoming]) -> None:
        if not messages:
            return
        try:
            await self.client.xack(self.stream, self.group, *[m.handle for m in messages])
        except (RedisError, OSError) as exc:
            raise SourceError(f"Redis XACK failed: {exc!r}") from exc

    async def close(self) -> None:
        await self.client.aclose()
