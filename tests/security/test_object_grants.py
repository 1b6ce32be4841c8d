"""Per-object grants: grant_outbox / revoke_outbox / grant_inbox / revoke_inbox and the
object_grants view (the checks in each data-plane function have their own tests)."""

import threading

import psycopg
import pytest
from groups import wait_blocked
from mbx import drop_role, make_role, raises, rows, scalar


@pytest.fixture
def role(db):
    name = make_role(db, "mailbox_consumer")
    yield name
    drop_role(db, name)


def test_grant_and_revoke_outbox(db, role):
    db.execute("SELECT mailbox.create_outbox('events')")
    db.execute("SELECT mailbox.grant_outbox('events', %s, 'consume')", [role])
    db.execute("SELECT mailbox.grant_outbox('events', %s, 'consume')", [role])  # idempotent
    db.execute("SELECT mailbox.grant_outbox('events', %s, 'publish')", [role])
    assert rows(
        db,
        "SELECT object_kind, object_name, grantee::text, privilege"
        " FROM mailbox.object_grants ORDER BY 4",
    ) == [
        ("outbox", "events", role, "consume"),
        ("outbox", "events", role, "publish"),
    ]
    db.execute("SELECT mailbox.revoke_outbox('events', %s, 'consume')", [role])
    db.execute(
        "SELECT mailbox.revoke_outbox('events', %s, 'consume')", [role]
    )  # nothing left: no-op
    assert rows(db, "SELECT privilege FROM mailbox.object_grants") == [("publish",)]


def test_grant_and_revoke_inbox(db, role):
    db.execute("SELECT mailbox.create_inbox('orders_in')")
    db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'process')", [role])
    assert rows(db, "SELECT object_kind, object_name, privilege FROM mailbox.object_grants") == [
        ("inbox", "orders_in", "process")
    ]
    db.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'process')", [role])
    assert scalar(db, "SELECT count(*) FROM mailbox.object_grants") == 0


def has_grants(db, inbox):
    return scalar(db, "SELECT has_grants FROM mailbox._inbox WHERE inbox_name = %s", [inbox])


def test_the_inbox_has_grants_flag_follows_its_grants(db, role):
    """The data plane checks an inbox's grants only when its catalog row says it has some."""
    db.execute("SELECT mailbox.create_inbox('orders_in')")
    assert has_grants(db, "orders_in") is False
    db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'receive')", [role])
    assert has_grants(db, "orders_in") is True
    db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'process')", [role])
    db.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'receive')", [role])
    assert has_grants(db, "orders_in") is True  # process is still granted
    db.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'receive')", [role])  # no-op
    assert has_grants(db, "orders_in") is True
    db.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'process')", [role])
    assert has_grants(db, "orders_in") is False
    # a refused grant changes nothing
    with raises("22023"):
        db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'publish')", [role])
    assert has_grants(db, "orders_in") is False


def test_a_revoke_racing_a_grant_keeps_the_inbox_closed(db, connect, role):
    """A revoke of the last grant that runs while another grant of the inbox is uncommitted
    must not leave the flag FALSE once that grant commits (the inbox would then be open to
    every consumer although it has a grant): grant changes of one inbox take its catalog
    row's lock first, so the revoke's recount sees the grant."""
    other = make_role(db, "mailbox_consumer")
    try:
        db.execute("SELECT mailbox.create_inbox('orders_in')")
        db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'receive')", [role])
        granting = connect(autocommit=False)
        granting.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'process')", [role])
        revoking = connect()
        errors = []

        def revoke():
            try:
                revoking.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'receive')", [role])
            except Exception as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=revoke)
        t.start()
        wait_blocked(db, revoking)
        granting.commit()
        t.join(10)
        assert not t.is_alive() and not errors, errors
        assert rows(db, "SELECT privilege FROM mailbox.object_grants") == [("process",)]
        assert has_grants(db, "orders_in") is True
        conn = connect()
        conn.execute(f'SET ROLE "{other}"')
        with raises("42501"):
            conn.execute("SELECT * FROM mailbox.inbox_claim('orders_in', 'w1')")
    finally:
        drop_role(db, other)


