"""`pg-mailbox maintain` against a real database."""

import signal
import subprocess
import sys
import time

from groups import publish
from mbx import scalar


def test_maintain_once_drains_and_reports(db, dsn):
    db.execute("SELECT mailbox.create_outbox('e', 0)")
    publish(db, "e", 5)
    out = subprocess.run(
        [sys.executable, "-m", "pg_mailbox", "maintain", "--dsn", dsn, "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert '"outbox_rows_drained": 5' in out
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_e") == 0


def test_maintain_once_fails_cleanly_without_the_extension(fresh_dsn):
    got = subprocess.run(
        [sys.executable, "-m", "pg_mailbox", "maintain", "--dsn", fresh_dsn, "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 3 and "maintenance failed" in got.stderr
    assert "CREATE EXTENSION pg_mailbox" in got.stderr and "Traceback" not in got.stderr


def test_maintain_numberer_numbers_rows_nobody_polls_and_stops_on_sigterm(db, dsn):
    """--numberer runs CALL mailbox.run_numberer() beside maintenance: new rows get offsets
    without any poll (SPEC 2.2.4's numbering in transactions nobody holds open); SIGTERM
    ends it and the process exits 0."""
    running = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CALL mailbox.run_numberer%%'"
    db.execute("SELECT mailbox.create_outbox('e', 0)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pg_mailbox", "maintain", "--dsn", dsn, "--numberer"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        publish(db, "e", 5)
        deadline = time.monotonic() + 30
        while scalar(db, "SELECT head_offset FROM mailbox._outbox") < 5:
            assert time.monotonic() < deadline, "the numberer never numbered the rows"
            time.sleep(0.1)
        running = (
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CALL mailbox.run_numberer%%'"
        )
        assert scalar(db, running) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "numberer running" in out and "Traceback" not in err
    deadline = time.monotonic() + 10
    while scalar(db, running):
        assert time.monotonic() < deadline, "the numberer's backend outlived the command"
        time.sleep(0.1)
