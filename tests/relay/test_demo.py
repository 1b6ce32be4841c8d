"""`pg-mailbox demo` runs the real pipeline end to end (SPEC §5.4): orders -> captured
outbox -> relay -> NATS JetStream (or, when no NATS answers, the inbox sink) -> ingest ->
inbox. The summary's numbers must agree with each other and with the database: every
produced event is in the inbox exactly once, and the replayed ones were dropped as
duplicates. Real PostgreSQL and the machine's real NATS server; nothing is mocked."""

import asyncio
import os
import re
import subprocess
import sys

import nats
import psycopg
from nats.js.errors import NotFoundError

from pg_mailbox.cluster import free_port

NATS_URL = "nats://127.0.0.1:4222"
REPLAYED = 100  # pg_mailbox.demo.REPLAY


def demo(*argv, env=None, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "pg_mailbox", "demo", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def numbers(stdout: str) -> dict:
    def one(pattern):
        match = re.search(pattern, stdout, re.M)
        assert match, f"summary lacks {pattern!r}:\n{stdout}"
        return int(match.group(1))

    return {
        "produced": one(r"^  produced\s+(\d+) events"),
        "outbox_rows": one(r"rows in the outbox: (\d+)\)"),
        "relayed": one(r"^  relayed\s+(\d+) messages"),
        "received": one(r"^  received\s+(\d+) messages"),
        "duplicates": one(r"^  duplicates\s+(\d+) dropped"),
    }


def assert_exactly_once(dsn: str, summary: dict) -> None:
    """The database agrees with the summary: outbox and inbox hold the same event ids."""
    with psycopg.connect(dsn) as conn:
        outbox = {r[0] for r in conn.execute("SELECT event_id::text FROM mailbox.outbox_orders")}
        inbox = [r[0] for r in conn.execute("SELECT event_id FROM mailbox.orders_inbox")]
        lag = conn.execute(
            "SELECT group_offset, head_offset FROM mailbox.consumer_lag('demo_relay') LIMIT 1"
        ).fetchone()
    assert len(inbox) == len(set(inbox)) == summary["received"]
    assert set(inbox) == outbox
    assert len(outbox) == summary["produced"] == summary["outbox_rows"] == summary["relayed"]
    assert lag[0] == lag[1], "the relay committed everything, replay included"


def stream_exists(name: str) -> bool:
    async def check():
        nc = await nats.connect(NATS_URL)
        try:
            await nc.jetstream().stream_info(name)
            return True
        except NotFoundError:
            return False
        finally:
            await nc.close()

    return asyncio.run(check())


def test_demo_relays_through_nats_end_to_end(fresh_dsn):
    got = demo("--dsn", fresh_dsn, "--seconds", "2", "--rate", "400")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    out = got.stdout
    route = re.search(r"^  route\s+(.*)$", out, re.M).group(1)
    assert "NATS JetStream 127.0.0.1:4222" in route and "ingest" in route, route
    summary = numbers(out)
    assert summary["produced"] > 100, "two seconds at 400/s produce hundreds of events"
    assert summary["produced"] == summary["relayed"] == summary["received"]
    # the replay at the end: NATS's dedup window (Nats-Msg-Id) drops every replayed event
    assert summary["duplicates"] == REPLAYED
    assert "NATS's dedup window (Nats-Msg-Id) dropped 100, the inbox 0" in out
    assert "every produced event is in the inbox exactly once: yes" in out
    assert "FROM mailbox.outbox_orders" in out
    assert re.search(r"^  .*(pg-mailbox|-m pg_mailbox) status --dsn ", out, re.M)
    assert out.rstrip().endswith("demo done")
    # stderr is not a terminal here: plain progress lines instead of the live table
    assert re.search(r"^demo \[.*producers writing.*\]: producers \d+", got.stderr, re.M)
    assert_exactly_once(fresh_dsn, summary)
    stream = re.search(r"stream (PG_MAILBOX_DEMO_\w+)", route).group(1)
    assert not stream_exists(stream), "without --keep the demo removes its NATS stream"


def test_demo_falls_back_to_the_inbox_sink_without_nats(fresh_dsn):
    # nothing listens on this port: the relay writes straight into the inbox instead
    unused = f"nats://127.0.0.1:{free_port()}"
    got = demo("--dsn", fresh_dsn, "--seconds", "1", env={"PG_MAILBOX_NATS": unused})
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    out = got.stdout
    assert f"(postgresql sink; no NATS at {unused})" in out
    assert "ingest: started" not in got.stderr  # no broker, so nothing to ingest from
    summary = numbers(out)
    assert summary["produced"] > 0
    assert summary["produced"] == summary["relayed"] == summary["received"]
    # the inbox's primary key drops the replayed events; the sink reports them duplicates
    assert summary["duplicates"] == min(REPLAYED, summary["produced"])
    assert f"the inbox's primary key dropped {summary['duplicates']})" in out
    assert "every produced event is in the inbox exactly once: yes" in out
    assert_exactly_once(fresh_dsn, summary)

    # a second run refuses to touch the objects the first made unless --replace
    again = demo("--dsn", fresh_dsn, "--seconds", "1", "--nats", "off")
    assert again.returncode == 1
    assert "already in this database: table public.orders, outbox orders, inbox orders_inbox" in (
        again.stderr
    )
    replaced = demo("--dsn", fresh_dsn, "--seconds", "1", "--nats", "off", "--replace")
    assert replaced.returncode == 0, replaced.stdout[-3000:] + replaced.stderr[-3000:]
    assert "(postgresql sink; NATS off)" in replaced.stdout
    assert_exactly_once(fresh_dsn, numbers(replaced.stdout))


def test_demo_throwaway_cluster_keep_and_stop(tmp_path):
    """The README's path: no DSN, a cluster of its own under --dir; --keep leaves it
    running for a look, --stop removes it."""
    where = tmp_path / "demo"
    got = demo("--dir", str(where), "--seconds", "1", "--keep")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    kept = re.search(r'^cluster kept running: psql "(.*)"$', got.stdout, re.M)
    assert kept, got.stdout
    summary = numbers(got.stdout)
    assert summary["produced"] == summary["received"] > 0
    assert_exactly_once(kept.group(1), summary)
    stream = re.search(r"stream (PG_MAILBOX_DEMO_\w+)", got.stdout)
    if stream:  # NATS answered: --keep keeps the stream too, for `nats stream info`
        assert stream_exists(stream.group(1))
        assert f"stream info {stream.group(1)}" in got.stdout

        async def drop():
            nc = await nats.connect(NATS_URL)
            await nc.jetstream().delete_stream(stream.group(1))
            await nc.close()

        asyncio.run(drop())

    stopped = demo("--dir", str(where), "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not where.exists()
    try:
        psycopg.connect(kept.group(1), connect_timeout=3).close()
    except psycopg.OperationalError:
        pass
    else:
        raise AssertionError("the demo cluster still answers after --stop")
