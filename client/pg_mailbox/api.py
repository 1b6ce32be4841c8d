"""Typed wrappers of the pg_mailbox SQL API (pgmq-py style).

Every function takes the caller's psycopg connection, so it runs in the caller's
transaction (or autocommit) and never opens connections of its own. Each call exists
twice: ``poll_outbox(conn, ...)`` for a :class:`psycopg.Connection` and
``apoll_outbox(aconn, ...)`` for a :class:`psycopg.AsyncConnection`. The relay, ingest
and status commands write the extension's SQL only through this module.

Result columns are read by name, so a newer extension that adds a column (``partition``
on ``poll_outbox``) does not break a client built against an older one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.adapt import Loader
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

EXTENSION = "pg_mailbox"


class RawJson(str):
    """JSON text as the server sent it, not parsed (``poll_outbox(..., raw=True)``): a relay
    that only forwards payloads skips a decode and an encode per row."""

    __slots__ = ()


class _RawJsonLoader(Loader):
    def load(self, data) -> RawJson:
        return RawJson(bytes(data).decode())


def _poll_cursor(conn, raw: bool):
    cur = conn.cursor(row_factory=dict_row)
    if raw:
        cur.adapters.register_loader("jsonb", _RawJsonLoader)
    return cur


@dataclass(slots=True)
class OutboxRow:
    """One row of ``mailbox.poll_outbox``."""

    outbox_id: int
    event_id: UUID
    created_at: datetime
    source: str | None
    event_type: str | None
    key: str | None
    headers: dict
    inserted_count: int
    deleted_count: int
    is_claim_check: bool
    full_refresh: bool
    payload: dict
    partition: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> OutboxRow:
        known = {k: d.pop(k) for k in list(d) if k in _ROW_FIELDS}
        return cls(**known, extra=d)


_ROW_FIELDS = {f for f in OutboxRow.__dataclass_fields__ if f != "extra"}


@dataclass(slots=True)
class DeltaRow:
    row_num: int
    op: str
    payload: Any


@dataclass(slots=True)
class Lag:
    group_name: str
    consumer_id: str | None
    committed_offset: int | None
    group_offset: int | None
    head_offset: int | None
    lag: int | None
    in_flight: int | None
    last_heartbeat_at: datetime | None
    heartbeat_age_seconds: float | None
    healthy: bool | None


# --- SQL text (one place; sync and async share it) -------------------------------------

SQL_POLL = "SELECT * FROM mailbox.poll_outbox(%s, %s, %s, %s)"
SQL_COMMIT = "SELECT mailbox.commit_offset(%s, %s, %s)"
SQL_EXTEND = "SELECT mailbox.extend_lease(%s, %s, %s)"
SQL_SEEK = "SELECT mailbox.seek_offset(%s, %s, %s)"
SQL_HEARTBEAT = "SELECT mailbox.consumer_heartbeat(%s, %s)"
SQL_DELTA = "SELECT row_num, op, payload FROM mailbox.outbox_delta_rows(%s, %s, %s, %s)"
SQL_CONSUMED = "SELECT mailbox.outbox_rows_consumed(%s, %s, %s)"
SQL_PARK = "SELECT mailbox.outbox_park(%s, %s, %s, %s)"
SQL_CREATE_GROUP = "SELECT mailbox.create_consumer_group(%s, %s, %s)"
SQL_LAG = "SELECT * FROM mailbox.consumer_lag(%s)"
SQL_RECEIVE = (
    "SELECT mailbox.inbox_receive(%s, %s, %s, p_event_type => %s, p_source => %s,"
    " p_aggregate_id => %s, p_sequence_num => %s, p_headers => %s)"
)
# one statement per batch (issue 11): the server parses the array once
SQL_RECEIVE_BATCH = "SELECT inserted FROM mailbox.inbox_receive_batch(%s, %s::jsonb)"
SQL_GROUP_OUTBOX = "SELECT outbox_name FROM mailbox.consumer_group_lag WHERE group_name = %s"
SQL_EXT_VERSION = "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = %s"
SQL_HAS_PARK = (
    "SELECT pg_catalog.to_regprocedure('mailbox.outbox_park(text, text, bigint, text)') IS NOT NULL"
)
SQL_INBOX_EXISTS = "SELECT count(*) FROM mailbox.inbox_status(%s)"
SQL_MAINTENANCE = "SELECT mailbox.run_maintenance()"
SQL_OUTBOXES = "SELECT outbox_name FROM mailbox.outboxes ORDER BY 1"
SQL_OUTBOX_STATUS = "SELECT mailbox.outbox_status(%s)"
SQL_GROUPS = "SELECT * FROM mailbox.consumer_group_lag ORDER BY group_name"
SQL_INBOXES = "SELECT inbox_name FROM mailbox.inbox_status() ORDER BY 1"
SQL_INBOX_HEALTH = "SELECT mailbox.inbox_health(%s)"
SQL_ALERTS = "SELECT * FROM mailbox.alert_log ORDER BY 1 DESC LIMIT %s"
SQL_ENABLE_OUTBOX = "SELECT mailbox.enable_outbox(%s::text, p_outbox_name => %s::text)"
SQL_DROP_OUTBOX = "SELECT mailbox.drop_outbox(%s, %s)"
SQL_CREATE_INBOX = "SELECT mailbox.create_inbox(%s)"
SQL_DROP_INBOX = "SELECT mailbox.drop_inbox(%s, %s, %s)"
SQL_OUTBOX_EXISTS = "SELECT count(*) FROM mailbox.outboxes WHERE outbox_name = %s"
SQL_RUN_NUMBERER = "CALL mailbox.run_numberer(%s)"
SQL_CREATE_OUTBOX = "SELECT mailbox.create_outbox(%s, %s, %s, %s)"
SQL_PUBLISH = "SELECT mailbox.outbox_publish(%s, %s, %s, %s, %s)"
SQL_PUBLISH_BATCH = "SELECT count(*) FROM mailbox.outbox_publish_batch(%s, %s::jsonb[], %s, %s, %s)"


def _receive_params(inbox: str, msg: dict) -> list:
    return [
        inbox,
        msg["event_id"],
        _jsonb(msg.get("payload")),
        msg.get("event_type"),
        msg.get("source"),
        msg.get("aggregate_id"),
        msg.get("sequence_num"),
        _jsonb(msg.get("headers")) if msg.get("headers") is not None else None,
    ]


def _jsonb(value: Any) -> Jsonb:
    return Jsonb(value, dumps=str) if isinstance(value, RawJson) else Jsonb(value, dumps=dumps)


def _lag_rows(rows: list[dict]) -> list[Lag]:
    return [Lag(**{k: r.get(k) for k in Lag.__dataclass_fields__}) for r in rows]


# --- synchronous -------------------------------------------------------------------------


def poll_outbox(
    conn: psycopg.Connection,
    group: str,
    consumer: str,
    batch_size: int = 100,
    visibility_seconds: int = 30,
    raw: bool = False,
) -> list[OutboxRow]:
    """``raw=True``: payload and headers as :class:`RawJson` text."""
    cur = _poll_cursor(conn, raw)
    cur.execute(SQL_POLL, [group, consumer, batch_size, visibility_seconds])
    return [OutboxRow.from_dict(r) for r in cur.fetchall()]


def commit_offset(conn: psycopg.Connection, group: str, consumer: str, last_offset: int) -> int:
    return conn.execute(SQL_COMMIT, [group, consumer, last_offset]).fetchone()[0]


def extend_lease(
    conn: psycopg.Connection, group: str, consumer: str, extension_seconds: int = 30
) -> datetime | None:
    return conn.execute(SQL_EXTEND, [group, consumer, extension_seconds]).fetchone()[0]


def seek_offset(conn: psycopg.Connection, group: str, consumer: str, offset: int | None) -> None:
    conn.execute(SQL_SEEK, [group, consumer, offset])


def consumer_heartbeat(conn: psycopg.Connection, group: str, consumer: str) -> None:
    conn.execute(SQL_HEARTBEAT, [group, consumer])


def outbox_delta_rows(
    conn: psycopg.Connection, outbox: str, outbox_id: int, after_row: int = 0, limit: int = 1000
) -> list[DeltaRow]:
    rows = conn.execute(SQL_DELTA, [outbox, outbox_id, after_row, limit]).fetchall()
    return [DeltaRow(*r) for r in rows]


def outbox_rows_consumed(
    conn: psycopg.Connection, outbox: str, outbox_id: int, group: str | None = None
) -> None:
    conn.execute(SQL_CONSUMED, [outbox, outbox_id, group])


def outbox_park(
    conn: psycopg.Connection, group: str, consumer: str, outbox_id: int, reason: str
) -> None:
    conn.execute(SQL_PARK, [group, consumer, outbox_id, reason])


def create_consumer_group(
    conn: psycopg.Connection, name: str, outbox: str, auto_offset_reset: str = "latest"
) -> None:
    conn.execute(SQL_CREATE_GROUP, [name, outbox, auto_offset_reset])


def enable_outbox(conn: psycopg.Connection, table: str, outbox: str | None = None) -> str:
    """Capture ``table`` into an outbox (named ``outbox``, or derived); returns its name."""
    return conn.execute(SQL_ENABLE_OUTBOX, [table, outbox]).fetchone()[0]


def drop_outbox(conn: psycopg.Connection, outbox: str, if_exists: bool = False) -> None:
    conn.execute(SQL_DROP_OUTBOX, [outbox, if_exists])


def outbox_exists(conn: psycopg.Connection, outbox: str) -> bool:
    return conn.execute(SQL_OUTBOX_EXISTS, [outbox]).fetchone()[0] > 0


def create_outbox(
    conn: psycopg.Connection,
    outbox: str,
    retention_hours: int = 24,
    inline_threshold_rows: int | None = None,
    partitions: int = 1,
) -> None:
    conn.execute(SQL_CREATE_OUTBOX, [outbox, retention_hours, inline_threshold_rows, partitions])


def outbox_publish(
    conn: psycopg.Connection,
    outbox: str,
    payload: Any,
    event_type: str | None = None,
    key: str | None = None,
    headers: dict | None = None,
) -> UUID:
    """Publish one event in the caller's transaction; returns its event_id."""
    params = [outbox, _jsonb(payload), _jsonb(headers or {}), key, event_type]
    return conn.execute(SQL_PUBLISH, params).fetchone()[0]


