"""One NOTIFY mailbox_outbox_new per committing transaction per outbox (SPEC §1.3), sent only
while a consumer of the outbox waits for it: its last poll returned nothing (part 17)."""

import time

import pytest
from mbx import raises


@pytest.fixture
def listener(db, connect):
    db.execute("SELECT mailbox.create_outbox('a')")
    db.execute("SELECT mailbox.create_outbox('b')")
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t')")
    conn = connect()
    conn.execute("LISTEN mailbox_outbox_new")
    for outbox in ("a", "b", "t"):
        wait_on(db, outbox)
    return conn


def wait_on(db, outbox, consumer="c1"):
    """A consumer of the outbox polls and finds nothing: it now waits for a wake-up."""
    db.execute(
        "SELECT mailbox.create_consumer_group(%s, %s)"
        " WHERE NOT EXISTS (SELECT 1 FROM mailbox._consumer_group WHERE group_name = %s)",
        [f"g_{outbox}", outbox, f"g_{outbox}"],
    )
    assert (
        db.execute(
            "SELECT * FROM mailbox.poll_outbox(%s, %s)", [f"g_{outbox}", consumer]
        ).fetchall()
        == []
    )


def drain(conn, wait=0.5):
    """Every notification that arrives within `wait` seconds of the last one."""
    got = []
    while True:
        batch = [(n.channel, n.payload) for n in conn.notifies(timeout=wait, stop_after=1)]
        if not batch:
            return got
        got.extend(batch)


def test_one_notification_per_transaction_per_outbox(listener, connect):
    producer = connect(autocommit=False)
    for _ in range(5):
        producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    producer.execute("SELECT mailbox.outbox_publish_batch('a', ARRAY['{}', '{}']::jsonb[])")
    producer.execute("SELECT mailbox.outbox_publish('b', '{}')")
    producer.execute("INSERT INTO t VALUES (1)")
    producer.execute("INSERT INTO t VALUES (2)")
    assert drain(listener, 0.3) == []  # nothing before commit
    producer.commit()
    assert sorted(drain(listener)) == [
        ("mailbox_outbox_new", "a"),
        ("mailbox_outbox_new", "b"),
        ("mailbox_outbox_new", "t"),
    ]


def test_no_notification_for_a_rolled_back_transaction(listener, connect):
    producer = connect(autocommit=False)
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    producer.execute("INSERT INTO t VALUES (1)")
    producer.rollback()
    producer.execute("SAVEPOINT s")
    producer.execute("SELECT mailbox.outbox_publish('b', '{}')")
    producer.execute("ROLLBACK TO SAVEPOINT s")
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    producer.commit()
    assert drain(listener) == [("mailbox_outbox_new", "a")]


def test_notify_can_be_switched_off(listener, connect):
    producer = connect()
    producer.execute("SET mailbox.outbox_notify = off")
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    producer.execute("INSERT INTO t VALUES (1)")
    assert drain(listener, 0.3) == []


def test_notification_arrives_promptly(listener, connect):
    producer = connect()
    started = time.monotonic()
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    got = list(listener.notifies(timeout=5, stop_after=1))
    assert got and got[0].payload == "a"
    assert time.monotonic() - started < 5


def test_a_bad_notify_setting_is_an_error_naming_it(listener, connect):
    producer = connect()
    producer.execute("SET mailbox.outbox_notify = 'maybe'")
    for call in ("SELECT mailbox.outbox_publish('a', '{}')", "INSERT INTO t VALUES (1)"):
        with raises("22023") as info:
            producer.execute(call)
        assert "mailbox.outbox_notify" in str(info.value)
    producer.execute("SET mailbox.outbox_notify = 'OFF'")
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    assert drain(listener, 0.3) == []


