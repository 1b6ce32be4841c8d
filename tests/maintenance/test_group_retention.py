"""Retention that never drains what a group still needs, and does not bloat (SPEC §4)."""

import time

import psycopg
import pytest
from groups import commit, poll, publish
from mbx import raises, rows, scalar


@pytest.fixture
def outbox(db):
    db.execute("SELECT mailbox.create_outbox('e', 0)")  # retention 0 h: drain as soon as allowed
    return db


def row_count(db):
    return scalar(db, "SELECT count(*) FROM mailbox.outbox_e")


def test_a_slow_group_holds_rows_back(outbox, connect):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('fast', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('slow', 'e', 'earliest')")
    publish(db, "e", 100)
    got = poll(db, "fast", "c", batch=100)
    commit(db, "fast", "c", 100)
    got = poll(db, "slow", "c", batch=30)
    commit(db, "slow", "c", got[-1][0])
    db.execute("SET mailbox.outbox_chunk_rows = 10")  # (applies to rows numbered from now on)
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] <= 30
    assert row_count(db) >= 70
    # the slow group still gets every row it has not committed
    assert [r[0] for r in poll(db, "slow", "c", batch=100)] == list(range(31, 101))
    commit(db, "slow", "c", 100)
    db.execute("SELECT mailbox.run_maintenance()")
    assert row_count(db) == 0


def test_retention_hours_keep_young_rows(db):
    db.execute("SELECT mailbox.create_outbox('e', 1)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    publish(db, "e", 10)
    poll(db, "g", "c")
    commit(db, "g", "c", 10)
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] == 0
    db.execute("UPDATE mailbox._outbox_log_e SET created_at = created_at - interval '2 hours'")
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] == 10


def test_force_retention_overrides_groups(outbox, connect):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('slow', 'e', 'earliest')")
    publish(db, "e", 50)
    poll(db, "slow", "c", batch=10)  # holds a lease on 1..10
    db.execute("SET mailbox.outbox_force_retention = on")
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] == 50
    assert row_count(db) == 0
    lag = db.execute("SELECT group_offset, lag FROM mailbox.consumer_group_lag").fetchone()
    assert lag == (50, 0)
    publish(db, "e", 2)
    assert [r[0] for r in poll(db, "slow", "c")] == [51, 52]


def test_claim_check_rows_wait_until_consumed_and_take_their_delta_rows(db):
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t', 0, 2)")
    db.execute("SELECT mailbox.create_consumer_group('a', 't', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('b', 't', 'earliest')")
    db.execute("INSERT INTO t SELECT generate_series(1, 5)")  # claim-check: 5 > 2
    for group in ("a", "b"):
        (row,) = poll(db, group, "c")
        commit(db, group, "c", row[0])
    db.execute("SELECT mailbox.run_maintenance()")
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows_t") == 5  # not read yet
    db.execute("SELECT mailbox.outbox_rows_consumed('t', 1, 'a')")
    db.execute("SELECT mailbox.run_maintenance()")
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_t") == 1  # b has not read it
    db.execute("SELECT mailbox.outbox_rows_consumed('t', 1, 'b')")
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] == 1
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows_t") == 0
    assert rows(db, "SELECT * FROM mailbox._claim_check_consumed") == []


def test_outbox_without_groups_drains_by_age(outbox):
    db = outbox
    publish(db, "e", 20)
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] == 20
    status = scalar(db, "SELECT mailbox.outbox_status('e')")
    assert status["row_count"] == 0 and status["last_drained_count"] == 20
    assert status["last_drained_at"] is not None