def test_a_grant_change_under_repeatable_read_after_a_concurrent_one_fails_with_40001(
    db, connect, role
):
    """Under REPEATABLE READ the recount would read an old snapshot, so a grant change of an
    inbox whose grants changed since that snapshot is refused (retry the transaction)."""
    db.execute("SELECT mailbox.create_inbox('orders_in')")
    late = connect(autocommit=False)
    late.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    late.execute("SELECT 1")  # takes the snapshot
    db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'receive')", [role])
    with raises("40001"):
        late.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'receive')", [role])
    late.rollback()
    assert has_grants(db, "orders_in") is True
    assert rows(db, "SELECT privilege FROM mailbox.object_grants") == [("receive",)]


@pytest.mark.parametrize(
    ("call", "sqlstate"),
    [
        ("mailbox.grant_outbox('events', {role}, 'receive')", "22023"),
        ("mailbox.grant_outbox('events', {role}, 'PUBLISH')", "22023"),
        ("mailbox.grant_outbox('events', {role}, NULL)", "22004"),
        ("mailbox.grant_outbox('events', NULL, 'publish')", "22004"),
        ("mailbox.grant_outbox('nope', {role}, 'publish')", "42704"),
        ("mailbox.grant_outbox(NULL, {role}, 'publish')", "22004"),
        ("mailbox.grant_outbox('events', 'no_such_role', 'publish')", "42704"),
        ("mailbox.revoke_outbox('nope', {role}, 'publish')", "42704"),
        ("mailbox.grant_inbox('orders_in', {role}, 'consume')", "22023"),
        ("mailbox.grant_inbox('nope', {role}, 'receive')", "42704"),
        ("mailbox.revoke_inbox('orders_in', {role}, 'publish')", "22023"),
    ],
)
def test_bad_grants_are_refused_and_write_nothing(db, role, call, sqlstate):
    db.execute("SELECT mailbox.create_outbox('events')")
    db.execute("SELECT mailbox.create_inbox('orders_in')")
    with raises(sqlstate):
        db.execute("SELECT " + call.format(role=f"'{role}'"))
    assert scalar(db, "SELECT count(*) FROM mailbox._object_grant") == 0


def test_dropping_an_object_forgets_its_grants(db, role):
    db.execute("SELECT mailbox.create_outbox('events')")
    db.execute("SELECT mailbox.grant_outbox('events', %s, 'publish')", [role])
    db.execute("SELECT mailbox.drop_outbox('events')")
    db.execute("SELECT mailbox.create_outbox('events')")  # a new outbox of that name starts open
    assert scalar(db, "SELECT count(*) FROM mailbox._object_grant") == 0


def test_only_admins_grant(db, connect, role):
    db.execute("SELECT mailbox.create_outbox('events')")
    conn = connect()
    conn.execute(f'SET ROLE "{role}"')
    for call in ("grant_outbox", "revoke_outbox"):
        with raises("42501"):
            conn.execute(f"SELECT mailbox.{call}('events', %s, 'consume')", [role])
    with raises("42501"):
        conn.execute("SELECT * FROM mailbox.object_grants")


