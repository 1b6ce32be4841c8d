"""`pg-mailbox demo`: the whole pipeline, end to end, in well under a minute (SPEC §5.4).

    producers --INSERT/UPDATE--> public.orders --capture--> outbox mailbox.outbox_orders
      --pg-mailbox relay--> NATS JetStream --pg-mailbox ingest--> inbox mailbox.orders_inbox

With no ``--dsn`` it starts a throwaway PostgreSQL cluster of its own and installs the
extension. NATS is used when a server answers at ``--nats`` (default 127.0.0.1:4222);
otherwise the relay writes straight into the database's own inbox through the
``postgresql://…?inbox=`` sink. The relay and ingest are the real ones
(:class:`pg_mailbox.relay.Relay`, :func:`pg_mailbox.ingest._run`) run as asyncio tasks in
this process, so their counters feed the live table. At the end the demo replays the last
events on purpose, as a relay restarted after a crash would, to show the duplicates being
dropped, then checks that every produced event reached the inbox exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pg_mailbox import api, config, ingest, relay
from pg_mailbox.cluster import Cluster, ClusterError
from pg_mailbox.config import MailboxCliError, option, positive_float, positive_int
from pg_mailbox.runtime import Log, Metrics, Stopper

DEMO_DB = "demo"
DEMO_TABLE_COMMENT = "pg_mailbox demo table"
OUTBOX = "orders"
INBOX = "orders_inbox"
GROUP = "demo_relay"
CONSUMER = "demo-relay"
REPLAY = 100  # events replayed on purpose at the end
DRAIN_TIMEOUT = 30.0  # seconds to wait for the pipeline to catch up after the producers
CUSTOMERS = ("ann", "bob", "cy", "dee", "eve", "fay", "gus", "hal")


class DemoError(RuntimeError):
    """The demo cannot go on; the message says why and what to do."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # --dsn is a flag only (no PG_MAILBOX_DSN): an environment meant for a production relay
    # must never point the demo, which creates and drops tables, at that database.
    parser.add_argument(
        "--dsn",
        help="use this existing database (superuser) instead of a throwaway cluster; the demo"
        f" creates public.orders, the outbox {OUTBOX!r} and the inbox {INBOX!r} there",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help=f"with --dsn: drop an existing public.orders, outbox {OUTBOX!r} and inbox"
        f" {INBOX!r} first",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(".demo"),
        help="where the throwaway cluster lives (default: ./.demo, recreated on every run)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="leave the throwaway cluster (and the NATS stream) in place and print how to"
        " look at them",
    )
    parser.add_argument(
        "--stop", action="store_true", help="stop and remove a cluster left by --keep, then exit"
    )
    option(
        parser,
        "--nats",
        default="nats://127.0.0.1:4222",
        help="NATS server to relay through when it answers; 'off' (or one that does not"
        " answer) relays straight into the database's own inbox instead",
    )
    option(
        parser,
        "--seconds",
        default=5.0,
        type=positive_float,
        help="how long the producers write orders",
    )
    option(parser, "--producers", default=4, type=positive_int, help="concurrent producers")
    option(
        parser,
        "--rate",
        default=800,
        type=positive_int,
        help="target write statements (= outbox events) per second, all producers together",
    )


# --- numbers ---------------------------------------------------------------------------


@dataclass
class Stats:
    """What the live table and the summary show. Counters come from the producers
    themselves and from the relay's and ingest's Prometheus registries."""

    route: str = ""
    produced: int = 0
    in_outbox: int = 0
    received: int = 0
    produce_started: float = 0.0
    produce_ended: float | None = None
    replayed: int = 0
    relay_metrics: Metrics = field(default_factory=Metrics)
    ingest_metrics: Metrics = field(default_factory=Metrics)
    sink_kind: str = ""
    phase: str = "starting"

    def _relay(self, result: str) -> int:
        value = self.relay_metrics.registry.get_sample_value(
            "pg_mailbox_relay_messages_total",
            {"group": GROUP, "sink": self.sink_kind, "result": result},
        )
        return int(value or 0)

    @property
    def relayed(self) -> int:
        return self._relay("delivered")

    @property
    def relay_duplicates(self) -> int:
        return self._relay("duplicate")

    @property
    def ingest_duplicates(self) -> int:
        value = self.ingest_metrics.registry.get_sample_value(
            "pg_mailbox_ingest_messages_total", {"inbox": INBOX, "result": "duplicate"}
        )
        return int(value or 0)


