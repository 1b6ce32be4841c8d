"""create_outbox / outbox_publish / outbox_publish_batch (SPEC §1.2)."""

import uuid

import pytest
from mbx import drop_role, make_role, outbox_rows, raises, rows, scalar


@pytest.fixture
def events(db):
    db.execute("SELECT mailbox.create_outbox('events')")
    return db


def test_publish_returns_the_event_id_and_stores_every_field(events):
    db = events
    event_id = scalar(
        db,
        "SELECT mailbox.outbox_publish('events', %s, %s, %s, %s)",
        ['{"order": 7}', '{"trace": "t1"}', "order-7", "order.created"],
    )
    assert isinstance(event_id, uuid.UUID)
    (row,) = outbox_rows(db, "events")
    assert row["event_id"] == event_id
    assert row["payload"] == {"order": 7} and row["headers"] == {"trace": "t1"}
    assert row["key"] == "order-7" and row["event_type"] == "order.created"
    assert not row["is_claim_check"] and not row["full_refresh"]
    assert row["outbox_id"] is None  # offsets are given when the row becomes visible to polls


def test_publish_defaults(events):
    db = events
    db.execute("SELECT mailbox.outbox_publish('events', '[1, 2]')")
    db.execute("SELECT mailbox.outbox_publish('events', '\"scalar\"', NULL)")
    a, b = outbox_rows(db, "events")
    assert a["headers"] == {} and a["key"] is None and a["event_type"] is None
    assert a["payload"] == [1, 2] and b["payload"] == "scalar" and b["headers"] == {}


def test_publish_runs_in_the_callers_transaction(events, connect):
    db = events
    conn = connect(autocommit=False)
    conn.execute("CREATE TABLE biz (id int)")
    conn.commit()
    conn.execute("INSERT INTO biz VALUES (1)")
    conn.execute("SELECT mailbox.outbox_publish('events', '{\"n\": 1}')")
    assert outbox_rows(db, "events") == []
    conn.rollback()
    assert outbox_rows(db, "events") == []
    conn.execute("INSERT INTO biz VALUES (2)")
    conn.execute("SELECT mailbox.outbox_publish('events', '{\"n\": 2}')")
    conn.commit()
    assert [r["payload"] for r in outbox_rows(db, "events")] == [{"n": 2}]


def test_publish_batch_returns_ids_in_array_order(events):
    db = events
    payloads = [f'{{"n": {i}}}' for i in range(200)]
    ids = [
        r[0]
        for r in rows(
            db,
            "SELECT * FROM mailbox.outbox_publish_batch('events', %s::jsonb[],"
            " '{\"h\": 1}', 'k', 'batch')",
            [payloads],
        )
    ]
    got = outbox_rows(db, "events")
    assert ids == [r["event_id"] for r in got]
    assert [r["payload"]["n"] for r in got] == list(range(200))
    assert all(
        r["headers"] == {"h": 1} and r["key"] == "k" and r["event_type"] == "batch" for r in got
    )
    assert rows(db, "SELECT * FROM mailbox.outbox_publish_batch('events', '{}'::jsonb[])") == []


def test_bad_publish_input_gets_its_sqlstate_and_writes_nothing(events):
    db = events
    with raises("22004"):
        db.execute("SELECT mailbox.outbox_publish('events', NULL)")
    with raises("22004"):
        db.execute("SELECT mailbox.outbox_publish(NULL, '{}')")
    with raises("42704") as info:
        db.execute("SELECT mailbox.outbox_publish('nope', '{}')")
    assert "outbox not found: nope" in str(info.value)
    assert info.value.diag.message_hint
    with raises("22023"):
        db.execute("SELECT mailbox.outbox_publish('events', '{}', '[1]')")
    with raises("22004"):
        db.execute("SELECT mailbox.outbox_publish_batch('events', ARRAY['{}', NULL]::jsonb[])")
    with raises("22004"):
        db.execute("SELECT mailbox.outbox_publish_batch('events', NULL)")
    with raises("42704"):
        db.execute("SELECT mailbox.outbox_publish_batch('nope', ARRAY['{}']::jsonb[])")
    assert outbox_rows(db, "events") == []


@pytest.fixture
def producer(db):
    role = make_role(db, "mailbox_producer")
    yield role
    drop_role(db, role)


def test_producer_role_publishes_and_cannot_manage(events, connect, producer):
    conn = connect()
    conn.execute(f'SET ROLE "{producer}"')
    conn.execute("SELECT mailbox.outbox_publish('events', '{}')")
    conn.execute("SELECT mailbox.outbox_publish_batch('events', ARRAY['{}']::jsonb[])")
    with raises("42501"):
        conn.execute("SELECT mailbox.create_outbox('mine')")
    with raises("42501"):
        conn.execute("SELECT * FROM mailbox.outbox_events")
    assert len(outbox_rows(events, "events")) == 2


def test_role_without_producer_grant_gets_42501(events, connect):
    role = make_role(events)
    try:
        conn = connect()
        conn.execute(f'SET ROLE "{role}"')
        with raises("42501"):
            conn.execute("SELECT mailbox.outbox_publish('events', '{}')")
        conn.execute("RESET ROLE")
    finally:
        drop_role(events, role)


def test_create_outbox_options_and_duplicates(db):
    db.execute("SELECT mailbox.create_outbox('a', 0, 5)")
    assert rows(db, "SELECT retention_hours, inline_threshold_rows FROM mailbox.outboxes") == [
        (0, 5)
    ]
    with raises("42710"):
        db.execute("SELECT mailbox.create_outbox('a')")
    with raises("22023"):
        db.execute("SELECT mailbox.create_outbox('b', -1)")
    with raises("22023"):
        db.execute("SELECT mailbox.create_outbox('b', 1, -1)")
    with raises("22004"):
        db.execute("SELECT mailbox.create_outbox('b', NULL)")
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes") == 1
