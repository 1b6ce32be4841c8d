"""`make installcheck` (the PGXS pg_regress smoke test) against the session's server."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_make_installcheck(pg_cluster):
    env = {**os.environ, **pg_cluster.env()}
    done = subprocess.run(
        ["make", "-s", "--no-print-directory", "installcheck"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    diffs = REPO / "regression.diffs"
    details = diffs.read_text() if diffs.exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + details
