"""create_inbox / inbox_receive: deduplication, NOTIFY, argument errors (SPEC §3.1)."""

import threading

import pytest
from mbx import raises, rows, scalar
from psycopg.types.json import Jsonb


@pytest.fixture
def orders(db):
    db.execute("SELECT mailbox.create_inbox('orders')")
    return db


def test_create_inbox_makes_table_indexes_and_views(orders):
    db = orders
    cols = rows(
        db,
        """SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
            WHERE attrelid = 'mailbox.orders'::regclass AND attnum > 0 ORDER BY attnum""",
    )
    assert [c[0] for c in cols] == [
        "event_id",
        "event_type",
        "source",
        "aggregate_id",
        "sequence_num",
        "priority",
        "payload",
        "headers",
        "trace_id",
        "received_at",
        "processed_at",
        "error",
        "retry_count",
    ]
    assert dict(cols)["priority"] == "smallint" and dict(cols)["sequence_num"] == "bigint"
    indexes = {
        r[0]: r[1]
        for r in rows(
            db,
            """SELECT indexrelid::regclass::text, pg_get_expr(indpred, indrelid)
                      FROM pg_index WHERE indrelid = 'mailbox.orders'::regclass""",
        )
    }
    assert indexes["mailbox.orders_pkey"] is None
    assert indexes["mailbox.orders_pending_idx"] == "(processed_at IS NULL)"
    assert "retry_count >= 3" in indexes["mailbox.orders_dlq_idx"]
    assert indexes["mailbox.orders_processed_idx"] == "(processed_at IS NOT NULL)"
    views = [
        r[0]
        for r in rows(
            db,
            "SELECT viewname FROM pg_views WHERE schemaname = 'mailbox'"
            " AND viewname LIKE '%orders' ORDER BY 1",
        )
    ]
    assert views == ["dlq_orders", "pending_orders", "stats_orders"]


def test_create_inbox_in_a_user_schema_without_optional_views(db):
    db.execute("CREATE SCHEMA app")
    db.execute("SELECT mailbox.create_inbox('payments', 'app', 5, '1s', false, false, 24)")
    assert scalar(db, "SELECT to_regclass('app.payments') IS NOT NULL")
    assert scalar(db, "SELECT to_regclass('app.pending_payments') IS NOT NULL")
    assert scalar(db, "SELECT to_regclass('app.dlq_payments') IS NULL")
    assert scalar(db, "SELECT to_regclass('app.stats_payments') IS NULL")
    (status,) = rows(
        db,
        "SELECT inbox_schema, table_name, max_retries, is_managed"
        " FROM mailbox.inbox_status('payments')",
    )
    assert tuple(status) == ("app", "payments", 5, True)


def test_create_inbox_errors(orders):
    db = orders
    with raises("42710") as info:
        db.execute("SELECT mailbox.create_inbox('orders')")
    assert "inbox already exists: orders" in str(info.value)
    with raises("22023"):
        db.execute("SELECT mailbox.create_inbox('Bad-Name')")
    with raises("22023"):
        db.execute("SELECT mailbox.create_inbox(%s)", ["x" * 41])
    with raises("22004"):
        db.execute("SELECT mailbox.create_inbox(NULL)")
    with raises("22023"):
        db.execute("SELECT mailbox.create_inbox('zero', p_max_retries => 0)")
    with raises("22023"):
        db.execute("SELECT mailbox.create_inbox('neg', p_retention_hours => -1)")
    with raises("3F000"):
        db.execute("SELECT mailbox.create_inbox('nowhere', 'no_such_schema')")
    db.execute("CREATE TABLE public.taken (id int)")
    with raises("42710"):
        db.execute("SELECT mailbox.create_inbox('taken', 'public')")
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox") == 1


def test_receive_returns_true_once_and_stores_every_field(orders):
    db = orders
    args = ["e1", '{"n": 1}', "order.created", "shop", "order-7", 3, '{"h": 1}', "trace-1", 2]
    sql = "SELECT mailbox.inbox_receive('orders', %s, %s, %s, %s, %s, %s, %s, %s, %s)"
    assert scalar(db, sql, args) is True
    assert scalar(db, sql, args) is False
    (row,) = rows(
        db,
        "SELECT event_id, payload, event_type, source, aggregate_id, sequence_num,"
        " headers, trace_id, priority, retry_count, processed_at FROM mailbox.orders",
    )
    assert tuple(row) == (
        "e1",
        {"n": 1},
        "order.created",
        "shop",
        "order-7",
        3,
        {"h": 1},
        "trace-1",
        2,
        0,
        None,
    )