def outbox_publish_batch(
    conn: psycopg.Connection,
    outbox: str,
    payloads: list,
    event_type: str | None = None,
    key: str | None = None,
    headers: dict | None = None,
) -> int:
    """Publish many events with one statement (same type, key and headers); returns how many."""
    params = [outbox, [_jsonb(p) for p in payloads], _jsonb(headers or {}), key, event_type]
    return conn.execute(SQL_PUBLISH_BATCH, params).fetchone()[0]


def create_inbox(conn: psycopg.Connection, inbox: str) -> None:
    conn.execute(SQL_CREATE_INBOX, [inbox])


def drop_inbox(
    conn: psycopg.Connection, inbox: str, if_exists: bool = False, cascade: bool = False
) -> None:
    conn.execute(SQL_DROP_INBOX, [inbox, if_exists, cascade])


def run_numberer(conn: psycopg.Connection, seconds: int = 60) -> None:
    """One ``CALL mailbox.run_numberer(seconds)``; needs an autocommit connection (it commits
    each pass itself)."""
    conn.execute(SQL_RUN_NUMBERER, [seconds])


def consumer_lag(conn: psycopg.Connection, group: str | None = None) -> list[Lag]:
    return _lag_rows(conn.cursor(row_factory=dict_row).execute(SQL_LAG, [group]).fetchall())


