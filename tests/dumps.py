"""pg_dump / pg_restore helpers shared by the dump tests (tests/upgrade/test_dump_restore.py,
tests/inbox/test_inbox_adopted.py): a scratch database on the same server, and a dump of one
database restored into another in a given format."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from pg_mailbox.cluster import find_bindir


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


@contextmanager
def _new_database(server_dsn: str) -> Iterator[str]:
    """A new empty database (from template0) on the server of server_dsn; dropped after."""
    name = "t_restore_" + uuid.uuid4().hex[:10]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def dump_and_restore(source_dsn: str, target_dsn: str, fmt: str, tmp_path) -> None:
    """pg_dump source, restore into target (an empty database); any error fails the test."""
    bindir = find_bindir()
    env = {"PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "30"}
    path = tmp_path / f"dump.{fmt}"
    flag = "--format=plain" if fmt == "plain" else "--format=custom"  # "custom", "parallel"
    done = _run([str(bindir / "pg_dump"), flag, "--file", str(path), "--dbname", source_dsn], env)
    assert done.returncode == 0, done.stderr
    if fmt == "plain":
        done = _run(
            [
                str(bindir / "psql"),
                "--no-psqlrc",
                "--quiet",
                "--set",
                "ON_ERROR_STOP=1",
                "--file",
                str(path),
                "--dbname",
                target_dsn,
            ],
            env,
        )
    elif fmt == "custom":
        done = _run(
            [
                str(bindir / "pg_restore"),
                "--exit-on-error",
                "--dbname",
                target_dsn,
                str(path),
            ],
            env,
        )
    else:
        done = _restore_in_parallel(bindir, env, path, target_dsn, tmp_path)
    assert done.returncode == 0, done.stderr
    # psql and pg_restore print every server error; a warning would do, too
    assert "ERROR" not in done.stderr and "WARNING" not in done.stderr, done.stderr


def _restore_in_parallel(bindir, env, path, target_dsn, tmp_path):
    """pg_restore --jobs as docs/backup.md says: pre-data, then the data of the extension's
    tables in one job and in the dump's (foreign-key) order, then the rest in parallel."""
    listed = _run([str(bindir / "pg_restore"), "--list", str(path)], env)
    assert listed.returncode == 0, listed.stderr
    config = re.compile(r"^\d+; \d+ \d+ TABLE DATA mailbox _")
    lines = listed.stdout.splitlines(keepends=True)
    (tmp_path / "config.list").write_text("".join(x for x in lines if config.match(x)))
    (tmp_path / "rest.list").write_text("".join(x for x in lines if not config.match(x)))
    restore = [str(bindir / "pg_restore"), "--exit-on-error", "--dbname", target_dsn]
    steps = [
        ["--section=pre-data"],
        ["--use-list", str(tmp_path / "config.list")],
        [
            "--jobs=3",
            "--section=data",
            "--section=post-data",
            "--use-list",
            str(tmp_path / "rest.list"),
        ],
    ]
    for step in steps:
        done = _run([*restore, *step, str(path)], env)
        if done.returncode != 0:
            return done
    return done