def test_receive_errors(orders):
    db = orders
    with raises("22004") as info:
        db.execute("SELECT mailbox.inbox_receive('orders', NULL, '{}')")
    assert info.value.diag.message_hint
    with raises("42704") as info:
        db.execute("SELECT mailbox.inbox_receive('nope', 'e1', '{}')")
    assert "inbox not found: nope" in str(info.value)
    with raises("22004"):
        db.execute("SELECT mailbox.inbox_receive(NULL, 'e1', '{}')")
    assert scalar(db, "SELECT count(*) FROM mailbox.orders") == 0


def test_plain_insert_on_conflict_is_a_valid_writer(orders):
    db = orders
    for _ in range(2):
        db.execute(
            "INSERT INTO mailbox.orders (event_id, payload) VALUES ('p1', '{}')"
            " ON CONFLICT (event_id) DO NOTHING"
        )
    assert [r[0] for r in rows(db, "SELECT event_id FROM mailbox.pending_orders")] == ["p1"]


def test_receive_notifies_new_messages_only(orders, connect):
    listener = connect()
    listener.execute("LISTEN mailbox_inbox_new")
    # the worker's claim finds nothing: it waits for a wake-up (part 33, wake-ups)
    assert rows(listener, "SELECT * FROM mailbox.inbox_claim('orders', 'w')") == []
    db = orders
    db.execute("SELECT mailbox.inbox_receive('orders', 'n1', '{}')")
    db.execute("SELECT mailbox.inbox_receive('orders', 'n1', '{}')")
    db.execute("SELECT mailbox.inbox_receive('orders', 'n2', '{}')")
    got = [n.payload for n in listener.notifies(timeout=1.0, stop_after=3)]
    assert got == ["orders", "orders"]


def notes(listener, timeout=0.5):
    return [n.payload for n in listener.notifies(timeout=timeout, stop_after=10)]


def waiters(db):
    return rows(
        db,
        "SELECT i.inbox_name, w.worker FROM mailbox._inbox_waiter w"
        " JOIN mailbox._inbox i USING (inbox_key) ORDER BY 1, 2",
    )


