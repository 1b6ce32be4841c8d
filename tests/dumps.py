"""pg_dump / pg_restore helpers shared by the dump tests (tests/upgrade/test_dump_restore.py,
tests/inbox/test_inbox_adopted.py): a scratch database on the same server, and a dump of one
database restored into another in a given format. Also the database with rows in flight
those tests and the upgrade tests (tests/upgrade/test_upgrade_with_data.py) build, the
state they compare and the calls whose answers they check (build_state, state, exercise,
check_exercise)."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from groups import poll
from mbx import drop_role, make_role, scalar
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


LEGACY = """
CREATE SCHEMA legacy;
CREATE TABLE legacy.incoming (
    msg_id uuid PRIMARY KEY,
    kind text,
    body jsonb,
    arrived timestamptz NOT NULL DEFAULT now(),
    handled_at timestamptz,
    attempts int NOT NULL DEFAULT 0,
    last_error text,
    stream text,
    position bigint
);
"""


def build_state(db: psycopg.Connection, owner: str) -> None:
    """Outboxes, groups, leases and inboxes with rows in flight. owner owns the captured
    table (and so its capture function)."""
    db.execute("CREATE TABLE public.orders (id int PRIMARY KEY, item text, qty int)")
    db.execute(sql.SQL("ALTER TABLE public.orders OWNER TO {}").format(sql.Identifier(owner)))
    db.execute("SELECT mailbox.create_outbox('events')")
    db.execute(
        "SELECT mailbox.enable_outbox('public.orders', p_inline_threshold_rows => 3,"
        " p_outbox_name => 'orders')"
    )
    for group, outbox in [("billing", "events"), ("audit", "events"), ("shipping", "orders")]:
        db.execute("SELECT mailbox.create_consumer_group(%s, %s, 'earliest')", [group, outbox])
    # ten events, one transaction each
    for n in range(1, 11):
        db.execute(
            "SELECT mailbox.outbox_publish('events', %s, p_key => %s)", [f'{{"n": {n}}}', str(n)]
        )
    # billing: acknowledged up to 2, 3-4 leased to c1, 5-7 leased to c2, 8-10 numbered only
    assert [r[0] for r in poll(db, "billing", "c1", 4, 3600)] == [1, 2, 3, 4]
    assert scalar(db, "SELECT mailbox.commit_offset('billing', 'c1', 2)") == 2
    assert [r[0] for r in poll(db, "billing", "c2", 3, 3600)] == [5, 6, 7]
    # audit: everything read and acknowledged
    assert len(poll(db, "audit", "a1", 100, 3600)) == 10
    assert scalar(db, "SELECT mailbox.commit_offset('audit', 'a1', 10)") == 10
    # three more events that no poll has numbered yet
    for n in range(11, 14):
        db.execute("SELECT mailbox.outbox_publish('events', %s)", [f'{{"n": {n}}}'])

    # captured: inline rows (3 or fewer per statement), a claim-check row, an update, a delete
    db.execute("INSERT INTO public.orders VALUES (1, 'apple', 1), (2, 'pear', 2)")
    db.execute("INSERT INTO public.orders SELECT g, 'bulk', g FROM generate_series(10, 16) g")
    db.execute("UPDATE public.orders SET qty = 5 WHERE id = 1")
    got = poll(db, "shipping", "s1", 2, 3600)
    assert [r[0] for r in got] == [1, 2]
    assert scalar(db, "SELECT mailbox.commit_offset('shipping', 's1', 1)") == 1
    db.execute("DELETE FROM public.orders WHERE id = 2")  # not numbered yet

    # a managed inbox with ordering: processed, dead-lettered, leased and pending messages
    db.execute("SELECT mailbox.create_inbox('payments', p_max_retries => 1)")
    db.execute("SELECT mailbox.enable_inbox_ordering('payments')")
    for event_id, agg, seq in [
        ("p1", "A", 1),
        ("p2", "A", 2),
        ("p3", "B", 1),
        ("p4", "C", 1),
        ("p5", "D", 1),
        ("p6", "C", 2),
    ]:
        db.execute(
            "SELECT mailbox.inbox_receive('payments', %s, %s, 'paid',"
            " p_aggregate_id => %s, p_sequence_num => %s)",
            [event_id, f'{{"id": "{event_id}"}}', agg, seq],
        )
    # the head of each aggregate is claimable: p1, p3, p4, p5
    claimed = db.execute(
        "SELECT event_id FROM mailbox.inbox_claim('payments', 'w1', 10, 3600) ORDER BY 1"
    ).fetchall()
    assert claimed == [("p1",), ("p3",), ("p4",), ("p5",)]
    db.execute("SELECT mailbox.inbox_mark_processed('payments', 'p1')")
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('payments', 'p3', 'boom')") == "dead_letter"
    # p4 and p5 stay leased to w1 (live leases); p2 and p6 pend behind their aggregates

    # an adopted table with ordering
    db.execute(LEGACY)
    db.execute(
        """SELECT mailbox.enable_inbox_tracking('legacy_in', 'legacy.incoming',
               p_id_column => 'msg_id', p_processed_at_column => 'handled_at',
               p_retry_count_column => 'attempts', p_error_column => 'last_error',
               p_received_at_column => 'arrived', p_event_type_column => 'kind',
               p_max_retries => 1, p_payload_column => 'body')"""
    )
    db.execute("SELECT mailbox.enable_inbox_ordering('legacy_in', 'stream', 'position')")
    ids = [str(uuid.UUID(int=i)) for i in range(1, 6)]
    for i, (stream, pos) in enumerate([("s", 1), ("s", 2), ("t", 1), ("u", 1), ("s", 3)]):
        db.execute(
            "SELECT mailbox.inbox_receive('legacy_in', %s, %s, 'k',"
            " p_aggregate_id => %s, p_sequence_num => %s)",
            [ids[i], f'{{"i": {i}}}', stream, pos],
        )
    for event_id in [
        r[0]
        for r in db.execute("SELECT event_id FROM mailbox.inbox_claim('legacy_in', 'w1', 10, 3600)")
    ]:
        if event_id == ids[0]:
            db.execute("SELECT mailbox.inbox_mark_processed('legacy_in', %s)", [event_id])
        elif event_id == ids[2]:
            db.execute("SELECT mailbox.inbox_mark_failed('legacy_in', %s, 'bad')", [event_id])
        else:
            # released for a retry in an hour: a pending message waiting for its retry time
            db.execute(
                "SELECT mailbox.inbox_mark_failed('legacy_in', %s, 'later', 3600)", [event_id]
            )


# State compared between the original and the restored database. The sequencer's snapshot
# columns and the log's _xid hold transaction ids, which a restore rebases (docs/backup.md).
STATE = {
    "outboxes": "SELECT outbox_key, outbox_name, source_rel::regclass::text, source_name,"
    " retention_hours, inline_threshold_rows, created_at, head_offset"
    " FROM mailbox._outbox ORDER BY 1",
    "chunks": "SELECT outbox_key, base_offset, row_count, ids, dense, first_id, created_at"
    " FROM mailbox._outbox_chunk ORDER BY 1, 2",
    "retention": "SELECT * FROM mailbox._outbox_retention ORDER BY 1",
    "claim_check_consumed": "SELECT * FROM mailbox._claim_check_consumed ORDER BY 1, 2, 3",
    "log": "SELECT outbox_key, _id, event_id, created_at, source, event_type, key, headers,"
    " payload, inserted_count, deleted_count, is_claim_check, full_refresh"
    " FROM mailbox._outbox_log ORDER BY 1, 2",
    "delta_rows": "SELECT * FROM mailbox._outbox_delta_rows ORDER BY 1, 2, 3",
    "groups": "SELECT * FROM mailbox._consumer_group ORDER BY 1",
    "consumers": "SELECT * FROM mailbox._consumer ORDER BY 1, 2",
    "leases": "SELECT * FROM mailbox._lease ORDER BY 1, 2",
    "lost_leases": "SELECT * FROM mailbox._lost_lease ORDER BY 1, 2, 3",
    "inboxes": "SELECT to_jsonb(i) FROM mailbox._inbox AS i ORDER BY inbox_key",
    "inbox_leases": "SELECT * FROM mailbox._inbox_lease ORDER BY 1, 2",
    "inbox_aggregates": "SELECT * FROM mailbox._inbox_aggregate ORDER BY 1, 2",
    "inbox_dlq_events": "SELECT * FROM mailbox._inbox_dlq_event ORDER BY 1",
    "inbox_gap_alerts": "SELECT * FROM mailbox._inbox_gap_alert ORDER BY 1, 2, 3",
    "alerts": "SELECT * FROM mailbox.alert_log ORDER BY 1",
    "payments": "SELECT * FROM mailbox.payments ORDER BY event_id",
    "legacy": "SELECT * FROM legacy.incoming ORDER BY msg_id",
    "orders": "SELECT * FROM public.orders ORDER BY id",
    "sequences": "SELECT sequencename, last_value FROM pg_sequences"
    " WHERE schemaname = 'mailbox' ORDER BY 1",
    # the objects made at run time: partitions, indexes, constraints, views, triggers,
    # generated functions, privileges
    "partitions": "SELECT c.oid::regclass::text, pg_get_expr(c.relpartbound, c.oid),"
    " i.inhparent::regclass::text FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid"
    " WHERE c.relnamespace = 'mailbox'::regnamespace ORDER BY 1",
    "indexes": "SELECT schemaname, tablename, indexname, indexdef FROM pg_indexes"
    " WHERE schemaname IN ('mailbox', 'public', 'legacy') ORDER BY 1, 2, 3",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
    " FROM pg_constraint WHERE connamespace IN ('mailbox'::regnamespace,"
    " 'public'::regnamespace, 'legacy'::regnamespace) ORDER BY 1, 2",
    "views": "SELECT schemaname, viewname, definition FROM pg_views"
    " WHERE schemaname IN ('mailbox', 'public', 'legacy') ORDER BY 1, 2",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger"
    " WHERE NOT tgisinternal ORDER BY 1, 2",
    # the inbox routers are extension members (not dumped) that cache the catalog: a restore
    # has the script's, until maintenance rebuilds them (ROUTERS, check_round_trip)
    "functions": "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proacl::text[]"
    " FROM pg_proc AS p WHERE p.pronamespace = 'mailbox'::regnamespace"
    " AND p.proname NOT LIKE '\\_inbox\\_route\\_%' ORDER BY 1",
    "owners": "SELECT c.oid::regclass::text, c.relowner::regrole::text FROM pg_class AS c"
    " WHERE c.relnamespace IN ('mailbox'::regnamespace, 'public'::regnamespace,"
    " 'legacy'::regnamespace) UNION ALL SELECT p.oid::regprocedure::text,"
    " p.proowner::regrole::text FROM pg_proc AS p"
    " WHERE p.pronamespace = 'mailbox'::regnamespace ORDER BY 1",
    "table_privileges": "SELECT c.oid::regclass::text, c.relacl::text[] FROM pg_class AS c"
    " WHERE c.relnamespace IN ('mailbox'::regnamespace, 'public'::regnamespace,"
    " 'legacy'::regnamespace) ORDER BY 1",
}


# The inbox routers (docs/inbox.md, "How calls reach an inbox").
ROUTERS = (
    "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc AS p"
    " WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname LIKE '\\_inbox\\_route\\_%'"
    " ORDER BY 1"
)


def state(conn: psycopg.Connection) -> dict[str, list]:
    return {name: conn.execute(query).fetchall() for name, query in STATE.items()}


def outbox_poll(conn, group, consumer, batch=100, visibility=30):
    got = conn.execute(
        "SELECT outbox_id, key, payload FROM mailbox.poll_outbox(%s, %s, %s, %s)",
        [group, consumer, batch, visibility],
    ).fetchall()
    offsets = [r[0] for r in got]
    # one poll returns contiguous offsets in ascending order
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True
    return got


def exercise(db: psycopg.Connection) -> dict[str, object]:
    """The same calls on the original and on the restored database; the answers must match."""
    out: dict[str, object] = {}
    # live leases are not offered again: billing gets what was never delivered, in order
    # (8-10 numbered before the dump, 11-13 numbered now)
    out["billing_live"] = outbox_poll(db, "billing", "c3", 100, 3600)
    out["audit"] = outbox_poll(db, "audit", "a2", 100, 3600)
    out["shipping_live"] = outbox_poll(db, "shipping", "s2", 100, 3600)
    out["claim_check"] = db.execute(
        "SELECT * FROM mailbox.outbox_delta_rows('orders', 2)"
    ).fetchall()
    # the leases taken before the dump expire (their visibility timeout, shortened here)
    db.execute(
        "UPDATE mailbox._lease SET lease_until = now() - interval '1 second'"
        " WHERE consumer_id IN ('c1', 'c2', 's1')"
    )
    # a consumer id has one batch in flight (docs/consumer-groups.md#restarts): c4 takes the
    # expired leases one after the other, committing each
    out["billing_expired"] = []
    for _ in range(3):
        batch = outbox_poll(db, "billing", "c4", 100, 3600)
        out["billing_expired"].append(batch)
        if batch:
            db.execute("SELECT mailbox.commit_offset('billing', 'c4', %s)", [batch[-1][0]])
    out["billing_commit"] = scalar(db, "SELECT mailbox.commit_offset('billing', 'c3', 13)")
    out["audit_commit"] = scalar(db, "SELECT mailbox.commit_offset('audit', 'a2', 13)")
    out["lag"] = db.execute(
        "SELECT group_name, group_offset, delivered_offset FROM mailbox._consumer_group ORDER BY 1"
    ).fetchall()
    # producers keep publishing, and offsets continue after the old head
    db.execute("SET ROLE mailbox_producer")
    db.execute("SELECT mailbox.outbox_publish('events', '{\"n\": 14}')")
    db.execute("RESET ROLE")
    out["billing_new"] = outbox_poll(db, "billing", "c3", 100, 3600)
    # capture still fires
    db.execute("INSERT INTO public.orders VALUES (20, 'new', 1)")
    out["shipping_expired"] = outbox_poll(db, "shipping", "s2", 100, 3600)
    # a commit acknowledges one batch: s2 holds 2 (taken over) and 3-4 (its own)
    out["shipping_commit"] = [
        scalar(db, "SELECT mailbox.commit_offset('shipping', 's2', %s)", [n]) for n in (2, 4)
    ]
    out["shipping_new"] = outbox_poll(db, "shipping", "s2", 100, 3600)
    out["heads"] = db.execute(
        "SELECT outbox_name, head_offset FROM mailbox._outbox ORDER BY 1"
    ).fetchall()

    # inboxes: claims honour ordering, the live lease and the dead letter; marks work
    claim = "SELECT event_id FROM mailbox.inbox_claim(%s, %s, 10, 3600) ORDER BY 1"
    out["payments_1"] = db.execute(claim, ["payments", "w3"]).fetchall()
    for event_id in ("p2", "p4", "p5"):
        db.execute("SELECT mailbox.inbox_mark_processed('payments', %s)", [event_id])
    out["payments_2"] = db.execute(claim, ["payments", "w3"]).fetchall()
    out["payments_views"] = db.execute(
        "SELECT (SELECT array_agg(event_id ORDER BY event_id) FROM mailbox.pending_payments),"
        " (SELECT array_agg(event_id ORDER BY event_id) FROM mailbox.dlq_payments)"
    ).fetchone()
    out["legacy_1"] = db.execute(claim, ["legacy_in", "w3"]).fetchall()
    for (event_id,) in out["legacy_1"]:
        db.execute("SELECT mailbox.inbox_mark_processed('legacy_in', %s)", [event_id])
    out["legacy_2"] = db.execute(claim, ["legacy_in", "w3"]).fetchall()
    db.execute("SET ROLE mailbox_producer")
    db.execute(
        "SELECT mailbox.inbox_receive('payments', 'p7', '{}',"
        " p_aggregate_id => 'E', p_sequence_num => 1)"
    )
    db.execute("RESET ROLE")
    db.execute("SET ROLE mailbox_consumer")
    out["payments_3"] = db.execute(claim, ["payments", "w4"]).fetchall()
    db.execute("RESET ROLE")
    # the kept ordering gaps (state dumped, triggers restored with the table) stay exact
    db.execute(
        "INSERT INTO mailbox.payments (event_id, payload, aggregate_id, sequence_num)"
        " VALUES ('p8', '{}', 'F', 3)"
    )
    out["payments_gaps"] = db.execute(
        "SELECT aggregate_id, expected_seq, found_seq FROM mailbox.inbox_ordering_gaps('payments')"
    ).fetchall()
    out["processed"] = db.execute(
        "SELECT event_id FROM mailbox.payments WHERE processed_at IS NOT NULL"
        " UNION ALL SELECT msg_id::text FROM legacy.incoming WHERE handled_at IS NOT NULL"
        " ORDER BY 1"
    ).fetchall()
    return out


def check_exercise(out: dict[str, object]) -> None:
    """What the calls above must answer (on the original as on the restored database)."""

    def offsets(batch):
        return [r[0] for r in batch]

    assert offsets(out["billing_live"]) == list(range(8, 14))
    assert [r[2] for r in out["billing_live"]] == [{"n": n} for n in range(8, 14)]
    assert offsets(out["audit"]) == [11, 12, 13]
    assert offsets(out["shipping_live"]) == [3, 4]
    assert len(out["claim_check"]) == 7
    assert [offsets(b) for b in out["billing_expired"]] == [[3, 4], [5, 6, 7], []]
    assert out["billing_commit"] == 6
    assert out["audit_commit"] == 3
    assert offsets(out["billing_new"]) == [14]
    assert offsets(out["shipping_expired"]) == [2]
    assert offsets(out["shipping_new"]) == [5]
    assert out["heads"] == [("events", 14), ("orders", 5)]
    assert out["payments_1"] == [("p2",)]
    assert out["payments_2"] == [("p6",)]
    assert out["payments_views"] == (["p6"], ["p3"])
    assert out["legacy_1"] == [(str(uuid.UUID(int=2)),)]
    assert out["legacy_2"] == [(str(uuid.UUID(int=5)),)]
    assert out["payments_3"] == [("p7",)]
    assert out["payments_gaps"] == [("F", 1, 3)]


@contextmanager
def state_at_version(dsn: str, version: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to dsn's (empty) database with pg_mailbox installed at
    `version` and build_state's rows; the captured table's owner is a throwaway role,
    dropped afterwards."""
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(
            sql.SQL("CREATE EXTENSION pg_mailbox VERSION {} CASCADE").format(sql.Literal(version))
        )
        role = make_role(db)
        try:
            build_state(db, role)
            yield db
        finally:
            drop_role(db, role)
