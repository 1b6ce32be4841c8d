"""End to end on real processes: outbox -> relay -> NATS JetStream -> ingest -> inbox with
the relay SIGKILLed and restarted; a database restart and a broker restart while the relay
runs (SPEC §5.2 failures: recover by itself, nothing lost)."""

import shutil
import signal
import subprocess
import threading
import time

import psycopg
import pytest
from relayhelp import (
    NATS,
    Proc,
    arun,
    group_offset,
    nats_count,
    nats_delete_stream,
    nats_stream_ids,
    uid,
    wait_for,
)

from pg_mailbox.cluster import Cluster, free_port


def producers(dsn, outbox, n_threads, per_thread, chunk=50, pause=0.0):
    """n_threads concurrent producers, each committing `chunk` events per transaction."""
    ids, errors = [], []
    lock = threading.Lock()

    def work(t):
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for start in range(0, per_thread, chunk):
                    got = conn.execute(
                        "SELECT mailbox.outbox_publish_batch(%s, ARRAY(SELECT"
                        " jsonb_build_object('p', %s::int, 'n', g)"
                        " FROM generate_series(%s::int, %s::int) g),"
                        " '{}', %s)",
                        [outbox, t, start, start + chunk - 1, f"k{t}"],
                    ).fetchall()
                    with lock:
                        ids.extend(str(r[0]) for r in got)
                    if pause:
                        time.sleep(pause)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    return threads, ids, errors


@pytest.mark.slow
def test_20000_events_through_nats_with_the_relay_killed_twice(db, dsn, tmp_path):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_inbox('ib')")
    stream = uid("E2E").upper()
    subject = stream.lower() + ".{outbox}"
    sink = f"{NATS}?stream={stream}&subject={subject}"
    relay_args = (
        "relay",
        "--dsn",
        dsn,
        "--group",
        "g",
        "--consumer",
        "relay",
        "--sink",
        sink,
        "--batch-size",
        "500",
        "--visibility",
        "5",
        "--poll-interval",
        "0.5",
    )
    relay = Proc(tmp_path, "relay", *relay_args)
    ingest = None
    try:
        wait_for(lambda: "started" in relay.stderr(), what="relay start")
        ingest = Proc(
            tmp_path,
            "ingest",
            "ingest",
            "--dsn",
            dsn,
            "--inbox",
            "ib",
            "--source",
            f"{NATS}?stream={stream}&subject={stream.lower()}.>&durable=d_{stream.lower()}",
            "--batch-size",
            "500",
            "--poll-interval",
            "0.5",
        )
        threads, ids, errors = producers(dsn, "e", 4, 5000)
        for kill_at in (4000, 11000):
            wait_for(lambda k=kill_at: group_offset(db) >= k, timeout=120, what=f"offset {kill_at}")
            relay.kill()  # SIGKILL mid-run: its batch is neither committed nor lost
            relay = Proc(tmp_path, "relay", *relay_args)
        for th in threads:
            th.join(120)
        assert not errors, errors
        assert len(ids) == 20000
        wait_for(
            lambda: db.execute("SELECT count(*) FROM mailbox.ib").fetchone()[0] >= 20000,
            timeout=180,
            what="20000 events in the inbox",
        )
        got = {r[0] for r in db.execute("SELECT event_id FROM mailbox.ib").fetchall()}
        assert got == set(ids)
        # the stream's dedup window kept one copy of each, whatever the restarts resent
        assert arun(nats_count(stream)) == 20000
        assert "Traceback" not in relay.stderr() + ingest.stderr()
    finally:
        relay.kill()
        if ingest is not None:
            assert ingest.term() == 0
        arun(nats_delete_stream(stream))


