"""enable_outbox: statement-level capture into an outbox (SPEC §1.1)."""

import time

import psycopg
import pytest
from mbx import drop_role, last_offset, make_role, outbox_rows, raises, rows, scalar, sequence


@pytest.fixture
def orders(db):
    db.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text, amount numeric)")
    assert scalar(db, "SELECT mailbox.enable_outbox('public.orders')") == "orders"
    return db


def delta(db, outbox, outbox_id):
    return rows(
        db,
        "SELECT row_num, op, payload FROM mailbox.outbox_delta_rows(%s, %s, 0, 1000000)",
        [outbox, outbox_id],
    )


def test_insert_update_delete_are_captured_inline(orders):
    db = orders
    db.execute("INSERT INTO orders VALUES (1, 'ann', 10), (2, 'bob', 20)")
    db.execute("UPDATE orders SET amount = amount + 1 WHERE id = 1")
    db.execute("DELETE FROM orders WHERE id = 2")
    got = outbox_rows(db, "orders")
    assert [r["event_type"] for r in got] == ["INSERT", "UPDATE", "DELETE"]
    ins, upd, dele = (r["payload"] for r in got)
    assert ins == {
        "v": 1,
        "source": "public.orders",
        "op": "INSERT",
        "deleted": [],
        "inserted": [
            {"id": 1, "customer": "ann", "amount": 10},
            {"id": 2, "customer": "bob", "amount": 20},
        ],
    }
    assert upd["deleted"] == [{"id": 1, "customer": "ann", "amount": 10}]
    assert upd["inserted"] == [{"id": 1, "customer": "ann", "amount": 11}]
    assert dele["deleted"] == [{"id": 2, "customer": "bob", "amount": 20}]
    assert dele["inserted"] == []
    assert [(r["inserted_count"], r["deleted_count"]) for r in got] == [(2, 0), (1, 1), (0, 1)]
    assert all(
        r["source"] == "public.orders" and not r["is_claim_check"] and not r["full_refresh"]
        for r in got
    )
    assert len({r["event_id"] for r in got}) == 3


def test_statement_changing_no_rows_writes_nothing(orders):
    db = orders
    db.execute("DELETE FROM orders WHERE false")
    db.execute("UPDATE orders SET amount = 0 WHERE id = -1")
    assert outbox_rows(db, "orders") == []
    db.execute("SET mailbox.outbox_skip_empty_delta = off")
    db.execute("DELETE FROM orders WHERE false")
    (row,) = outbox_rows(db, "orders")
    assert row["payload"]["deleted"] == [] and row["deleted_count"] == 0


@pytest.mark.parametrize("threshold", [1, 5])
def test_threshold_is_inline_and_one_more_is_claim_check(orders, threshold):
    db = orders
    db.execute(f"SET mailbox.outbox_inline_threshold_rows = {threshold}")
    db.execute("INSERT INTO orders SELECT g, 'c', g FROM generate_series(1, %s) g", [threshold])
    db.execute(
        "INSERT INTO orders SELECT g, 'c', g FROM generate_series(1001, 1001 + %s) g", [threshold]
    )
    inline, claim = outbox_rows(db, "orders")
    assert not inline["is_claim_check"] and len(inline["payload"]["inserted"]) == threshold
    assert claim["is_claim_check"]
    assert claim["payload"] == {
        "v": 1,
        "claim_check": True,
        "source": "public.orders",
        "op": "INSERT",
        "inserted_count": threshold + 1,
        "deleted_count": 0,
    }
    sequence(db, "orders")
    offset = last_offset(db, "orders", claim_check_only=True)
    got = delta(db, "orders", offset)
    assert [r[0] for r in got] == list(range(1, threshold + 2))
    assert {r[1] for r in got} == {"I"}
    assert sorted(r[2]["id"] for r in got) == list(range(1001, 1002 + threshold))


