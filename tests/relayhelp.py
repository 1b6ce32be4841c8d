"""Helpers for the relay / ingest / CLI tests: subprocesses, a recording HTTP server,
real-broker probes (NATS JetStream, RabbitMQ, Redis on this machine; never mocks)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import psycopg

NATS = "nats://127.0.0.1:4222"
AMQP = "amqp://guest:guest@127.0.0.1:5672/"
REDIS = "redis://127.0.0.1:6379/0"


def uid(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def pg_url(dsn: str, **params: str) -> str:
    """A postgresql:// URL for the database of a conninfo string (sink URLs are URLs)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    q = {k: str(info[k]) for k in ("host", "port", "user") if info.get(k)}
    q.update(params)
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in q.items())
    return f"postgresql:///{info['dbname']}?{query}"


def cli(*args: str, env: dict | None = None, timeout: float = 120, cwd: str | None = None):
    """Run `python -m pg_mailbox ARGS`; returns the CompletedProcess (never raises)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PG_MAILBOX_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pg_mailbox", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )


def relay(dsn: str, sink: str, *extra: str, consumer: str = "c1", group: str = "g"):
    """`pg-mailbox relay --once` on group g; returns the CompletedProcess."""
    return cli(
        "relay",
        "--dsn",
        dsn,
        "--group",
        group,
        "--consumer",
        consumer,
        "--sink",
        sink,
        "--once",
        "--poll-interval",
        "0.2",
        *extra,
    )


def relay_once(dsn: str, sink: str, *extra: str):
    """relay() that must succeed without a traceback."""
    got = relay(dsn, sink, *extra)
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stderr
    return got


def group_offset(db, group: str = "g") -> int:
    return db.execute(
        "SELECT group_offset FROM mailbox.consumer_group_lag WHERE group_name = %s", [group]
    ).fetchone()[0]


class Proc:
    """A long-running `pg-mailbox` subprocess with stdout/stderr in files."""

    def __init__(self, tmp_path, name: str, *args: str, env: dict | None = None) -> None:
        self.out = tmp_path / f"{name}.out"
        self.err = tmp_path / f"{name}.err"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PG_MAILBOX_")}
        full_env.update(env or {})
        self.p = subprocess.Popen(
            [sys.executable, "-m", "pg_mailbox", *args],
            stdout=open(self.out, "ab"),  # noqa: SIM115 - the child owns it
            stderr=open(self.err, "ab"),  # noqa: SIM115
            env=full_env,
        )

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(10)

    def term(self, timeout: float = 30) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        return self.p.wait(timeout)

    def stderr(self) -> str:
        return self.err.read_text() if self.err.exists() else ""

    def lines(self) -> list[dict]:
        return [json.loads(x) for x in self.out.read_text().splitlines() if x.strip()]


def wait_for(pred, timeout: float = 60, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def track_receives(db) -> None:
    """Count function calls of the sessions the relay and ingest processes open from now on."""
    dbname = db.execute("SELECT current_database()").fetchone()[0]
    db.execute(f"ALTER DATABASE \"{dbname}\" SET track_functions = 'all'")


def receive_calls(db) -> dict[str, int]:
    """How often each inbox receive function ran in the tracked sessions (their statistics
    are flushed when those processes exit)."""
    db.execute("SELECT pg_stat_clear_snapshot()")
    got = db.execute(
        "SELECT funcname, calls FROM pg_stat_user_functions"
        " WHERE schemaname = 'mailbox' AND funcname IN ('inbox_receive', 'inbox_receive_batch')"
    ).fetchall()
    return {"inbox_receive": 0, "inbox_receive_batch": 0, **dict(got)}


def setup_outbox(db, outbox: str = "e", group: str = "g") -> None:
    db.execute("SELECT mailbox.create_outbox(%s)", [outbox])
    db.execute("SELECT mailbox.create_consumer_group(%s, %s, 'earliest')", [group, outbox])


def publish(db, outbox: str, n: int, key: str | None = None, tag: str = "x") -> list[str]:
    """n events in one transaction; returns their event ids in order."""
    return [
        str(r[0])
        for r in db.execute(
            "SELECT mailbox.outbox_publish_batch(%s,"
            " ARRAY(SELECT jsonb_build_object('tag', %s::text, 'n', g)"
            "       FROM generate_series(1, %s) g), '{}', %s, 'thing.created')",
            [outbox, tag, n, key],
        ).fetchall()
    ]


# --- an HTTP endpoint that records what it got -----------------------------------------


class Recorder:
    """A local HTTP server. ``behave(n, key) -> (status, delay)`` decides each answer
    (n counts requests from 1); every request is recorded as (key, body, status)."""

    def __init__(self, behave=None) -> None:
        self.behave = behave or (lambda n, key: (200, 0))
        self.got: list[tuple[str, dict, int]] = []
        self.lock = threading.Lock()
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_HEAD(self):  # noqa: N802 - http.server API
                self.send_response(200)
                self.end_headers()

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                key = self.headers.get("Idempotency-Key")
                with rec.lock:
                    n = len(rec.got) + 1
                    status, delay = rec.behave(n, key)
                    rec.got.append((key, json.loads(body), status))
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def delivered(self) -> list[str]:
        with self.lock:
            return [k for k, _, s in self.got if 200 <= s < 300 or s == 409]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- brokers ---------------------------------------------------------------------------


def arun(coro):
    return asyncio.run(coro)


async def nats_stream_ids(stream: str, url: str = NATS) -> list[str]:
    """Nats-Msg-Id of every message in a JetStream stream, in stream order."""
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        ids = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            ids.append((msg.headers or {}).get("Nats-Msg-Id"))
        return ids
    finally:
        await nc.close()


async def nats_count(stream: str, url: str = NATS) -> int:
    import nats

    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(stream)).state.messages
    finally:
        await nc.close()


async def nats_delete_stream(stream: str, url: str = NATS) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        try:
            await nc.jetstream().delete_stream(stream)
        except Exception:  # noqa: BLE001 - already gone
            pass
    finally:
        await nc.close()


async def amqp_declare(queue: str) -> None:
    import aio_pika

    conn = await aio_pika.connect(AMQP)
    async with conn:
        ch = await conn.channel()
        await ch.declare_queue(queue, durable=False, auto_delete=False)


async def amqp_drain(queue: str, delete: bool = True) -> list:
    """Every message of a queue (acked), as aio-pika messages."""
    import aio_pika

    conn = await aio_pika.connect(AMQP)
    async with conn:
        ch = await conn.channel()
        q = await ch.get_queue(queue)
        got = []
        while True:
            m = await q.get(no_ack=True, fail=False)
            if m is None:
                break
            got.append(m)
        if delete:
            await q.delete(if_unused=False, if_empty=False)
        return got
