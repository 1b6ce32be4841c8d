"""Adversarial tests of the inbox routers (static dispatch, part 35 routes) and of the inbox
wake-ups (part 33): other sessions with cached plans while inboxes come and go, many inboxes,
tenant-owned adopted tables on the dynamic path, routers as a restore leaves them, and who
gets a NOTIFY mailbox_inbox_new when (docs/inbox.md "How calls reach an inbox", "Wake-ups").

Which path a call took is read from the calling session's own function statistics
(track_functions = 'all', pg_stat_get_xact_function_calls, compared inside one transaction so
no stats flush resets them): an inlined router is never counted itself, a static arm calls
only mailbox._inbox_<key>_<kind>, the ELSE arm also mailbox._inbox_dispatch_<kind>.
"""

import re
import threading
import time
from pathlib import Path

import psycopg
import pytest
from groups import wait_blocked
from mbx import drop_role, make_role, raises, rows, scalar
from psycopg.types.json import Jsonb

CHANNEL = "mailbox_inbox_new"
KINDS = ("receive", "claim", "processed")


# ------------------------------------------------------------------------------- helpers
def key(conn, inbox):
    return scalar(conn, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox])


def router_src(conn, kind):
    return scalar(
        conn, "SELECT prosrc FROM pg_proc WHERE oid = %s::regproc", [f"mailbox._inbox_route_{kind}"]
    )


def routed_keys(conn, kind):
    src = router_src(conn, kind)
    return sorted(int(k) for k in re.findall(rf"mailbox\._inbox_(\d+)_{kind}\(", src))


def receive(conn, inbox, event_id, payload="{}", **kw):
    named = "".join(f", p_{k} => %({k})s" for k in kw)
    return scalar(
        conn,
        f"SELECT mailbox.inbox_receive(%(inbox)s, %(id)s, %(payload)s{named})",
        {"inbox": inbox, "id": event_id, "payload": payload, **kw},
    )


def claimed(conn, inbox, worker="w", batch=10):
    got = rows(conn, "SELECT event_id FROM mailbox.inbox_claim(%s, %s, %s)", [inbox, worker, batch])
    return [r[0] for r in got]


def mark(conn, inbox, event_id):
    return scalar(conn, "SELECT mailbox.inbox_mark_processed(%s, %s)", [inbox, event_id])


def table_ids(conn, table, where="true"):
    return sorted(r[0] for r in rows(conn, f"SELECT event_id FROM {table} WHERE {where}"))


def calls(conn, fn):
    """Calls of ``fn`` this session made that were not flushed to the shared stats yet."""
    return scalar(conn, "SELECT coalesce(pg_stat_get_xact_function_calls(to_regproc(%s)), 0)", [fn])


class Paths:
    """Counts, inside one transaction of ``conn``, the static and dynamic calls of ``kind``."""

    def __init__(self, conn, keys, kind):
        self.conn, self.kind = conn, kind
        self.fns = [f"mailbox._inbox_{k}_{kind}" for k in keys]
        if kind in ("receive", "processed"):  # a managed inbox's single receive and mark
            self.fns += [f"mailbox._inbox_{k}_{kind}_named" for k in keys]  # (part 35, named)
        self.before = self._now()

    def _now(self):
        return (
            sum(calls(self.conn, fn) for fn in self.fns),
            calls(self.conn, f"mailbox._inbox_dispatch_{self.kind}"),
            calls(self.conn, f"mailbox._inbox_route_{self.kind}"),
        )

    def delta(self):
        """(generated calls, dynamic calls, router calls not inlined) since construction"""
        now = self._now()
        return tuple(n - b for n, b in zip(now, self.before, strict=True))


def tracked(connect):
    conn = connect()
    conn.execute("SET track_functions = 'all'")
    conn.execute("SET lock_timeout = '10s'")  # a test that blocks itself fails, not hangs
    return conn


def round_trip(conn, inbox, event_id):
    assert receive(conn, inbox, event_id, payload=None) is True
    assert claimed(conn, inbox) == [event_id]
    assert mark(conn, inbox, event_id) is True


def notes(listener, timeout=0.3):
    return sorted(
        n.payload for n in listener.notifies(timeout=timeout, stop_after=20) if n.channel == CHANNEL
    )


def waiters(conn):
    return rows(
        conn,
        "SELECT i.inbox_name, w.worker FROM mailbox._inbox_waiter AS w"
        " JOIN mailbox._inbox AS i USING (inbox_key) ORDER BY 1, 2",
    )


@pytest.fixture
def listener(connect):
    conn = connect()
    conn.execute(f"LISTEN {CHANNEL}")
    return conn


@pytest.fixture
def tenant(db):
    """A non-superuser role that owns tables it has adopted as inboxes."""
    name = make_role(db)
    db.execute(f'GRANT CREATE ON SCHEMA public TO "{name}"')
    yield name
    for (inbox,) in rows(
        db,
        "SELECT inbox_name FROM mailbox._inbox AS i JOIN pg_class AS c ON c.oid = i.table_rel"
        " WHERE c.relowner = %s::regrole",
        [name],
    ):
        db.execute("SELECT mailbox.drop_inbox(%s)", [inbox])
    drop_role(db, name)


def adopt(db, owner, inbox, table):
    """``table`` (in public), owned by ``owner``, adopted as ``inbox`` with renamed columns."""
    db.execute(
        f"CREATE TABLE public.{table} (id text PRIMARY KEY, payload jsonb, done timestamptz,"
        " tries int NOT NULL DEFAULT 0, got timestamptz)"
    )
    if owner is not None:
        db.execute(f'ALTER TABLE public.{table} OWNER TO "{owner}"')
    db.execute(
        "SELECT mailbox.enable_inbox_tracking(%s, %s, 'id', 'done', 'tries',"
        " p_received_at_column => 'got')",
        [inbox, f"public.{table}"],
    )


def as_role(connect, role):
    conn = connect()
    conn.execute(f'SET ROLE "{role}"')
    return conn