def test_drained_outbox_shrinks_back_to_empty_size_without_vacuum_full(outbox):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    empty = scalar(db, "SELECT pg_total_relation_size('mailbox._outbox_log_e')")
    publish(db, "e", 200000)
    full = scalar(db, "SELECT pg_total_relation_size('mailbox._outbox_log_e')")
    while got := poll(db, "g", "c", batch=10000):
        commit(db, "g", "c", got[-1][0])
    result = scalar(db, "SELECT mailbox.run_maintenance()")
    assert result["outbox_rows_drained"] == 200000
    # TRUNCATE takes the lock only if it is free right now: autovacuum, woken by 200k dead
    # rows, may hold it (CI saw that). Maintenance then truncates on a later run.
    truncated = result["outbox_tables_truncated"]
    for _ in range(20):
        if truncated:
            break
        time.sleep(0.5)
        truncated = scalar(db, "SELECT mailbox.run_maintenance()")["outbox_tables_truncated"]
    assert truncated == 1
    after = scalar(db, "SELECT pg_total_relation_size('mailbox._outbox_log_e')")
    assert full > 20 * 1024 * 1024 and after <= empty + 64 * 1024, (empty, full, after)
    publish(db, "e", 3)
    assert [r[0] for r in poll(db, "g", "c")] == [200001, 200002, 200003]


def test_truncation_waits_for_nobody(outbox, connect):
    """A producer holding the table makes maintenance skip TRUNCATE instead of blocking."""
    db = outbox
    publish(db, "e", 5)
    producer = connect(autocommit=False)
    producer.execute("SELECT mailbox.outbox_publish('e', '{}')")
    result = scalar(db, "SELECT mailbox.run_maintenance()")
    assert result["outbox_rows_drained"] == 5 and result["outbox_tables_truncated"] == 0
    producer.commit()
    assert row_count(db) == 1


def test_schedule_maintenance_without_pg_cron_is_55000(db):
    with raises("55000") as info:
        db.execute("SELECT mailbox.schedule_maintenance()")
    assert "pg-mailbox maintain" in info.value.diag.message_hint
    with raises("55000"):
        db.execute("SELECT mailbox.unschedule_maintenance()")


def test_schedule_maintenance_with_pg_cron(pg_cluster):
    """pg_cron lives in the cluster's cron.database_name (postgres): install both there."""
    dsn = pg_cluster.dsn("postgres")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_mailbox CASCADE")
        try:
            job = scalar(conn, "SELECT mailbox.schedule_maintenance('*/5 * * * *')")
            assert rows(conn, "SELECT schedule, command FROM cron.job WHERE jobid = %s", [job]) == [
                ("*/5 * * * *", "SELECT mailbox.run_maintenance()")
            ]
            assert scalar(conn, "SELECT mailbox.schedule_maintenance('* * * * *')") == job
            assert scalar(conn, "SELECT mailbox.unschedule_maintenance()") is True
            assert scalar(conn, "SELECT mailbox.unschedule_maintenance()") is False
        finally:
            conn.execute("DROP EXTENSION pg_mailbox CASCADE")
            conn.execute("DROP EXTENSION pg_cron")


def test_one_run_drains_thousands_of_small_chunks(outbox):
    """Under load every poll numbers a small chunk; one run must drain them all (a run once
    stopped after 1,000 chunks, and the outbox grew without bound under continuous load)."""
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    with db.pipeline() as pipeline:  # a Sync after each statement: each its own transaction
        for _ in range(1100):  # 1,100 chunks of 2 rows: a publish, then a poll that numbers it
            for sql in (
                "SELECT mailbox.outbox_publish_batch('e', ARRAY['{}'::jsonb, '{}'::jsonb])",
                "SELECT count(*) FROM mailbox.poll_outbox('g', 'c', 2)",
                "SELECT mailbox.commit_offset('g', 'c', 1000000)",
            ):
                db.execute(sql)
                pipeline.sync()
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_chunk") >= 1100
    # a budget smaller than the backlog stops at a chunk boundary and keeps the rest in order
    db.execute("SET mailbox.outbox_drain_batch_size = 1001")
    db.execute("SET mailbox.maintenance_max_batches = 1")
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] == 1002
    assert scalar(db, "SELECT low_offset FROM mailbox._outbox_retention") == 1002
    assert scalar(db, "SELECT min(outbox_id) FROM mailbox.outbox_e") == 1003
    db.execute("RESET mailbox.outbox_drain_batch_size")
    db.execute("RESET mailbox.maintenance_max_batches")
    assert scalar(db, "SELECT mailbox.run_maintenance()")["outbox_rows_drained"] == 1198
    assert row_count(db) == 0
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_chunk") == 0
    assert scalar(db, "SELECT low_offset FROM mailbox._outbox_retention") == 2200
