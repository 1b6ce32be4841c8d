"""The relay's behaviour (SPEC §5.2): poison handling, retries with backoff, claim-check
pages in bounded memory, LISTEN wake-up, two relays in one group, a hung sink."""

import statistics
import time

from relayhelp import Proc, Recorder, group_offset, publish, relay, setup_outbox, wait_for


def committed(db, consumer, group="g"):
    row = db.execute(
        "SELECT committed_offset FROM mailbox.consumer_status"
        " WHERE group_name = %s AND consumer_id = %s",
        [group, consumer],
    ).fetchone()
    return row[0] if row else None


# --- HTTP: retry vs poison --------------------------------------------------------------


def test_http_5xx_and_timeouts_are_retried_with_backoff(db, dsn):
    setup_outbox(db)
    ids = publish(db, "e", 3)

    def behave(n, key):
        if n == 1:
            return 503, 0
        if n == 2:
            return 500, 0
        if n == 3:
            return 200, 3  # longer than the sink's timeout: retried
        if n == 4:
            return 429, 0
        return 200, 0

    rec = Recorder(behave)
    try:
        started = time.monotonic()
        got = relay(dsn, rec.url + "?timeout=1")
        assert got.returncode == 0, got.stderr
        assert "sink failing, retrying" in got.stderr
        keys = [k for k, _, _ in rec.got]
        assert keys[:5] == [ids[0]] * 5  # the same message until it went through
        assert rec.delivered()[-3:] == ids
        assert time.monotonic() - started > 1.0  # the timeout plus backoff really waited
        assert group_offset(db) == 3
    finally:
        rec.close()


def test_http_4xx_is_poison_stop_exits_4_naming_the_event(db, dsn):
    setup_outbox(db)
    ids = publish(db, "e", 5)
    rec = Recorder(lambda n, key: (422, 0) if key == ids[2] else (200, 0))
    try:
        got = relay(dsn, rec.url)
        assert got.returncode == 4, got.stderr
        assert f"event {ids[2]}" in got.stderr and "Traceback" not in got.stderr
        assert "--on-poison skip" in got.stderr
        assert rec.delivered() == ids[:2]
        assert group_offset(db) == 2  # committed up to the event before the poison one
        # a restart stops at the same event again
        again = relay(dsn, rec.url)
        assert again.returncode == 4 and f"event {ids[2]}" in again.stderr
        assert group_offset(db) == 2
    finally:
        rec.close()


def test_http_4xx_skip_commits_past_it(db, dsn):
    setup_outbox(db)
    ids = publish(db, "e", 5)
    rec = Recorder(lambda n, key: (400, 0) if key == ids[1] else (200, 0))
    try:
        got = relay(dsn, rec.url, "--on-poison", "skip", "--metrics-port", "0")
        assert got.returncode == 0, got.stderr
        assert "poison message" in got.stderr and ids[1] in got.stderr
        assert rec.delivered() == [ids[0], *ids[2:]]
        assert group_offset(db) == 5
    finally:
        rec.close()


def test_max_attempts_turns_a_failing_message_into_poison(db, dsn):
    setup_outbox(db)
    ids = publish(db, "e", 2)
    rec = Recorder(lambda n, key: (500, 0))
    try:
        got = relay(dsn, rec.url, "--max-attempts", "3")
        assert got.returncode == 4 and f"event {ids[0]}" in got.stderr
        assert "failed 3 times" in got.stderr
        assert len(rec.got) == 3
        assert group_offset(db) == 0
    finally:
        rec.close()


# --- claim-check pages -------------------------------------------------------------------


def _hwm_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _relay_until_drained(db, dsn, tmp_path, name, rows_expected):
    p = Proc(
        tmp_path,
        name,
        "relay",
        "--dsn",
        dsn,
        "--group",
        "g",
        "--consumer",
        name,
        "--sink",
        "stdout:",
        "--poll-interval",
        "0.2",
        "--batch-size",
        "100",
    )
    try:
        wait_for(lambda: group_offset(db) >= rows_expected, timeout=120, what="relay drained")
        return p, _hwm_kib(p.p.pid)
    finally:
        assert p.term() == 0