def inbox_receive(conn: psycopg.Connection, inbox: str, msg: dict) -> bool:
    """``msg``: event_id, payload, and optionally event_type, source, aggregate_id,
    sequence_num, headers. Returns False for a duplicate."""
    return conn.execute(SQL_RECEIVE, _receive_params(inbox, msg)).fetchone()[0]


def group_outbox(conn: psycopg.Connection, group: str) -> str | None:
    row = conn.execute(SQL_GROUP_OUTBOX, [group]).fetchone()
    return row[0] if row else None


def extension_version(conn: psycopg.Connection) -> str | None:
    row = conn.execute(SQL_EXT_VERSION, [EXTENSION]).fetchone()
    return row[0] if row else None


def has_outbox_park(conn: psycopg.Connection) -> bool:
    return conn.execute(SQL_HAS_PARK).fetchone()[0]


def inbox_exists(conn: psycopg.Connection, inbox: str) -> bool:
    try:
        with conn.transaction():
            return conn.execute(SQL_INBOX_EXISTS, [inbox]).fetchone()[0] > 0
    except psycopg.errors.UndefinedObject:
        return False


def run_maintenance(conn: psycopg.Connection) -> dict:
    return conn.execute(SQL_MAINTENANCE).fetchone()[0]


def outboxes(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute(SQL_OUTBOXES).fetchall()]