def test_update_counts_twice_and_claim_check_keeps_old_then_new(orders):
    db = orders
    db.execute("INSERT INTO orders SELECT g, 'c', g FROM generate_series(1, 3) g")
    db.execute("SET mailbox.outbox_inline_threshold_rows = 5")  # an UPDATE of 3 rows counts 6
    db.execute("UPDATE orders SET amount = amount * 10")
    upd = outbox_rows(db, "orders")[-1]
    assert upd["is_claim_check"] and (upd["inserted_count"], upd["deleted_count"]) == (3, 3)
    sequence(db, "orders")
    got = delta(db, "orders", last_offset(db, "orders"))
    assert [(n, op) for n, op, _ in got] == [
        (1, "D"),
        (2, "D"),
        (3, "D"),
        (4, "I"),
        (5, "I"),
        (6, "I"),
    ]
    assert sorted(p["amount"] for _, op, p in got if op == "D") == [1, 2, 3]
    assert sorted(p["amount"] for _, op, p in got if op == "I") == [10, 20, 30]


def test_per_outbox_threshold_overrides_the_setting(db):
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t', p_inline_threshold_rows => 2)")
    db.execute("SET mailbox.outbox_inline_threshold_rows = 100")
    db.execute("INSERT INTO t SELECT generate_series(1, 3)")
    assert outbox_rows(db, "t")[0]["is_claim_check"]


def test_truncate_writes_a_full_refresh_row_and_alert(orders):
    db = orders
    db.execute("INSERT INTO orders VALUES (1, 'a', 1)")
    db.execute("TRUNCATE orders")
    row = outbox_rows(db, "orders")[-1]
    assert row["full_refresh"] and row["event_type"] == "TRUNCATE"
    assert row["payload"] == {
        "v": 1,
        "source": "public.orders",
        "op": "TRUNCATE",
        "full_refresh": True,
        "inserted": [],
        "deleted": [],
    }
    alert = scalar(db, "SELECT payload FROM mailbox.alert_log WHERE event = 'outbox_full_refresh'")
    assert alert["outbox"] == "orders" and alert["op"] == "TRUNCATE"


def test_snapshot_inline_and_claim_check(orders):
    db = orders
    db.execute("INSERT INTO orders SELECT g, 'c', g FROM generate_series(1, 3) g")
    assert scalar(db, "SELECT mailbox.outbox_snapshot('orders')") == 3
    snap = outbox_rows(db, "orders")[-1]
    assert snap["full_refresh"] and snap["event_type"] == "SNAPSHOT"
    assert snap["payload"]["op"] == "SNAPSHOT" and snap["payload"]["deleted"] == []
    assert sorted(r["id"] for r in snap["payload"]["inserted"]) == [1, 2, 3]

    db.execute("SET mailbox.outbox_inline_threshold_rows = 2")
    assert scalar(db, "SELECT mailbox.outbox_snapshot('orders')") == 3
    snap = outbox_rows(db, "orders")[-1]
    assert snap["is_claim_check"] and snap["full_refresh"]
    assert snap["payload"]["inserted_count"] == 3
    sequence(db, "orders")
    got = delta(db, "orders", last_offset(db, "orders"))
    assert sorted(p["id"] for _, _, p in got) == [1, 2, 3]


def test_initial_snapshot(db):
    db.execute("CREATE TABLE t (id int)")
    db.execute("INSERT INTO t SELECT generate_series(1, 4)")
    db.execute("SELECT mailbox.enable_outbox('t', p_initial_snapshot => true)")
    (snap,) = outbox_rows(db, "t")
    assert snap["event_type"] == "SNAPSHOT" and snap["inserted_count"] == 4 and snap["full_refresh"]


def test_snapshot_of_published_outbox_is_rejected(db):
    db.execute("SELECT mailbox.create_outbox('events')")
    with raises("55000"):
        db.execute("SELECT mailbox.outbox_snapshot('events')")
    with raises("42704"):
        db.execute("SELECT mailbox.outbox_snapshot('nope')")


def test_rollback_leaves_no_outbox_row_and_no_delta_row(orders, connect):
    db = orders
    db.execute("SET mailbox.outbox_inline_threshold_rows = 1")
    conn = connect(autocommit=False)
    conn.execute("SET mailbox.outbox_inline_threshold_rows = 1")
    conn.execute("INSERT INTO orders VALUES (1, 'a', 1)")
    conn.execute("INSERT INTO orders SELECT g, 'c', g FROM generate_series(10, 20) g")
    conn.rollback()
    assert outbox_rows(db, "orders") == []
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows_orders") == 0