def test_claim_check_goes_out_in_pages_in_bounded_memory(db, dsn, tmp_path):
    db.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    db.execute("SELECT mailbox.enable_outbox('t', p_inline_threshold_rows => 100)")
    db.execute("SELECT mailbox.create_consumer_group('g', 't', 'earliest')")
    # a baseline: the same relay moving a few small rows
    db.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 10) g")
    _, base_kib = _relay_until_drained(db, dsn, tmp_path, "base", 1)
    n = 200_000
    db.execute("INSERT INTO t SELECT g, repeat('p', 100) FROM generate_series(11, %s) g", [n + 10])
    p, big_kib = _relay_until_drained(db, dsn, tmp_path, "big", 2)
    pages = [x for x in p.lines() if x.get("pages")]
    assert len(pages) == 200 and {x["pages"] for x in pages} == {200}
    assert [x["page"] for x in pages] == list(range(1, 201))
    assert len({x["event_id"] for x in pages}) == 1
    body = pages[0]["payload"]
    assert set(body) == {"v", "source", "op", "inserted", "deleted"}
    assert body["op"] == "INSERT" and body["source"] == "public.t"
    assert all(len(x["payload"]["inserted"]) <= 1000 for x in pages)
    got = sorted(r["id"] for x in pages for r in x["payload"]["inserted"])
    assert got == list(range(11, n + 11))
    # ~40 MB of rows went through; the relay held one page (~0.15 MB) at a time
    assert big_kib - base_kib < 30_000, (base_kib, big_kib)
    status = db.execute("SELECT mailbox.outbox_status('t')").fetchone()[0]
    assert status["claim_check_pending_count"] == 0  # outbox_rows_consumed was called


# --- LISTEN wake-up ---------------------------------------------------------------------


def test_listen_wakes_the_relay_well_before_the_poll_interval(db, dsn, tmp_path):
    setup_outbox(db)
    p = Proc(
        tmp_path,
        "r",
        "relay",
        "--dsn",
        dsn,
        "--group",
        "g",
        "--consumer",
        "c1",
        "--sink",
        "stdout:",
        "--poll-interval",
        "5",
    )
    try:
        wait_for(lambda: "started" in p.stderr(), what="relay start")
        time.sleep(1)  # its first poll found nothing: it waits on LISTEN now
        delays = []
        for i in range(10):
            t0 = time.monotonic()
            publish(db, "e", 1, tag=f"w{i}")
            wait_for(
                lambda i=i: len(p.out.read_text().splitlines()) > i,
                timeout=10,
                interval=0.002,
                what="event on stdout",
            )
            delays.append(time.monotonic() - t0)
            time.sleep(0.3)
        p50 = statistics.median(delays)
        assert p50 < 0.5, delays
    finally:
        assert p.term() == 0


# --- two relays, one group --------------------------------------------------------------


def test_two_relays_split_the_work_without_duplicates(db, dsn, tmp_path):
    setup_outbox(db)
    ids = []
    for _ in range(10):
        ids += publish(db, "e", 200)
    relays = [
        Proc(
            tmp_path,
            f"r{i}",
            "relay",
            "--dsn",
            dsn,
            "--group",
            "g",
            "--consumer",
            f"r{i}",
            "--sink",
            "stdout:",
            "--batch-size",
            "20",
            "--poll-interval",
            "0.2",
        )
        for i in range(2)
    ]
    try:
        wait_for(lambda: group_offset(db) == 2000, timeout=120, what="both drained")
    finally:
        for r in relays:
            assert r.term() == 0
    seen = [[x["event_id"] for x in r.lines()] for r in relays]
    assert all(seen), "each relay got a share"
    assert sorted(seen[0] + seen[1]) == sorted(ids)  # every event exactly once
    warn = relays[0].stderr() + relays[1].stderr()
    assert "lease lost" not in warn


def test_a_hung_sink_loses_its_rows_to_the_other_relay(db, dsn, tmp_path):
    setup_outbox(db)
    ids = publish(db, "e", 30)
    hang = Recorder(lambda n, key: (200, 60))
    a = Proc(
        tmp_path,
        "a",
        "relay",
        "--dsn",
        dsn,
        "--group",
        "g",
        "--consumer",
        "a",
        "--sink",
        hang.url + "?timeout=120",
        "--visibility",
        "3",
        "--poll-interval",
        "0.2",
    )
    b = None
    try:
        wait_for(lambda: hang.got, timeout=30, what="relay a holds the batch")
        b = Proc(
            tmp_path,
            "b",
            "relay",
            "--dsn",
            dsn,
            "--group",
            "g",
            "--consumer",
            "b",
            "--sink",
            "stdout:",
            "--visibility",
            "3",
            "--poll-interval",
            "0.2",
        )
        wait_for(lambda: group_offset(db) == 30, timeout=60, what="b delivered everything")
        assert [x["event_id"] for x in b.lines()] == ids
        assert not committed(db, "a")  # a committed none of them
        assert "abandoned" in a.stderr()
    finally:
        a.kill()
        if b is not None:
            assert b.term() == 0
        hang.close()


# --- metrics ----------------------------------------------------------------------------