class Display:
    """A rich live table when stderr is a terminal, else one progress line a second."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.live = None
        self.last: dict[str, tuple[float, int]] = {}
        self.rates: dict[str, float] = {}
        self.last_line = 0.0

    def __enter__(self) -> Display:
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            self.live = Live(
                self._table(), console=Console(stderr=True), refresh_per_second=4, transient=False
            )
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.__exit__(None, None, None)

    def _rate(self, name: str, value: int, now: float) -> float:
        then, before = self.last.get(name, (now, value))
        if now - then >= 0.5:
            self.rates[name] = (value - before) / (now - then)
            self.last[name] = (now, value)
        elif name not in self.last:
            self.last[name] = (now, value)
        return self.rates.get(name, 0.0)

    @property
    def sink_name(self) -> str:
        return "NATS JetStream" if self.stats.sink_kind == "nats" else "the inbox sink"

    def _rows(self) -> list[tuple[str, str, int, float]]:
        s, now = self.stats, time.monotonic()
        rows = [
            ("producers", "write statements committed on public.orders", s.produced),
            ("outbox", f"rows in mailbox.outbox_{OUTBOX}", s.in_outbox),
            ("relay", f"messages {self.sink_name} acknowledged", s.relayed),
            ("inbox", f"messages in mailbox.{INBOX}", s.received),
        ]
        return [(a, b, n, self._rate(a, n, now)) for a, b, n in rows]

    def _table(self):
        from rich.table import Table

        table = Table(title=f"pg_mailbox demo: {self.stats.phase}", caption=self.stats.route)
        table.add_column("stage")
        table.add_column("what is counted")
        table.add_column("count", justify="right")
        table.add_column("per second now", justify="right")
        for stage, what, n, rate in self._rows():
            table.add_row(stage, what, str(n), f"{rate:,.0f}")
        dups = self.stats.relay_duplicates + self.stats.ingest_duplicates
        table.add_row("duplicates", "dropped by the broker or the inbox", str(dups), "")
        return table

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._table())
            return
        now = time.monotonic()
        if now - self.last_line < 1.0:
            return
        self.last_line = now
        parts = [f"{stage} {n} ({rate:,.0f}/s)" for stage, _, n, rate in self._rows()]
        print(f"demo [{self.stats.phase}]: " + ", ".join(parts), file=sys.stderr, flush=True)


# --- database set-up -------------------------------------------------------------------


def _prepare_existing(conn: psycopg.Connection, replace: bool) -> None:
    """Refuse to touch a user's objects unless --replace says so."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_mailbox CASCADE")
    found = []
    if conn.execute("SELECT to_regclass('public.orders')").fetchone()[0]:
        found.append("table public.orders")
    if api.outbox_exists(conn, OUTBOX):
        found.append(f"outbox {OUTBOX}")
    if api.inbox_exists(conn, INBOX):
        found.append(f"inbox {INBOX}")
    if found and not replace:
        raise DemoError(f"already in this database: {', '.join(found)}; rerun with --replace")
    api.drop_outbox(conn, OUTBOX, if_exists=True)
    api.drop_inbox(conn, INBOX, if_exists=True, cascade=True)
    conn.execute("DROP TABLE IF EXISTS public.orders")


def _setup(conn: psycopg.Connection) -> None:
    conn.execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, customer text NOT NULL,"
        " amount numeric NOT NULL, status text NOT NULL DEFAULT 'new')"
    )
    conn.execute(sql.SQL("COMMENT ON TABLE public.orders IS {}").format(DEMO_TABLE_COMMENT))
    api.enable_outbox(conn, "public.orders", OUTBOX)
    api.create_consumer_group(conn, GROUP, OUTBOX, "earliest")
    api.create_inbox(conn, INBOX)


def _inbox_sink_url(dsn: str) -> str:
    """The ``postgresql://…?inbox=`` sink URL of the demo database, from any DSN form."""
    params = {k: v for k, v in conninfo_to_dict(dsn).items() if v is not None}
    password = params.pop("password", None)
    if password:
        # not in the URL, which the relay logs: libpq reads it from the environment
        os.environ["PGPASSWORD"] = password
    return "postgresql://?" + urlencode({**params, "inbox": INBOX})


