"""Capture and snapshots run the captured table's code with its owner's or the caller's
rights, never the extension owner's (docs/security.md, "Whose rights run what")."""

import pytest
from mbx import drop_role, raises, rows, scalar

# A cast to json runs inside to_jsonb; this one reports who ran it and tries to escalate.
EVIL_CAST = """
CREATE TYPE mood AS ENUM ('ok', 'sad');
CREATE TABLE ran_as (who text, superuser boolean);
GRANT INSERT ON ran_as TO PUBLIC;
CREATE FUNCTION mood_json(mood) RETURNS json LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.ran_as VALUES (current_user,
        (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user));
    BEGIN
        EXECUTE format('ALTER ROLE %I SUPERUSER', session_user);
    EXCEPTION WHEN OTHERS THEN NULL;
    END;
    RETURN to_json($1::text);
END
$f$;
CREATE CAST (mood AS json) WITH FUNCTION mood_json(mood);
CREATE TABLE orders (id int PRIMARY KEY, m mood);
"""


@pytest.fixture
def tenant(db):
    """A login role owning public objects, with mailbox_admin (the review's attacker)."""
    name = "tenant_" + str(abs(hash(db.info.dbname)) % 10**8)
    db.execute(f'CREATE ROLE "{name}" LOGIN')
    db.execute(f'GRANT mailbox_admin TO "{name}"')
    db.execute(f'GRANT CREATE ON SCHEMA public TO "{name}"')
    yield name
    db.execute("DROP CAST IF EXISTS (mood AS json)")  # casts have no owner for DROP OWNED
    drop_role(db, name)


def as_role(connect, role):
    conn = connect()
    conn.execute(f'SET ROLE "{role}"')
    return conn


