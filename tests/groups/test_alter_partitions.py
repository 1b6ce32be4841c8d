"""mailbox.alter_outbox_partitions (issue 13): the partition count of an outbox changes while
its consumers run; offsets stay, and per-key order holds in every group across the change
(docs/ordering.md#changing-the-partition-count). Real PostgreSQL, deliberate interleavings."""

import random
import threading
import time

import psycopg
import pytest
from dumps import _new_database, dump_and_restore
from groups import Notices, Numberer, commit, holders, ppoll, produce_keyed, wait_for
from mbx import drop_role, make_role, raises, rows, scalar


def publish_keys(conn, keys, outbox="e"):
    conn.execute(
        "SELECT count(mailbox.outbox_publish(%s, jsonb_build_object('k', k), '{}', k))"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS u (k, n)",
        [outbox, keys],
    )


def part(key, parts):
    """The partition of a key with `parts` partitions, as the SPEC defines it (SQL's hashtext)."""
    return PARTS_CACHE[(key, parts)]


PARTS_CACHE: dict = {}


def remember_parts(db, keys, counts):
    for n in counts:
        for k, p in rows(
            db,
            "SELECT k, (abs(hashtext(coalesce(k, ''))::bigint) %% %s)::int"
            " FROM unnest(%s::text[]) AS k",
            [n, keys],
        ):
            PARTS_CACHE[(k, n)] = p


def outbox_parts(db, outbox="e"):
    return scalar(db, "SELECT mailbox.outbox_status(%s)", [outbox])["partitions"]


def group_state(db, group="g"):
    """(partitions the group uses, boundary of a change it drains or None)."""
    st = scalar(db, "SELECT mailbox.outbox_status('e')")
    (g,) = [x for x in st["consumer_groups"] if x["name"] == group]
    return g["partitions"], g["partition_change_boundary"]


def partition_rows(db, group="g"):
    return rows(
        db,
        "SELECT partition FROM mailbox.consumer_partition_lag WHERE group_name = %s ORDER BY 1",
        [group],
    )


KEYS = [f"k{i}" for i in range(40)]


@pytest.fixture
def box(db):
    remember_parts(db, KEYS + [""], range(1, 9))

    def make(parts):
        db.execute("SELECT mailbox.create_outbox('e', p_partitions => %s)", [parts])
        db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
        return db

    return make


# -- arguments, privileges ------------------------------------------------------------------


def test_bad_arguments_change_nothing(box):
    db = box(4)
    db.execute("SELECT mailbox.create_outbox('one')")
    publish_keys(db, KEYS[:5])
    for bad in (0, -1, 257):
        with raises("22023") as exc:
            db.execute("SELECT mailbox.alter_outbox_partitions('e', %s)", [bad])
        assert "p_partitions" in exc.value.diag.message_primary
        assert "p_partitions" in exc.value.diag.message_hint
    with raises("22004") as exc:
        db.execute("SELECT mailbox.alter_outbox_partitions('e', NULL)")
    assert "p_partitions" in exc.value.diag.message_hint
    with raises("42704"):
        db.execute("SELECT mailbox.alter_outbox_partitions('nope', 8)")
    with raises("22004"):
        db.execute("SELECT mailbox.alter_outbox_partitions(NULL, 8)")
    assert outbox_parts(db) == 4 and outbox_parts(db, "one") == 1
    assert scalar(db, "SELECT count(*) FROM mailbox._partition_change") == 0
    assert len(partition_rows(db)) == 4
    # the same count: nothing happens, not even a pause
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 4)")
    db.execute("SELECT mailbox.alter_outbox_partitions('one', 1)")
    assert scalar(db, "SELECT count(*) FROM mailbox._partition_change") == 0
    assert outbox_parts(db) == 4 and group_state(db) == (4, None)


