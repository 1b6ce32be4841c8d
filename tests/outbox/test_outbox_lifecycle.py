"""Bad input, disable_outbox/drop_outbox and DROP EXTENSION leave nothing behind (SPEC §0, §1)."""

import threading

import psycopg
import pytest
from mbx import raises, rows, scalar

BAD_NAMES = [
    "o'brien",
    'quo"te',
    "semi;colon",
    "has space",
    "UpperCase",
    "x" * 41,
    "é" * 20 + "x",
    "",
    "1starts_with_digit",
    "dash-ed",
]

# Every object a user could notice: relations, triggers, functions, types, constraints.
OBJECTS_SQL = """
SELECT 'rel ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
   AND n.nspname NOT LIKE 'pg_temp%%' AND n.nspname NOT LIKE 'pg_toast_temp%%'
UNION ALL
SELECT 'trigger ' || tgrelid::regclass || ' ' || tgname FROM pg_trigger WHERE NOT tgisinternal
UNION ALL
SELECT 'proc ' || p.oid::regprocedure FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
UNION ALL
SELECT 'type ' || t.oid::regtype FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
   AND n.nspname NOT LIKE 'pg_temp%%'
UNION ALL
SELECT 'constraint ' || conrelid::regclass || ' ' || conname FROM pg_constraint
 WHERE connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
UNION ALL
SELECT 'schema ' || nspname FROM pg_namespace
 WHERE nspname NOT LIKE 'pg_%%' AND nspname <> 'information_schema'
"""


def objects(conn):
    return {r[0] for r in rows(conn, OBJECTS_SQL)}


def catalog_counts(conn):
    return rows(
        conn,
        "SELECT (SELECT count(*) FROM mailbox._outbox), (SELECT count(*) FROM mailbox._outbox_log)",
    )


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_outbox_names_are_rejected_and_create_nothing(db, name):
    db.execute("CREATE TABLE t (id int)")
    before = objects(db)
    with raises("22023") as info:
        db.execute("SELECT mailbox.create_outbox(%s)", [name])
    assert info.value.diag.message_hint
    with raises("22023"):
        db.execute("SELECT mailbox.enable_outbox('t', p_outbox_name => %s)", [name])
    assert objects(db) == before
    assert catalog_counts(db) == [(0, 0)]


def test_forty_byte_name_is_accepted(db):
    db.execute("SELECT mailbox.create_outbox(%s)", ["x" * 40])
    db.execute("SELECT mailbox.outbox_publish(%s, '{}')", ["x" * 40])


def test_null_names_are_22004(db):
    with raises("22004"):
        db.execute("SELECT mailbox.create_outbox(NULL)")
    with raises("22004"):
        db.execute("SELECT mailbox.enable_outbox(NULL)")
    with raises("22004"):
        db.execute("SELECT mailbox.disable_outbox(NULL)")
    with raises("22004"):
        db.execute("SELECT mailbox.outbox_status(NULL)")


@pytest.mark.parametrize(
    "ddl, target",
    [
        ("CREATE VIEW v AS SELECT 1 AS x", "v"),
        ("CREATE SEQUENCE s", "s"),
        ("CREATE MATERIALIZED VIEW mv AS SELECT 1 AS x", "mv"),
        ("CREATE TYPE ct AS (a int)", "ct"),
    ],
)
def test_enable_outbox_on_a_non_table_is_42809(db, ddl, target):
    db.execute(ddl)
    before = objects(db)
    with raises("42809") as info:
        db.execute("SELECT mailbox.enable_outbox(%s)", [target])
    assert "not a table" in str(info.value)
    assert objects(db) == before


def test_enable_outbox_input_errors(db):
    with raises("42704") as info:
        db.execute("SELECT mailbox.enable_outbox('public.missing')")
    assert "table not found: public.missing" in str(info.value)
    with raises("22023"):
        db.execute("SELECT mailbox.enable_outbox('a b; drop table x')")
    with raises("22023"):
        db.execute("SELECT mailbox.enable_outbox('mailbox._outbox')")
    db.execute("CREATE TEMP TABLE tmp (id int)")
    with raises("22023"):
        db.execute("SELECT mailbox.enable_outbox('tmp')")
    db.execute("CREATE TABLE public.orders (id int)")
    db.execute("SELECT mailbox.enable_outbox('public.orders')")
    before = objects(db)
    with raises("42710") as info:
        db.execute("SELECT mailbox.enable_outbox('public.orders', p_outbox_name => 'other')")
    assert "outbox already enabled for table: public.orders" in str(info.value)
    db.execute("CREATE TABLE o2 (id int)")
    before = objects(db)
    with raises("42710"):
        db.execute("SELECT mailbox.enable_outbox('o2', p_outbox_name => 'orders')")
    assert objects(db) == before


def test_disable_outbox_removes_everything_it_created(db):
    db.execute("CREATE TABLE public.orders (id int PRIMARY KEY)")
    db.execute(
        "CREATE TRIGGER user_trigger BEFORE UPDATE ON orders FOR EACH ROW"
        " EXECUTE FUNCTION suppress_redundant_updates_trigger()"
    )
    before = objects(db)
    db.execute("SELECT mailbox.enable_outbox('public.orders', p_inline_threshold_rows => 1)")
    db.execute("INSERT INTO orders SELECT generate_series(1, 5)")
    db.execute("TRUNCATE orders")
    assert objects(db) != before
    db.execute("SELECT mailbox.disable_outbox('orders')")
    assert objects(db) == before
    assert catalog_counts(db) == [(0, 0)]
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_delta_rows") == 0
    db.execute("INSERT INTO orders VALUES (99)")  # the table works as before, uncaptured
    # and it can be enabled again
    db.execute("SELECT mailbox.enable_outbox('public.orders')")


