"""bench/relay_bench.py --quick runs end to end and prints its table (numbers mean nothing
at this size; the point is that the benchmark does not rot)."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "relay_bench.py"


def test_relay_bench_quick_prints_the_table(dsn):
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--quick",
            "--dsn",
            dsn,
            "--batches",
            "100",
            "--relays",
            "1",
            "--latency-samples",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "command: " in out and "machine: " in out and "load average at start" in out
    for sink in ("nats", "amqp"):
        assert any(line.startswith(f"{sink}      100      1 ") for line in out.splitlines()), out
    assert "commit -> NATS subscriber" in out and "p50" in out