def test_no_notification_while_no_consumer_waits(db, connect):
    db.execute("SELECT mailbox.create_outbox('a')")
    listener = connect()
    listener.execute("LISTEN mailbox_outbox_new")
    producer = connect()
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")  # no consumer at all
    assert drain(listener, 0.3) == []
    wait_on(db, "a")  # a consumer finds nothing new: it waits
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    assert drain(listener) == [("mailbox_outbox_new", "a")]
    # it receives the row and is busy: producers stop notifying
    assert len(db.execute("SELECT * FROM mailbox.poll_outbox('g_a', 'c1')").fetchall()) == 1
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    assert drain(listener, 0.3) == []
    db.execute("SELECT mailbox.commit_offset('g_a', 'c1', 2)")  # offset 1 predates the group
    assert len(db.execute("SELECT * FROM mailbox.poll_outbox('g_a', 'c1')").fetchall()) == 1
    db.execute("SELECT mailbox.commit_offset('g_a', 'c1', 3)")
    # an empty poll again: waiting, and the next commit wakes it
    assert db.execute("SELECT * FROM mailbox.poll_outbox('g_a', 'c1')").fetchall() == []
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")
    assert drain(listener) == [("mailbox_outbox_new", "a")]


def test_a_waiting_consumer_that_stops_polling_expires(db, connect):
    db.execute("SELECT mailbox.create_outbox('a')")
    wait_on(db, "a")
    db.execute("SET mailbox.consumer_heartbeat_timeout_seconds = 1")
    wait_on(db, "a")  # waiting for one second only
    db.execute("RESET mailbox.consumer_heartbeat_timeout_seconds")
    listener = connect()
    listener.execute("LISTEN mailbox_outbox_new")
    time.sleep(1.2)
    connect().execute("SELECT mailbox.outbox_publish('a', '{}')")
    assert drain(listener, 0.3) == []


def test_snapshots_and_batches_wake_a_waiting_consumer(listener, connect):
    producer = connect()
    producer.execute("SELECT mailbox.outbox_publish_batch('b', ARRAY['{}']::jsonb[])")
    producer.execute("SELECT mailbox.outbox_snapshot('t')")
    assert sorted(drain(listener)) == [("mailbox_outbox_new", "b"), ("mailbox_outbox_new", "t")]


def test_maintenance_forgets_expired_waits(db):
    db.execute("SELECT mailbox.create_outbox('a')")
    db.execute("SET mailbox.consumer_heartbeat_timeout_seconds = 1")
    wait_on(db, "a", "gone")
    db.execute("RESET mailbox.consumer_heartbeat_timeout_seconds")
    wait_on(db, "a", "alive")
    time.sleep(1.2)
    assert (
        db.execute("SELECT mailbox.run_maintenance()->>'consumer_waits_expired'").fetchone()[0]
        == "1"
    )
    assert db.execute("SELECT consumer_id FROM mailbox._outbox_waiter").fetchall() == [("alive",)]


def test_maintenance_skips_an_expired_wait_that_an_open_poll_is_ending(db, connect):
    """A consumer whose expired wait is being deleted by its own open poll transaction holds
    that row: maintenance skips it (never waits for the consumer's business logic) and
    forgets it on a later pass."""
    db.execute("SELECT mailbox.create_outbox('a')")
    consumer = connect(autocommit=False)
    wait_on(consumer, "a", "slow")
    consumer.commit()
    db.execute("UPDATE mailbox._outbox_waiter SET waiting_until = now() - interval '1 second'")
    db.execute("SELECT mailbox.outbox_publish('a', '{}')")
    # a poll that finds the event ends the wait, in a transaction left open
    assert len(consumer.execute("SELECT * FROM mailbox.poll_outbox('g_a', 'slow')").fetchall()) == 1
    maintenance = connect()
    maintenance.execute("SET lock_timeout = '500ms'")
    try:
        got = maintenance.execute("SELECT mailbox.run_maintenance()->>'consumer_waits_expired'")
        assert got.fetchone()[0] == "0"
    finally:
        consumer.rollback()
    got = maintenance.execute("SELECT mailbox.run_maintenance()->>'consumer_waits_expired'")
    assert got.fetchone()[0] == "1"
    assert db.execute("SELECT count(*) FROM mailbox._outbox_waiter").fetchone()[0] == 0