def test_only_mailbox_admin_may_change_the_count(box, connect):
    db = box(4)
    consumer = make_role(db, "mailbox_consumer", "mailbox_producer")
    admin = make_role(db, "mailbox_admin")
    try:
        conn = connect()
        conn.execute(f'SET ROLE "{consumer}"')
        with raises("42501"):
            conn.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
        # a consume grant on the outbox itself does not make one an administrator
        db.execute("SELECT mailbox.grant_outbox('e', %s::regrole, 'consume')", [consumer])
        with raises("42501"):
            conn.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
        conn.execute("RESET ROLE")
        assert outbox_parts(db) == 4
        conn.execute(f'SET ROLE "{admin}"')
        conn.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
        conn.execute("RESET ROLE")
        assert outbox_parts(db) == 8
        # it is a definer with a pinned search path (it runs no code of the caller's)
        assert rows(
            db,
            "SELECT prosecdef, proconfig FROM pg_proc"
            " WHERE oid = 'mailbox.alter_outbox_partitions(text, int)'::regprocedure",
        ) == [(True, ["search_path=pg_catalog, mailbox, pg_temp"])]
    finally:
        drop_role(db, consumer)
        drop_role(db, admin)


# -- deterministic interleavings ------------------------------------------------------------


@pytest.mark.parametrize("old,new", [(1, 4), (4, 1), (4, 8), (8, 4), (4, 6)])
def test_caught_up_group_switches_at_once(box, connect, old, new):
    """A group with nothing in flight takes the new count in the ALTER's transaction: the views
    show it, and rows after the change come in the new layout, offsets going on."""
    db = box(old)
    publish_keys(db, KEYS)
    c = connect()
    got = ppoll(c, "g", "a", batch=1000)
    assert [r[0] for r in got] == list(range(1, 41))
    assert all(p == part(k, old) for _, k, p in got)
    assert commit(c, "g", "a", 40) == 40
    db.execute("SELECT mailbox.alter_outbox_partitions('e', %s)", [new])
    assert outbox_parts(db) == new and group_state(db) == (new, None)
    assert len(partition_rows(db)) == (new if new > 1 else 0)
    publish_keys(db, KEYS)
    got = ppoll(c, "g", "a", batch=1000)
    assert [r[0] for r in got] == list(range(41, 81))
    assert all(p == part(k, new) for _, k, p in got)
    assert commit(c, "g", "a", 80) == 40
    lag = rows(db, "SELECT group_offset, head_offset, lag FROM mailbox.consumer_lag('g')")
    assert lag == [(80, 80, 0)]


@pytest.mark.parametrize("old,new", [(1, 4), (4, 1), (4, 8)])
def test_rows_in_flight_hold_back_the_new_layout(box, connect, old, new):
    """A consumer between poll and commit during the ALTER: no row after the boundary goes to
    anyone until its rows are committed; its commit still acknowledges them; then the group
    switches and rows after the boundary come in the new layout."""
    db = box(old)
    publish_keys(db, KEYS)  # offsets 1..40
    a = connect(autocommit=False)
    got_a = ppoll(a, "g", "a", batch=10)
    a.commit()  # a works on its batch ...
    assert len(got_a) == 10
    db.execute("SELECT mailbox.alter_outbox_partitions('e', %s)", [new])
    assert outbox_parts(db) == new
    assert group_state(db) == (old, 40)  # draining: the old count up to offset 40
    publish_keys(db, KEYS)  # offsets 41..80, after the boundary
    b = connect()
    seen_b = []
    for _ in range(5):
        got = ppoll(b, "g", "b", batch=1000)
        seen_b += got
        if got:
            commit(b, "g", "b", got[-1][0])
    # b got only rows up to the boundary, of keys a does not hold, in the old layout
    assert all(o <= 40 for o, _, _ in seen_b)
    assert all(p == part(k, old) for _, k, p in seen_b)
    a_keys = {k for _, k, _ in got_a}
    if old > 1:
        assert not a_keys & {k for _, k, _ in seen_b}
    # a's commit of rows it legitimately holds succeeds
    assert commit(a, "g", "a", got_a[-1][0]) == len(got_a)
    a.commit()
    delivered = {o for o, _, _ in got_a} | {o for o, _, _ in seen_b}
    rest = []
    for _ in range(10):
        for conn, name in ((a, "a"), (b, "b")):
            got = ppoll(conn, "g", name, batch=1000)
            if got:
                rest += got
                commit(conn, "g", name, got[-1][0])
            if not conn.autocommit:
                conn.commit()
    offsets = [o for o, _, _ in rest]
    assert sorted(delivered | set(offsets)) == list(range(1, 81))
    assert len(delivered) + len(offsets) == 80, "a row was delivered twice"
    for o, k, p in rest:
        assert p == part(k, old if o <= 40 else new), (o, k, p)
    # every row up to the boundary came before any row after it
    before = [i for i, o in enumerate(offsets) if o <= 40]
    after = [i for i, o in enumerate(offsets) if o > 40]
    assert after and (not before or max(before) < min(after))
    assert group_state(db) == (new, None)
    assert rows(db, "SELECT group_offset, lag FROM mailbox.consumer_lag('g') LIMIT 1") == [(80, 0)]


