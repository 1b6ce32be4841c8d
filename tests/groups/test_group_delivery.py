"""Fan-out across groups, competition inside a group, no duplicates (SPEC §2.2 items 1, 7)."""

import threading

import pytest
from groups import commit, poll, publish
from mbx import raises, rows, scalar


@pytest.fixture
def outbox(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    return db


def drain(conn, group, consumer, batch=100):
    got = []
    while True:
        batch_rows = poll(conn, group, consumer, batch)
        if not batch_rows:
            return got
        got.extend(r[0] for r in batch_rows)
        assert commit(conn, group, consumer, batch_rows[-1][0]) == len(batch_rows)


def test_every_group_receives_every_row(outbox):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('a', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('b', 'e', 'earliest')")
    publish(db, "e", 250)
    assert drain(db, "a", "c1") == list(range(1, 251))
    assert drain(db, "b", "c1", batch=7) == list(range(1, 251))


def test_poll_returns_rows_in_offset_order_with_every_column(outbox):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('a', 'e')")
    eid = scalar(
        db, "SELECT mailbox.outbox_publish('e', '{\"k\": 1}', '{\"h\": 2}', 'key1', 'typ')"
    )
    cur = db.execute("SELECT * FROM mailbox.poll_outbox('a', 'c1')")
    cols = [c.name for c in cur.description]
    assert cols == [
        "outbox_id",
        "event_id",
        "created_at",
        "source",
        "event_type",
        "key",
        "headers",
        "inserted_count",
        "deleted_count",
        "is_claim_check",
        "full_refresh",
        "payload",
        "partition",  # SPEC §2.3: last; 0 for an outbox of one partition
    ]
    (row,) = cur.fetchall()
    assert row[0] == 1 and row[1] == eid and row[4:7] == ("typ", "key1", {"h": 2})
    assert row[-2:] == ({"k": 1}, 0)


def test_a_leased_row_goes_to_one_consumer_at_a_time(outbox, connect):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('a', 'e', 'earliest')")
    publish(db, "e", 10)
    first = poll(connect(), "a", "c1", batch=6)
    second = poll(connect(), "a", "c2", batch=6)
    assert [r[0] for r in first] == list(range(1, 7))
    assert [r[0] for r in second] == list(range(7, 11))
    assert poll(connect(), "a", "c3") == []


def test_auto_offset_reset_earliest_and_latest(outbox):
    db = outbox
    publish(db, "e", 5)
    db.execute("SELECT mailbox.create_consumer_group('early', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('late', 'e', 'latest')")
    db.execute("SELECT mailbox.create_consumer_group('dflt', 'e')")
    publish(db, "e", 3)
    assert drain(db, "early", "c") == list(range(1, 9))
    assert drain(db, "late", "c") == [6, 7, 8]
    assert drain(db, "dflt", "c") == [6, 7, 8]


def test_group_input_errors(outbox):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('a', 'e')")
    with raises("42710"):
        db.execute("SELECT mailbox.create_consumer_group('a', 'e')")
    with raises("42704"):
        db.execute("SELECT mailbox.create_consumer_group('b', 'nope')")
    with raises("22023"):
        db.execute("SELECT mailbox.create_consumer_group('b', 'e', 'middle')")
    with raises("22004"):
        db.execute("SELECT mailbox.create_consumer_group('b', 'e', NULL)")
    with raises("22023"):
        db.execute("SELECT mailbox.create_consumer_group('', 'e')")
    with raises("22023"):
        db.execute("SELECT mailbox.create_consumer_group(%s, 'e')", ["g" * 201])
    with raises("22004"):
        db.execute("SELECT mailbox.create_consumer_group(NULL, 'e')")
    assert scalar(db, "SELECT count(*) FROM mailbox.consumer_group_lag") == 1
    with raises("42704"):
        db.execute("SELECT * FROM mailbox.poll_outbox('nope', 'c')")
    with raises("22023"):
        db.execute("SELECT * FROM mailbox.poll_outbox('a', '')")
    with raises("22023"):
        db.execute("SELECT * FROM mailbox.poll_outbox('a', 'c', 0)")
    with raises("22023"):
        db.execute("SELECT * FROM mailbox.poll_outbox('a', 'c', 10, 0)")
    with raises("22004"):
        db.execute("SELECT * FROM mailbox.poll_outbox('a', 'c', NULL)")
    with raises("42704"):
        db.execute("SELECT mailbox.drop_consumer_group('nope')")
    db.execute("SELECT mailbox.drop_consumer_group('nope', true)")
    db.execute("SELECT mailbox.drop_consumer_group('a')")
    assert scalar(db, "SELECT count(*) FROM mailbox.consumer_group_lag") == 0


def test_dropping_the_outbox_drops_its_groups(outbox):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('a', 'e')")
    poll(db, "a", "c")
    db.execute("SELECT mailbox.drop_outbox('e')")
    assert rows(db, "SELECT * FROM mailbox._consumer_group") == []
    assert rows(db, "SELECT * FROM mailbox._consumer") == []


def test_three_racing_consumers_get_every_row_exactly_once(outbox, connect):
    db = outbox
    db.execute("SELECT mailbox.create_consumer_group('a', 'e', 'earliest')")
    publish(db, "e", 20000)
    seen = {name: [] for name in ("c1", "c2", "c3")}
    barrier = threading.Barrier(3)
    errors = []

    def consume(name):
        try:
            conn = connect()
            barrier.wait()
            seen[name] = drain(conn, "a", name, batch=50)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(n,)) for n in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    everything = sorted(o for got in seen.values() for o in got)
    assert everything == list(range(1, 20001))  # none lost, none twice
    assert all(got for got in seen.values()), "every consumer should have competed"
    assert scalar(db, "SELECT group_offset FROM mailbox.consumer_group_lag") == 20000