# ===================================================================== 1. static dispatch
def test_a_session_with_cached_plans_follows_drop_recreate_adopt_and_reconfigure(db, connect):
    """A worker warms its plans on a, b, c; meanwhile b is dropped and made again (new key,
    new table), a superuser-owned table is adopted as d and c gets priority. The worker's next
    calls reach the new functions through re-inlined routers (no dynamic call) and write
    each message into its own inbox's table only."""
    for name in ("a", "b", "c"):
        db.execute("SELECT mailbox.create_inbox(%s)", [name])
    worker = tracked(connect)
    for name in ("a", "b", "c"):
        round_trip(worker, name, f"warm-{name}")
    old_b = key(db, "b")

    db.execute("SELECT mailbox.drop_inbox('b', false, true)")
    db.execute("SELECT mailbox.create_inbox('b')")
    adopt(db, None, "d", "ext_d")  # owned by the extension owner: routed statically
    db.execute("SELECT mailbox.enable_inbox_priority('c')")
    assert key(db, "b") != old_b
    assert scalar(db, "SELECT to_regproc(%s)", [f"mailbox._inbox_{old_b}_receive"]) is None
    keys = [key(db, n) for n in ("a", "b", "c", "d")]
    for kind in KINDS:
        assert routed_keys(db, kind) == sorted(keys), kind

    with worker.transaction():
        paths = {kind: Paths(worker, keys, kind) for kind in KINDS}
        for name in ("a", "b", "d"):
            assert receive(worker, name, f"new-{name}", payload=None) is True
        assert receive(worker, "c", "c-low", payload=None, priority=9) is True
        assert receive(worker, "c", "c-high", payload=None, priority=1) is True
        assert claimed(worker, "c", batch=1) == ["c-high"]  # the new (priority) claim body
        for name in ("a", "b", "d"):
            assert claimed(worker, name) == [f"new-{name}"]
            assert mark(worker, name, f"new-{name}") is True
        assert mark(worker, "c", "c-high") is True
        assert paths["receive"].delta() == (5, 0, 0)
        assert paths["claim"].delta() == (4, 0, 0)
        assert paths["processed"].delta() == (4, 0, 0)

    assert table_ids(db, "mailbox.a") == ["new-a", "warm-a"]
    assert table_ids(db, "mailbox.b") == ["new-b"]  # the re-made table, nothing of the old one
    assert table_ids(db, "mailbox.c") == ["c-high", "c-low", "warm-c"]
    assert sorted(r[0] for r in rows(db, "SELECT id FROM public.ext_d")) == ["new-d"]
    assert table_ids(db, "mailbox.c", "processed_at IS NULL") == ["c-low"]


def test_an_open_transaction_reaches_inboxes_made_after_it_began(db, connect):
    """A worker inside one READ COMMITTED transaction (so it accepts no cache invalidation
    between its statements) keeps a stale router: an inbox dropped, re-made under the same name
    (new key) or adopted while it runs is reached through the ELSE arm, in the right table."""
    db.execute("SET lock_timeout = '10s'")
    db.execute("SELECT mailbox.create_inbox('a')")
    db.execute("SELECT mailbox.create_inbox('b')")
    worker = tracked(connect)
    round_trip(worker, "a", "warm-a")
    round_trip(worker, "b", "warm-b")
    with worker.transaction():
        assert receive(worker, "a", "in-tx-a", payload=None) is True
        db.execute("SELECT mailbox.drop_inbox('b', false, true)")  # b untouched by this tx
        db.execute("SELECT mailbox.create_inbox('b')")
        adopt(db, None, "d", "ext_d")
        new_keys = [key(db, "b"), key(db, "d")]
        paths = Paths(worker, new_keys, "receive")
        assert receive(worker, "b", "in-tx-b", payload=None) is True
        assert receive(worker, "d", "in-tx-d", payload=None) is True
        assert paths.delta()[0] == 2  # through a stale router's ELSE arm or a new arm
        assert claimed(worker, "b") == ["in-tx-b"]
        assert claimed(worker, "d") == ["in-tx-d"]
        assert mark(worker, "d", "in-tx-d") is True
        assert receive(worker, "a", "in-tx-a2", payload=None) is True
    assert table_ids(db, "mailbox.a") == ["in-tx-a", "in-tx-a2", "warm-a"]
    assert table_ids(db, "mailbox.b") == ["in-tx-b"]
    assert rows(db, "SELECT id, done IS NOT NULL FROM public.ext_d") == [("in-tx-d", True)]
    # drop_inbox waits for a transaction that wrote the inbox's table (part 35, named receive)
    with worker.transaction():
        receive(worker, "a", "x", payload=None)
        with raises("55P03"):
            db.execute("SET lock_timeout = '200ms'")
            db.execute("SELECT mailbox.drop_inbox('a')")
    db.execute("SET lock_timeout = '10s'")
    # one that did not: its stale routers still name a's named receive, which stores nothing
    # and asks for a retry, which finds the inbox unknown
    with raises("40001"):
        with worker.transaction():
            receive(worker, "b", "b2", payload=None)
            db.execute("SELECT mailbox.drop_inbox('a')")
            receive(worker, "a", "y", payload=None)
    with raises("42704"):
        receive(worker, "a", "y", payload=None)
    assert table_ids(db, "mailbox.a") == ["in-tx-a", "in-tx-a2", "warm-a", "x"]


def test_a_rolled_back_drop_inbox_restores_the_routers_for_every_session(db, connect):
    db.execute("SELECT mailbox.create_inbox('a')")
    db.execute("SELECT mailbox.create_inbox('b')")
    ka, kb = key(db, "a"), key(db, "b")
    admin, worker = tracked(connect), tracked(connect)
    db.execute("SET lock_timeout = '10s'")
    for conn, who in ((admin, "admin"), (worker, "worker")):
        round_trip(conn, "a", f"warm-{who}")
        round_trip(conn, "b", f"warm-{who}")
    before = {kind: router_src(db, kind) for kind in KINDS}

    with admin.transaction():
        # the table is kept, but its writers wait for this transaction (part 35, named receive)
        admin.execute("SELECT mailbox.drop_inbox('a')")
        assert routed_keys(admin, "receive") == [kb]
        with raises("42704"):
            with admin.transaction():  # a savepoint
                receive(admin, "a", "gone", payload=None)
        assert receive(admin, "b", "in-drop-tx", payload=None) is True  # the rebuilt router
        # the other session still sees the committed inbox, and waits to write it
        worker.execute("SET lock_timeout = '200ms'")
        with raises("55P03"):
            receive(worker, "a", "during", payload=None)
        worker.execute("SET lock_timeout = '10s'")
        assert receive(worker, "b", "during", payload=None) is True
        raise psycopg.Rollback()

    for kind in KINDS:
        assert router_src(db, kind) == before[kind]
        assert routed_keys(db, kind) == [ka, kb]
    for conn, suffix in ((admin, "admin"), (worker, "worker")):
        with conn.transaction():
            paths = Paths(conn, [ka], "receive")
            assert receive(conn, "a", f"after-{suffix}", payload=None) is True
            assert paths.delta() == (1, 0, 0)  # static again, in both sessions
    assert table_ids(db, "mailbox.a") == sorted(
        ["after-admin", "after-worker", "warm-admin", "warm-worker"]
    )
    assert table_ids(db, "mailbox.b", "event_id = 'in-drop-tx'") == []


