"""``redis://HOST:PORT/DB?stream=T``: ``XADD`` with deduplication.

Fields: ``event_id`` (the message id), ``payload`` (JSON) and the envelope metadata.
A second publish of one message id within ``dedup_seconds`` (default 86400) adds nothing:
one Lua script sets ``<stream>:dedup:<id>`` (NX, EX dedup_seconds) and XADDs only when
that key was new, atomically.
"""

from __future__ import annotations

import redis.asyncio as aredis
from redis.exceptions import RedisError, ResponseError

from pg_mailbox.api import dumps
from pg_mailbox.sinks import DELIVERED, DUPLICATE, Message, Sink, SinkError, SinkUnavailable, render
from pg_mailbox.sinks._meta import to_headers

SCRIPT = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
end
return false
"""


class RedisSink(Sink):
    kind = "redis"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.stream = self.params.get("stream", "mailbox.{outbox}")
        self.dedup_seconds = int(self.params.get("dedup_seconds", 86400))
        base = url.split("?", 1)[0]
        self.client = aredis.from_url(base, socket_connect_timeout=3, socket_timeout=10)
        self.script = self.client.register_script(SCRIPT)

    async def start(self) -> None:
        try:
            await self.client.ping()
        except (RedisError, OSError) as exc:
            raise SinkUnavailable(f"Redis at {self.describe()}: {exc!r}") from exc

    async def publish(self, messages: list[Message]) -> list[str]:
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for m in messages:
                    stream = render(self.stream, m.envelope)
                    fields = {
                        **to_headers(m.meta()),
                        "event_id": m.id,
                        "payload": dumps(m.envelope.get("payload")),
                    }
                    flat = [x for kv in fields.items() for x in kv]
                    await self.script(
                        keys=[f"{stream}:dedup:{m.id}", stream],
                        args=[self.dedup_seconds, *flat],
                        client=pipe,
                    )
                results = await pipe.execute()
        except ResponseError as exc:
            raise SinkError(f"Redis refused XADD: {exc}", outage=False) from exc
        except (RedisError, OSError) as exc:
            raise SinkError(f"Redis publish failed: {exc!r}") from exc
        return [DELIVERED if r else DUPLICATE for r in results]

    async def close(self) -> None:
        await self.client.aclose()
