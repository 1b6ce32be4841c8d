"""`pg-mailbox maintain` against a real database."""

import subprocess
import sys

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