def test_twenty_inboxes_with_unrouted_tenant_keys_in_between_each_reach_their_own_table(
    db, connect, tenant
):
    """20 managed inboxes split the CASE (20 -> 10 + 10 -> 5 + 5 each); two tenant-owned
    inboxes have keys inside those ranges but no arm. A worker that inlined the router when
    only some existed reaches every inbox, each message in its own table, tenants dynamically."""
    worker = tracked(connect)
    managed, tenants = [], []
    for i in range(20):
        name = f"m{i:02d}"
        db.execute("SELECT mailbox.create_inbox(%s)", [name])
        managed.append(name)
        if i == 0:
            round_trip(worker, name, "warm")  # cached with a one-arm router
        if i in (4, 13):
            adopt(db, tenant, f"t{i}", f"tenant_{i}")
            tenants.append(f"t{i}")
    managed_keys = [key(db, n) for n in managed]
    tenant_keys = [key(db, n) for n in tenants]
    assert min(managed_keys) < min(tenant_keys) and max(tenant_keys) < max(managed_keys)
    for kind in KINDS:
        assert routed_keys(db, kind) == sorted(managed_keys), kind
    assert router_src(db, "receive").count("OPERATOR(pg_catalog.<)") == 3

    with worker.transaction():
        static = {kind: Paths(worker, managed_keys, kind) for kind in KINDS}
        dynamic = {kind: Paths(worker, tenant_keys, kind) for kind in KINDS}
        for name in reversed(managed + tenants):  # also the highest keys first
            round_trip(worker, name, f"msg-{name}")
        for kind in KINDS:
            assert static[kind].delta() == (20, 2, 0), kind  # 2 dispatches: the tenants'
            assert dynamic[kind].delta() == (2, 2, 0), kind
    for name in managed:
        expected = ["msg-m00", "warm"] if name == "m00" else [f"msg-{name}"]
        assert table_ids(db, f"mailbox.{name}") == expected, name
    for name, table in zip(tenants, ("tenant_4", "tenant_13"), strict=True):
        assert rows(db, f"SELECT id, done IS NOT NULL FROM public.{table}") == [
            (f"msg-{name}", True)
        ]


def test_a_tenant_inbox_works_through_the_dynamic_path_and_waits_for_wakeups(
    db, connect, tenant, listener
):
    adopt(db, tenant, "legacy", "legacy")
    db.execute("SELECT mailbox.create_inbox('mine')")
    k = key(db, "legacy")
    assert (
        scalar(
            db,
            "SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE oid = %s::regproc",
            [f"mailbox._inbox_{k}_receive"],
        )
        == tenant
    )
    for kind in KINDS:
        assert k not in routed_keys(db, kind)
    worker = tracked(connect)
    with worker.transaction():
        paths = {kind: Paths(worker, [k], kind) for kind in KINDS}
        assert claimed(worker, "legacy", "tw") == []  # the ELSE arm returns NULL: a wait
        assert receive(worker, "legacy", "l1", payload='{"n": 1}') is True
        assert receive(worker, "legacy", "l1", payload='{"n": 2}') is False
        got = rows(worker, "SELECT event_id, payload FROM mailbox.inbox_claim('legacy', 'tw')")
        assert got == [("l1", {"n": 1})]
        assert mark(worker, "legacy", "l1") is True
        assert mark(worker, "legacy", "l1") is False
        assert paths["receive"].delta() == (2, 2, 0)
        assert paths["claim"].delta() == (2, 2, 0)
        assert paths["processed"].delta() == (2, 2, 0)
    # its own wait, visible to its own receive, was ended by its claim: one wake-up at commit
    assert notes(listener) == ["legacy"]
    assert rows(db, "SELECT id, tries, done IS NOT NULL FROM public.legacy") == [("l1", 0, True)]
    assert table_ids(db, "mailbox.mine") == []
    # the tenant inbox's wait (recorded by the ELSE path) wakes on a receive into it
    assert claimed(worker, "legacy", "tw") == []
    assert waiters(db) == [("legacy", "tw")]
    assert receive(db, "legacy", "l2", payload=None) is True
    assert receive(db, "mine", "m1", payload=None) is True  # nobody waits on mine
    assert notes(listener) == ["legacy"]


@pytest.mark.parametrize("dropped", ["receive", "claim", "processed"])
def test_a_tenant_dropping_one_of_its_generated_functions_breaks_only_that_call_of_its_inbox(
    db, connect, tenant, dropped
):
    adopt(db, tenant, "legacy", "legacy")
    adopt(db, None, "sup", "sup_owned")  # routed statically
    db.execute("SELECT mailbox.create_inbox('mine')")
    k = key(db, "legacy")
    worker = tracked(connect)  # plans cached with the routers as they are now
    for name in ("mine", "sup", "legacy"):
        round_trip(worker, name, f"warm-{name}")
    assert receive(db, "legacy", "pending", payload=None) is True

    hostile = as_role(connect, tenant)
    hostile.execute(f"DROP FUNCTION mailbox._inbox_{k}_{dropped}")
    calls_by_kind = {
        "receive": lambda c: receive(c, "legacy", "after", payload=None),
        "claim": lambda c: claimed(c, "legacy"),
        "processed": lambda c: mark(c, "legacy", "pending"),
    }
    for conn in (worker, db):
        with raises("42883") as info:
            calls_by_kind[dropped](conn)
        assert f"_inbox_{k}_{dropped}" in str(info.value)
    # its other calls still work
    for kind, call in calls_by_kind.items():
        if kind != dropped:
            call(worker)
    # every other inbox, in the session with cached plans and in a new one, keeps working
    fresh = connect()
    for conn, who in ((worker, "worker"), (fresh, "fresh")):
        for name in ("mine", "sup"):
            round_trip(conn, name, f"after-{who}")
    # inbox DDL rebuilds the routers without naming the tenant's functions, and still works
    db.execute("SELECT mailbox.create_inbox('later')")
    round_trip(worker, "later", "l")
    for kind in KINDS:
        assert k not in routed_keys(db, kind)
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_routes_rebuilt'") == 0
    # the tenant's inbox can be dropped and the table adopted again, with fresh functions
    db.execute("SELECT mailbox.drop_inbox('legacy')")
    db.execute(
        "SELECT mailbox.enable_inbox_tracking('legacy', 'public.legacy', 'id', 'done', 'tries',"
        " p_received_at_column => 'got')"
    )
    assert key(db, "legacy") != k
    assert receive(worker, "legacy", "readopted", payload=None) is True
    assert "readopted" in claimed(worker, "legacy", batch=100)
    assert mark(worker, "legacy", "readopted") is True
    assert table_ids(db, "mailbox.mine") == ["after-fresh", "after-worker", "warm-mine"]
    assert sorted(r[0] for r in rows(db, "SELECT id FROM public.sup_owned")) == [
        "after-fresh",
        "after-worker",
        "warm-sup",
    ]