def assert_not_superuser(db, role):
    assert scalar(db, "SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role]) is False


@pytest.mark.parametrize("threshold", [100, 1], ids=["inline", "claim_check"])
def test_cast_in_a_captured_table_runs_as_the_table_owner(db, connect, tenant, threshold):
    conn = as_role(connect, tenant)
    conn.execute(EVIL_CAST)
    conn.execute(
        "SELECT mailbox.enable_outbox('public.orders', p_inline_threshold_rows => %s)", [threshold]
    )
    conn.execute("INSERT INTO orders VALUES (1, 'ok'), (2, 'sad')")
    conn.execute("UPDATE orders SET m = 'sad'")
    conn.execute("DELETE FROM orders")
    assert_not_superuser(db, tenant)
    assert set(rows(db, "SELECT DISTINCT who, superuser FROM ran_as")) == {(tenant, False)}
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_orders") == 3


def test_a_writer_without_mailbox_roles_still_captures(db, connect, tenant):
    conn = as_role(connect, tenant)
    conn.execute(EVIL_CAST)
    conn.execute("SELECT mailbox.enable_outbox('public.orders')")
    db.execute("CREATE ROLE plain_writer LOGIN")
    try:
        db.execute("GRANT INSERT ON orders TO plain_writer")
        writer = as_role(connect, "plain_writer")
        writer.execute("INSERT INTO orders VALUES (7, 'ok')")
        payload = scalar(db, "SELECT payload FROM mailbox.outbox_orders")
        assert payload["inserted"] == [{"id": 7, "m": "ok"}]
        # the cast ran as the table owner, not as the writer and never as the superuser
        assert rows(db, "SELECT who FROM ran_as") == [(tenant,)]
    finally:
        db.execute("DROP OWNED BY plain_writer")
        db.execute("DROP ROLE plain_writer")


@pytest.mark.parametrize("threshold", [100, 1], ids=["inline", "claim_check"])
def test_snapshot_reads_the_table_as_its_owner(db, connect, tenant, threshold):
    conn = as_role(connect, tenant)
    conn.execute(EVIL_CAST)
    conn.execute("INSERT INTO orders VALUES (1, 'ok'), (2, 'sad'), (3, 'ok')")
    conn.execute(
        "SELECT mailbox.enable_outbox('public.orders', p_inline_threshold_rows => %s,"
        " p_initial_snapshot => true)",
        [threshold],
    )
    assert scalar(conn, "SELECT mailbox.outbox_snapshot('orders')") == 3
    assert_not_superuser(db, tenant)
    assert set(rows(db, "SELECT DISTINCT who FROM ran_as")) == {(tenant,)}
    got = rows(
        db,
        "SELECT is_claim_check, inserted_count FROM mailbox.outbox_orders"
        " WHERE event_type = 'SNAPSHOT'",
    )
    assert got == [(threshold == 1, 3)] * 2
    if threshold == 1:
        assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows_orders") == 6


def test_large_claim_check_snapshot_is_written_in_pages(db):
    db.execute("CREATE TABLE big (id int PRIMARY KEY)")
    db.execute("INSERT INTO big SELECT generate_series(1, 2500)")
    db.execute("SELECT mailbox.enable_outbox('big', p_inline_threshold_rows => 10)")
    assert scalar(db, "SELECT mailbox.outbox_snapshot('big')") == 2500
    got = rows(
        db, "SELECT row_num, payload->>'id' FROM mailbox.outbox_delta_rows_big ORDER BY row_num"
    )
    assert [r[0] for r in got] == list(range(1, 2501))
    assert sorted(int(r[1]) for r in got) == list(range(1, 2501))


def test_an_admin_snapshot_runs_the_owners_cast_as_the_owner(db, connect, tenant):
    """The admin who takes a snapshot lends the table owner none of its rights."""
    conn = as_role(connect, tenant)
    conn.execute(EVIL_CAST)
    conn.execute("INSERT INTO orders VALUES (1, 'ok')")
    conn.execute("SELECT mailbox.enable_outbox('public.orders')")
    conn.execute("GRANT SELECT ON orders TO PUBLIC")
    db.execute("CREATE ROLE snap_admin LOGIN")
    try:
        db.execute("GRANT mailbox_admin TO snap_admin")
        admin = as_role(connect, "snap_admin")
        assert scalar(admin, "SELECT mailbox.outbox_snapshot('orders')") == 1
        assert rows(db, "SELECT DISTINCT who FROM ran_as") == [(tenant,)]
    finally:
        db.execute("DROP OWNED BY snap_admin")
        db.execute("DROP ROLE snap_admin")


def test_a_snapshot_is_refused_to_a_caller_restricted_by_row_security(db, connect, tenant):
    for table in ("docs", "notes"):
        db.execute(f"CREATE TABLE {table} (id int, team text)")
        db.execute(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b')")
        db.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        db.execute(f"CREATE POLICY team_a ON {table} USING (team = 'a')")
        db.execute(f'GRANT SELECT, TRIGGER ON {table} TO "{tenant}"')
    db.execute("SELECT mailbox.enable_outbox('docs')")
    conn = as_role(connect, tenant)
    with raises("42501") as info:
        conn.execute("SELECT mailbox.outbox_snapshot('docs')")
    assert "row-level security" in str(info.value)
    with raises("42501"):
        conn.execute("SELECT mailbox.enable_outbox('notes', p_initial_snapshot => true)")
    assert scalar(db, "SELECT count(*) FROM mailbox.outboxes WHERE outbox_name = 'notes'") == 0
    # the owner (here the superuser) takes it, whole
    assert scalar(db, "SELECT mailbox.outbox_snapshot('docs')") == 2


def test_capture_refuses_to_run_for_a_new_owner_until_repaired(db, connect, tenant):
    db.execute("CREATE TABLE orders (id int)")
    db.execute("SELECT mailbox.enable_outbox('orders')")
    db.execute(f'ALTER TABLE orders OWNER TO "{tenant}"')
    with raises("55000") as info:
        db.execute("INSERT INTO orders VALUES (1)")
    assert "repair_outbox_capture('orders')" in str(info.value)
    assert scalar(db, "SELECT enabled FROM mailbox.outboxes") is True
    conn = as_role(connect, tenant)
    conn.execute("SELECT mailbox.repair_outbox_capture('orders')")
    db.execute("INSERT INTO orders VALUES (1)")
    # and back: the previous owner keeps no right on the outbox
    db.execute("CREATE ROLE first_owner")
    try:
        db.execute(f'GRANT first_owner TO "{tenant}"')
        db.execute("ALTER TABLE orders OWNER TO first_owner")
        conn.execute("SELECT mailbox.repair_outbox_capture('orders')")
        db.execute(f'ALTER TABLE orders OWNER TO "{tenant}"')
        conn.execute("SELECT mailbox.repair_outbox_capture('orders')")
        db.execute("INSERT INTO orders VALUES (2)")
        assert not scalar(
            db,
            "SELECT has_any_column_privilege('first_owner', 'mailbox._outbox_log_orders',"
            " 'INSERT')",
        )
        assert scalar(
            db,
            "SELECT has_any_column_privilege(%s, 'mailbox._outbox_log_orders', 'INSERT')",
            [tenant],
        )
    finally:
        db.execute("DROP OWNED BY first_owner")
        db.execute("DROP ROLE first_owner")
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_orders") == 2
    owner = scalar(
        db,
        "SELECT proowner::regrole::text FROM pg_proc WHERE proname LIKE '\\_outbox\\_%\\_capture'",
    )
    assert owner == f"{tenant}"


def test_repair_needs_an_outbox_with_a_table(db):
    db.execute("SELECT mailbox.create_outbox('events')")
    with raises("55000"):
        db.execute("SELECT mailbox.repair_outbox_capture('events')")
    with raises("42704"):
        db.execute("SELECT mailbox.repair_outbox_capture('nope')")


def test_table_owner_may_write_only_its_own_outbox(db, connect, tenant):
    conn = as_role(connect, tenant)
    conn.execute("CREATE TABLE mine (id int)")
    conn.execute("SELECT mailbox.enable_outbox('mine')")
    db.execute("SELECT mailbox.create_outbox('other')")
    db.execute(f'REVOKE mailbox_admin FROM "{tenant}"')
    owner = as_role(connect, tenant)
    with raises("42501"):
        owner.execute(
            "INSERT INTO mailbox._outbox_log_other (outbox_key, payload) VALUES (2, '{}')"
        )
    with raises("42501"):
        owner.execute("INSERT INTO mailbox._outbox_log (outbox_key, payload) VALUES (2, '{}')")
    with raises("42501"):  # offsets and row keys always come from their defaults
        owner.execute(
            "INSERT INTO mailbox._outbox_log_mine (outbox_key, payload, _xid) VALUES (1, '{}', '1')"
        )
    for relation in ("mailbox._outbox_log_mine", "mailbox.outbox_mine"):
        with raises("42501"):
            owner.execute(f"SELECT payload FROM {relation}")


@pytest.mark.parametrize(
    ("held", "missing"),
    [("SELECT", "TRIGGER"), ("TRIGGER", "SELECT")],
    ids=["select_only", "trigger_only"],
)
def test_capture_needs_select_and_trigger(db, connect, tenant, held, missing):
    db.execute("CREATE TABLE secret (id int)")
    db.execute(f'GRANT {held} ON secret TO "{tenant}"')
    conn = as_role(connect, tenant)
    with raises("42501") as info:
        conn.execute("SELECT mailbox.enable_outbox('public.secret')")
    assert f"lacks {missing}" in str(info.value)
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox") == 0


def test_an_owner_who_alters_its_row_reader_gets_no_snapshot(db, connect, tenant):
    """The owner owns its snapshot row reader and may ALTER it; made SECURITY INVOKER it would
    run the owner's casts as the extension owner, so the snapshot refuses it."""
    conn = as_role(connect, tenant)
    conn.execute(EVIL_CAST)
    conn.execute("INSERT INTO orders VALUES (1, 'ok')")
    conn.execute("SELECT mailbox.enable_outbox('public.orders')")
    reader = scalar(
        db, "SELECT oid::regprocedure::text FROM pg_proc WHERE proname LIKE '\\_outbox\\_%\\_rows'"
    )
    conn.execute(f"ALTER FUNCTION {reader} SECURITY INVOKER")
    with raises("55000") as info:
        db.execute("SELECT mailbox.outbox_snapshot('orders')")
    assert "repair_outbox_capture" in str(info.value)
    assert scalar(db, "SELECT count(*) FROM ran_as") == 0
    assert_not_superuser(db, tenant)
    conn.execute("SELECT mailbox.repair_outbox_capture('orders')")
    assert scalar(db, "SELECT mailbox.outbox_snapshot('orders')") == 1
    assert rows(db, "SELECT DISTINCT who FROM ran_as") == [(tenant,)]