def test_authorize_rule(db, connect, role):
    """_authorize: open without grants; then grantees (also through membership) and admins."""
    db.execute("SELECT mailbox.create_outbox('events')")
    key = scalar(db, "SELECT outbox_key FROM mailbox._outbox")
    # a definer function like pg_mailbox's own, so the check runs as the extension owner
    # while the caller is the SET ROLE role
    db.execute(
        "CREATE FUNCTION public.probe(int, text) RETURNS void LANGUAGE sql SECURITY DEFINER"
        " AS $$ SELECT mailbox._authorize('outbox', $1, $2) $$"
    )
    member = make_role(db, role)
    admin = make_role(db, "mailbox_admin")
    other = make_role(db, "mailbox_consumer")

    def allowed(who, privilege):
        conn = connect()
        conn.execute(f'SET ROLE "{who}"')
        try:
            conn.execute("SELECT public.probe(%s, %s)", [key, privilege])
        except psycopg.errors.InsufficientPrivilege as e:
            assert "events" in str(e) and privilege in str(e)
            return False
        return True

    try:
        assert all(
            allowed(who, "consume") for who in (role, member, admin, other)
        )  # no grant: open
        db.execute("SELECT mailbox.grant_outbox('events', %s, 'consume')", [role])
        assert allowed(role, "consume")
        assert allowed(member, "consume")  # membership in a grantee counts
        assert allowed(admin, "consume") and allowed(admin, "publish")
        assert not allowed(other, "consume")
        assert not allowed(role, "publish")  # one privilege does not imply the other
        db.execute("SELECT mailbox.revoke_outbox('events', %s, 'consume')", [role])
        assert allowed(other, "consume")  # no grant left: open again
    finally:
        for name in (member, admin, other):
            drop_role(db, name)


# ------------------------------------------------- a managed inbox's named receive (part 35)
def producer(connect, name):
    conn = connect(autocommit=False)
    conn.execute(f'SET ROLE "{name}"')  # committed with the first transaction: it stays
    return conn


def receive(conn, inbox, event_id):
    return scalar(conn, "SELECT mailbox.inbox_receive(%s, %s, '{}')", [inbox, event_id])


def test_a_first_grant_waits_for_a_transaction_that_wrote_the_inbox(db, connect, role):
    """A managed inbox's single receive looks nothing up (docs/inbox.md, "How calls reach an
    inbox"): a transaction that wrote the inbox's table takes no new lock there, so keeps
    the routers it has. A first grant waits for it, and applies to every receive after."""
    name = make_role(db, "mailbox_producer")
    try:
        db.execute("SELECT mailbox.create_inbox('orders_in')")
        conn = producer(connect, name)
        assert receive(conn, "orders_in", "m1") is True
        granting = connect()
        errors = []

        def grant():
            try:
                granting.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'receive')", [role])
            except Exception as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=grant)
        t.start()
        wait_blocked(db, granting)
        assert receive(conn, "orders_in", "m2") is True  # before the grant
        conn.commit()
        t.join(10)
        assert not t.is_alive() and not errors, errors
        with raises("42501"):
            receive(conn, "orders_in", "m3")
        conn.rollback()
        assert rows(db, "SELECT event_id FROM mailbox.orders_in ORDER BY 1") == [("m1",), ("m2",)]
    finally:
        drop_role(db, name)


def test_a_receive_from_before_a_first_grant_is_refused_not_stored(db, connect, role):
    """A transaction that had not written the inbox when its first grant committed still
    runs its old routers: the named receive finds them stale after its INSERT (whose lock
    makes it read the catalog) and refuses with 40001, storing nothing; the retry takes the
    full path, which checks the grant."""
    name = make_role(db, "mailbox_producer")
    try:
        db.execute("SELECT mailbox.create_inbox('orders_in')")
        db.execute("SELECT mailbox.create_inbox('other_in')")
        conn = producer(connect, name)
        assert receive(conn, "orders_in", "warm") is True  # plans with the arms inlined
        conn.commit()
        assert (
            receive(conn, "other_in", "o1") is True
        )  # this transaction holds no lock of orders_in
        db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'receive')", [role])
        with raises("40001") as info:
            receive(conn, "orders_in", "late")
        assert "changed while this transaction was open" in str(info.value)
        conn.rollback()
        with raises("42501"):
            receive(conn, "orders_in", "late")
        conn.rollback()
        assert rows(db, "SELECT event_id FROM mailbox.orders_in") == [("warm",)]
        # the last revoke gives the named receive back
        db.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'receive')", [role])
        assert receive(conn, "orders_in", "reopened") is True
        conn.commit()
        assert "'orders_in'" in scalar(
            db, "SELECT prosrc FROM pg_proc WHERE proname = '_inbox_route_receive_named'"
        )
    finally:
        drop_role(db, name)