def _shown_dsn(dsn: str) -> str:
    """The DSN to print: without its password (libpq asks, or reads PGPASSWORD/.pgpass)."""
    params = conninfo_to_dict(dsn)
    if params.pop("password", None) is None:
        return dsn
    return make_conninfo("", **params)


async def _nats_answers(url: str) -> bool:
    if url.strip().lower() in ("off", "none", "no", ""):
        return False
    import nats

    async def quiet(exc: Exception) -> None:
        pass

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                url,
                connect_timeout=1,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                error_cb=quiet,
            ),
            3,
        )
    except Exception:  # noqa: BLE001 - any failure means "no NATS here"
        return False
    try:
        await nc.jetstream().account_info()
        return True
    except Exception:  # noqa: BLE001 - a server without JetStream is no use either
        return False
    finally:
        await nc.close()


async def _delete_stream(url: str, stream: str) -> None:
    import nats

    try:
        nc = await asyncio.wait_for(nats.connect(url, allow_reconnect=False), 3)
        try:
            await nc.jetstream().delete_stream(stream)
        finally:
            await nc.close()
    except Exception:  # noqa: BLE001, S110 - best effort cleanup of a demo stream
        pass


# --- the pipeline ----------------------------------------------------------------------


def _sub_args(module, argv: list[str]) -> argparse.Namespace:
    """Arguments for the real relay/ingest, as their command line would give them (the
    user's PG_MAILBOX_* environment and config file are ignored: the demo is self-contained)."""
    parser = argparse.ArgumentParser(prog=f"pg-mailbox {module.__name__.rsplit('.', 1)[-1]}")
    module.add_arguments(parser)
    args = parser.parse_args([*argv, "--config", ""])
    return config.resolve(parser, args, environ={})


def _arm(stopper: Stopper) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopper._signal)


class DemoRelay(relay.Relay):
    """The real relay; it only shares the demo's stopper so Ctrl-C stops everything."""

    def __init__(self, args: argparse.Namespace, stopper: Stopper, metrics: Metrics) -> None:
        super().__init__(args, Log(args.log_format, "relay"), metrics)
        self.shared_stopper = stopper
        self.started = asyncio.Event()

    async def start(self) -> None:
        await super().start()
        self.stopper = self.shared_stopper  # Relay.start made (and armed) its own
        _arm(self.stopper)
        self.started.set()