@pytest.mark.parametrize("old,new", [(1, 4), (4, 1), (4, 8)])
def test_a_lease_expiring_across_the_change(box, connect, old, new):
    """A consumer's lease expires after the ALTER: another consumer gets its rows again, in the
    old layout, before any row after the boundary; the dead one's late commit acknowledges
    nothing (lease lost)."""
    db = box(old)
    publish_keys(db, KEYS)  # 1..40
    a = connect()
    got_a = ppoll(a, "g", "a", batch=10, visibility=1)
    assert [r[0] for r in got_a] == list(range(1, 11))
    db.execute("SELECT mailbox.alter_outbox_partitions('e', %s)", [new])
    assert group_state(db) == (old, 40)
    publish_keys(db, KEYS)  # 41..80
    time.sleep(1.2)
    b = connect()
    again = ppoll(b, "g", "b", batch=1000)
    assert again[:10] == got_a  # the same rows first, the old layout
    assert all(o <= 40 and p == part(k, old) for o, k, p in again)
    notices = Notices(a)
    assert commit(a, "g", "a", 10) == 0
    assert any("lease lost" in w for w in notices.warnings())
    assert ppoll(b, "g", "b", batch=1000)[:10] == got_a  # still b's, not committed
    assert commit(b, "g", "b", 10) == 10
    seen = {o for o, _, _ in again}
    last = max(o for o, _, _ in again)
    for _ in range(3):
        if seen == set(range(1, 41)):
            break
        got = ppoll(b, "g", "b", batch=1000)
        assert all(o <= 40 and p == part(k, old) for o, k, p in got)
        seen |= {o for o, _, _ in got}
        last = max(o for o, _, _ in got)
    assert seen == set(range(1, 41)) and group_state(db) == (old, 40)
    assert commit(b, "g", "b", last) == 30
    got = []
    for _ in range(3):
        for conn, name in ((b, "b"), (a, "a")):
            batch = ppoll(conn, "g", name, batch=1000)
            got += batch
            if batch:
                commit(conn, "g", name, batch[-1][0])
    assert group_state(db) == (new, None)  # ... or the first poll after it
    assert sorted(o for o, _, _ in got) == list(range(41, 81))
    assert all(p == part(k, new) for _, k, p in got)


def test_parked_rows_follow_the_new_layout(box, connect):
    db = box(4)
    publish_keys(db, KEYS)  # 1..40
    a = connect()
    assert len(ppoll(a, "g", "a", batch=1000)) == 40
    db.execute("SELECT mailbox.outbox_park('g', 'a', 5, 'poison')")
    assert commit(a, "g", "a", 40) == 39
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
    assert group_state(db) == (8, None)  # a parked row counts as acknowledged
    assert rows(
        db, 'SELECT outbox_id, partition FROM mailbox.outbox_parked WHERE "group" = %s', ["g"]
    ) == [(5, part("k4", 8))]
    publish_keys(db, KEYS)  # 41..80
    got = ppoll(a, "g", "a", batch=1000)
    assert [r[0] for r in got] == list(range(41, 81))
    assert commit(a, "g", "a", 80) == 40
    db.execute("SELECT mailbox.outbox_unpark('g', 5)")
    assert ppoll(a, "g", "a", batch=1000) == [(5, "k4", part("k4", 8))]
    assert commit(a, "g", "a", 80) == 1
    assert ppoll(a, "g", "a", batch=1000) == []
    assert rows(db, "SELECT group_offset, lag FROM mailbox.consumer_lag('g')") == [(80, 0)]