def test_a_tenant_dropping_its_settle_function_fails_only_commits_that_claimed_from_it(
    db, connect, tenant
):
    """The lease rows of a READ COMMITTED claim are written at commit through the inbox's
    generated _unsettled function: without it, a commit that claimed from that inbox fails
    (and rolls back, so nothing is lost); commits that did not are unaffected."""
    adopt(db, tenant, "legacy", "legacy")
    db.execute("SELECT mailbox.create_inbox('mine')")
    k = key(db, "legacy")
    for inbox in ("legacy", "mine"):
        assert receive(db, inbox, f"{inbox}-1", payload=None) is True
    as_role(connect, tenant).execute(f"DROP FUNCTION mailbox._inbox_{k}_unsettled")
    worker = connect(autocommit=False)
    assert claimed(worker, "mine") == ["mine-1"]
    worker.commit()  # mine's claim settles
    assert claimed(worker, "legacy") == ["legacy-1"]
    with raises("42883") as info:
        worker.commit()
    assert f"_inbox_{k}_unsettled" in str(info.value)
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease WHERE inbox_key = %s", [k]) == 0
    # claimed and marked in one transaction: the commit still asks _unsettled what is left
    assert claimed(worker, "legacy") == ["legacy-1"]
    assert mark(worker, "legacy", "legacy-1") is True
    with raises("42883"):
        worker.commit()
    # marking without a claim settles nothing
    assert mark(worker, "legacy", "legacy-1") is True
    worker.commit()
    assert rows(db, "SELECT id, done IS NOT NULL FROM public.legacy") == [("legacy-1", True)]
    mine = key(db, "mine")
    leases = "SELECT event_id FROM mailbox._inbox_lease WHERE inbox_key = %s"
    assert rows(db, leases, [mine]) == [("mine-1",)]


def test_a_tenant_altering_its_functions_or_table_breaks_only_its_inbox(db, connect, tenant):
    adopt(db, tenant, "legacy", "legacy")
    adopt(db, tenant, "second", "second")  # the same tenant's other inbox
    db.execute("SELECT mailbox.create_inbox('mine')")
    k = key(db, "legacy")
    worker = connect()
    for name in ("mine", "legacy", "second"):
        round_trip(worker, name, f"warm-{name}")
    hostile = as_role(connect, tenant)

    # it cannot rename its functions into another inbox's name, nor give them away
    with raises("42501"):
        hostile.execute(f"ALTER FUNCTION mailbox._inbox_{k}_receive RENAME TO _inbox_{k}_x")
    with raises("42501"):
        hostile.execute(f"ALTER FUNCTION mailbox._inbox_{k}_receive OWNER TO mailbox_admin")

    # SECURITY INVOKER: the body refuses to run as anyone but the tenant
    hostile.execute(f"ALTER FUNCTION mailbox._inbox_{k}_receive SECURITY INVOKER")
    with raises("42501") as info:
        receive(worker, "legacy", "x", payload=None)
    assert f"inbox function receive of inbox legacy must run as {tenant}" in str(info.value)
    # moved out of schema mailbox: not found, so not called
    hostile.execute(f"ALTER FUNCTION mailbox._inbox_{k}_claim SET SCHEMA public")
    with raises("42883"):
        claimed(worker, "legacy")
    # a mapped column renamed: its inbox's statements fail on the column
    hostile.execute("ALTER TABLE public.legacy RENAME COLUMN done TO done_at")
    with raises("42703"):
        mark(worker, "legacy", "warm-legacy")

    for name in ("mine", "second"):
        round_trip(worker, name, f"after-{name}")
    assert table_ids(db, "mailbox.mine") == ["after-mine", "warm-mine"]
    assert sorted(r[0] for r in rows(db, "SELECT id FROM public.second")) == [
        "after-second",
        "warm-second",
    ]


ROUTES_SOURCE = Path(__file__).resolve().parents[2] / "sql" / "functions" / "35_inbox_routes.sql"
NAMED_SOURCE = ROUTES_SOURCE.with_name("35_inbox_named_routes.sql")


def script_routers(conn):
    """The routers as the extension script makes them, ELSE only (what a restore from pg_dump
    has), one per kind the installed version routes: {kind: CREATE OR REPLACE statement}."""
    source = ROUTES_SOURCE.read_text()
    made = {}
    for kind, args, nargs, returns in rows(
        conn, "SELECT kind, args, nargs, returns FROM mailbox._inbox_route_kinds()"
    ):
        params = ", ".join(f"${i}" for i in range(1, nargs + 1))
        body = f"SELECT mailbox._inbox_dispatch_{kind}({params})"
        # the script's own text for this router (sql/functions/35_inbox_routes.sql)
        assert f"AS $${body}$$;" in source, kind
        made[kind] = (
            f"CREATE OR REPLACE FUNCTION mailbox._inbox_route_{kind}(mailbox._inbox, {args})"
            f" RETURNS {returns} LANGUAGE sql VOLATILE SECURITY INVOKER AS $${body}$$"
        )
    assert set(KINDS) <= set(made)
    # the named routers of a managed inbox's single receive (35_inbox_named_routes.sql)
    named = NAMED_SOURCE.read_text()
    for kind, signature, returns, body in (
        (
            "receive_named",
            "text, text, jsonb, text, text, text, bigint, jsonb, text, int",
            "boolean",
            "SELECT NULL::pg_catalog.bool",
        ),
        ("processed_named", "text, text", "boolean", "SELECT NULL::pg_catalog.bool"),
        ("named_version", "text", "text", "SELECT NULL::pg_catalog.text"),
    ):
        assert f"AS $${body}$$;" in named, kind
        made[kind] = (
            f"CREATE OR REPLACE FUNCTION mailbox._inbox_route_{kind}({signature})"
            f" RETURNS {returns} LANGUAGE sql SECURITY INVOKER AS $${body}$$"
        )
    return made