def test_rolled_back_savepoint_leaves_nothing_for_its_statements(orders, connect):
    db = orders
    conn = connect(autocommit=False)
    conn.execute("SET mailbox.outbox_inline_threshold_rows = 1")
    conn.execute("INSERT INTO orders VALUES (1, 'kept', 1)")
    conn.execute("SAVEPOINT s")
    conn.execute("INSERT INTO orders SELECT g, 'gone', g FROM generate_series(10, 20) g")
    conn.execute("UPDATE orders SET customer = 'gone' WHERE id = 1")
    conn.execute("ROLLBACK TO SAVEPOINT s")
    conn.commit()
    (row,) = outbox_rows(db, "orders")
    assert row["payload"]["inserted"] == [{"id": 1, "customer": "kept", "amount": 1}]
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows_orders") == 0


def test_rows_exist_only_once_producer_commits(orders, connect):
    db = orders
    producer = connect(autocommit=False)
    producer.execute("INSERT INTO orders VALUES (1, 'a', 1)")
    assert outbox_rows(db, "orders") == []  # not visible before commit
    producer.commit()
    assert len(outbox_rows(db, "orders")) == 1


def test_hundred_thousand_row_statement_is_one_claim_check_row(orders):
    db = orders
    started = time.monotonic()
    db.execute("INSERT INTO orders SELECT g, 'bulk', g FROM generate_series(1, 100000) g")
    elapsed = time.monotonic() - started
    (row,) = outbox_rows(db, "orders")
    assert row["is_claim_check"] and row["inserted_count"] == 100000
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows_orders") == 100000
    assert (
        scalar(db, "SELECT count(DISTINCT row_num) FROM mailbox.outbox_delta_rows_orders") == 100000
    )
    # generous bound: this is a 'does not blow up' check, not a benchmark (see bench/)
    assert elapsed < 60, f"100k-row capture took {elapsed:.1f}s"
    db.execute("UPDATE orders SET amount = 0")
    upd = outbox_rows(db, "orders")[-1]
    assert (upd["inserted_count"], upd["deleted_count"]) == (100000, 100000)
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows_orders") == 300000


def test_partitioned_source_is_captured_at_its_root(db):
    db.execute("CREATE TABLE m (id int, v text) PARTITION BY RANGE (id)")
    db.execute("CREATE TABLE m_1 PARTITION OF m FOR VALUES FROM (0) TO (100)")
    db.execute("CREATE TABLE m_2 PARTITION OF m FOR VALUES FROM (100) TO (200)")
    db.execute("SELECT mailbox.enable_outbox('m')")
    db.execute("INSERT INTO m VALUES (1, 'a'), (150, 'b')")
    (row,) = outbox_rows(db, "m")
    assert row["inserted_count"] == 2


@pytest.fixture
def writer_role(db):
    """A role that may only INSERT into orders: no rights at all on the mailbox schema."""
    db.execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text, amount numeric)")
    db.execute("SELECT mailbox.enable_outbox('public.orders')")
    role = make_role(db)
    db.execute(f'GRANT INSERT ON public.orders TO "{role}"')
    yield role
    drop_role(db, role)


def test_role_with_only_insert_still_produces_outbox_rows(db, connect, writer_role):
    conn = connect()
    conn.execute(f'SET ROLE "{writer_role}"')
    conn.execute("INSERT INTO public.orders VALUES (1, 'x', 1)")
    with raises("42501"):
        conn.execute("SELECT count(*) FROM mailbox.outbox_orders")
    with raises("42501"):
        conn.execute("SELECT mailbox.outbox_publish('orders', '{}')")
    assert len(outbox_rows(db, "orders")) == 1


