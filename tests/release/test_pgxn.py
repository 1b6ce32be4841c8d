"""The PGXN distribution, built and installed the way a PGXN user installs it.

`make dist` zips HEAD (git archive; .gitattributes leaves development files out) plus the
built script. pgxnclient (a dev extra, from PyPI) then installs the zip into a *fresh copy*
of the PostgreSQL that PG_CONFIG names, with no pg_mailbox in it, so the test proves that
the zip alone installs: `pgxn install ./pg_mailbox-X.zip`, a private cluster started from
that copy, `pgxn load`, a behaviour smoke test, and `pgxn check` (the pg_regress smoke test
of the distribution, i.e. `make installcheck`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import psycopg
import pytest

from pg_mailbox.cluster import Cluster, find_bindir

REPO = Path(__file__).resolve().parents[2]
PGXN = Path(sys.executable).with_name("pgxn")


def make_var(name: str) -> str:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", f"print-{name}"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def pg_config_of(bindir: Path, what: str) -> Path:
    out = subprocess.run(
        [str(bindir / "pg_config"), f"--{what}"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def fresh_postgres_copy(dest: Path) -> Path:
    """Copies the server PG_CONFIG names (binaries, share, libraries) under dest, keeping
    their relative layout (pg_config and the server find their files relative to their own
    location), without pg_mailbox. Returns the copy's bindir."""
    bindir = find_bindir()
    dirs = {k: pg_config_of(bindir, k) for k in ("bindir", "sharedir", "pkglibdir", "libdir")}
    root = Path(os.path.commonpath([dirs["bindir"], dirs["sharedir"], dirs["pkglibdir"]]))
    for key in ("bindir", "sharedir", "pkglibdir"):
        target = dest / dirs[key].relative_to(root)
        shutil.copytree(dirs[key], target, symlinks=True, dirs_exist_ok=True)
    # pgxn install checks that the library directory is writable (else it wants sudo)
    (dest / dirs["libdir"].relative_to(root)).mkdir(parents=True, exist_ok=True)
    copy_bindir = dest / dirs["bindir"].relative_to(root)
    extdir = pg_config_of(copy_bindir, "sharedir") / "extension"
    assert extdir.is_relative_to(dest), f"the copy's pg_config points outside it: {extdir}"
    for leftover in extdir.glob("pg_mailbox*"):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    return copy_bindir


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture
def workdir():
    # Not pytest's tmp_path: as root, the server runs as "postgres" and must traverse it.
    path = Path(tempfile.mkdtemp(prefix="pg_mailbox-pgxn-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_make_dist_contents(workdir):
    version = make_var("EXTVERSION")
    dist = workdir / f"pg_mailbox-{version}.zip"
    run(["make", "-s", "--no-print-directory", "dist", f"DIST={dist}"], REPO)
    prefix = f"pg_mailbox-{version}/"
    with zipfile.ZipFile(dist) as zf:
        names = set(zf.namelist())
        meta = json.loads(zf.read(prefix + "META.json"))
    assert all(n.startswith(prefix) for n in names)
    for shipped in (
        "META.json",
        "Makefile",
        "pg_mailbox.control",
        "README.md",
        "docs/install.md",
        "test/sql/smoke.sql",
        "test/expected/smoke.out",
        "plpython/mailbox_server/__init__.py",
        meta["provides"]["pg_mailbox"]["file"],
        meta["provides"]["pg_mailbox"]["docfile"],
    ):
        assert prefix + shipped in names, f"{shipped} missing from the distribution"
    assert any(n.startswith(prefix + "sql/") and n.endswith(".sql") for n in names)
    for dev in ("tests/", "bench/", ".ci/", "dbt/integration_tests/", ".gitattributes"):
        assert not any(n.startswith(prefix + dev) for n in names), f"{dev} is exported"
    # the built script in the zip is the one `make` builds from the parts
    with zipfile.ZipFile(dist) as zf:
        built = zf.read(prefix + f"pg_mailbox--{version}.sql")
    assert built == (REPO / f"pg_mailbox--{version}.sql").read_bytes()


def test_pgxn_install_load_and_check(workdir):
    version = make_var("EXTVERSION")
    zip_name = f"pg_mailbox-{version}.zip"
    run(["make", "-s", "--no-print-directory", "dist", f"DIST={workdir / zip_name}"], REPO)

    bindir = fresh_postgres_copy(workdir / "pg")
    pg_config = str(bindir / "pg_config")
    extdir = pg_config_of(bindir, "sharedir") / "extension"
    assert not (extdir / "pg_mailbox.control").exists()

    out = run(
        [str(PGXN), "install", "--pg_config", pg_config, "--make", "make", f"./{zip_name}"],
        workdir,
    )
    assert (extdir / "pg_mailbox.control").exists(), out
    assert (extdir / f"pg_mailbox--{version}.sql").exists(), out
    assert (extdir / "pg_mailbox" / "python" / version / "mailbox_server").is_dir(), out

    with Cluster(workdir / "cluster", bindir=bindir) as cluster:
        dsn = cluster.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE pgxn_smoke")
            host, port, user = conn.info.host, conn.info.port, conn.info.user
        conn_args = ["-h", host, "-p", str(port), "-U", user]
        smoke_dsn = cluster.dsn("pgxn_smoke")
        with psycopg.connect(smoke_dsn, autocommit=True) as conn:
            # pgxn load runs CREATE EXTENSION without CASCADE (docs/install.md says so)
            conn.execute("CREATE EXTENSION plpython3u")
        run(
            [
                str(PGXN),
                "load",
                "--pg_config",
                pg_config,
                "-d",
                "pgxn_smoke",
                *conn_args,
                f"./{zip_name}",
            ],
            workdir,
        )
        with psycopg.connect(smoke_dsn, autocommit=True) as conn:
            assert conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'"
            ).fetchone() == (version,)
            # behaviour, PL/Python included: outbox -> group, inbox receive -> claim
            conn.execute("SELECT mailbox.create_outbox('smoke')")
            conn.execute("SELECT mailbox.create_consumer_group('g', 'smoke', 'earliest')")
            conn.execute("SELECT mailbox.outbox_publish('smoke', '{\"n\": 1}')")
            polled = conn.execute("SELECT payload FROM mailbox.poll_outbox('g', 'c1')").fetchall()
            assert polled == [({"n": 1},)]
            conn.execute("SELECT mailbox.create_inbox('smoke_in')")
            conn.execute("SELECT mailbox.inbox_receive('smoke_in', 'e1', '{}')")
            claimed = conn.execute(
                "SELECT event_id FROM mailbox.inbox_claim('smoke_in', 'w1')"
            ).fetchall()
            assert claimed == [("e1",)]
            health = conn.execute("SELECT mailbox.inbox_health('smoke_in')").fetchone()[0]
            assert health["inbox_name"] == "smoke_in"
        # the distribution's own pg_regress smoke test (make installcheck)
        run(
            [
                str(PGXN),
                "check",
                "--pg_config",
                pg_config,
                "--make",
                "make",
                *conn_args,
                f"./{zip_name}",
            ],
            workdir,
        )