@pytest.mark.slow
def test_database_restart_while_the_relay_runs(tmp_path):
    with Cluster() as cluster:
        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE r")
        dsn = cluster.dsn("r")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_mailbox CASCADE")
            conn.execute("SELECT mailbox.create_outbox('e')")
            conn.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
        relay = Proc(
            tmp_path,
            "relay",
            "relay",
            "--dsn",
            dsn,
            "--group",
            "g",
            "--consumer",
            "r",
            "--sink",
            "stdout:",
            "--poll-interval",
            "0.2",
            "--batch-size",
            "50",
        )
        stop = threading.Event()
        published = []

        def produce():
            while not stop.is_set():
                try:
                    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as c:
                        while not stop.is_set():
                            c.execute("SELECT mailbox.outbox_publish('e', '{\"x\":1}')")
                            published.append(1)
                            time.sleep(0.005)
                except psycopg.Error:
                    time.sleep(0.2)  # the server is restarting

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            wait_for(lambda: len(relay.lines()) > 200, timeout=60, what="relay running")
            cluster._run(
                "pg_ctl",
                "restart",
                "-D",
                str(cluster.data_dir),
                "-m",
                "fast",
                "-l",
                str(cluster.log_path),
                "-w",
            )
            time.sleep(2)
            stop.set()
            producer.join(30)
            with psycopg.connect(dsn, autocommit=True) as conn:
                want = {str(r[0]) for r in conn.execute("SELECT event_id FROM mailbox.outbox_e")}
                wait_for(
                    lambda: want <= {x["event_id"] for x in relay.lines()},
                    timeout=60,
                    what="every committed event relayed after the restart",
                )
                wait_for(
                    lambda: (
                        conn.execute("SELECT lag FROM mailbox.consumer_lag('g')").fetchone()[0] == 0
                    ),
                    timeout=30,
                    what="lag 0",
                )
            assert "database unreachable, retrying" in relay.stderr()
            assert "database reachable again" in relay.stderr()
            assert len(want) > 200
        finally:
            stop.set()
            assert relay.term() == 0
            assert "Traceback" not in relay.stderr()


def _nats_server(port, store, log):
    return subprocess.Popen(
        ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)],
        stdout=open(log, "ab"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="needs nats-server")
def test_broker_restart_while_the_relay_runs(db, dsn, tmp_path):
    """A private nats-server (the shared one must not be restarted) goes away and comes
    back on the same port and storage while the relay publishes: nothing is lost."""
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    store = tmp_path / "js"
    server = _nats_server(port, store, tmp_path / "nats.log")
    relay = None
    try:
        wait_for(lambda: _listening(port), timeout=20, what="nats-server")
        db.execute("SELECT mailbox.create_outbox('e')")
        db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
        relay = Proc(
            tmp_path,
            "relay",
            "relay",
            "--dsn",
            dsn,
            "--group",
            "g",
            "--consumer",
            "r",
            "--sink",
            f"{url}?stream=B&subject=b.{{outbox}}",
            "--poll-interval",
            "0.2",
            "--batch-size",
            "50",
        )
        wait_for(lambda: "started" in relay.stderr(), what="relay start")
        threads, ids, errors = producers(dsn, "e", 2, 1000, chunk=10, pause=0.1)
        wait_for(lambda: group_offset(db) > 300, timeout=60, what="relay publishing")
        server.send_signal(signal.SIGTERM)
        server.wait(20)
        time.sleep(7)  # longer than one connect attempt (5 s): the relay must notice
        server = _nats_server(port, store, tmp_path / "nats.log")
        for th in threads:
            th.join(120)
        assert not errors
        wait_for(lambda: group_offset(db) == 2000, timeout=120, what="relay drained")
        stored = arun(nats_stream_ids("B", url))
        assert set(stored) == set(ids)  # nothing lost
        assert "sink failing, retrying" in relay.stderr()
        assert "sink reachable again" in relay.stderr()
    finally:
        if relay is not None:
            assert relay.term() == 0
            assert "Traceback" not in relay.stderr()
        server.send_signal(signal.SIGTERM)
        server.wait(20)


def _listening(port):
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
        return True
    except OSError:
        return False
