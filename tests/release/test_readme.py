"""The README's quick start works verbatim (run through psql, as a user would paste it)."""

import re
import shutil
import subprocess
from pathlib import Path

import psycopg

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart_sql():
    text = README.read_text()
    match = re.search(r"<!-- quickstart:[^>]*-->\s*```sql\n(.*?)```", text, re.S)
    assert match, "README.md lost its quick-start block"
    return match.group(1)


def test_readme_quickstart_runs_verbatim(fresh_dsn, tmp_path):
    script = tmp_path / "quickstart.sql"
    script.write_text(quickstart_sql())
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    got = subprocess.run(
        [psql, "-X", "-v", "ON_ERROR_STOP=1", "-d", fresh_dsn, "-f", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    assert '"order_id": 1' not in got.stdout  # the published event went to 'events', not 'orders'
    assert "order.created" not in got.stdout
    with psycopg.connect(fresh_dsn) as conn:
        lag = conn.execute(
            "SELECT group_offset, head_offset FROM mailbox.consumer_lag('billing')"
        ).fetchone()
        assert lag == (1, 1)
        assert conn.execute("SELECT count(*) FROM mailbox.outbox_events").fetchone()[0] == 1
        processed = conn.execute(
            "SELECT processed_count, pending_count FROM mailbox.inbox_status('payments')"
        ).fetchone()
        assert processed == (1, 0)
        assert conn.execute("SELECT count(*) FROM mailbox.payments").fetchone()[0] == 1