def test_metrics_endpoint_counts_deliveries(db, dsn, tmp_path):
    import urllib.request

    from pg_mailbox.cluster import free_port

    setup_outbox(db)
    publish(db, "e", 7)
    port = free_port()
    p = Proc(
        tmp_path,
        "r",
        "relay",
        "--dsn",
        dsn,
        "--group",
        "g",
        "--consumer",
        "c1",
        "--sink",
        "stdout:",
        "--poll-interval",
        "0.2",
        "--metrics-port",
        str(port),
    )
    try:
        wait_for(lambda: group_offset(db) == 7, what="relay drained")

        def scrape():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                return r.read().decode()

        text = wait_for(
            lambda: "pg_mailbox_relay_messages_total" in scrape() and scrape(), what="metrics"
        )
        assert (
            'pg_mailbox_relay_messages_total{group="g",result="delivered",sink="stdout"} 7.0'
        ) in text
        assert "pg_mailbox_relay_batch_seconds_count" in text
        assert 'pg_mailbox_relay_lag_rows{group="g"}' in text
    finally:
        assert p.term() == 0


# --- SIGTERM ----------------------------------------------------------------------------


def test_sigterm_finishes_the_batch_in_hand_and_commits_it(db, dsn, tmp_path):
    setup_outbox(db)
    ids = publish(db, "e", 8)
    rec = Recorder(lambda n, key: (200, 0.3))  # a slow receiver: the batch takes ~2.4 s
    p = Proc(
        tmp_path,
        "r",
        "relay",
        "--dsn",
        dsn,
        "--group",
        "g",
        "--consumer",
        "c1",
        "--sink",
        rec.url,
        "--batch-size",
        "100",
        "--poll-interval",
        "0.2",
    )
    try:
        wait_for(lambda: rec.got, what="first POST")
        p.p.send_signal(15)
        assert p.p.wait(30) == 0, p.stderr()
        assert rec.delivered() == ids  # the batch in hand was finished, not dropped
        assert group_offset(db) == 8  # and committed before exiting
        assert "stopped reason=signal" in p.stderr()
    finally:
        p.kill()
        rec.close()


def test_http_4xx_park_parks_it_and_the_other_keys_flow(db, dsn):
    """--on-poison park (SPEC §5.2, §2.3): the poison event is parked with outbox_park, the
    relay goes on, rows of other keys are delivered, and outbox_unpark delivers it again."""
    db.execute("SELECT mailbox.create_outbox('e', p_partitions => 4)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    bad = publish(db, "e", 1, key="k1")[0]
    later_same_key = publish(db, "e", 1, key="k1")
    others = publish(db, "e", 3, key="k2")
    poisoned = {bad}
    rec = Recorder(lambda n, key: (422, 0) if key in poisoned else (200, 0))
    try:
        got = relay(dsn, rec.url, "--on-poison", "park")
        assert got.returncode == 0, got.stderr
        assert "poison message" in got.stderr and bad in got.stderr
        delivered = rec.delivered()
        assert bad not in delivered
        assert set(others) <= set(delivered)
        parked = db.execute(
            "SELECT event_id::text, reason FROM mailbox.outbox_parked WHERE \"group\" = 'g'"
        ).fetchall()
        parked_ids = [p[0] for p in parked]
        assert bad in parked_ids and all(p[1] for p in parked)
        # the relay keeps a key's order: a later event of the parked key waits parked too
        assert later_same_key[0] in parked_ids and later_same_key[0] not in delivered
        # once the receiver is fixed, unparking delivers the event again
        poisoned.clear()
        for (offset,) in db.execute(
            "SELECT outbox_id FROM mailbox.outbox_parked WHERE \"group\" = 'g' ORDER BY 1"
        ).fetchall():
            db.execute("SELECT mailbox.outbox_unpark('g', %s)", [offset])
        again = relay(dsn, rec.url, "--on-poison", "park")
        assert again.returncode == 0, again.stderr
        assert bad in rec.delivered()
        assert set(rec.delivered()) >= {bad, *later_same_key, *others}
    finally:
        rec.close()


def test_progress_shows_on_a_terminal_only(db, dsn, tmp_path):
    """SPEC 5.1: long work shows progress when stderr is a terminal; a pipe gets none."""
    import os
    import pty
    import subprocess
    import sys

    setup_outbox(db)
    publish(db, "e", 500)
    out_file = tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "pg_mailbox", "relay", "--dsn", dsn, "--group", "g"]
    args += ["--consumer", "c1", "--sink", "stdout:", "--once", "--batch-size", "10"]
    primary, secondary = pty.openpty()
    with open(out_file, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=secondary)
        os.close(secondary)
        seen = b""
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            seen += chunk
        proc.wait(timeout=120)
    os.close(primary)
    assert proc.returncode == 0, seen
    text = seen.decode()
    assert "rows relayed" in text and "\x1b[K" in text
    assert sum(1 for _ in open(out_file)) == 500
    # a pipe: event lines only
    db.execute("SELECT mailbox.seek_offset('g', 'c1', 0)")
    piped = relay(dsn, "stdout:")
    assert piped.returncode == 0 and "rows relayed" not in piped.stderr