def test_routers_as_the_script_makes_them_reach_every_inbox_until_refresh_rebuilds_them(
    db, connect
):
    for name in ("a", "b"):
        db.execute("SELECT mailbox.create_inbox(%s)", [name])
    keys = [key(db, "a"), key(db, "b")]
    worker = tracked(connect)
    round_trip(worker, "a", "warm")  # plans with the arms inlined
    script = script_routers(db)
    for stmt in script.values():
        db.execute(stmt)
    for kind in script:
        assert routed_keys(db, kind) == [], kind
    with worker.transaction():
        paths = {kind: Paths(worker, keys, kind) for kind in KINDS}
        round_trip(worker, "a", "restored-a")
        round_trip(worker, "b", "restored-b")
        for kind in KINDS:
            assert paths[kind].delta() == (2, 2, 0), kind  # the dynamic call, everywhere
    assert table_ids(db, "mailbox.a") == ["restored-a", "warm"]
    assert table_ids(db, "mailbox.b") == ["restored-b"]

    assert scalar(db, "SELECT mailbox._inbox_refresh_routes()") == len(script)
    assert scalar(db, "SELECT mailbox._inbox_refresh_routes()") == 0
    for kind in script:
        if kind != "named_version":  # its arms name no function
            assert routed_keys(db, kind) == sorted(keys), kind
    with worker.transaction():
        paths = {kind: Paths(worker, keys, kind) for kind in KINDS}
        round_trip(worker, "b", "rebuilt-b")
        for kind in KINDS:
            assert paths[kind].delta() == (1, 0, 0), kind
    # one router out of date: only that one is rebuilt (by maintenance, which reports it)
    db.execute(script["claim"])
    assert routed_keys(db, "claim") == [] and routed_keys(db, "receive") == sorted(keys)
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_routes_rebuilt'") == 1
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_routes_rebuilt'") == 0
    round_trip(worker, "a", "after-maintenance")
    assert table_ids(db, "mailbox.a") == ["after-maintenance", "restored-a", "warm"]


def stale_worker(db, connect):
    """A worker whose plans and generated functions are cached for inboxes x and y, then
    inside an open READ COMMITTED transaction that already locked every extension table a
    call takes (so no cache invalidation reaches it before it calls x's functions, but for
    the table checks, which open x's table by oid: a claim of x reads the change there)."""
    db.execute("SELECT mailbox.create_inbox('x')")
    db.execute("SELECT mailbox.create_inbox('y')")
    worker = connect(autocommit=False)
    for i in range(2):
        for inbox in ("x", "y"):
            receive(worker, inbox, f"warm-{i}", aggregate_id="W", sequence_num=i + 1)
            claimed(worker, inbox)
            mark(worker, inbox, f"warm-{i}")
    worker.commit()
    receive(worker, "y", "open")
    assert claimed(worker, "y") == ["open"]
    mark(worker, "y", "open")
    return worker


def stale_call(worker, call, message="changed its ordering or priority"):
    """call() in the worker's open transaction, which already ran x's old functions: they
    refuse with 40001 (retry) instead of running the old configuration's code"""
    with raises("40001") as info:
        call()
    assert message in str(info.value), info.value
    worker.rollback()


# a managed inbox's single receive runs its named receive (part 35), which has no catalog
# row to compare: the insert trigger that enabling ordering adds refuses its message first
TRIGGER_REFUSES = "is ordered: a pending message needs an aggregate and a sequence"


def test_a_receive_in_a_transaction_older_than_enable_ordering_obeys_it(db, connect):
    worker = stale_worker(db, connect)
    db.execute("SELECT mailbox.enable_inbox_ordering('x')")
    assert scalar(db, "SELECT ordering FROM mailbox.inbox_status('x')") is True
    stale_call(worker, lambda: receive(worker, "x", "no-aggregate"), TRIGGER_REFUSES)
    with raises("22004"):  # the retry runs the new configuration's receive
        receive(worker, "x", "no-aggregate")
    worker.rollback()
    assert rows(db, "SELECT event_id FROM mailbox.x WHERE aggregate_id IS NULL") == []


def test_a_claim_in_a_transaction_older_than_enable_ordering_gets_only_heads(db, connect):
    worker = stale_worker(db, connect)
    for event_id, seq in (("s2", 2), ("s1", 1)):
        receive(db, "x", event_id, aggregate_id="B", sequence_num=seq)
    db.execute("SELECT mailbox.enable_inbox_ordering('x')")
    # the claim's table check opens x by oid, a lock this transaction did not hold: the
    # session reads the change there, and the claim runs the ordered code at once (before
    # that check, it ran the old code and refused with 40001)
    got = claimed(worker, "x")
    worker.rollback()
    assert got == ["s1"]


def test_a_claim_in_a_transaction_older_than_enable_priority_takes_priority_first(db, connect):
    worker = stale_worker(db, connect)
    receive(db, "x", "low", priority=9)
    receive(db, "x", "high", priority=1)
    db.execute("SELECT mailbox.enable_inbox_priority('x')")
    got = claimed(worker, "x", batch=1)  # up to date at once, as above
    worker.rollback()
    assert got == ["high"]


def test_a_mark_in_a_transaction_older_than_disable_ordering_is_never_misapplied(db, connect):
    worker = stale_worker(db, connect)
    worker.rollback()
    db.execute("SELECT mailbox.enable_inbox_ordering('x')")
    # the worker caches x's ordered functions, then leases p2 for a later transaction
    receive(db, "x", "p1", aggregate_id="B", sequence_num=1)
    assert claimed(worker, "x") == ["p1"]
    mark(worker, "x", "p1")
    worker.commit()
    receive(db, "x", "p2", aggregate_id="B", sequence_num=2)
    assert claimed(worker, "x") == ["p2"]
    worker.commit()
    # a transaction that touches only y (so holds no lock of x) while ordering goes off
    receive(worker, "y", "busy")
    assert claimed(worker, "y") == ["busy"]
    db.execute("SELECT mailbox.disable_inbox_ordering('x')")
    # The disable sends so many invalidations that the server may make this idle session
    # catch up on them (a sinval catch-up interrupt) before its next statement, which then
    # runs the new, unordered code. Otherwise the old ordered code it still has refuses
    # (40001). Which one happens is the server's timing: the refusal is proven where the call
    # is in flight when the change commits (test_inbox_races.py,
    # test_a_mark_that_waited_for_enable_ordering_is_refused_and_its_retry_records_the_position).
    try:
        assert mark(worker, "x", "p2") is True  # caught up: the new functions
    except psycopg.errors.SerializationFailure as exc:
        assert "changed its ordering or priority" in str(exc), exc
        worker.rollback()
        assert mark(worker, "x", "p2") is True  # the retry runs the unordered functions
    worker.commit()
    assert scalar(db, "SELECT processed_at IS NOT NULL FROM mailbox.x WHERE event_id = 'p2'")


def test_a_named_mark_in_a_transaction_older_than_enable_ordering_is_refused_not_misapplied(
    db, connect
):
    """x is unordered, so the worker's single mark of it is the named mark, which records no
    aggregate position. Enabling ordering commits while the worker's transaction (which holds
    no lock of x) is open: after its UPDATE, whose lock makes it read the catalog, the named
    mark finds its version stale and refuses (40001), marking nothing; the retry takes the
    ordered full path, which records the position, so B's next message is claimable."""
    worker = stale_worker(db, connect)
    receive(db, "x", "b1", aggregate_id="B", sequence_num=1)
    receive(db, "x", "b2", aggregate_id="B", sequence_num=2)
    k = key(db, "x")
    assert f"_inbox_{k}_processed_named" in router_src(db, "processed_named")
    db.execute("SELECT mailbox.enable_inbox_ordering('x')")
    assert f"_inbox_{k}_processed_named" not in router_src(db, "processed_named")
    stale_call(worker, lambda: mark(worker, "x", "b1"), "changed while this transaction was open")
    assert scalar(db, "SELECT processed_at FROM mailbox.x WHERE event_id = 'b1'") is None
    assert mark(worker, "x", "b1") is True  # the retry: the full path of the ordered inbox
    worker.commit()
    position = (
        "SELECT last_seq FROM mailbox._inbox_aggregate WHERE inbox_key = %s AND aggregate_id = 'B'"
    )
    assert scalar(db, position, [k]) == 1
    assert claimed(db, "x") == ["b2"]  # B's head, after the recorded position


