"""pg_mailbox.api, the typed client layer, against a real database: set-up, a poll/commit
cycle, the inbox, and the numberer call (docs/relay.md, "Using pg_mailbox.api")."""

import threading

import psycopg
from mbx import raises, rows, scalar

from pg_mailbox import api


def test_set_up_poll_commit_and_tear_down_through_the_api(db, dsn):
    db.execute("CREATE TABLE public.orders (id int PRIMARY KEY, total int)")
    assert api.enable_outbox(db, "public.orders", "orders") == "orders"
    assert api.outbox_exists(db, "orders") and not api.outbox_exists(db, "nope")
    api.create_consumer_group(db, "billing", "orders", "earliest")
    db.execute("INSERT INTO public.orders SELECT g, g * 10 FROM generate_series(1, 3) g")
    rows = api.poll_outbox(db, "billing", "w1", batch_size=10)
    assert len(rows) == 1 and rows[0].payload["inserted"][2]["total"] == 30
    assert api.commit_offset(db, "billing", "w1", rows[-1].outbox_id) >= 1
    assert api.poll_outbox(db, "billing", "w1", batch_size=10) == []

    api.create_inbox(db, "payments")
    assert api.inbox_exists(db, "payments") and not api.inbox_exists(db, "nope")
    assert api.inbox_receive(db, "payments", {"event_id": "e1", "payload": {"x": 1}})
    assert not api.inbox_receive(db, "payments", {"event_id": "e1", "payload": {"x": 1}})
    api.drop_inbox(db, "payments", cascade=True)
    assert not api.inbox_exists(db, "payments")
    assert scalar(db, "SELECT to_regclass('mailbox.payments')") is None
    api.drop_inbox(db, "payments", if_exists=True)  # gone: no error

    api.drop_outbox(db, "orders")
    assert not api.outbox_exists(db, "orders")
    api.drop_outbox(db, "orders", if_exists=True)
    with raises("42704"):
        api.drop_outbox(db, "orders")


def test_run_numberer_numbers_what_a_producer_commits(db, dsn):
    db.execute("SELECT mailbox.create_outbox('e')")
    api.create_consumer_group(db, "g", "e", "earliest")
    db.execute("SELECT mailbox.outbox_publish('e', '{}') FROM generate_series(1, 5)")
    with psycopg.connect(dsn, autocommit=True) as numberer:
        t = threading.Thread(target=api.run_numberer, args=(numberer, 1))
        t.start()
        t.join(30)
        assert not t.is_alive()
    assert scalar(db, "SELECT count(outbox_id) FROM mailbox.outbox_e") == 5


def test_create_outbox_and_publish_through_the_api(db):
    api.create_outbox(db, "events", retention_hours=1, partitions=4)
    status = api.outbox_status(db, "events")
    assert status["retention_hours"] == 1
    assert scalar(db, "SELECT partitions FROM mailbox._outbox_partitioning") == 4
    event_id = api.outbox_publish(
        db, "events", {"n": 1}, event_type="created", key="k1", headers={"h": "v"}
    )
    assert api.outbox_publish_batch(db, "events", [{"n": 2}, {"n": 3}], key="k2") == 2
    got = rows(
        db,
        "SELECT event_id, event_type, key, headers, payload FROM mailbox.outbox_events"
        " ORDER BY payload ->> 'n'",
    )
    assert got[0] == (event_id, "created", "k1", {"h": "v"}, {"n": 1})
    assert [(r[2], r[4]) for r in got[1:]] == [("k2", {"n": 2}), ("k2", {"n": 3})]
    with raises("42710"):
        api.create_outbox(db, "events")