def outbox_status(conn: psycopg.Connection, outbox: str) -> dict:
    return conn.execute(SQL_OUTBOX_STATUS, [outbox]).fetchone()[0]


def groups(conn: psycopg.Connection) -> list[dict]:
    return conn.cursor(row_factory=dict_row).execute(SQL_GROUPS).fetchall()


def inboxes(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute(SQL_INBOXES).fetchall()]


def inbox_health(conn: psycopg.Connection, inbox: str) -> dict:
    return conn.execute(SQL_INBOX_HEALTH, [inbox]).fetchone()[0]


def recent_alerts(conn: psycopg.Connection, limit: int = 10) -> list[dict]:
    return conn.cursor(row_factory=dict_row).execute(SQL_ALERTS, [limit]).fetchall()


# --- asynchronous ------------------------------------------------------------------------


async def apoll_outbox(
    conn: psycopg.AsyncConnection,
    group: str,
    consumer: str,
    batch_size: int = 100,
    visibility_seconds: int = 30,
    raw: bool = False,
) -> list[OutboxRow]:
    """``raw=True``: payload and headers as :class:`RawJson` text."""
    cur = _poll_cursor(conn, raw)
    await cur.execute(SQL_POLL, [group, consumer, batch_size, visibility_seconds])
    return [OutboxRow.from_dict(r) for r in await cur.fetchall()]


async def acommit_and_poll(
    conn: psycopg.AsyncConnection,
    group: str,
    consumer: str,
    last_offset: int | None,
    batch_size: int = 100,
    visibility_seconds: int = 30,
    raw: bool = False,
) -> tuple[int | None, list[OutboxRow]]:
    """Commit the previous batch (when ``last_offset`` is set) and poll the next one in
    one round trip (a pipeline); returns (rows acknowledged, next batch)."""
    if last_offset is None:
        rows = await apoll_outbox(conn, group, consumer, batch_size, visibility_seconds, raw)
        return None, rows
    async with conn.pipeline():
        c1 = conn.cursor()
        await c1.execute(SQL_COMMIT, [group, consumer, last_offset])
        c2 = _poll_cursor(conn, raw)
        await c2.execute(SQL_POLL, [group, consumer, batch_size, visibility_seconds])
    acked = (await c1.fetchone())[0]
    return acked, [OutboxRow.from_dict(r) for r in await c2.fetchall()]


async def acommit_offset(
    conn: psycopg.AsyncConnection, group: str, consumer: str, last_offset: int
) -> int:
    return (await (await conn.execute(SQL_COMMIT, [group, consumer, last_offset])).fetchone())[0]


async def aextend_lease(
    conn: psycopg.AsyncConnection, group: str, consumer: str, extension_seconds: int = 30
) -> datetime | None:
    cur = await conn.execute(SQL_EXTEND, [group, consumer, extension_seconds])
    return (await cur.fetchone())[0]


async def aseek_offset(
    conn: psycopg.AsyncConnection, group: str, consumer: str, offset: int | None
) -> None:
    await conn.execute(SQL_SEEK, [group, consumer, offset])