def test_receivers_notify_only_while_a_worker_waits(orders, connect):
    db = orders
    db.execute("SELECT mailbox.create_inbox('other')")
    listener = connect()
    listener.execute("LISTEN mailbox_inbox_new")
    # nobody has claimed and found nothing: no NOTIFY (and no commit serialised on it)
    db.execute("SELECT mailbox.inbox_receive('orders', 'a', '{}')")
    db.execute(
        "SELECT count(*) FROM mailbox.inbox_receive_batch('orders', %s)",
        [Jsonb([{"p_event_id": "b"}])],
    )
    assert notes(listener) == []
    worker = connect()
    assert len(rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w1', 10)")) == 2
    assert waiters(db) == []
    # w1's claim comes back empty: it waits, on this inbox only
    assert rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w1', 10)") == []
    assert rows(worker, "SELECT * FROM mailbox.inbox_claim('other', 'w2', 10)") == []
    assert waiters(db) == [("orders", "w1"), ("other", "w2")]
    db.execute("SELECT mailbox.inbox_receive('orders', 'c', '{}')")
    db.execute("SELECT mailbox.inbox_receive('orders', 'c', '{}')")  # duplicate: nothing new
    db.execute(
        "SELECT count(*) FROM mailbox.inbox_receive_batch('orders', %s)",
        [Jsonb([{"p_event_id": "d"}])],
    )
    assert notes(listener) == ["orders", "orders"]
    # w1 finds messages again: busy, it no longer waits, and receivers stop notifying
    assert len(rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w1', 10)")) == 2
    assert waiters(db) == [("other", "w2")]
    db.execute("SELECT mailbox.inbox_receive('orders', 'e', '{}')")
    assert notes(listener) == []
    # a wait ends by itself: an expired one wakes nobody, and maintenance forgets it
    db.execute("SELECT mailbox.inbox_receive('other', 'x', '{}')")
    assert notes(listener) == ["other"]
    db.execute("UPDATE mailbox._inbox_waiter SET waiting_until = now() - interval '1 second'")
    db.execute("SELECT mailbox.inbox_receive('other', 'y', '{}')")
    assert notes(listener) == []
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_waits_expired'") == 1
    assert waiters(db) == []


def waiter_reads(db, sql, args=()):
    """Runs sql in a transaction of its own; how many scans of _inbox_waiter it made (the
    difference inside the transaction: PostgreSQL 15's xact counters of scans are not reset
    when a transaction ends, only when the backend next reports its statistics)."""
    scans = (
        "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_xact_all_tables"
        " WHERE relid = 'mailbox._inbox_waiter'::regclass"
    )
    with db.transaction():
        before = scalar(db, scans)
        db.execute(sql, args)
        return scalar(db, scans) - before


BOUND = "SELECT pg_sequence_last_value('mailbox._inbox_waiting_until')"


def test_a_receive_looks_for_waiters_only_before_the_bound_every_wait_raises(orders, connect):
    db = orders
    listener = connect()
    listener.execute("LISTEN mailbox_inbox_new")
    receive = "SELECT mailbox.inbox_receive('orders', %s, '{}')"
    # no worker has ever waited: the named receive reads the bound, not the waiter table
    assert scalar(db, BOUND) is None
    assert waiter_reads(db, receive, ["a"]) == 0
    worker = connect()
    worker.execute("SET mailbox.consumer_heartbeat_timeout_seconds = 5")
    assert len(rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w', 10)")) == 1
    clock = "SELECT extract(epoch FROM clock_timestamp())::float8"
    before = scalar(db, clock)
    assert rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w', 10)") == []
    after = scalar(db, clock)
    # the wait (5 s) raised the bound 70 s past the moment it was recorded: past the end of
    # any wait (60 s at most) that began by then, whatever its worker's timeout
    assert before + 69 < scalar(db, BOUND) <= after + 71
    # a new message before the bound: the receive looks, finds the wait and notifies
    assert waiter_reads(db, receive, ["b"]) > 0
    assert notes(listener) == ["orders"]
    # a duplicate stores nothing and looks for no one
    assert waiter_reads(db, receive, ["b"]) == 0
    # a wait never lowers the bound
    far = int(scalar(db, clock)) + 1000
    db.execute("SELECT setval('mailbox._inbox_waiting_until', %s)", [far])
    rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w', 10)")
    assert scalar(db, BOUND) == far
    # two waits racing: the read and the setval are not atomic, so the later setval wins even
    # if it is the lower. Here a 60 s wait's raise is lost (set back), and a 1 s wait records
    # after it: the bound still covers the 60 s wait (a review found the bound of a 1 s wait
    # an end time short, and a wait whose end time was read before its upsert waited)
    other = connect()
    assert rows(other, "SELECT * FROM mailbox.inbox_claim('orders', 'w60', 10)") == []
    db.execute("SELECT setval('mailbox._inbox_waiting_until', 1)")
    worker.execute("SET mailbox.consumer_heartbeat_timeout_seconds = 1")
    rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w', 10)")
    end60 = scalar(
        db,
        "SELECT extract(epoch FROM waiting_until)::float8 FROM mailbox._inbox_waiter"
        " WHERE worker = 'w60'",
    )
    assert scalar(db, BOUND) > end60
    assert waiter_reads(db, receive, ["c0"]) > 0
    assert notes(listener) == ["orders"]
    # past the bound no worker can still wait (it is set back here to show that the bound
    # alone decides): the receive does not look, even at a recorded wait, and notifies no one
    db.execute("SELECT setval('mailbox._inbox_waiting_until', 1)")
    assert waiter_reads(db, receive, ["c"]) == 0
    assert notes(listener) == []


def test_a_wait_lasts_the_heartbeat_timeout_at_most_60_seconds_and_drop_forgets_it(orders, connect):
    db = orders
    worker = connect()
    assert rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w', 10)") == []
    left = scalar(db, "SELECT extract(epoch FROM waiting_until - now()) FROM mailbox._inbox_waiter")
    assert 55 < left <= 61
    worker.execute("SET mailbox.consumer_heartbeat_timeout_seconds = 5")
    assert rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'w', 10)") == []
    left = scalar(db, "SELECT extract(epoch FROM waiting_until - now()) FROM mailbox._inbox_waiter")
    assert 0 < left <= 6
    db.execute("SELECT mailbox.drop_inbox('orders', false, true)")
    assert waiters(db) == []


def test_an_ordered_or_repeatable_read_claim_records_and_clears_its_wait(orders, connect):
    db = orders
    worker = connect(autocommit=False)
    worker.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'rr', 10)") == []
    worker.commit()
    assert waiters(db) == [("orders", "rr")]
    db.execute("SELECT mailbox.inbox_receive('orders', 'm', '{}')")
    worker.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert len(rows(worker, "SELECT * FROM mailbox.inbox_claim('orders', 'rr', 10)")) == 1
    worker.commit()
    assert waiters(db) == []


def test_four_connections_receiving_the_same_ids_store_each_once(orders, connect):
    ids = [f"dup-{i}" for i in range(300)]
    conns = [connect() for _ in range(4)]
    barrier = threading.Barrier(4)
    results = [None] * 4
    errors = []

    def worker(n):
        try:
            barrier.wait(timeout=10)
            # each connection walks the ids in a different order to maximise collisions
            order = ids if n % 2 == 0 else list(reversed(ids))
            results[n] = {
                i: scalar(
                    conns[n],
                    "SELECT mailbox.inbox_receive('orders', %s, %s)",
                    [i, f'{{"from": {n}}}'],
                )
                for i in order
            }
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    for i in ids:
        assert sum(r[i] for r in results) == 1, i
    assert scalar(orders, "SELECT count(*) FROM mailbox.orders") == len(ids)


@pytest.mark.parametrize("outcome, second_returns", [("commit", False), ("rollback", True)])
def test_a_duplicate_waits_for_the_first_writers_transaction(
    orders, connect, outcome, second_returns
):
    first, second = connect(autocommit=False), connect()
    assert scalar(first, "SELECT mailbox.inbox_receive('orders', 'x1', '{}')") is True
    pid = scalar(second, "SELECT pg_backend_pid()")
    result = {}
    t = threading.Thread(
        target=lambda: result.setdefault(
            "v", scalar(second, "SELECT mailbox.inbox_receive('orders', 'x1', '{}')")
        )
    )
    t.start()
    # the second receive must be waiting on the first transaction, not done
    for _ in range(100):
        if (
            scalar(orders, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
            == "Lock"
        ):
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail("second receive never waited for the first transaction")
    assert "v" not in result
    getattr(first, outcome)()
    t.join(timeout=10)
    assert result["v"] is second_returns
    assert scalar(orders, "SELECT count(*) FROM mailbox.orders") == 1


def test_a_priority_outside_a_smallint_column_names_p_priority(orders, db):
    db = orders
    for bad in (40000, -40000):
        with raises("22023") as info:
            db.execute("SELECT mailbox.inbox_receive('orders', 'p', '{}', p_priority => %s)", [bad])
        assert "p_priority" in str(info.value) and info.value.diag.message_hint.startswith(
            "p_priority is -32768 to 32767"
        )
    assert scalar(db, "SELECT mailbox.inbox_receive('orders', 'p', '{}', p_priority => 32767)")
    # an adopted table's integer column takes every int
    db.execute(
        "CREATE TABLE public.wide (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int, received_at timestamptz, priority int)"
    )
    db.execute("SELECT mailbox.enable_inbox_tracking('wide', 'public.wide')")
    assert scalar(db, "SELECT mailbox.inbox_receive('wide', 'p', NULL, p_priority => 40000)")


def test_an_event_id_over_1000_bytes_names_p_event_id(orders):
    db = orders
    with raises("22023") as info:
        db.execute("SELECT mailbox.inbox_receive('orders', repeat('x', 1024 * 1024), '{}')")
    assert "p_event_id" in str(info.value) and "1000 bytes" in info.value.diag.message_hint
    with raises("22023"):  # bytes, not characters
        db.execute("SELECT mailbox.inbox_receive('orders', repeat('é', 501), '{}')")
    assert scalar(db, "SELECT mailbox.inbox_receive('orders', repeat('x', 1000), '{}')")
    assert scalar(db, "SELECT count(*) FROM mailbox.orders") == 1