def test_the_named_mark_ends_a_lease_committed_by_another_worker(db, connect):
    """A message claimed in one transaction (its lease row written at commit) and marked in
    another: the named mark ends the lease in its UPDATE's statement. A mark that waited for
    the claimer's row lock cannot see a lease row that the claimer's commit inserted (it is
    newer than the mark's snapshot); that row holds nothing, as a processed message is never
    claimed again, and maintenance removes it once it expires."""
    db.execute("SELECT mailbox.create_inbox('l')")
    k = key(db, "l")
    for event_id in ("l1", "l2"):
        receive(db, "l", event_id)
    claimer, marker = connect(autocommit=False), connect(autocommit=False)
    marker.execute("SET track_functions = 'all'")
    assert claimed(claimer, "l", batch=1) == ["l1"]
    claimer.commit()
    leases = "SELECT event_id FROM mailbox._inbox_lease WHERE inbox_key = %s ORDER BY 1"
    assert rows(db, leases, [k]) == [("l1",)]
    assert mark(marker, "l", "l1") is True
    assert calls(marker, f"mailbox._inbox_{k}_processed_named") == 1
    assert calls(marker, f"mailbox._inbox_{k}_processed") == 0  # not the full path
    assert mark(marker, "l", "l1") is False  # already processed
    marker.commit()
    assert rows(db, leases, [k]) == []
    # l2's claim is open while the marker waits for its row lock
    assert claimed(claimer, "l") == ["l2"]
    done = []
    t = threading.Thread(target=lambda: done.append(mark(marker, "l", "l2")))
    t.start()
    wait_blocked(db, marker)
    claimer.commit()  # its settle inserts l2's lease row
    t.join(10)
    marker.commit()
    assert done == [True]
    assert scalar(db, "SELECT processed_at IS NOT NULL FROM mailbox.l WHERE event_id = 'l2'")
    assert claimed(db, "l") == []  # never claimed again
    assert scalar(db, "SELECT pending_count FROM mailbox.inbox_status('l')") == 0


def test_a_receive_in_a_transaction_older_than_an_ordering_column_change_is_refused(db, connect):
    """Enabling ordering again with other columns keeps it on: the column mapping is what
    the stale functions differ in."""
    worker = stale_worker(db, connect)
    worker.rollback()
    db.execute("ALTER TABLE mailbox.x ADD COLUMN agg2 text, ADD COLUMN seq2 bigint")
    db.execute("SELECT mailbox.enable_inbox_ordering('x')")
    receive(worker, "x", "o1", aggregate_id="A", sequence_num=1)  # caches the ordered receive
    worker.commit()
    receive(worker, "y", "busy")  # a transaction holding no lock of x
    # (a pending message without agg2 and seq2 would never be claimed under the new mapping:
    # the enable refuses while one is pending, docs/inbox-ordering.md)
    db.execute("UPDATE mailbox.x SET processed_at = now() WHERE processed_at IS NULL")
    db.execute("SELECT mailbox.enable_inbox_ordering('x', 'agg2', 'seq2')")
    stale_call(
        worker,
        lambda: receive(worker, "x", "o2", aggregate_id="B", sequence_num=1),
        TRIGGER_REFUSES,
    )
    assert receive(worker, "x", "o2", aggregate_id="B", sequence_num=1) is True
    worker.commit()
    assert rows(db, "SELECT agg2, seq2 FROM mailbox.x WHERE event_id = 'o2'") == [("B", 1)]


def test_a_commit_that_settles_a_claim_is_not_refused_after_a_priority_change(db, connect):
    """What a claim's commit and a mark run does not depend on priority: no 40001 there."""
    worker = stale_worker(db, connect)
    receive(db, "x", "m1")
    receive(db, "x", "m2")
    assert claimed(worker, "x") == ["m1", "m2"]  # an open claim of x, settled at commit
    db.execute("SELECT mailbox.enable_inbox_priority('x')")
    assert mark(worker, "x", "m1") is True
    worker.commit()  # settles: m2 stays leased to the worker
    assert rows(
        db,
        "SELECT l.event_id FROM mailbox._inbox_lease l JOIN mailbox._inbox i USING (inbox_key)"
        " WHERE i.inbox_name = 'x'",
    ) == [("m2",)]


# ========================================================================== 2. wake-ups
@pytest.fixture
def two(db):
    db.execute("SELECT mailbox.create_inbox('orders')")
    db.execute("SELECT mailbox.create_inbox('other')")
    return db


def test_an_empty_claim_waits_and_each_committed_receiving_transaction_notifies_once(
    two, connect, listener
):
    db = two
    worker = connect()
    assert claimed(worker, "orders", "w1") == []
    assert waiters(db) == [("orders", "w1")]
    producer = connect(autocommit=False)
    assert receive(producer, "orders", "a") is True
    assert receive(producer, "orders", "b") is True
    assert receive(producer, "other", "c") is True  # nobody waits on other
    assert notes(listener) == []  # not before the commit
    producer.commit()
    assert notes(listener) == ["orders"]  # once for the transaction
    # inbox_receive_batch: one notification per batch that stored something
    got = rows(
        producer,
        "SELECT * FROM mailbox.inbox_receive_batch('orders', %s)",
        [Jsonb([{"p_event_id": "d"}, {"p_event_id": "a"}, {"p_event_id": "e"}])],
    )
    assert got == [("d", True), ("a", False), ("e", True)]
    assert notes(listener) == []
    producer.commit()
    assert notes(listener) == ["orders"]
    # a rolled-back receive notifies nobody
    assert receive(producer, "orders", "f") is True
    producer.rollback()
    assert notes(listener) == []
    # the worker is still waiting (it claimed nothing since); its inbox name is the payload
    assert waiters(db) == [("orders", "w1")]
    db.execute("SELECT mailbox.inbox_receive('orders', 'g', '{}')")
    assert notes(listener) == ["orders"]