def test_disable_unknown_outbox(db):
    with raises("42704"):
        db.execute("SELECT mailbox.disable_outbox('nope')")
    with raises("42704"):
        db.execute("SELECT mailbox.drop_outbox('nope')")
    db.execute("SELECT mailbox.disable_outbox('nope', true)")
    db.execute("SELECT mailbox.drop_outbox('nope', p_if_exists => true)")


def test_drop_outbox_of_published_outbox(db):
    before = objects(db)
    db.execute("SELECT mailbox.create_outbox('events')")
    db.execute("SELECT mailbox.outbox_publish('events', '{}')")
    db.execute("SELECT mailbox.drop_outbox('events')")
    assert objects(db) == before


def test_drop_extension_leaves_nothing_behind(fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION plpython3u")
        conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY)")
        before = objects(conn)
        conn.execute("CREATE EXTENSION pg_mailbox")
        conn.execute("SELECT mailbox.enable_outbox('public.orders', p_inline_threshold_rows => 1)")
        conn.execute("SELECT mailbox.create_outbox('events')")
        conn.execute("INSERT INTO orders SELECT generate_series(1, 3)")
        conn.execute("SELECT mailbox.outbox_publish('events', '{}')")
        with raises("2BP01"):  # dependent objects exist: plain DROP refuses, as for any extension
            conn.execute("DROP EXTENSION pg_mailbox")
        conn.execute("DROP EXTENSION pg_mailbox CASCADE")
        # PostgreSQL creates the control file's schema but does not make it an extension
        # member, so the (empty) schema is all that stays; docs/outbox.md says so.
        assert objects(conn) == before | {"schema mailbox"}
        assert (
            scalar(
                conn,
                "SELECT count(*) FROM pg_depend WHERE refclassid = 'pg_extension'::regclass"
                " AND refobjid NOT IN (SELECT oid FROM pg_extension)",
            )
            == 0
        )
        conn.execute("INSERT INTO orders VALUES (42)")
        # and it installs again cleanly
        conn.execute("CREATE EXTENSION pg_mailbox")
        conn.execute("SELECT mailbox.enable_outbox('public.orders')")


def test_drop_extension_without_outboxes_needs_no_cascade(fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_mailbox CASCADE")
        conn.execute("DROP EXTENSION pg_mailbox")
        assert (
            scalar(
                conn,
                "SELECT count(*) FROM pg_class WHERE relnamespace = 'mailbox'::regnamespace"
                " OR oid IN (SELECT objid FROM pg_depend WHERE refobjid = 'mailbox'::regnamespace)",
            )
            == 0
        )
        conn.execute("DROP SCHEMA mailbox")  # empty: RESTRICT succeeds


def test_create_outbox_does_not_wait_for_other_outboxes_producers(db, connect):
    """Partitions are ATTACHed (SHARE UPDATE EXCLUSIVE on the parent), so an open producer
    transaction on one outbox neither blocks nor is blocked by creating another."""
    db.execute("SELECT mailbox.create_outbox('busy')")
    producer = connect(autocommit=False)
    producer.execute("SELECT mailbox.outbox_publish('busy', '{}')")  # stays open
    admin = connect()
    admin.execute("SET lock_timeout = '5s'")
    admin.execute("SELECT mailbox.create_outbox('fresh')")
    admin.execute("SELECT mailbox.outbox_publish('fresh', '{}')")
    producer.commit()
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_log") == 2


def test_concurrent_enable_of_the_same_table_creates_one_outbox(db, connect):
    db.execute("CREATE TABLE t (id int)")
    errors, barrier = [], threading.Barrier(2)

    def enable():
        conn = connect()
        barrier.wait()
        try:
            conn.execute("SELECT mailbox.enable_outbox('t')")
        except psycopg.Error as exc:
            errors.append(exc.sqlstate)

    threads = [threading.Thread(target=enable) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes") == 1
    assert errors == ["42710"]


def test_drop_outbox_gives_up_with_55p03_instead_of_queueing(db, connect):
    """drop_outbox needs the shared log exclusively for a moment; it never waits in the lock
    queue (that would stall every producer behind it): it retries for about two seconds and
    fails cleanly, dropping nothing, then succeeds once producers pause."""
    db.execute("SELECT mailbox.create_outbox('a')")
    db.execute("SELECT mailbox.create_outbox('b')")
    producer = connect(autocommit=False)
    producer.execute("SELECT mailbox.outbox_publish('a', '{}')")  # stays open > 2 s
    with raises("55P03") as info:
        db.execute("SELECT mailbox.drop_outbox('b')")
    assert "outbox log is busy" in str(info.value) and info.value.diag.message_hint
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes WHERE outbox_name = 'b'") == 1
    producer.commit()
    db.execute("SELECT mailbox.drop_outbox('b')")
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes") == 1


def test_snapshot_of_a_dropped_source_table_is_55000(db):
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t')")
    db.execute("DROP TABLE t")
    with raises("55000") as info:
        db.execute("SELECT mailbox.outbox_snapshot('t')")
    assert "source table of outbox t no longer exists" in str(info.value)
