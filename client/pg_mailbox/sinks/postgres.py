"""``postgresql://…?inbox=I``: ``mailbox.inbox_receive`` into another database, one
transaction per batch; the inbox's primary key drops duplicates."""

from __future__ import annotations

from urllib.parse import urlencode

import psycopg

from pg_mailbox import api
from pg_mailbox.sinks import DELIVERED, DUPLICATE, Message, Sink, SinkError, SinkUnavailable


def to_inbox(m: Message) -> dict:
    e = m.envelope
    return {
        "event_id": m.id,
        "payload": e.get("payload"),
        "event_type": e.get("event_type"),
        "source": e.get("source") or e.get("outbox"),
        "aggregate_id": e.get("key"),
        "sequence_num": None,
        "headers": {k: api.loads(v) for k, v in m.meta().items()},
    }


class PostgresSink(Sink):
    kind = "postgresql"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.inbox = self.params.pop("inbox", None)
        if not self.inbox:
            raise ValueError(f"postgresql sink needs ?inbox=NAME: {url}")
        p = self.parts
        query = urlencode(self.params)
        self.conninfo = f"{p.scheme}://{p.netloc}{p.path}" + (f"?{query}" if query else "")
        self.conn: psycopg.AsyncConnection | None = None

    async def _connect(self) -> psycopg.AsyncConnection:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, connect_timeout=5
            )
        return self.conn

    async def start(self) -> None:
        try:
            conn = await self._connect()
        except psycopg.Error as exc:
            raise SinkUnavailable(f"inbox database: {exc}") from exc
        if not await api.ainbox_exists(conn, self.inbox):
            raise SinkUnavailable(
                f"inbox not found in the sink database: {self.inbox}"
                f" (SELECT mailbox.create_inbox('{self.inbox}'))"
            )

    async def publish(self, messages: list[Message]) -> list[str]:
        try:
            conn = await self._connect()
            flags = await api.ainbox_receive_many(conn, self.inbox, [to_inbox(m) for m in messages])
        except psycopg.OperationalError as exc:
            self.conn = None
            raise SinkError(f"inbox database: {exc}") from exc
        except psycopg.Error as exc:
            raise SinkError(f"inbox_receive failed: {exc}", outage=False) from exc
        return [DELIVERED if f else DUPLICATE for f in flags]

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
