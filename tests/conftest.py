"""Fixtures for the pg_mailbox test suite.

- ``pg_cluster`` (session): the server the tests use. By default a throwaway PostgreSQL
  cluster started once per session (pg_mailbox.cluster: private /tmp directory, free
  port, unix socket only, trust auth, pg_cron preloaded); with ``MAILBOX_TEST_DSN`` an
  existing server instead (the DSN's user must be a superuser, pg_mailbox installed).
- ``dsn``: conninfo of a fresh database in which ``CREATE EXTENSION pg_mailbox CASCADE``
  ran as superuser; dropped (WITH FORCE) after the test.
- ``fresh_dsn``: the same without the extension (install / drop tests).
- ``db``: an autocommit superuser connection to ``dsn``'s database.
- ``connect(autocommit=True, user=None, **kw)``: more connections to that database,
  closed after the test.

``MAILBOX_TEST_UPGRADE_FROM=<version>`` makes ``dsn`` install that older version and
``ALTER EXTENSION ... UPDATE`` it, so the behaviour suite runs on an upgraded database.

pytest-postgresql's own process fixture (``postgresql_proc``) cannot be used: it runs
initdb/pg_ctl as the current user, and CI is root, which PostgreSQL refuses. We start the
cluster with pg_mailbox.cluster (root-aware) and use pytest-postgresql's DatabaseJanitor
for the per-test databases.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from pytest_postgresql.janitor import DatabaseJanitor

from pg_mailbox.cluster import Cluster

EXTENSION = "pg_mailbox"


class Server:
    """Connection facts of the server under test, for psycopg and for libpq tools."""

    def __init__(self, base_dsn: str, cluster: Cluster | None = None) -> None:
        self.base_dsn = base_dsn
        self.cluster = cluster
        with psycopg.connect(base_dsn) as conn:
            info = conn.info
            self.host, self.port, self.user = info.host, info.port, info.user
            self.password = info.password or None
            self.maintenance_db = info.dbname

    def dsn(self, dbname: str | None = None, **params: object) -> str:
        return make_conninfo(self.base_dsn, dbname=dbname or self.maintenance_db, **params)

    def env(self) -> dict[str, str]:
        """Environment for psql, pg_regress and friends (PGHOST/PGPORT/PGUSER)."""
        env = {"PGHOST": self.host, "PGPORT": str(self.port), "PGUSER": self.user}
        if self.password:
            env["PGPASSWORD"] = self.password
        return env


class _Janitor(DatabaseJanitor):
    """pytest-postgresql's janitor, dropping in one statement WITH (FORCE) (PG13+), which
    also ends any session a test left behind, e.g. a worker thread still waiting on a lock."""

    def drop(self) -> None:
        with self.cursor() as cur:
            cur.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(self.dbname)
                )
            )


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Server]:
    existing = os.environ.get("MAILBOX_TEST_DSN")
    if existing:
        yield Server(existing)
        return
    with Cluster() as cluster:
        yield Server(cluster.dsn(), cluster)


def _database_name(request: pytest.FixtureRequest) -> str:
    # Readable in pg_stat_activity and logs, unique, and within the 63-byte limit.
    test = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:40]
    return f"t_{test}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def fresh_dsn(pg_cluster: Server, request: pytest.FixtureRequest) -> Iterator[str]:
    janitor = _Janitor(
        user=pg_cluster.user,
        password=pg_cluster.password,
        host=pg_cluster.host,
        port=pg_cluster.port,
        dbname=_database_name(request),
        template_dbname="template0",
        maintenance_dbname=pg_cluster.maintenance_db,
    )
    with janitor:
        yield pg_cluster.dsn(janitor.dbname)


def _create_extension(conn: psycopg.Connection) -> None:
    old = os.environ.get("MAILBOX_TEST_UPGRADE_FROM")
    try:
        if old:
            conn.execute(
                sql.SQL("CREATE EXTENSION {} VERSION {} CASCADE").format(
                    sql.Identifier(EXTENSION), sql.Literal(old)
                )
            )
            conn.execute(sql.SQL("ALTER EXTENSION {} UPDATE").format(sql.Identifier(EXTENSION)))
        else:
            conn.execute(sql.SQL("CREATE EXTENSION {} CASCADE").format(sql.Identifier(EXTENSION)))
    except psycopg.Error as exc:
        available = conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = %s", [EXTENSION]
        ).fetchone()[0]
        hint = "" if available else " (not installed in this server: run `make install`)"
        pytest.fail(f"CREATE EXTENSION {EXTENSION} failed{hint}: {exc}", pytrace=False)


@pytest.fixture
def dsn(fresh_dsn: str) -> str:
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        _create_extension(conn)
    return fresh_dsn


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def connect(dsn: str) -> Iterator[Callable[..., psycopg.Connection]]:
    opened: list[psycopg.Connection] = []

    def _connect(
        autocommit: bool = True, user: str | None = None, **kw: object
    ) -> psycopg.Connection:
        if user is not None:
            kw["user"] = user
        conn = psycopg.connect(dsn, autocommit=autocommit, **kw)
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()
