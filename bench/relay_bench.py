"""Relay benchmark: outbox -> `pg-mailbox relay` -> NATS JetStream / RabbitMQ (issue 10).

Cells (one table): for each sink (--sinks), batch size (--batches) and number of relays
(--relays), the msg/s at which `pg-mailbox relay` subprocesses drain an unread backlog of
--rows events into the broker, waiting for every acknowledgement (JetStream PubAck,
RabbitMQ publisher confirms) before committing. Beside them, in the same run, a minimal
hand-written loop (poll_outbox -> publish with the same client library -> wait for acks
-> commit_offset) on the same backlog: the ratio relay / hand-written is the relay's cost.

Rules: every cell drains a backlog of its own that no consumer has read: a fresh outbox,
--rows events published in transactions of 1000 before the clock starts and NOT numbered,
so the first polls number it inside the clock exactly as they would for a relay started on
a real backlog (no numberer runs; the poll numbers inline, the default). Each cell reads
through a consumer group created 'earliest' into a stream or queue of its own, so no cell
sees another's dedup state. A relay cell's clock starts at the relay's "started" log line
(process start-up is not counted) and stops when the group offset reaches --rows. --rounds
repeats every cell, alternating whether the hand-written loop or the relays go first; the
table shows median rates and the median of the per-round ratios.

Latency: one relay, --poll-interval 5, waiting on LISTEN; the bench commits one event at a
time and measures commit -> message seen by a core NATS subscriber of the subject
(after JetStream stored it): p50/p99 over --latency-samples.

Usage: python bench/relay_bench.py [--dsn DSN] [--rows 20000] [--batches 100,1000]
       [--relays 1,2] [--sinks nats,amqp] [--rounds 3] [--latency-samples 200] [--quick]
Without --dsn a throwaway cluster is started (pg_mailbox.cluster) and removed afterwards.
Needs NATS (JetStream) on 127.0.0.1:4222 and RabbitMQ on 127.0.0.1:5672 (guest/guest).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import psycopg

from pg_mailbox import api

NATS = os.environ.get("BENCH_NATS", "nats://127.0.0.1:4222")
AMQP = os.environ.get("BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672/")
PAYLOAD = "jsonb_build_object('order_id', g, 'amount', g * 10, 'customer', 'customer-' || g)"


def progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def percentile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


# --- preparation -------------------------------------------------------------------------


def prepare(db: psycopg.Connection, rows: int) -> tuple[str, str]:
    """A fresh outbox holding an unread, unnumbered backlog and an 'earliest' group on it."""
    outbox = f"rb_{uuid.uuid4().hex[:8]}"
    api.create_outbox(db, outbox)
    for start in range(1, rows + 1, 1000):
        end = min(rows, start + 999)
        db.execute(
            f"SELECT count(*) FROM mailbox.outbox_publish_batch(%s,"
            f" ARRAY(SELECT {PAYLOAD} FROM generate_series(%s::int, %s::int) g),"
            " '{}', NULL, 'order.created')",
            [outbox, start, end],
        )
    group = f"g_{outbox}"
    api.create_consumer_group(db, group, outbox, "earliest")
    db.execute("CHECKPOINT")  # no cell pays for the previous cell's dirty pages
    return outbox, group


def discard(db: psycopg.Connection, outbox: str) -> None:
    db.execute("SELECT mailbox.drop_outbox(%s, true)", [outbox])


def group_offset(db: psycopg.Connection, group: str) -> int:
    return db.execute(
        "SELECT group_offset FROM mailbox.consumer_group_lag WHERE group_name = %s", [group]
    ).fetchone()[0]


def sink_url(kind: str, name: str) -> str:
    if kind == "nats":
        return f"{NATS}?stream={name.upper()}&subject={name}.{{outbox}}&dedup_seconds=120"
    return f"{AMQP}?routing_key={name}"


async def _amqp_queue(name: str, delete: bool = False) -> None:
    import aio_pika

    conn = await aio_pika.connect(AMQP)
    async with conn:
        ch = await conn.channel()
        if delete:
            await ch.queue_delete(name)
        else:
            await ch.declare_queue(name, durable=True)


async def _nats_stream(name: str, delete: bool = False) -> None:
    import nats
    from nats.js.api import StreamConfig

    nc = await nats.connect(NATS)
    try:
        js = nc.jetstream()
        if delete:
            try:
                await js.delete_stream(name.upper())
            except Exception:  # noqa: BLE001 - already gone
                pass
        else:
            await js.add_stream(
                StreamConfig(name=name.upper(), subjects=[f"{name}.*"], duplicate_window=120)
            )
    finally:
        await nc.close()


def make_target(kind: str, name: str) -> None:
    asyncio.run(_nats_stream(name) if kind == "nats" else _amqp_queue(name))


def drop_target(kind: str, name: str) -> None:
    asyncio.run(_nats_stream(name, True) if kind == "nats" else _amqp_queue(name, True))


# --- cells -------------------------------------------------------------------------------


def relay_cell(dsn: str, db, kind: str, batch: int, relays: int, rows: int, tmp: str) -> float:
    outbox, group = prepare(db, rows)
    target = f"rb_{uuid.uuid4().hex[:8]}"
    make_target(kind, target)
    procs, errs = [], []
    try:
        for i in range(relays):
            # the relay appends (O_APPEND) through a descriptor of its own: a file object
            # shared with this process would share its offset, and our seek to read would
            # make the relay overwrite its log from the start
            errs.append(os.path.join(tmp, f"{target}_{i}.err"))
            with open(errs[-1], "ab") as err:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "pg_mailbox",
                            "relay",
                            "--dsn",
                            dsn,
                            "--group",
                            group,
                            "--consumer",
                            f"r{i}",
                            "--sink",
                            sink_url(kind, target),
                            "--batch-size",
                            str(batch),
                            "--log-format",
                            "json",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                    )
                )
        starts: list[float] = []
        while len(starts) < relays:
            starts = []
            for path in errs:
                with open(path, "rb") as err:
                    # complete lines only: the last one may still be being written
                    for line in err.read().decode(errors="replace").split("\n")[:-1]:
                        ev = json.loads(line)
                        if ev.get("event") == "started":
                            starts.append(ev["ts"])
            for p, path in zip(procs, errs, strict=True):
                if p.poll() is not None:
                    with open(path, "rb") as err:
                        raise RuntimeError(f"relay exited: {err.read().decode()[-2000:]}")
            time.sleep(0.01)
        while group_offset(db, group) < rows:
            time.sleep(0.01)
        end = time.time()
        return rows / (end - min(starts))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        drop_target(kind, target)
        discard(db, outbox)


async def _hand_loop(dsn: str, kind: str, batch: int, rows: int, group: str, target: str):
    """The minimal loop a user would write with the same client libraries."""
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    if kind == "nats":
        import nats

        nc = await nats.connect(NATS)
        js = nc.jetstream()

        async def publish(rs):
            futs = [
                await js.publish_async(
                    f"{target}.bench", json.dumps(r[2]).encode(), headers={"Nats-Msg-Id": str(r[1])}
                )
                for r in rs
            ]
            await asyncio.gather(*futs)

        async def close():
            await nc.close()
    else:
        import aio_pika

        ac = await aio_pika.connect(AMQP)
        ch = await ac.channel(publisher_confirms=True)
        ex = ch.default_exchange

        async def publish(rs):
            await asyncio.gather(
                *[
                    ex.publish(
                        aio_pika.Message(
                            json.dumps(r[2]).encode(),
                            message_id=str(r[1]),
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=target,
                    )
                    for r in rs
                ]
            )

        async def close():
            await ac.close()

    started = time.time()
    done = 0
    while done < rows:
        cur = await conn.execute(
            "SELECT outbox_id, event_id, payload FROM mailbox.poll_outbox(%s, 'hand', %s, 30)",
            [group, batch],
        )
        rs = await cur.fetchall()
        if not rs:
            break
        await publish(rs)
        await conn.execute("SELECT mailbox.commit_offset(%s, 'hand', %s)", [group, rs[-1][0]])
        done += len(rs)
    elapsed = time.time() - started
    await close()
    await conn.close()
    return done / elapsed


def hand_cell(dsn: str, db, kind: str, batch: int, rows: int) -> float:
    outbox, group = prepare(db, rows)
    target = f"hb_{uuid.uuid4().hex[:8]}"
    make_target(kind, target)
    try:
        return asyncio.run(_hand_loop(dsn, kind, batch, rows, group, target))
    finally:
        drop_target(kind, target)
        discard(db, outbox)


async def _latency(dsn: str, samples: int, tmp: str) -> list[float]:
    import nats

    target = f"lat_{uuid.uuid4().hex[:8]}"
    await _nats_stream(target)
    db = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await api.acreate_outbox(db, "lat")
    await api.acreate_consumer_group(db, "lat_g", "lat", "latest")
    err = open(os.path.join(tmp, "latency.err"), "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pg_mailbox",
            "relay",
            "--dsn",
            dsn,
            "--group",
            "lat_g",
            "--sink",
            sink_url("nats", target).replace("{outbox}", "lat"),
            "--poll-interval",
            "5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    nc = await nats.connect(NATS)
    got: asyncio.Queue = asyncio.Queue()

    async def seen(_msg) -> None:
        got.put_nowait(time.perf_counter())

    await nc.subscribe(f"{target}.lat", cb=seen)
    delays = []
    try:
        await asyncio.sleep(2)  # started, polled once, waiting on LISTEN
        for _ in range(samples):
            t0 = time.perf_counter()
            await db.execute("SELECT mailbox.outbox_publish('lat', '{\"x\": 1}')")
            t1 = await asyncio.wait_for(got.get(), 10)
            delays.append((t1 - t0) * 1000)
            await asyncio.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(30)
        await nc.close()
        await _nats_stream(target, True)
        await db.execute("SELECT mailbox.drop_outbox('lat')")
        await db.close()
    return delays


# --- report ------------------------------------------------------------------------------


def machine(db) -> list[str]:
    load = open("/proc/loadavg").read().split()[:3]
    cpu = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return [
        f"machine: {platform.node()} {os.cpu_count()} CPU(s) {cpu};"
        f" python {platform.python_version()}",
        f"server: {db.execute('SELECT version()').fetchone()[0].split(',')[0]}",
        f"load average at start: {' '.join(load)} (other agents share these cores)",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn")
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--batches", default="100,1000")
    ap.add_argument("--relays", default="1,2")
    ap.add_argument("--sinks", default="nats,amqp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-samples", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.latency_samples, args.relays, args.rounds = 2000, 20, "1,2", 1
    batches = [int(x) for x in args.batches.split(",")]
    relays = [int(x) for x in args.relays.split(",")]
    sinks = args.sinks.split(",")

    cluster = None
    dsn = args.dsn
    if not dsn:
        from pg_mailbox.cluster import Cluster

        cluster = Cluster().__enter__()
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE relay_bench")
        dsn = cluster.dsn("relay_bench")
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION pg_mailbox CASCADE")
    try:
        with psycopg.connect(dsn, autocommit=True) as db, tempfile.TemporaryDirectory() as tmp:
            print("command: " + " ".join(["python", "bench/relay_bench.py", *sys.argv[1:]]))
            for line in machine(db):
                print(line)
            samples: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
            for rnd in range(args.rounds):
                for kind in sinks:
                    for batch in batches:
                        # alternate who goes first, so drift in the machine's load
                        # does not always favour the same side
                        hand_first = rnd % 2 == 0
                        hand = None
                        if hand_first:
                            progress(f"round {rnd + 1}: {kind} batch {batch}: hand-written loop")
                            hand = hand_cell(dsn, db, kind, batch, args.rows)
                        rates = {}
                        for n in relays:
                            progress(f"round {rnd + 1}: {kind} batch {batch}: {n} relay(s)")
                            rates[n] = relay_cell(dsn, db, kind, batch, n, args.rows, tmp)
                        if not hand_first:
                            progress(f"round {rnd + 1}: {kind} batch {batch}: hand-written loop")
                            hand = hand_cell(dsn, db, kind, batch, args.rows)
                        for n in relays:
                            samples.setdefault((kind, batch, n), []).append((rates[n], hand))
            print()
            print(
                f"outbox -> broker, each cell a fresh unread backlog of {args.rows} events"
                f" (numbering inside the clock), msg/s, medians of {args.rounds} round(s)"
            )
            print(
                f"{'sink':<6} {'batch':>6} {'relays':>6} {'relay msg/s':>12}"
                f" {'hand loop msg/s':>16} {'relay/hand':>10}"
            )
            for (kind, batch, n), pairs in samples.items():
                rate = statistics.median(r for r, _ in pairs)
                hand = statistics.median(h for _, h in pairs)
                ratio = statistics.median(r / h for r, h in pairs)
                print(f"{kind:<6} {batch:>6} {n:>6} {rate:>12,.0f} {hand:>16,.0f} {ratio:>10.2f}")
            if args.latency_samples:
                progress("idle latency")
                d = asyncio.run(_latency(dsn, args.latency_samples, tmp))
                print()
                print(
                    f"commit -> NATS subscriber, idle relay on LISTEN (--poll-interval 5),"
                    f" {len(d)} samples: p50 {percentile(d, 0.5):.1f} ms,"
                    f" p99 {percentile(d, 0.99):.1f} ms, mean {statistics.mean(d):.1f} ms"
                )
    finally:
        if cluster is not None:
            cluster.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