def test_no_notification_while_nobody_waits(two, connect, listener):
    db = two
    other = connect()
    other.execute(f"LISTEN {CHANNEL}")  # a listener that never claims is not a waiting worker
    assert receive(db, "orders", "a") is True
    got = rows(
        db,
        "SELECT * FROM mailbox.inbox_receive_batch('orders', %s)",
        [Jsonb([{"p_event_id": "b"}])],
    )
    assert got == [("b", True)]
    assert notes(listener) == [] and notes(other) == []
    # a worker waits on other: orders still notifies nobody
    assert claimed(connect(), "other", "w") == []
    assert receive(db, "orders", "c") is True
    assert notes(listener) == []
    # duplicates store nothing: no notification even while someone waits
    assert claimed(connect(), "orders", "w2") == ["a", "b", "c"]
    assert claimed(connect(), "orders", "w2") == []  # leased: nothing claimable, a wait
    assert receive(db, "orders", "a") is False
    got = rows(
        db,
        "SELECT * FROM mailbox.inbox_receive_batch('orders', %s)",
        [Jsonb([{"p_event_id": "b"}, {"p_event_id": "c"}])],
    )
    assert got == [("b", False), ("c", False)]
    assert notes(listener) == []
    # an expired wait is no wait, even before maintenance forgets it
    db.execute("UPDATE mailbox._inbox_waiter SET waiting_until = now() - interval '1 second'")
    assert receive(db, "orders", "d") is True
    assert receive(db, "other", "e") is True
    assert notes(listener) == []
    assert len(waiters(db)) == 2


def test_a_claim_that_gets_messages_ends_the_wait_and_its_rollback_restores_it(
    two, connect, listener
):
    db = two
    worker = connect(autocommit=False)
    assert claimed(worker, "orders", "w") == []
    worker.commit()
    assert receive(db, "orders", "m1") is True
    assert notes(listener) == ["orders"]
    assert claimed(worker, "orders", "w") == ["m1"]  # busy: the wait ends ...
    assert receive(db, "orders", "m2") is True
    # ... for receivers only once that claim commits; until then the wait is still visible
    assert notes(listener) == ["orders"]
    worker.rollback()  # the claim (and the end of the wait) rolled back: still waiting
    assert waiters(db) == [("orders", "w")]
    assert receive(db, "orders", "m3") is True
    assert notes(listener) == ["orders"]
    assert claimed(worker, "orders", "w") == ["m1", "m2", "m3"]
    worker.commit()
    assert waiters(db) == []
    assert receive(db, "orders", "m4") is True
    assert notes(listener) == []
    # a claim that returns messages of another inbox does not end the wait on this one
    assert claimed(worker, "orders", "w", batch=10) == ["m4"]
    assert claimed(worker, "orders", "w") == []
    worker.commit()
    assert receive(db, "other", "o1") is True
    assert claimed(worker, "other", "w") == ["o1"]
    worker.commit()
    assert waiters(db) == [("orders", "w")]
    assert receive(db, "orders", "m5") is True
    assert notes(listener) == ["orders"]


def test_a_rolled_back_empty_claim_leaves_no_wait(two, connect, listener):
    db = two
    worker = connect(autocommit=False)
    assert claimed(worker, "orders", "w") == []
    # not committed: receivers cannot see the wait yet (the documented race: poll instead)
    assert receive(db, "orders", "early") is True
    assert notes(listener) == []
    worker.rollback()
    assert waiters(db) == []
    assert receive(db, "orders", "late") is True
    assert notes(listener) == []
    # the same worker's empty claim that does commit is seen
    assert claimed(worker, "orders", "w") == ["early", "late"]
    worker.commit()
    assert claimed(worker, "orders", "w") == []
    worker.commit()
    assert receive(db, "orders", "later") is True
    assert notes(listener) == ["orders"]


def test_maintenance_forgets_exactly_the_expired_waits(two, connect, listener):
    db = two
    for inbox, worker in (("orders", "gone"), ("orders", "live"), ("other", "gone")):
        assert claimed(connect(), inbox, worker) == []
    db.execute(
        "UPDATE mailbox._inbox_waiter SET waiting_until = now() - interval '1 second'"
        " WHERE worker = 'gone'"
    )
    assert receive(db, "other", "o") is True
    assert notes(listener) == []  # other's only wait expired
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_waits_expired'") == 2
    assert waiters(db) == [("orders", "live")]
    assert scalar(db, "SELECT mailbox.run_maintenance() -> 'inbox_waits_expired'") == 0
    assert receive(db, "orders", "m") is True
    assert notes(listener) == ["orders"]


def test_two_connections_with_one_worker_name_wait_separately(two, connect, listener):
    """Waits are per connection: several connections may claim under one name (replicas of
    one service), and each writes only its own wait."""
    db = two
    first, second = connect(), connect()
    assert claimed(first, "orders", "w") == []
    assert claimed(second, "orders", "w") == []
    assert waiters(db) == [("orders", "w"), ("orders", "w")]
    assert receive(db, "orders", "a") is True
    assert notes(listener) == ["orders"]
    # one of them finds work and stops waiting; the other still waits, so it is woken
    assert claimed(second, "orders", "w") == ["a"]
    assert waiters(db) == [("orders", "w")]
    assert receive(db, "orders", "b") is True
    assert notes(listener) == ["orders"]
    assert claimed(first, "orders", "w") == ["b"]
    assert waiters(db) == []


@pytest.mark.parametrize("first_claim", ["empty", "busy"])
def test_claimers_sharing_a_worker_name_do_not_wait_for_each_other(two, connect, first_claim):
    db = two
    first = connect(autocommit=False)
    if first_claim == "busy":
        assert claimed(first, "orders", "w") == []  # waiting ...
        first.commit()
        assert receive(db, "orders", "job") is True
        assert claimed(first, "orders", "w") == ["job"]  # ... then busy, transaction open
    else:
        assert claimed(first, "orders", "w") == []  # waiting, transaction open
    second = connect()
    second.execute("SET lock_timeout = '500ms'")
    try:
        assert claimed(second, "orders", "w") == []
    finally:
        first.rollback()


