"""The dbt package (dbt/) run by real dbt-core + dbt-postgres against a private database.

dbt is slow to start, so everything runs in-process through dbtRunner (imports paid once)
and the invocations are few: deps, run, run again, build (run + test), one run that must be
refused, and the run-operations. The integration project is dbt/integration_tests/.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]

# dbt-core and dbt-postgres are dev extras (pyproject.toml): missing, this module fails to
# import rather than skip, so `make test` cannot pass without running it.
from dbt.cli import main as dbt_main  # noqa: E402


class Dbt:
    """dbt invocations in one project directory, against one database."""

    def __init__(self, project: Path, env: dict[str, str]):
        self.project = project
        self.env = env
        self.runner = dbt_main.dbtRunner()

    def __call__(self, *args: str):
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            return self.runner.invoke(
                [
                    *args,
                    "--project-dir",
                    str(self.project),
                    "--profiles-dir",
                    str(self.project),
                ]
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def statuses(res) -> dict[str, tuple[str, str]]:
    """node name -> (status, message) of a run/test/build result."""
    return {r.node.name: (str(r.status), r.message or "") for r in res.result.results}


@pytest.fixture(scope="module")
def dbt_db(pg_cluster, tmp_path_factory):
    """A database with pg_mailbox and the app's source tables, the integration project
    copied out of the repository (dbt writes target/, logs/, dbt_packages/ beside it), and
    `dbt deps` done."""
    dbname = f"t_dbt_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    dsn = pg_cluster.dsn(dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_mailbox CASCADE")
            conn.execute(
                "CREATE SCHEMA app;"
                " CREATE TABLE app.orders (id int PRIMARY KEY, customer text, amount numeric);"
                " CREATE TABLE app.events"
                "  (event_id text PRIMARY KEY, event_type text, payload jsonb);"
                " INSERT INTO app.orders VALUES (1, 'ann', 10), (2, 'bob', 20), (3, 'ann', 5);"
                " INSERT INTO app.events VALUES"
                "  ('e1', 'paid', '{\"n\": 1}'), ('e2', 'paid', '{\"n\": 2}');"
                " CREATE TABLE app.plain (id int PRIMARY KEY)"
            )
        work = tmp_path_factory.mktemp("dbt")
        shutil.copytree(
            REPO / "dbt",
            work / "dbt",
            ignore=shutil.ignore_patterns("target", "logs", "dbt_packages"),
        )
        env = {
            "MAILBOX_DBT_HOST": pg_cluster.host,
            "MAILBOX_DBT_PORT": str(pg_cluster.port),
            "MAILBOX_DBT_USER": pg_cluster.user,
            "MAILBOX_DBT_PASSWORD": pg_cluster.password or "",
            "MAILBOX_DBT_DBNAME": dbname,
            "DBT_SEND_ANONYMOUS_USAGE_STATS": "false",
            "DBT_LOG_PATH": str(work / "logs"),
            "DBT_TARGET_PATH": str(work / "target"),
        }
        dbt = Dbt(work / "dbt" / "integration_tests", env)
        res = dbt("deps")
        assert res.success, res.exception
        yield dbt, dsn
    finally:
        with psycopg.connect(pg_cluster.dsn(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
            )


def catalog_state(conn) -> dict:
    """What a second run must not change: outboxes, groups, inboxes, rows, triggers."""
    q = lambda s: conn.execute(s).fetchall()  # noqa: E731
    return {
        "outboxes": q(
            "SELECT outbox_name, source, enabled, head_offset FROM mailbox.outboxes ORDER BY 1"
        ),
        "groups": q(
            "SELECT group_name, outbox_name, auto_offset_reset FROM mailbox.consumer_group_lag"
            " ORDER BY 1"
        ),
        "inboxes": q(
            "SELECT inbox_name, inbox_schema, table_name, max_retries, pending_count"
            " FROM mailbox.inbox_status() ORDER BY 1"
        ),
        "log_rows": q("SELECT count(*) FROM mailbox.outbox_orders_captured"),
        "model_rows": q("SELECT count(*), sum(amount) FROM it.orders_captured"),
        "inbox_rows": q("SELECT count(*) FROM it.inbox_events"),
        "triggers": q(
            "SELECT tgname, tgenabled FROM pg_trigger"
            " WHERE tgrelid = 'it.orders_captured'::regclass AND NOT tgisinternal ORDER BY 1"
        ),
    }


def poll_all(conn, group, consumer="c1"):
    rows = conn.execute(
        "SELECT outbox_id, payload FROM mailbox.poll_outbox(%s, %s, 100, 30)", [group, consumer]
    ).fetchall()
    return rows


def test_dbt_package_end_to_end(dbt_db):
    dbt, dsn = dbt_db
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        # -- first run: models built, capture enabled, groups and the adopted inbox created
        res = dbt("run")
        assert res.success, statuses(res) if res.result else res.exception
        outboxes = conn.execute(
            "SELECT outbox_name, source, enabled FROM mailbox.outboxes"
        ).fetchall()
        assert outboxes == [("orders_captured", "it.orders_captured", True)]
        # the first build is one CREATE TABLE AS: not captured (capture starts after it);
        # the groups exist, reading from the start
        groups = conn.execute(
            "SELECT group_name, auto_offset_reset FROM mailbox.consumer_group_lag ORDER BY 1"
        ).fetchall()
        assert groups == [("it_audit", "earliest"), ("it_billing", "earliest")]
        inbox = conn.execute(
            "SELECT inbox_schema, table_name, max_retries, is_managed, pending_count"
            " FROM mailbox.inbox_status('inbox_events')"
        ).fetchone()
        assert inbox == ("it", "inbox_events", 2, False, 2)
        # the plain table model has no trigger of ours
        assert (
            conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'it.order_totals'::regclass"
                " AND NOT tgisinternal"
            ).fetchone()[0]
            == 0
        )

        # -- second run with no new source rows: nothing changes
        before = catalog_state(conn)
        res = dbt("run")
        assert res.success, statuses(res)
        assert catalog_state(conn) == before

        # -- new source rows: the incremental run appends them, capture writes one outbox
        # row in dbt's transaction, and the consumer group sees exactly those rows
        conn.execute("INSERT INTO app.orders VALUES (4, 'cid', 7), (5, 'bob', 1)")
        conn.execute("INSERT INTO app.events VALUES ('e3', 'refund', '{\"n\": 3}')")
        # a dead letter in the run-operation's inbox, for the tests that must catch it
        res = dbt("run-operation", "mailbox_create_inbox", "--args", "{name: it_payments}")
        assert res.success, res.exception
        res = dbt("run-operation", "mailbox_create_inbox", "--args", "{name: it_payments}")
        assert res.success, res.exception  # idempotent
        conn.execute("SELECT mailbox.inbox_receive('it_payments', 'p1', '{}')")
        for _ in range(3):
            conn.execute("SELECT mailbox.inbox_mark_failed('it_payments', 'p1', 'boom', 0)")

        res = dbt("run", "--select", "orders_captured", "inbox_events")
        assert res.success, statuses(res)
        rows = poll_all(conn, "it_billing")
        assert len(rows) == 1, rows
        offset, payload = rows[0]
        assert payload["op"] == "INSERT"
        assert payload["source"] == "it.orders_captured"
        assert sorted(r["id"] for r in payload["inserted"]) == [4, 5]
        conn.execute("SELECT mailbox.commit_offset('it_billing', 'c1', %s)", [offset])
        assert conn.execute(
            "SELECT count(*) FROM it.inbox_events WHERE event_id = 'e3'"
        ).fetchone() == (1,)

        # -- dbt test: passing tests pass, and the deliberately failing ones are caught
        res = dbt("test")
        got = statuses(res)
        assert res.success, got
        # tests dbt named itself: the ones expected to pass
        passing = [n for n in got if n.startswith("pg_mailbox_mailbox_")]
        assert sorted(n.split("_")[3] for n in passing) == ["group", "inbox", "no"], got
        assert all(got[n][0] == "pass" for n in passing), got
        assert got["it_audit_lag_is_caught"][0] == "warn", got
        assert got["it_payments_dead_letter_is_caught"][0] == "warn", got
        assert got["it_payments_degraded_is_caught"][0] == "warn", got
    finally:
        conn.close()


def test_dbt_refuses_to_lose_capture(dbt_db):
    """A table model with outbox_enabled is refused before anything is built; an incremental
    model forced through --full-refresh (a new table) fails and is rolled back, so its
    capture, data and consumer groups stay."""
    dbt, dsn = dbt_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        res = dbt("run", "--select", "orders_captured")
        assert res.success, statuses(res)
        before = catalog_state(conn)
        oid = conn.execute("SELECT 'it.orders_captured'::regclass::oid").fetchone()[0]
        res = dbt(
            "run",
            "--full-refresh",
            "--select",
            "orders_captured",
            "refused_table",
            "refused_unknown_key",
            "--vars",
            "{mailbox_it_refusals: true, mailbox_it_allow_full_refresh: true}",
        )
        assert not res.success
        got = statuses(res)
        status, message = got["refused_table"]
        assert status == "error"
        assert "outbox_enabled needs a table that outlives the run" in message, message
        assert "materialized as 'table'" in message, message
        status, message = got["refused_unknown_key"]
        assert status == "error"
        assert "unknown key partition (allowed: outbox_name," in message, message
        assert conn.execute("SELECT to_regclass('it.refused_unknown_key')").fetchone()[0] is None
        status, message = got["orders_captured"]
        assert status == "error"
        assert "outbox orders_captured captures it.orders_captured__dbt_backup" in message, message
        assert "HINT" in message and "full_refresh=false" in message, message
        # rolled back: same table (oid), same capture, same rows and groups
        assert conn.execute("SELECT 'it.orders_captured'::regclass::oid").fetchone()[0] == oid
        assert conn.execute("SELECT to_regclass('it.refused_table')").fetchone()[0] is None
        assert catalog_state(conn) == before


def test_dbt_run_operations_idempotent_and_errors(dbt_db):
    dbt, dsn = dbt_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO app.plain VALUES (0)")
        for attempt in range(2):  # the second call changes nothing but repairs capture
            res = dbt(
                "run-operation",
                "mailbox_enable_outbox",
                "--args",
                "{relation: app.plain, outbox_name: plain_events, initial_snapshot: true}",
            )
            assert res.success, res.exception
            res = dbt(
                "run-operation",
                "mailbox_create_consumer_group",
                "--args",
                "{name: plain_readers, outbox: plain_events, auto_offset_reset: earliest}",
            )
            assert res.success, res.exception
            assert conn.execute(
                "SELECT outbox_name, source, enabled FROM mailbox.outboxes"
                " WHERE outbox_name = 'plain_events'"
            ).fetchall() == [("plain_events", "app.plain", True)]
            if attempt == 0:
                # someone disables capture: the next call puts it back
                conn.execute("ALTER TABLE app.plain DISABLE TRIGGER USER")
                assert conn.execute(
                    "SELECT enabled FROM mailbox.outboxes WHERE outbox_name = 'plain_events'"
                ).fetchone() == (False,)
        assert conn.execute(
            "SELECT count(*) FROM mailbox.consumer_group_lag WHERE group_name = 'plain_readers'"
        ).fetchone() == (1,)
        # committed by the run-operation: capture works for another session right away; the
        # initial snapshot was written once, not again by the second call
        conn.execute("INSERT INTO app.plain VALUES (1), (2)")
        rows = poll_all(conn, "plain_readers")
        got = [(p["op"], sorted(r["id"] for r in p["inserted"])) for _, p in rows]
        assert got == [("SNAPSHOT", [0]), ("INSERT", [1, 2])]


@pytest.mark.parametrize(
    "macro,args,expected",
    [
        # the SPEC's error from the server, message and HINT, reaches the dbt user
        (
            "mailbox_create_consumer_group",
            "{name: g1, outbox: no_such_outbox}",
            "outbox not found: no_such_outbox",
        ),
        ("mailbox_enable_outbox", "{relation: app.no_such_table}", "table not found"),
        (
            "mailbox_create_consumer_group",
            "{name: g2, outbox: err_outbox, auto_offset_reset: sideways}",
            "auto_offset_reset",
        ),
        ("mailbox_create_inbox", "{name: Bad-Name}", "Bad-Name"),
        # idempotent only for the same inbox: one of that name in another schema is 42710
        ("mailbox_create_inbox", "{name: err_inbox, schema: public}", "inbox already exists"),
        # caught in Jinja before any SQL, naming the argument
        ("mailbox_create_consumer_group", "{name: g3}", "outbox is required"),
        ("mailbox_create_inbox", "{name: x, max_retries: many}", "max_retries must be a whole"),
    ],
)
def test_dbt_macro_errors_are_clear(dbt_db, macro, args, expected, capsys):
    dbt, dsn = dbt_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not conn.execute("SELECT to_regclass('mailbox.err_inbox')").fetchone()[0]:
            conn.execute("SELECT mailbox.create_inbox('err_inbox')")
            conn.execute("SELECT mailbox.create_outbox('err_outbox')")
    res = dbt("run-operation", macro, "--args", args)
    assert not res.success
    out = capsys.readouterr().out + str(res.exception or "")
    assert expected in out, out[-3000:]
    assert "HINT" in out or "pg_mailbox: " in out, out[-3000:]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT count(*) FROM mailbox.consumer_group_lag WHERE group_name IN ('g1', 'g2', 'g3')"
        ).fetchone() == (0,)
        assert conn.execute("SELECT to_regclass('public.err_inbox')").fetchone() == (None,)


def test_dbt_package_files():
    """The package is what dbt expects: a project named pg_mailbox whose macros dispatch."""
    project = (REPO / "dbt" / "dbt_project.yml").read_text()
    assert "name: pg_mailbox" in project
    macros = "".join(p.read_text() for p in (REPO / "dbt" / "macros").glob("*.sql"))
    for name in ("mailbox_enable_outbox", "mailbox_create_consumer_group", "mailbox_create_inbox"):
        assert f"adapter.dispatch('{name}_sql', 'pg_mailbox')" in macros, name