async def _started(task: asyncio.Task, ready: asyncio.Event) -> None:
    """Wait until ``ready`` or until the task failed (its error is raised here)."""
    waiter = asyncio.ensure_future(ready.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        task.result()  # raises the start-up error
        raise DemoError("the relay stopped while starting")


async def _producer(dsn: str, n: int, stats: Stats, stop: Stopper, until: float, rate: float):
    """Write orders: mostly single-row INSERTs, some UPDATEs, now and then a 3-row INSERT.
    Each statement commits on its own and writes exactly one outbox row."""
    rnd = random.Random(n)
    mine: list[int] = []
    interval = 1.0 / rate
    next_at = time.monotonic()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not stop.stopping and time.monotonic() < until:
            roll = rnd.random()
            if mine and roll < 0.3:
                await conn.execute(
                    "UPDATE public.orders SET status = %s WHERE id = %s",
                    [rnd.choice(("paid", "shipped", "cancelled")), rnd.choice(mine)],
                )
            elif roll < 0.35:
                cur = await conn.execute(
                    "INSERT INTO public.orders (customer, amount)"
                    " SELECT %s, round((random() * 100)::numeric, 2) FROM generate_series(1, 3)"
                    " RETURNING id",
                    [rnd.choice(CUSTOMERS)],
                )
                mine += [r[0] for r in await cur.fetchall()]
            else:
                cur = await conn.execute(
                    "INSERT INTO public.orders (customer, amount) VALUES (%s, %s) RETURNING id",
                    [rnd.choice(CUSTOMERS), round(rnd.uniform(1, 100), 2)],
                )
                mine.append((await cur.fetchone())[0])
            stats.produced += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = time.monotonic()  # behind: do not burst to catch up


async def _watch(dsn: str, stats: Stats, display: Display, done: asyncio.Event) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while not done.is_set():
            row = await (
                await conn.execute(
                    sql.SQL("SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {})").format(
                        sql.Identifier("mailbox", f"outbox_{OUTBOX}"),
                        sql.Identifier("mailbox", INBOX),
                    )
                )
            ).fetchone()
            stats.in_outbox, stats.received = row
            display.refresh()
            try:
                await asyncio.wait_for(done.wait(), 0.25)
            except TimeoutError:
                pass


async def _until(cond, seconds: float, stop: Stopper) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if stop.stopping or time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def pipeline(args: argparse.Namespace, dsn: str, stats: Stats) -> dict:
    """Run producers, relay and (with NATS) ingest; return facts for the summary."""
    stop = Stopper()
    run_id = uuid.uuid4().hex[:8]
    stream = f"PG_MAILBOX_DEMO_{run_id}"
    subject = f"pg_mailbox_demo.{run_id}"
    use_nats = await _nats_answers(args.nats)
    nats_host = urlsplit(args.nats).netloc if use_nats else ""
    if use_nats:
        sink = f"nats://{nats_host}?" + urlencode(
            {"stream": stream, "subject": subject + ".{outbox}"}, safe="{}"
        )
        stats.route = (
            f"public.orders -> outbox -> relay -> NATS JetStream {nats_host} (stream {stream})"
            f" -> ingest -> inbox mailbox.{INBOX}"
        )
    else:
        sink = _inbox_sink_url(dsn)
        where = "NATS off" if args.nats.strip().lower() == "off" else f"no NATS at {args.nats}"
        stats.route = (
            f"public.orders -> outbox -> relay -> inbox mailbox.{INBOX} (postgresql sink; {where})"
        )
    print(f"route: {stats.route}", flush=True)
    relay_args = _sub_args(
        relay,
        ["--dsn", dsn, "--group", GROUP, "--sink", sink, "--consumer", CONSUMER]
        + ["--poll-interval", "0.2", "--batch-size", "200"],
    )
    the_relay = DemoRelay(relay_args, stop, stats.relay_metrics)
    stats.sink_kind = "nats" if use_nats else "postgresql"
    tasks: list[asyncio.Task] = []
    watch_done = asyncio.Event()
    facts: dict = {"stream": stream if use_nats else None, "nats": args.nats if use_nats else None}
    with Display(stats) as display:
        try:
            relay_task = asyncio.create_task(the_relay.run())
            tasks.append(relay_task)
            await _started(relay_task, the_relay.started)
            if use_nats:
                ingest_args = _sub_args(
                    ingest,
                    ["--dsn", dsn, "--inbox", INBOX, "--poll-interval", "0.2"]
                    + ["--batch-size", "200", "--source"]
                    + [
                        f"nats://{nats_host}?"
                        + urlencode({"stream": stream, "subject": subject + ".>"})
                        + "&durable=demo_ingest"
                    ],
                )
                tasks.append(
                    asyncio.create_task(ingest._run(ingest_args, stats.ingest_metrics, stop))
                )
            tasks.append(asyncio.create_task(_watch(dsn, stats, display, watch_done)))

            stats.phase = f"{args.producers} producers writing for {args.seconds:g} s"
            stats.produce_started = time.monotonic()
            until = stats.produce_started + args.seconds
            await asyncio.gather(
                *(
                    _producer(dsn, n, stats, stop, until, args.rate / args.producers)
                    for n in range(args.producers)
                )
            )
            stats.produce_ended = time.monotonic()

            stats.phase = "draining: the relay and ingest catch up"
            caught_up = await _until(
                lambda: stats.received >= stats.produced and stats.relayed >= stats.produced,
                DRAIN_TIMEOUT,
                stop,
            )
            facts["drained_at"] = time.monotonic()
            facts["caught_up"] = caught_up
            if caught_up:
                stats.phase = f"replaying the last {REPLAY} events, as a restarted relay would"
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    # the offsets of the newest REPLAY rows (offsets need not be dense)
                    cur = await conn.execute(
                        sql.SQL(
                            "SELECT min(outbox_id) - 1, count(*) FROM (SELECT outbox_id FROM {}"
                            " WHERE outbox_id IS NOT NULL ORDER BY outbox_id DESC LIMIT %s) AS t"
                        ).format(sql.Identifier("mailbox", f"outbox_{OUTBOX}")),
                        [REPLAY],
                    )
                    seek_to, stats.replayed = await cur.fetchone()
                    dups_before = stats.relay_duplicates
                    await api.aseek_offset(conn, GROUP, CONSUMER, seek_to)
                facts["replay_done"] = await _until(
                    lambda: stats.relay_duplicates - dups_before >= stats.replayed,
                    DRAIN_TIMEOUT,
                    stop,
                )
                await asyncio.sleep(0.5)  # anything a replay got through would arrive now
            stats.phase = "done" if not stop.stopping else "interrupted"
        finally:
            facts["interrupted"] = stop.stopping
            stop.event.set()  # the relay commits what was acknowledged, ingest leaves
            watch_done.set()
            done, pending = await asyncio.wait(tasks, timeout=15) if tasks else (set(), set())
            for t in pending:
                t.cancel()
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()
            display.refresh()
    return facts


# --- summary ---------------------------------------------------------------------------


def _facts_from_db(conn: psycopg.Connection) -> dict:
    outbox = sql.Identifier("mailbox", f"outbox_{OUTBOX}")
    inbox = sql.Identifier("mailbox", INBOX)
    q = sql.SQL(
        "SELECT (SELECT count(*) FROM {o}),"
        " (SELECT count(*) FROM {i}),"
        " (SELECT count(*) FROM {o} o WHERE NOT EXISTS"
        "    (SELECT 1 FROM {i} i WHERE i.event_id = o.event_id::text)),"
        " (SELECT count(*) FROM {i} i WHERE NOT EXISTS"
        "    (SELECT 1 FROM {o} o WHERE i.event_id = o.event_id::text)),"
        " (SELECT percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP"
        "    (ORDER BY extract(epoch FROM i.received_at - o.created_at))"
        "    FROM {o} o JOIN {i} i ON i.event_id = o.event_id::text)"
    ).format(o=outbox, i=inbox)
    in_outbox, in_inbox, missing, extra, latency = conn.execute(q).fetchone()
    return {
        "in_outbox": in_outbox,
        "in_inbox": in_inbox,
        "missing": missing,
        "extra": extra,
        "latency": latency,
    }


def summary(stats: Stats, facts: dict, db: dict, dsn: str, keep: bool, cluster: bool) -> bool:
    """Print the closing summary on stdout; True when every event arrived exactly once."""
    produce_s = (stats.produce_ended or time.monotonic()) - stats.produce_started
    flow_s = facts.get("drained_at", time.monotonic()) - stats.produce_started
    exact = (
        db["missing"] == 0
        and db["extra"] == 0
        and db["in_inbox"] == stats.produced == db["in_outbox"]
    )
    dups = stats.relay_duplicates + stats.ingest_duplicates
    if facts.get("stream"):
        by = "NATS JetStream"
        dropped_by = (
            f"NATS's dedup window (Nats-Msg-Id) dropped {stats.relay_duplicates},"
            f" the inbox {stats.ingest_duplicates}"
        )
    else:
        by = "the inbox sink"
        dropped_by = f"the inbox's primary key dropped {stats.relay_duplicates}"
    lat = db["latency"]
    out = [
        "",
        "pg_mailbox demo: summary",
        f"  route       {stats.route}",
        f"  produced    {stats.produced} events    (write statements on public.orders in"
        f" {produce_s:.1f} s: {stats.produced / max(produce_s, 1e-9):.0f}/s;"
        f" rows in the outbox: {db['in_outbox']})",
        f"  relayed     {stats.relayed} messages  (acknowledged by {by};"
        f" {stats.relayed / max(flow_s, 1e-9):.0f}/s)",
        f"  received    {db['in_inbox']} messages  (rows in inbox mailbox.{INBOX};"
        f" {db['in_inbox'] / max(flow_s, 1e-9):.0f}/s)",
        f"  duplicates  {dups} dropped    "
        + (
            f"(the last {stats.replayed} events were sent again on purpose, as by a relay"
            f" restarted after a crash: {dropped_by})"
            if stats.replayed
            else "(stopped before the replay of the last events)"
        ),
    ]
    if lat:
        out.append(
            f"  latency     p50 {lat[0] * 1000:.0f} ms, p95 {lat[1] * 1000:.0f} ms"
            " (outbox commit -> inbox row)"
        )
    out.append(
        f"  rates       relayed and received per second count from the first write until all"
        f" was in the inbox ({flow_s:.1f} s), so they include the wait for the producers"
    )
    interrupted = bool(facts.get("interrupted"))
    if exact:
        out.append("  check       every produced event is in the inbox exactly once: yes")
    elif interrupted and db["extra"] == 0:
        out.append(
            f"  check       interrupted before the pipeline drained: {db['missing']} events"
            " were still on their way (none arrived twice)"
        )
    else:
        out.append(
            f"  check       NOT exactly once: {db['missing']} outbox events missing from the"
            f" inbox, {db['extra']} inbox rows not in the outbox"
            + ("" if facts.get("caught_up") else f" (not drained within {DRAIN_TIMEOUT:g} s)")
        )
    out += ["", "Where to look next:"]
    if cluster and not keep:
        out.append(
            "  (the throwaway cluster is gone: `pg-mailbox demo --keep` leaves it for these)"
        )
    dsn = _shown_dsn(dsn)
    psql = f'psql "{dsn}"'
    out += [
        f"  {psql} -c 'SELECT outbox_id, event_id, payload FROM mailbox.outbox_{OUTBOX}"
        " ORDER BY outbox_id DESC LIMIT 5'",
        f"  {psql} -c 'SELECT * FROM mailbox.stats_{INBOX}'",
        f"  {psql} -c 'SELECT * FROM mailbox.consumer_lag()'",
        f'  {_command()} status --dsn "{dsn}"',
    ]
    if facts.get("stream") and keep:
        out.append(f"  nats --server {facts['nats']} stream info {facts['stream']}")
    out.append("  docs/relay.md explains the relay and ingest; docs/inbox.md the inbox")
    print("\n".join(out), flush=True)
    return exact or (interrupted and db["extra"] == 0)


def _command() -> str:
    """How to run pg-mailbox again: by name when it is on PATH (else by path)."""
    if shutil.which("pg-mailbox"):
        return "pg-mailbox"
    if Path(sys.argv[0]).name == "pg-mailbox":
        return sys.argv[0]  # as the user typed it, e.g. .venv/bin/pg-mailbox
    return f"{Path(sys.executable).name} -m pg_mailbox"


# --- entry point -----------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    cluster: Cluster | None = None
    try:
        if args.stop:
            Cluster(args.dir).destroy()
            print(f"stopped and removed the demo cluster at {args.dir}")
            return 0
        if args.dsn:
            dsn = args.dsn
            print("using the database of --dsn; installing pg_mailbox there", flush=True)
            with psycopg.connect(dsn, autocommit=True) as conn:
                _prepare_existing(conn, args.replace)
                _setup(conn)
        else:
            print(f"starting a throwaway PostgreSQL cluster in {args.dir}", flush=True)
            Cluster(args.dir).destroy()  # rerunnable: a kept cluster from last time goes
            cluster = Cluster(args.dir).init().start()
            with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DB)))
            dsn = cluster.dsn(DEMO_DB)
            print(f"installing pg_mailbox in {dsn}", flush=True)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_mailbox CASCADE")
                _setup(conn)
        print(
            f"captured public.orders into outbox mailbox.outbox_{OUTBOX};"
            f" consumer group {GROUP}; inbox mailbox.{INBOX}",
            flush=True,
        )
        stats = Stats()
        facts = asyncio.run(pipeline(args, dsn, stats))
        with psycopg.connect(dsn, autocommit=True) as conn:
            db = _facts_from_db(conn)
        ok = summary(stats, facts, db, dsn, args.keep, cluster is not None)
        if facts.get("stream") and not args.keep:
            asyncio.run(_delete_stream(facts["nats"], facts["stream"]))
    except (psycopg.Error, ClusterError, DemoError, MailboxCliError) as exc:
        state = getattr(getattr(exc, "diag", None), "sqlstate", None)
        text = exc.render() if isinstance(exc, MailboxCliError) else str(exc)
        print(f"\ndemo failed{f' (SQLSTATE {state})' if state else ''}: {text}", file=sys.stderr)
        _finish(cluster, args, failed=True)
        return 1
    except BaseException:
        _finish(cluster, args, failed=True)
        raise
    _finish(cluster, args, failed=False)
    if not ok:
        return 1
    print("\ndemo done")
    return 0


def _finish(cluster: Cluster | None, args: argparse.Namespace, failed: bool) -> None:
    if cluster is None:
        return
    out = sys.stderr if failed else sys.stdout
    if args.keep:
        print(f'\ncluster kept running: psql "{cluster.dsn(DEMO_DB)}"', file=out)
        print(f"stop it with: pg-mailbox demo --stop --dir {args.dir}", file=out)
    else:
        cluster.destroy()
        if not failed:
            print("\ncluster stopped and removed (use --keep to explore it)")
