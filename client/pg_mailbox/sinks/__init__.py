"""Sinks: where the relay sends outbox rows. One module per URL scheme.

A sink implements :class:`Sink` (three async methods) and registers its schemes in
:data:`SCHEMES`. Adding Kafka or SQS is one module, ``sinks/kafka.py``::

    class KafkaSink(Sink):
        async def start(self): ...            # connect; raise SinkUnavailable when down
        async def publish(self, messages): ...# send in order, wait for every ack
        async def close(self): ...

plus one line in :data:`SCHEMES` (``"kafka": "pg_mailbox.sinks.kafka:KafkaSink"``).
See docs/relay.md#writing-a-sink for the contract.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

DELIVERED = "delivered"
DUPLICATE = "duplicate"


@dataclass(slots=True)
class Message:
    """One message to send: ``id`` is the idempotency key (the event id, or
    ``<event_id>:<page>`` for a claim-check page); ``envelope`` is SPEC §5.2's envelope
    (``payload`` included)."""

    id: str
    envelope: dict

    def meta(self) -> dict:
        """The envelope without its payload: what broker sinks put in headers."""
        return {k: v for k, v in self.envelope.items() if k != "payload"}


class SinkError(Exception):
    """A failure worth retrying. ``outage`` (the sink is unreachable) is retried forever;
    otherwise the failure counts towards --max-attempts of the first unsent message."""

    def __init__(self, message: str, outage: bool = True) -> None:
        super().__init__(message)
        self.outage = outage


class SinkUnavailable(Exception):
    """The sink cannot be reached at start-up (exit code 3)."""


class PoisonMessage(Exception):
    """The sink rejected ``messages[index]`` for good; the ones before it were delivered."""

    def __init__(self, index: int, reason: str, results: list[str] | None = None) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason
        self.results = results or []


class Sink(ABC):
    """Sends messages in order and returns only when the broker acknowledged each one."""

    #: a short name for logs and metrics labels
    kind = "sink"

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        self.parts = parts
        self.params = {k: v[-1] for k, v in parse_qs(parts.query).items()}

    @abstractmethod
    async def start(self) -> None:
        """Connect (and check the target exists); raise SinkUnavailable when it cannot."""

    @abstractmethod
    async def publish(self, messages: list[Message]) -> list[str]:
        """Send ``messages`` in order; return one of DELIVERED / DUPLICATE each, after the
        broker acknowledged all. Raise SinkError (retry) or PoisonMessage."""

    async def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""

    def describe(self) -> str:
        """The URL without a password, for logs."""
        p = self.parts
        host = p.hostname or ""
        if p.port:
            host += f":{p.port}"
        return f"{p.scheme}://{host}{p.path}" + (f"?{p.query}" if p.query else "")


def render(template: str, meta: dict) -> str:
    """``{outbox}``, ``{event_type}``, ``{key}``, ``{source}``; a missing value becomes ``_``."""
    if "{" not in template:
        return template
    return _render(
        template, meta.get("outbox"), meta.get("event_type"), meta.get("key"), meta.get("source")
    )


@functools.lru_cache(maxsize=4096)
def _render(template: str, outbox, event_type, key, source) -> str:
    values = {
        k: (str(v) if v not in (None, "") else "_")
        for k, v in (
            ("outbox", outbox),
            ("event_type", event_type),
            ("key", key),
            ("source", source),
        )
    }
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"bad template {template!r}: {exc}") from None


SCHEMES = {
    "stdout": "pg_mailbox.sinks.stdout:StdoutSink",
    "nats": "pg_mailbox.sinks.nats:NatsSink",
    "amqp": "pg_mailbox.sinks.amqp:AmqpSink",
    "amqps": "pg_mailbox.sinks.amqp:AmqpSink",
    "redis": "pg_mailbox.sinks.redis:RedisSink",
    "rediss": "pg_mailbox.sinks.redis:RedisSink",
    "http": "pg_mailbox.sinks.http:HttpSink",
    "https": "pg_mailbox.sinks.http:HttpSink",
    "postgresql": "pg_mailbox.sinks.postgres:PostgresSink",
    "postgres": "pg_mailbox.sinks.postgres:PostgresSink",
}


def load_scheme(url: str, schemes: dict[str, str], what: str):
    """The class registered for the URL's scheme (imported only when used)."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in schemes:
        raise ValueError(
            f"unknown {what} scheme {scheme!r} in {url!r}; known: {', '.join(sorted(schemes))}"
        )
    module, cls = schemes[scheme].split(":")
    return getattr(importlib.import_module(module), cls)


async def close_quietly(conn, timeout: float = 2) -> None:
    """Close a broker connection that may already be broken."""
    if conn is not None:
        try:
            await asyncio.wait_for(conn.close(), timeout)
        except Exception:  # noqa: BLE001 - already broken
            pass


def open_sink(url: str) -> Sink:
    return load_scheme(url, SCHEMES, "sink")(url)