def test_a_mark_from_before_a_first_grant_is_refused_not_applied(db, connect, role):
    """The single mark of an unordered managed inbox without grants is the named mark, which
    looks nothing up. A transaction that had not written the inbox when its first grant
    committed still runs its old routers: the named mark finds them stale after its UPDATE
    and refuses with 40001, marking nothing; the retry takes the full path, which checks the
    grant (42501 for a role without 'process')."""
    name = make_role(db, "mailbox_consumer")
    try:
        db.execute("SELECT mailbox.create_inbox('orders_in')")
        db.execute("SELECT mailbox.create_inbox('other_in')")
        for inbox, event_id in (("orders_in", "warm"), ("orders_in", "late"), ("other_in", "o1")):
            db.execute("SELECT mailbox.inbox_receive(%s, %s, '{}')", [inbox, event_id])
        conn = producer(connect, name)
        mark = "SELECT mailbox.inbox_mark_processed(%s, %s)"
        assert scalar(conn, mark, ["orders_in", "warm"]) is True  # plans with the arms inlined
        conn.commit()
        assert scalar(conn, mark, ["other_in", "o1"]) is True  # no lock of orders_in
        db.execute("SELECT mailbox.grant_inbox('orders_in', %s, 'process')", [role])
        with raises("40001") as info:
            scalar(conn, mark, ["orders_in", "late"])
        assert "changed while this transaction was open" in str(info.value)
        conn.rollback()
        with raises("42501"):
            scalar(conn, mark, ["orders_in", "late"])
        conn.rollback()
        assert rows(db, "SELECT event_id FROM mailbox.orders_in WHERE processed_at IS NULL") == [
            ("late",)
        ]
        # the last revoke gives the named mark back
        db.execute("SELECT mailbox.revoke_inbox('orders_in', %s, 'process')", [role])
        assert scalar(conn, mark, ["orders_in", "late"]) is True
        conn.commit()
        assert "'orders_in'" in scalar(
            db, "SELECT prosrc FROM pg_proc WHERE proname = '_inbox_route_processed_named'"
        )
    finally:
        drop_role(db, name)


def test_inbox_ddl_in_repeatable_read_cannot_rebuild_the_routers_from_before_a_grant(
    db, connect, role
):
    """Found by a review: a create_inbox in REPEATABLE READ that waited for the DDL lock
    behind a first grant rebuilt every router from its snapshot, which still saw the inbox
    without grants, and so gave the named mark (and receive) back their arms: consumers
    without the grant could mark. The rebuild now locks the catalog rows it reads and fails
    with 40001; its retry sees the grant."""
    name = make_role(db, "mailbox_consumer")
    try:
        db.execute("SELECT mailbox.create_inbox('gen')")
        db.execute("SELECT mailbox.inbox_receive('gen', 'a', '{}')")
        granting = connect(autocommit=False)
        granting.execute("SELECT mailbox.grant_inbox('gen', %s, 'process')", [role])
        creating = connect(autocommit=False)
        creating.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        errors = []

        def create():
            try:
                creating.execute("SELECT mailbox.create_inbox('other')")
                creating.commit()
            except psycopg.Error as exc:  # checked below
                errors.append(exc)
                creating.rollback()

        t = threading.Thread(target=create)
        t.start()
        wait_blocked(db, creating)
        granting.commit()
        t.join(10)
        assert not t.is_alive()
        assert [e.sqlstate for e in errors] == ["40001"], errors
        router = "SELECT prosrc FROM pg_proc WHERE proname = %s"
        for kind in ("processed_named", "receive_named"):
            assert "'gen'" not in scalar(db, router, [f"_inbox_route_{kind}"]), kind
        consumer = connect()
        consumer.execute(f'SET ROLE "{name}"')
        with raises("42501"):
            consumer.execute("SELECT mailbox.inbox_mark_processed('gen', 'a')")
        creating.execute("SELECT mailbox.create_inbox('other')")  # the retry
        creating.commit()
        assert "'gen'" not in scalar(db, router, ["_inbox_route_processed_named"])
        assert "'other'" in scalar(db, router, ["_inbox_route_processed_named"])
    finally:
        drop_role(db, name)