async def aoutbox_delta_rows(
    conn: psycopg.AsyncConnection,
    outbox: str,
    outbox_id: int,
    after_row: int = 0,
    limit: int = 1000,
) -> list[DeltaRow]:
    cur = await conn.execute(SQL_DELTA, [outbox, outbox_id, after_row, limit])
    return [DeltaRow(*r) for r in await cur.fetchall()]


async def aoutbox_rows_consumed(
    conn: psycopg.AsyncConnection, outbox: str, outbox_id: int, group: str | None = None
) -> None:
    await conn.execute(SQL_CONSUMED, [outbox, outbox_id, group])


async def aoutbox_park(
    conn: psycopg.AsyncConnection, group: str, consumer: str, outbox_id: int, reason: str
) -> None:
    await conn.execute(SQL_PARK, [group, consumer, outbox_id, reason])


async def acreate_outbox(
    conn: psycopg.AsyncConnection,
    outbox: str,
    retention_hours: int = 24,
    inline_threshold_rows: int | None = None,
    partitions: int = 1,
) -> None:
    await conn.execute(
        SQL_CREATE_OUTBOX, [outbox, retention_hours, inline_threshold_rows, partitions]
    )


async def acreate_consumer_group(
    conn: psycopg.AsyncConnection, name: str, outbox: str, auto_offset_reset: str = "latest"
) -> None:
    await conn.execute(SQL_CREATE_GROUP, [name, outbox, auto_offset_reset])


async def aconsumer_lag(conn: psycopg.AsyncConnection, group: str | None = None) -> list[Lag]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(SQL_LAG, [group])
    return _lag_rows(await cur.fetchall())


async def ainbox_receive_many(
    conn: psycopg.AsyncConnection, inbox: str, msgs: list[dict]
) -> list[bool]:
    """Receive messages with one ``inbox_receive_batch`` (one statement, one round trip,
    all or nothing); True for each new one, False for a duplicate (also a repeat inside
    the batch)."""
    if not msgs:
        return []
    cur = await conn.execute(SQL_RECEIVE_BATCH, [inbox, _batch_json(msgs)])
    return [bool(row[0]) for row in await cur.fetchall()]


def _batch_json(msgs: list[dict]) -> str:
    """The ``p_messages`` array of ``inbox_receive_batch``: one object per message keyed by
    ``inbox_receive``'s parameter names; a raw payload goes in as the server sent it."""
    items = []
    for m in msgs:
        o = {"p_event_id": m["event_id"], "p_payload": m.get("payload")}
        for k in ("event_type", "source", "aggregate_id", "sequence_num", "headers"):
            if m.get(k) is not None:
                o["p_" + k] = m[k]
        items.append(dumps(o))
    return "[" + ",".join(items) + "]"


async def agroup_outbox(conn: psycopg.AsyncConnection, group: str) -> str | None:
    row = await (await conn.execute(SQL_GROUP_OUTBOX, [group])).fetchone()
    return row[0] if row else None


async def aextension_version(conn: psycopg.AsyncConnection) -> str | None:
    row = await (await conn.execute(SQL_EXT_VERSION, [EXTENSION])).fetchone()
    return row[0] if row else None


async def ahas_outbox_park(conn: psycopg.AsyncConnection) -> bool:
    return (await (await conn.execute(SQL_HAS_PARK)).fetchone())[0]


async def ainbox_exists(conn: psycopg.AsyncConnection, inbox: str) -> bool:
    try:
        async with conn.transaction():
            return (await (await conn.execute(SQL_INBOX_EXISTS, [inbox])).fetchone())[0] > 0
    except psycopg.errors.UndefinedObject:
        return False


def dumps(value: Any) -> str:
    """JSON text (UUIDs and timestamps as strings); :class:`RawJson` as it is, also inside
    a dict (an envelope carrying a raw payload)."""
    if isinstance(value, RawJson):
        return value
    if isinstance(value, dict) and any(isinstance(v, RawJson) for v in value.values()):
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in value.items()) + "}"
    return json.dumps(value, default=str, separators=(",", ":"))


def loads(value: Any) -> Any:
    """The parsed value of :class:`RawJson`; anything else as it is."""
    return json.loads(value) if isinstance(value, RawJson) else value
