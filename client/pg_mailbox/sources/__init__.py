"""Sources: where `pg-mailbox ingest` reads broker messages from. One module per scheme.

A source implements :class:`Source`; adding SQS or Kafka is one module plus one line in
:data:`SCHEMES` (see docs/relay.md#writing-a-source)::

    class SqsSource(Source):
        async def start(self): ...                   # connect; SourceUnavailable when down
        async def fetch(self, max_messages, timeout) # -> list[Incoming], [] when idle
        async def ack(self, messages): ...           # after the inbox transaction committed
        async def close(self): ...
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pg_mailbox.sinks import load_scheme
from pg_mailbox.sinks._meta import from_headers


@dataclass(slots=True)
class Incoming:
    """One broker message on its way into the inbox (the dict api.inbox_receive takes)."""

    record: dict
    handle: Any = field(default=None, repr=False)  # what ack() needs


class SourceError(Exception):
    """A failure worth retrying (the broker went away)."""


class SourceUnavailable(Exception):
    """The source cannot be reached at start-up (exit code 3)."""


def record(message_id: str | None, body: bytes, headers: dict | None) -> dict:
    """The inbox record of a message: id = the broker's message id, else sha256 of the body."""
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        payload = {"raw": body.decode("utf-8", "replace")}
    rec = from_headers(headers)
    rec["event_id"] = message_id or hashlib.sha256(body).hexdigest()
    rec["payload"] = payload
    return rec


class Source(ABC):
    kind = "source"

    def __init__(self, url: str) -> None:
        self.url = url
        self.parts = urlsplit(url)
        self.params = {k: v[-1] for k, v in parse_qs(self.parts.query).items()}

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def fetch(self, max_messages: int, timeout: float) -> list[Incoming]: ...

    @abstractmethod
    async def ack(self, messages: list[Incoming]) -> None: ...

    async def close(self) -> None:  # noqa: B027 - optional
        pass


SCHEMES = {
    "nats": "pg_mailbox.sources.nats:NatsSource",
    "amqp": "pg_mailbox.sources.amqp:AmqpSource",
    "amqps": "pg_mailbox.sources.amqp:AmqpSource",
    "redis": "pg_mailbox.sources.redis:RedisSource",
    "rediss": "pg_mailbox.sources.redis:RedisSource",
}


def open_source(url: str) -> Source:
    return load_scheme(url, SCHEMES, "source")(url)
