"""migrations/: released files never change, the unreleased upgrade is what the sources build.

- migrations/released.sha256 lists every released file (frozen full scripts, their server
  Python under migrations/python/<version>/, released upgrade scripts) with its SHA-256;
  `make` checks it too (check-released).
- The one file not listed is the upgrade into the default version, built by
  `make migration` (scripts/build-upgrade.py) from sql/upgrade/<previous>--<version>.sql,
  sql/functions/, sql/*.sql and sql/upgrade/regenerate.sql, and committed: it must be
  exactly what the sources build now.
"""

import hashlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS = REPO / "migrations"
CONTROL = REPO / "pg_mailbox.control"
VERSION = re.search(r"default_version\s*=\s*'([^']+)'", CONTROL.read_text()).group(1)


def released() -> dict[str, str]:
    rows = (MIGRATIONS / "released.sha256").read_text().splitlines()
    return {path: digest for digest, path in (r.split(None, 1) for r in rows if r.strip())}


def test_released_files_are_unchanged():
    listed = released()
    assert f"migrations/pg_mailbox--{VERSION}.sql" not in listed, "the default version is released"
    for path, digest in listed.items():
        assert (REPO / path).exists(), f"released file {path} is missing"
        actual = hashlib.sha256((REPO / path).read_bytes()).hexdigest()
        assert actual == digest, f"released file {path} changed; released files never change"


def test_every_released_file_is_listed():
    listed = set(released())
    files = {
        str(p.relative_to(REPO))
        for p in MIGRATIONS.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".sql", ".py")
    }
    unreleased = {f"migrations/pg_mailbox--{v}--{VERSION}.sql" for v in _upgrade_sources()}
    assert files - listed == unreleased, "files in migrations/ neither released nor being built"
    # every released version has its server Python frozen beside its script
    for path in listed:
        m = re.fullmatch(r"migrations/pg_mailbox--([^-]+)\.sql", path)
        if m:
            assert f"migrations/python/{m.group(1)}/mailbox_server/__init__.py" in listed, path


def _upgrade_sources() -> list[str]:
    return [
        p.name.removesuffix(f"--{VERSION}.sql")
        for p in (REPO / "sql" / "upgrade").glob(f"*--{VERSION}.sql")
    ]


def test_the_frozen_python_carries_its_version():
    for init in MIGRATIONS.glob("python/*/mailbox_server/__init__.py"):
        version = init.parents[1].name
        assert f'__version__ = "{version}"' in init.read_text(), init


def test_the_upgrade_script_is_what_the_sources_build(tmp_path):
    sources = _upgrade_sources()
    assert len(sources) == 1, f"one schema delta sql/upgrade/*--{VERSION}.sql: {sources}"
    out = tmp_path / "upgrade.sql"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build-upgrade.py"), sources[0], VERSION, out],
        check=True,
    )
    committed = MIGRATIONS / f"pg_mailbox--{sources[0]}--{VERSION}.sql"
    assert committed.exists(), f"run `make migration` and commit {committed.name}"
    assert out.read_text() == committed.read_text(), (
        f"migrations/{committed.name} is stale: run `make migration` and commit it"
    )


def test_make_checks_the_released_files(tmp_path):
    """`make check-released` (part of `make`) passes on the tree, and the check it runs
    (sha256sum --check of released.sha256) fails on a copy of migrations/ with one released
    file changed."""
    env = {**os.environ, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    ok = subprocess.run(
        ["make", "-s", "--no-print-directory", "check-released"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    copy = tmp_path / "repo"
    (copy / "migrations").mkdir(parents=True)
    for path in released():
        target = copy / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPO / path).read_bytes())
    first = copy / next(iter(released()))
    first.write_bytes(first.read_bytes() + b"\n")
    (copy / "migrations" / "released.sha256").write_bytes(
        (MIGRATIONS / "released.sha256").read_bytes()
    )
    bad = subprocess.run(
        ["sha256sum", "--check", "--quiet", "--strict", "migrations/released.sha256"],
        cwd=copy,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE mailbox.t (a int);",
        "SELECT pg_catalog.pg_extension_config_dump('mailbox.t', '');",
        "CREATE TYPE mailbox.t AS (a int);",
    ],
)
def test_the_builder_refuses_statements_an_upgrade_cannot_rerun(statement, tmp_path):
    spec = importlib.util.spec_from_file_location(
        "build_upgrade", REPO / "scripts" / "build-upgrade.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    part = REPO / "build" / "test_part.sql"
    part.parent.mkdir(exist_ok=True)
    part.write_text(
        "-- a part\nCREATE FUNCTION mailbox.f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;\n"
        + statement
        + "\n"
    )
    try:
        with pytest.raises(SystemExit, match="cannot re-run in an upgrade"):
            mod.rerunnable(part)
        part.write_text(
            "CREATE FUNCTION mailbox.f() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;\n"
            "CREATE VIEW mailbox.v AS SELECT 1;\nCREATE CONSTRAINT TRIGGER t AFTER INSERT"
            " ON mailbox.x DEFERRABLE FOR EACH ROW EXECUTE FUNCTION mailbox.f();\n"
        )
        out = mod.rerunnable(part)
        assert "CREATE OR REPLACE FUNCTION mailbox.f()" in out
        assert "$$ SELECT 1; $$" in out
        assert "CREATE OR REPLACE VIEW mailbox.v" in out
        assert "DROP TRIGGER IF EXISTS t ON mailbox.x;\nCREATE CONSTRAINT TRIGGER t" in out
    finally:
        part.unlink()
