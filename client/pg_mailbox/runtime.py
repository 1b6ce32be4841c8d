"""What the long-running commands share: logs, backoff, metrics, signals, start-up checks."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pg_mailbox import __version__, api
from pg_mailbox.config import StartupError


class Log:
    """One line per event worth a human's attention, on stderr (text or JSON); on a terminal
    (text format) also a progress line that the next event line replaces (SPEC 5.1)."""

    def __init__(self, fmt: str = "text", name: str = "pg-mailbox") -> None:
        self.fmt = fmt
        self.name = name
        self.live = fmt == "text" and sys.stderr.isatty()
        self.shown = False
        self.count = 0
        self.started = time.monotonic()
        self.drawn_at = 0.0

    def progress(self, done: int, what: str, **fields: object) -> None:
        """Add ``done`` to the running count; redraw the progress line at most 4 times a
        second. Nothing unless stderr is a terminal."""
        self.count += done
        now = time.monotonic()
        if not self.live or now - self.drawn_at < 0.25:
            return
        self.drawn_at = now
        rate = self.count / max(now - self.started, 1e-9)
        extra = "".join(f", {k} {v}" for k, v in fields.items() if v is not None)
        sys.stderr.write(f"\r\x1b[K{self.name}: {self.count:,} {what} ({rate:,.0f}/s){extra}")
        sys.stderr.flush()
        self.shown = True

    def __call__(self, event: str, **fields: object) -> None:
        if self.shown:  # the event line takes the progress line's place
            sys.stderr.write("\r\x1b[K")
            self.shown = False
        if self.fmt == "json":
            line = json.dumps({"ts": time.time(), "event": event, **fields}, default=str)
        else:
            extra = " ".join(f"{k}={v}" for k, v in fields.items())
            line = f"{time.strftime('%H:%M:%S')} {self.name}: {event}" + (
                f" {extra}" if extra else ""
            )
        print(line, file=sys.stderr, flush=True)


class Backoff:
    """Capped exponential backoff with full jitter: 0.1 s, 0.2 s, ... up to ``cap``."""

    def __init__(self, base: float = 0.1, cap: float = 10.0) -> None:
        self.base, self.cap, self.n = base, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.base * (2**self.n))
        self.n = min(self.n + 1, 30)
        return delay / 2 + random.random() * delay / 2

    def reset(self) -> None:
        self.n = 0


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.messages = Counter(
            "pg_mailbox_relay_messages",
            "messages handled by the relay",
            ["group", "sink", "result"],
            registry=r,
        )
        self.batch_seconds = Histogram(
            "pg_mailbox_relay_batch_seconds", "time from poll to commit of one batch", registry=r
        )
        self.lag = Gauge(
            "pg_mailbox_relay_lag_rows",
            "rows of the group not yet committed",
            ["group"],
            registry=r,
        )
        self.lease_lost = Counter(
            "pg_mailbox_relay_lease_lost", "commits that lost a lease", ["group"], registry=r
        )
        self.reconnects = Counter(
            "pg_mailbox_relay_reconnects", "reconnections", ["target"], registry=r
        )
        self.ingested = Counter(
            "pg_mailbox_ingest_messages",
            "messages handled by ingest",
            ["inbox", "result"],
            registry=r,
        )

    def serve(self, port: int | None) -> None:
        if port:
            start_http_server(port, addr="127.0.0.1", registry=self.registry)


class Stopper:
    """SIGTERM/SIGINT set ``event``; a second signal leaves at once."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signal)

    def _signal(self) -> None:
        if self.event.is_set():
            os._exit(130)  # a second signal: leave now (leases expire, nothing is committed)
        self.event.set()

    @property
    def stopping(self) -> bool:
        return self.event.is_set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless asked to stop; True when stopping."""
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
        except TimeoutError:
            pass
        return self.event.is_set()


def describe_dsn(dsn: str) -> str:
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(unparsable DSN)"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items()) or "(libpq defaults: PGHOST, PGPORT, ...)"


async def connect(dsn: str, **kw: object) -> psycopg.AsyncConnection:
    """Start-up connection: unreachable database and missing extension are StartupError."""
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=10, **kw)
    except psycopg.Error as exc:
        raise StartupError(
            f"cannot connect to the database ({describe_dsn(dsn)}): "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}",
            "check --dsn / PG_MAILBOX_DSN (or PGHOST, PGPORT, PGUSER) and that the server runs",
        ) from None
    await check_extension(conn)
    return conn


async def check_extension(conn: psycopg.AsyncConnection) -> None:
    version = await api.aextension_version(conn)
    if version is None:
        await conn.close()
        raise StartupError(
            "the pg_mailbox extension is not installed in this database",
            "run: CREATE EXTENSION pg_mailbox CASCADE;  (as a superuser; `make install` first)",
        )
    if version != __version__:
        await conn.close()
        raise StartupError(
            f"the database has pg_mailbox {version}, this client is {__version__}",
            "run: ALTER EXTENSION pg_mailbox UPDATE;  or install the matching client",
        )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)