def test_wakeups_of_adopted_ordered_and_priority_inboxes_name_the_inbox(db, connect, listener):
    db.execute(
        "CREATE TABLE public.incoming (event_id text PRIMARY KEY, payload jsonb,"
        " processed_at timestamptz, retry_count int, received_at timestamptz)"
    )
    db.execute("SELECT mailbox.enable_inbox_tracking('adopted_in', 'public.incoming')")
    db.execute("SELECT mailbox.create_inbox('ordered_in')")
    db.execute("SELECT mailbox.enable_inbox_ordering('ordered_in')")
    db.execute("SELECT mailbox.create_inbox('prio_in')")
    db.execute("SELECT mailbox.enable_inbox_priority('prio_in')")
    worker = connect()
    for inbox in ("adopted_in", "ordered_in", "prio_in"):
        assert claimed(worker, inbox, "w") == []
    assert waiters(db) == [("adopted_in", "w"), ("ordered_in", "w"), ("prio_in", "w")]
    assert receive(db, "adopted_in", "a1") is True
    assert receive(db, "ordered_in", "o2", aggregate_id="A", sequence_num=2) is True
    assert receive(db, "prio_in", "p1", priority=3) is True
    assert notes(listener) == ["adopted_in", "ordered_in", "prio_in"]
    # ordered: o2 is not a head, so a claim finds nothing and keeps waiting
    assert claimed(worker, "ordered_in", "w") == []
    assert receive(db, "ordered_in", "o1", aggregate_id="A", sequence_num=1) is True
    assert notes(listener) == ["ordered_in"]
    assert claimed(worker, "ordered_in", "w") == ["o1"]
    assert claimed(worker, "prio_in", "w") == ["p1"]
    assert claimed(worker, "adopted_in", "w") == ["a1"]
    assert waiters(db) == []
    for inbox, event_id, kw in (
        ("adopted_in", "a2", {}),
        ("ordered_in", "o3", {"aggregate_id": "A", "sequence_num": 3}),
        ("prio_in", "p2", {"priority": 1}),
    ):
        assert receive(db, inbox, event_id, **kw) is True
    assert notes(listener) == []


def test_drop_inbox_forgets_waits_only_when_it_commits(two, connect, listener):
    db = two
    assert claimed(connect(), "orders", "w") == []
    assert claimed(connect(), "other", "w") == []
    admin = connect(autocommit=False)
    admin.execute("SELECT mailbox.drop_inbox('orders', false, true)")
    admin.rollback()
    assert waiters(db) == [("orders", "w"), ("other", "w")]
    assert receive(db, "orders", "a") is True
    assert notes(listener) == ["orders"]
    db.execute("SELECT mailbox.drop_inbox('orders', false, true)")
    db.execute("SELECT mailbox.create_inbox('orders')")
    assert waiters(db) == [("other", "w")]
    assert receive(db, "orders", "b") is True  # the new inbox: nobody waits on it yet
    assert notes(listener) == []
    assert receive(db, "other", "c") is True
    assert notes(listener) == ["other"]


def test_a_claim_whose_candidates_are_all_leased_or_locked_waits(two, connect, listener):
    db = two
    assert receive(db, "orders", "a") is True
    holder = connect()
    assert claimed(holder, "orders", "holder") == ["a"]  # committed lease
    locker = connect(autocommit=False)
    assert receive(db, "orders", "b") is True
    assert claimed(locker, "orders", "locker") == ["b"]  # row locked, transaction open
    worker = connect()
    assert claimed(worker, "orders", "w") == []
    assert ("orders", "w") in waiters(db)
    locker.rollback()  # b is claimable again, but a rollback wakes nobody: the worker polls
    assert notes(listener) == []
    assert claimed(worker, "orders", "w") == ["b"]
    assert ("orders", "w") not in waiters(db)


def test_maintenance_does_not_wait_for_a_worker_transaction_on_an_expired_wait(two, connect):
    db = two
    worker = connect(autocommit=False)
    assert claimed(worker, "orders", "w") == []
    worker.commit()
    db.execute("UPDATE mailbox._inbox_waiter SET waiting_until = now() - interval '1 second'")
    assert receive(db, "orders", "job") is True
    assert claimed(worker, "orders", "w") == ["job"]  # ends its (expired) wait, still open
    maintenance = connect()
    maintenance.execute("SET lock_timeout = '500ms'")
    try:
        # the row the open transaction deletes is skipped, not waited for
        assert scalar(maintenance, "SELECT mailbox.run_maintenance() -> 'inbox_waits_expired'") == 0
    finally:
        worker.rollback()
    # rolled back: the expired wait is back, and the next pass forgets it
    assert scalar(maintenance, "SELECT mailbox.run_maintenance() -> 'inbox_waits_expired'") == 1
    assert waiters(db) == []


# ----------------------------------------------- the named receive's SHARE lock (part 35)
def test_drop_inbox_keeping_the_table_waits_for_a_writer_before_dropping_its_views(db, connect):
    """drop_inbox without cascade waits for a transaction that wrote the managed table (it
    keeps the named receive) before it drops the views that transaction may read next, so
    the two do not deadlock."""
    db.execute("SELECT mailbox.create_inbox('dv')")
    worker = tracked(connect)
    dropper = connect()
    with worker.transaction():
        assert receive(worker, "dv", "a") is True
        errors = []

        def drop():
            try:
                dropper.execute("SELECT mailbox.drop_inbox('dv')")
            except Exception as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=drop)
        t.start()
        wait_blocked(db, dropper)
        assert scalar(worker, "SELECT count(*) FROM mailbox.pending_dv") == 1
    t.join(10)
    assert not t.is_alive() and not errors, errors
    assert table_ids(db, "mailbox.dv") == ["a"]
    assert scalar(db, "SELECT to_regclass('mailbox.pending_dv')") is None


def test_maintenance_leaves_a_named_receive_whose_table_is_written_to_its_next_pass(db, connect):
    """After a restore every named receive names its table's old oid; maintenance
    regenerates them, but not one whose table a transaction is writing: it would wait for
    that transaction and hold up the inbox's receivers meanwhile."""
    db.execute("SELECT mailbox.create_inbox('a')")
    k = key(db, "a")
    fn = f"mailbox._inbox_{k}_receive_named"
    oid = scalar(db, "SELECT 'mailbox.a'::regclass::oid")
    definition = scalar(db, "SELECT pg_get_functiondef(%s::regproc)", [fn])
    db.execute(definition.replace(f" {oid}::pg_catalog.regclass", " 1::pg_catalog.regclass"))
    current = (
        "SELECT mailbox._inbox_named_current(i) FROM mailbox._inbox AS i WHERE inbox_name = 'a'"
    )
    assert scalar(db, current) is False
    writer = connect(autocommit=False)
    writer.execute("INSERT INTO mailbox.a (event_id) VALUES ('w')")
    db.execute("SET lock_timeout = '3s'")
    started = time.monotonic()
    db.execute("SELECT mailbox._inbox_refresh_routes()")
    assert time.monotonic() - started < 1.5  # not waited for the writer
    assert scalar(db, current) is False
    assert "'a'" not in router_src(db, "receive_named")
    writer.commit()
    assert scalar(db, "SELECT mailbox._inbox_refresh_routes()") >= 1
    assert scalar(db, current) is True
    assert routed_keys(db, "receive_named") == [k]
    db.execute("SET track_functions = 'all'")
    with db.transaction():
        calls_before = calls(db, fn)
        assert receive(db, "a", "after") is True
        assert calls(db, fn) == calls_before + 1