def test_outbox_name_is_derived_from_the_table(db):
    long = "t" * 45
    db.execute(f"CREATE TABLE {long} (id int)")
    got = scalar(db, "SELECT mailbox.enable_outbox(%s)", [long])
    digest = scalar(db, "SELECT left(md5(%s), 7)", [f"public.{long}"])
    assert got == "t" * 32 + "_" + digest
    db.execute("CREATE SCHEMA other")
    db.execute("CREATE TABLE other.orders (id int)")
    db.execute("CREATE TABLE public.orders (id int)")
    assert scalar(db, "SELECT mailbox.enable_outbox('public.orders')") == "orders"
    digest = scalar(db, "SELECT left(md5('other.orders'), 7)")
    assert scalar(db, "SELECT mailbox.enable_outbox('other.orders')") == "orders_" + digest
    db.execute('CREATE TABLE "Mixed Case" (id int)')
    assert scalar(db, """SELECT mailbox.enable_outbox('"Mixed Case"')""") == "mixed_case"


def test_derived_names_of_odd_table_names_and_42710_when_even_the_hashed_one_is_taken(db):
    db.execute('CREATE TABLE "2024_sales" (id int)')
    assert scalar(db, """SELECT mailbox.enable_outbox('"2024_sales"')""") == "_2024_sales"
    db.execute('CREATE TABLE "ünïcode" (id int)')
    assert scalar(db, """SELECT mailbox.enable_outbox('"ünïcode"')""") == "_n_code"
    db.execute("CREATE SCHEMA s2")
    db.execute("CREATE TABLE s2.orders (id int)")
    hashed = "orders_" + scalar(db, "SELECT left(md5('s2.orders'), 7)")
    db.execute("SELECT mailbox.create_outbox('orders')")
    db.execute("SELECT mailbox.create_outbox(%s)", [hashed])
    with raises("42710") as e:
        db.execute("SELECT mailbox.enable_outbox('s2.orders')")
    assert e.value.diag.message_primary == f"outbox already exists: {hashed}"
    assert e.value.diag.message_hint == "Pass p_outbox_name to choose another name."
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes") == 4  # nothing half-made


def test_explicit_outbox_name(db):
    db.execute("CREATE TABLE t (id int)")
    assert scalar(db, "SELECT mailbox.enable_outbox('t', p_outbox_name => 'my_t')") == "my_t"
    db.execute("INSERT INTO t VALUES (1)")
    assert len(outbox_rows(db, "my_t")) == 1


def test_capture_survives_psycopg_pipeline_of_statements(orders):
    # many small statements in one transaction: one outbox row each, in order
    db = orders
    with db.transaction():
        for i in range(50):
            db.execute("INSERT INTO orders VALUES (%s, 'p', %s)", [i, i])
    got = outbox_rows(db, "orders")
    assert [r["payload"]["inserted"][0]["id"] for r in got] == list(range(50))


def test_dropped_source_keeps_outbox_until_dropped(db):
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t')")
    db.execute("INSERT INTO t VALUES (1)")
    db.execute("DROP TABLE t")
    assert scalar(db, "SELECT enabled FROM mailbox.outboxes WHERE outbox_name = 't'") is False
    assert len(outbox_rows(db, "t")) == 1
    db.execute("SELECT mailbox.drop_outbox('t')")
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes") == 0


def test_capture_trigger_uses_no_caller_search_path(orders, connect):
    conn = connect()
    conn.execute("CREATE SCHEMA evil")
    conn.execute(
        "CREATE FUNCTION evil.to_jsonb(anyelement) RETURNS jsonb"
        " LANGUAGE sql AS $$ SELECT '{\"evil\": true}'::jsonb $$"
    )
    conn.execute(
        "CREATE FUNCTION evil.count(anyelement) RETURNS bigint"
        " LANGUAGE sql AS $$ SELECT 0::bigint $$"
    )
    conn.execute("SET search_path = evil, pg_catalog, public")
    conn.execute("INSERT INTO orders VALUES (1, 'a', 1)")
    (row,) = outbox_rows(orders, "orders")
    assert row["payload"]["inserted"] == [{"id": 1, "customer": "a", "amount": 1}]


def test_error_in_capture_rolls_back_the_write(orders, connect):
    conn = connect()
    conn.execute("SET mailbox.outbox_inline_threshold_rows = 'lots'")
    with raises("22023") as info:
        conn.execute("INSERT INTO orders VALUES (1, 'a', 1)")
    assert "mailbox.outbox_inline_threshold_rows" in str(info.value)
    assert scalar(orders, "SELECT count(*) FROM orders") == 0
    assert isinstance(info.value, psycopg.Error)
