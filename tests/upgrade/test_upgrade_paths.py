"""Fresh install == upgraded install, and the API surface is reviewed in a committed file.

MAILBOX_UPDATE_SNAPSHOTS=1 rewrites tests/expected/api_surface.txt instead of comparing.
"""

import difflib
import os
import re
import warnings
from pathlib import Path

import psycopg
import pytest
from dumps import _new_database
from psycopg import sql
from snapshot import schema_snapshot

REPO = Path(__file__).resolve().parents[2]
API_SURFACE = REPO / "tests" / "expected" / "api_surface.txt"


def default_version() -> str:
    text = (REPO / "pg_mailbox.control").read_text()
    return re.search(r"^\s*default_version\s*=\s*'([^']+)'", text, re.MULTILINE).group(1)


def repo_scripts() -> tuple[dict[str, str], set[str]]:
    """migrations/: {source: target} of pg_mailbox--A--B.sql upgrades, and the versions of
    frozen pg_mailbox--A.sql full scripts (kept so the old version can be installed)."""
    upgrades, frozen = {}, set()
    for path in sorted((REPO / "migrations").glob("*.sql")):
        assert path.name.startswith("pg_mailbox--"), f"unexpected file migrations/{path.name}"
        parts = path.name.removeprefix("pg_mailbox--").removesuffix(".sql").split("--")
        assert len(parts) in (1, 2) and all(parts), f"badly named migrations/{path.name}"
        if len(parts) == 2:
            upgrades[parts[0]] = parts[1]
        else:
            frozen.add(parts[0])
    return upgrades, frozen


def update_paths(conn: psycopg.Connection) -> dict[str, str]:
    """Installed versions with a path to the default version: {source: path}."""
    rows = conn.execute(
        "SELECT source, path FROM pg_extension_update_paths('pg_mailbox')"
        " WHERE target = %s AND path IS NOT NULL AND source <> target",
        [default_version()],
    ).fetchall()
    return dict(rows)


def diff(expected: str, actual: str, names: tuple[str, str]) -> str:
    lines = difflib.unified_diff(
        expected.splitlines(), actual.splitlines(), *names, lineterm="", n=2
    )
    return "\n".join(lines)


def fresh_snapshot(dsn: str, *, bodies: bool) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return schema_snapshot(conn, bodies=bodies)


def test_every_migration_leads_to_the_default_version(fresh_dsn):
    """A migration without an installed path to the default version (not installed, chain
    broken, misnamed target) is caught here instead of silently never being tested."""
    upgrades, frozen = repo_scripts()
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        paths = update_paths(conn)
    assert set(paths) == set(upgrades), (
        "versions with an update path to the default version (installed) differ from"
        " migrations/*.sql sources (repo): run `make install`, or fix the chain"
    )
    assert frozen <= set(upgrades), "a frozen full script without an upgrade from its version"


def test_upgrades_equal_a_fresh_install(fresh_dsn, dsn, pg_cluster):
    """Every version with an update path (pg_extension_update_paths), installed from its
    frozen script into a database of its own and updated, describes itself exactly as a
    fresh install does: functions with signatures, attributes and bodies, tables, views,
    indexes, types, grants, the mailbox_* roles."""
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        paths = update_paths(conn)
    if not paths:
        # first release: nothing to upgrade from, and no migration may exist without a path
        assert repo_scripts()[0] == {}, "migrations exist but no update path is installed"
        return
    if os.environ.get("MAILBOX_TEST_UPGRADE_FROM"):
        pytest.skip("dsn is itself an upgraded install under MAILBOX_TEST_UPGRADE_FROM")
    fresh = fresh_snapshot(dsn, bodies=True)
    failures = []
    for source, path in sorted(paths.items()):
        with (
            _new_database(pg_cluster.dsn()) as old_dsn,
            psycopg.connect(old_dsn, autocommit=True) as conn,
        ):
            try:
                conn.execute(
                    sql.SQL("CREATE EXTENSION pg_mailbox VERSION {} CASCADE").format(
                        sql.Literal(source)
                    )
                )
            except psycopg.Error as exc:
                pytest.fail(
                    f"cannot install old version {source} ({exc}): keep its released install"
                    f" script frozen as migrations/pg_mailbox--{source}.sql"
                )
            before = schema_snapshot(conn, bodies=True)
            conn.execute("ALTER EXTENSION pg_mailbox UPDATE")
            version = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'"
            ).fetchone()[0]
            assert version == default_version(), f"{source} updated to {version}"
            upgraded = schema_snapshot(conn, bodies=True)
        assert before != fresh, f"{source}'s frozen script installs the current version"
        if upgraded != fresh:
            failures.append(f"{source} via {path}:\n" + diff(fresh, upgraded, ("fresh", source)))
    assert not failures, "upgraded install differs from fresh install:\n" + "\n".join(failures)


def test_api_surface_matches_expected_file(dsn):
    actual = fresh_snapshot(dsn, bodies=False)
    if os.environ.get("MAILBOX_UPDATE_SNAPSHOTS") == "1":
        API_SURFACE.parent.mkdir(parents=True, exist_ok=True)
        API_SURFACE.write_text(actual)
        warnings.warn(
            f"rewrote {API_SURFACE.relative_to(REPO)}: review and commit it", stacklevel=1
        )
        return
    assert API_SURFACE.exists(), (
        f"{API_SURFACE.relative_to(REPO)} is missing: run"
        " `MAILBOX_UPDATE_SNAPSHOTS=1 make test PYTEST_ARGS='-k api_surface'` and commit it"
    )
    expected = API_SURFACE.read_text()
    assert actual == expected, (
        "the extension's API surface changed; if intended, regenerate with"
        " MAILBOX_UPDATE_SNAPSHOTS=1 and commit tests/expected/api_surface.txt:\n"
        + diff(expected, actual, ("expected", "actual"))
    )