def test_a_row_parked_while_draining_unblocks_the_switch(box, connect):
    db = box(4)
    publish_keys(db, KEYS)  # 1..40
    a = connect()
    got = ppoll(a, "g", "a", batch=5)
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 2)")
    publish_keys(db, KEYS)  # 41..80
    assert commit(a, "g", "a", got[-2][0]) == 4
    db.execute("SELECT mailbox.outbox_park('g', 'a', %s, 'poison')", [got[-1][0]])
    rest = ppoll(a, "g", "a", batch=1000)
    assert [r[0] for r in rest] == list(range(6, 41))
    assert commit(a, "g", "a", 40) == 35
    rest = ppoll(a, "g", "a", batch=1000)
    assert [r[0] for r in rest] == list(range(41, 81))
    assert all(p == part(k, 2) for _, k, p in rest)


def test_changing_again_while_a_group_drains(box, connect):
    """4 -> 8 while rows are in flight, then 8 -> 2: the group drains its 4-partition layout up
    to the first boundary and goes straight to 2. 4 -> 8 -> 4: no switch at all."""
    db = box(4)
    publish_keys(db, KEYS)  # 1..40
    a = connect()
    held = ppoll(a, "g", "a", batch=10)
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
    publish_keys(db, KEYS)  # 41..80
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 2)")
    assert outbox_parts(db) == 2 and group_state(db) == (4, 40)
    publish_keys(db, KEYS)  # 81..120
    assert commit(a, "g", "a", held[-1][0]) == 10
    got = ppoll(a, "g", "a", batch=1000)
    assert [r[0] for r in got] == list(range(11, 41))
    assert commit(a, "g", "a", 40) == 30
    got = ppoll(a, "g", "a", batch=1000)
    assert [r[0] for r in got] == list(range(41, 121))
    assert all(p == part(k, 2) for _, k, p in got)
    assert commit(a, "g", "a", 120) == 80
    # back and forth while draining: the group keeps its layout, no pause left behind
    held = ppoll(a, "g", "a", batch=1000)
    assert held == []
    publish_keys(db, KEYS)  # 121..160
    held = ppoll(a, "g", "a", batch=10)
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 4)")
    assert group_state(db) == (2, 160)
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 2)")
    assert group_state(db) == (2, None)
    publish_keys(db, KEYS)  # 161..200
    assert commit(a, "g", "a", held[-1][0]) == 10
    got = ppoll(a, "g", "a", batch=1000)
    assert [r[0] for r in got] == list(range(131, 201))
    assert all(p == part(k, 2) for _, k, p in got)


def test_seek_while_draining_replays_in_the_new_layout(box, connect):
    db = box(4)
    publish_keys(db, KEYS)
    a = connect()
    ppoll(a, "g", "a", batch=10)
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 1)")
    assert group_state(db) == (4, 40)
    db.execute("SELECT mailbox.seek_offset('g', 'a', 0)")
    assert group_state(db) == (1, None)
    got = ppoll(a, "g", "a", batch=1000)
    assert [r[0] for r in got] == list(range(1, 41)) and {r[2] for r in got} == {0}


def test_a_new_group_starts_in_the_new_layout(box, connect):
    db = box(4)
    publish_keys(db, KEYS)
    a = connect()
    ppoll(a, "g", "a", batch=10)
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
    db.execute("SELECT mailbox.create_consumer_group('h', 'e', 'earliest')")
    assert group_state(db, "h") == (8, None) and group_state(db) == (4, 40)
    got = ppoll(a, "h", "a", batch=1000)
    assert [r[0] for r in got] == list(range(1, 41))
    assert all(p == part(k, 8) for _, k, p in got)


# -- consumers running during the change ----------------------------------------------------


