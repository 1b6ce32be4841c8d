"""One NOTIFY mailbox_outbox_new per committing transaction per outbox (SPEC §1.3)."""

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
    return conn


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