@pytest.mark.parametrize(
    "old,new,numberer",
    [(1, 4, False), (1, 4, True), (4, 1, True), (4, 8, False), (4, 8, True), (8, 3, False)],
    ids=["1-4", "1-4-numberer", "4-1-numberer", "4-8", "4-8-numberer", "8-3"],
)
def test_change_under_load_keeps_per_key_order(box, connect, old, new, numberer):
    """Two producers and three consumers (one keeping its poll transaction open while it
    works) run while the count changes; a fourth consumer holds a batch across the ALTER.
    Per key (on a side of the boundary with partitions), the group receives rows in offset
    order, never a row while an earlier row of its key is delivered and not committed; no row
    after the boundary before every row up to it is committed; every row exactly once;
    partitions follow the layout of their side of the boundary."""
    db = box(old)
    keys = [f"key-{i}" for i in range(60)]
    remember_parts(db, keys, (old, new))
    runner = Numberer(connect) if numberer else None
    total = 3000
    lock = threading.Lock()
    events = []  # ("recv", consumer, rows) / ("commit", consumer, offsets), in the order seen
    stop = threading.Event()
    errors = []

    def work(conn, name, got, rnd, open_txn):
        with lock:
            events.append(("recv", name, got))
        if not open_txn:
            conn.commit()
        time.sleep(rnd.random() * 0.004)  # processing
        with lock:  # recorded before the commit starts: a superset of what is committed
            events.append(("commit", name, [o for o, _, _ in got]))
        commit(conn, "g", name, got[-1][0])
        conn.commit()

    def consume(name, open_txn):
        conn = connect(autocommit=False)
        rnd = random.Random(name)
        try:
            while not stop.is_set():
                got = ppoll(conn, "g", name, batch=rnd.randint(5, 60))
                if not got:
                    conn.commit()
                    time.sleep(0.003)
                    continue
                work(conn, name, got, rnd, open_txn)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        if runner:
            wait_for(lambda: scalar(db, "SELECT mailbox._numberer_alive()"), what="numberer")
        threads = [
            threading.Thread(target=produce_keyed, args=(connect, i, keys, total // 2, errors))
            for i in range(2)
        ]
        threads += [threading.Thread(target=consume, args=(f"c{i}", i == 2)) for i in range(3)]
        for t in threads:
            t.start()
        # the holder: a batch in flight across the ALTER
        holder = connect(autocommit=False)
        wait_for(
            lambda: scalar(db, "SELECT head_offset FROM mailbox.outboxes") > total // 4,
            timeout=60,
            what="a quarter of the rows",
        )
        held = []

        def hold():
            held[:] = ppoll(holder, "g", "holder", batch=20)
            holder.commit()
            return bool(held)

        wait_for(hold, timeout=30, what="a batch for the holder")
        with lock:
            events.append(("recv", "holder", list(held)))
        db.execute("SELECT mailbox.alter_outbox_partitions('e', %s)", [new])
        parts, boundary = group_state(db)
        assert (parts, boundary is not None) == (old, True), "the holder's rows keep the old layout"
        time.sleep(0.5)  # the others run on, up to the boundary
        with lock:
            events.append(("commit", "holder", [o for o, _, _ in held]))
        commit(holder, "g", "holder", held[-1][0])
        holder.commit()
        threads.append(threading.Thread(target=consume, args=("holder", False)))
        threads[-1].start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not errors:
            with lock:
                committed = sum(len(e[2]) for e in events if e[0] == "commit")
            if committed >= total and group_state(db) == (new, None):
                break
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, errors
    finally:
        if runner:
            runner.stop()

    # replay what the consumers saw, in order
    done = set()
    delivered = []
    last = {}  # key -> (offset, consumer, batch number)
    for n, (kind, name, data) in enumerate(events):
        if kind == "commit":
            done.update(data)
            continue
        for o, k, p in data:
            delivered.append(o)
            assert p == part(k, old if o <= boundary else new), (o, k, p, boundary)
            if o > boundary:
                assert len(done & set(range(1, boundary + 1))) == boundary, (
                    f"row {o} after the boundary {boundary} before every row up to it was committed"
                )
            prev = last.get(k)
            side = o > boundary
            if prev is not None and (prev[0] > boundary) == side and (new if side else old) == 1:
                pass  # one partition: consumers compete, no per-key order (SPEC 2.3)
            elif prev is not None:
                assert prev[0] < o, f"key {k}: row {o} after row {prev[0]}"
                assert prev[2] == n or prev[0] in done, (
                    f"key {k}: row {o} delivered to {name} while row {prev[0]} was in flight"
                )
            last[k] = (o, name, n)
    assert sorted(delivered) == list(range(1, total + 1)), "not every row exactly once"
    assert 0 < boundary < total
    assert rows(db, "SELECT group_offset, lag FROM mailbox.consumer_lag('g') LIMIT 1") == [
        (total, 0)
    ]
    assert len(partition_rows(db)) == (new if new > 1 else 0)


def test_dump_and_restore_keep_the_new_count_and_a_change_in_progress(
    box, connect, dsn, pg_cluster, tmp_path
):
    db = box(4)
    publish_keys(db, KEYS)  # 1..40
    a = connect()
    held = ppoll(a, "g", "a", batch=10)
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
    assert group_state(db) == (4, 40)
    with _new_database(pg_cluster.dsn()) as target_dsn:
        dump_and_restore(dsn, target_dsn, "custom", tmp_path)
        with psycopg.connect(target_dsn, autocommit=True) as restored:
            assert outbox_parts(restored) == 8 and group_state(restored) == (4, 40)
            publish_keys(restored, KEYS)  # 41..80
            assert commit(restored, "g", "a", held[-1][0]) == 10
            got = ppoll(restored, "g", "a", batch=1000)
            assert [r[0] for r in got] == list(range(11, 41))
            assert all(p == part(k, 4) for _, k, p in got)
            assert commit(restored, "g", "a", 40) == 30
            got = ppoll(restored, "g", "a", batch=1000)
            assert [r[0] for r in got] == list(range(41, 81))
            assert all(p == part(k, 8) for _, k, p in got)
            assert group_state(restored) == (8, None)


def test_an_open_poll_transaction_defers_the_switch_and_blocks_nobody(box, connect):
    """Without a numberer, a poll switches a drained group; when another consumer's poll
    transaction is open (its partitions locked) the switch waits for a later poll instead of
    blocking this one."""
    db = box(4)
    publish_keys(db, KEYS)  # 1..40
    a = connect(options="-c statement_timeout=5000")
    b = connect(autocommit=False)
    assert len(ppoll(a, "g", "a", batch=1000)) == 40
    assert commit(a, "g", "a", 40) == 40
    assert ppoll(b, "g", "b") == []  # registers b
    b.commit()
    assert ppoll(a, "g", "a") == []  # a gives up two partitions
    assert ppoll(b, "g", "b") == []  # b takes them
    b.commit()
    assert sorted(holders(db).values()) == ["a", "a", "b", "b"]
    publish_keys(db, KEYS)  # 41..80
    got_a, got_b = ppoll(a, "g", "a", batch=1000), ppoll(b, "g", "b", batch=1000)
    b.commit()
    assert got_a and got_b and len(got_a) + len(got_b) == 40
    db.execute("SELECT mailbox.alter_outbox_partitions('e', 8)")
    assert group_state(db) == (4, 80)
    publish_keys(db, KEYS)  # 81..120
    assert commit(b, "g", "b", got_b[-1][0]) == len(got_b)
    b.commit()
    assert ppoll(b, "g", "b", batch=1000) == []  # a still holds rows; b's transaction stays open
    assert commit(a, "g", "a", got_a[-1][0]) == len(got_a)
    assert ppoll(a, "g", "a", batch=1000) == []  # drained, but b holds its partitions
    assert group_state(db) == (4, 80)
    b.commit()
    got = ppoll(a, "g", "a", batch=1000) + ppoll(b, "g", "b", batch=1000)
    b.commit()
    assert group_state(db) == (8, None)
    assert sorted(o for o, _, _ in got) == list(range(81, 121))
    assert all(p == part(k, 8) for _, k, p in got)
