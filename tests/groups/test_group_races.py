"""Adversarial review of the outbox sequencer and consumer groups (SPEC §1, §2, §4).

Every test drives its interleaving by holding connections (and their transactions) open in a
chosen order, waiting until a background statement is really blocked on a lock before going
on, or by 1-second leases. The invariant is SPEC §2.2: every group eventually receives every
committed row (at least once; exactly once when no lease expired), offsets are gapless and
never reused, a stale holder never acknowledges another consumer's rows, and nothing
unrelated stalls delivery. A test that fails documents a bug: its docstring says what the
contract expects.
"""

import random
import threading
import time

import psycopg
import pytest
from groups import Bg, Notices, commit, poll, publish, wait_blocked
from mbx import raises, rows, scalar

# --------------------------------------------------------------------------- helpers


def offsets(got):
    return [r[0] for r in got]


def tags(got):
    return [p["tag"] for _, p in got]


def drain(conn, group, consumer, batch=100):
    """Poll and commit until nothing is left; returns every row received."""
    seen = []
    while True:
        got = poll(conn, group, consumer, batch)
        if not got:
            return seen
        seen += got
        commit(conn, group, consumer, got[-1][0])


def group_state(db, group):
    return rows(
        db,
        "SELECT g.group_offset, g.delivered_offset, o.head_offset, r.low_offset"
        "  FROM mailbox._consumer_group g JOIN mailbox._outbox o USING (outbox_key)"
        "  JOIN mailbox._outbox_retention r USING (outbox_key) WHERE g.group_name = %s",
        [group],
    )[0]


def outbox_key(db, name):
    return scalar(db, "SELECT outbox_key FROM mailbox._outbox WHERE outbox_name = %s", [name])


@pytest.fixture
def outbox(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    return db


# ------------------------------------------------- sequencer: windows, own xid, subxacts


def test_a_transaction_writing_two_outboxes_and_polling_one_loses_nothing(db, connect):
    """A transaction that writes to two outboxes, polls each in turn (numbering a window of
    each while its own xid is running) and writes again must have all its rows delivered to
    both groups after it commits, each exactly once, at consecutive offsets."""
    for n in ("e1", "e2"):
        db.execute("SELECT mailbox.create_outbox(%s)", [n])
        db.execute("SELECT mailbox.create_consumer_group(%s, %s, 'earliest')", ["g" + n, n])
    t, other = connect(autocommit=False), connect()
    publish(t, "e1", 2, "t1")
    publish(t, "e2", 2, "t1")
    publish(other, "e1", 1, "o")  # completes after t got its xid
    publish(other, "e2", 1, "o")
    assert tags(poll(t, "ge2", "t")) == ["o"]
    publish(t, "e1", 2, "t2")
    publish(t, "e2", 2, "t2")
    assert tags(poll(t, "ge1", "t")) == ["o"]
    assert commit(t, "ge1", "t", 1) == 1
    assert commit(t, "ge2", "t", 1) == 1
    publish(t, "e2", 1, "t3")
    t.commit()
    c = connect()
    got1, got2 = drain(c, "ge1", "c"), drain(c, "ge2", "c")
    assert offsets(got1) == [2, 3, 4, 5] and tags(got1) == ["t1", "t1", "t2", "t2"]
    assert offsets(got2) == [2, 3, 4, 5, 6] and tags(got2) == ["t1", "t1", "t2", "t2", "t3"]


def test_windows_cut_mid_transaction_and_chunks_keep_every_row_once(outbox, connect):
    """Windows left half-numbered (p_limit reached inside one transaction's rows, chunks of 2
    rows) and continued by other transactions, while producer transactions span several
    windows: every committed row gets exactly one offset, offsets are gapless, and the rows
    of one transaction are consecutive."""
    db = outbox
    db.execute("SET mailbox.outbox_chunk_rows = 2")
    key = outbox_key(db, "e")

    def seq(limit):
        return scalar(db, "SELECT mailbox._sequence_outbox(%s, %s)", [key, limit])

    long, mid = connect(autocommit=False), connect(autocommit=False)
    publish(long, "e", 3, "L")
    publish(db, "e", 5, "A")
    publish(db, "e", 1, "B")
    assert seq(3) == 3  # cut inside A's rows
    publish(long, "e", 3, "L")  # the same open transaction writes again
    publish(mid, "e", 2, "M")
    publish(db, "e", 4, "C")
    assert seq(3) == 3  # the rest of A, then B: window still open
    assert seq(1) == 1  # window exhausted, a new one starts with C
    long.commit()
    assert seq(2) == 2
    mid.commit()
    got = drain(db, "g", "c", batch=3)
    assert offsets(got) == list(range(1, 19))
    t = tags(got)
    assert t[:10] == ["A"] * 5 + ["B"] + ["C"] * 4
    runs = [t[0]] + [b for a, b in zip(t, t[1:], strict=False) if a != b]
    assert sorted(runs) == ["A", "B", "C", "L", "M"]  # one run per transaction
    assert t.count("L") == 6 and t.count("M") == 2
    assert scalar(db, "SELECT sum(row_count) FROM mailbox._outbox_chunk") == 18


def test_savepoint_rollbacks_and_a_poll_inside_a_savepoint_lose_nothing(outbox, connect):
    """Rows of a rolled-back subtransaction never get offsets; a poll run inside a savepoint
    that is then rolled back leaves no trace; the surviving rows of the transaction arrive
    after its commit, gapless."""
    db = outbox
    t = connect(autocommit=False)
    publish(t, "e", 1, "a")
    t.execute("SAVEPOINT s")
    publish(t, "e", 1, "b")
    assert poll(db, "g", "c") == []
    t.execute("ROLLBACK TO SAVEPOINT s")
    publish(db, "e", 1, "x")  # someone else commits meanwhile
    assert tags(poll(db, "g", "c")) == ["x"]
    publish(t, "e", 1, "c")
    t.execute("SAVEPOINT s2")
    assert poll(t, "g", "t") == []  # x is leased to c
    publish(t, "e", 1, "d")
    t.execute("ROLLBACK TO SAVEPOINT s2")
    publish(t, "e", 1, "e")
    t.commit()
    assert commit(db, "g", "c", 1) == 1
    got = drain(db, "g", "c")
    assert offsets(got) == [2, 3, 4] and tags(got) == ["a", "c", "e"]


def test_capture_inside_functions_triggers_and_truncate_in_one_transaction(db, connect):
    """Statements run inside a SQL function and inside another table's trigger are captured
    like top-level ones; TRUNCATE followed by inserts in the same transaction, with a poll
    in between, arrive in statement order after the commit."""
    db.execute("CREATE TABLE src (id int)")
    db.execute("SELECT mailbox.enable_outbox('src')")
    db.execute("SELECT mailbox.create_consumer_group('gs', 'src', 'earliest')")
    db.execute("CREATE TABLE feed (id int)")
    db.execute(
        "CREATE FUNCTION feed_trg() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN INSERT INTO src SELECT id * 10 FROM new_rows; RETURN NULL; END$$"
    )
    db.execute(
        "CREATE TRIGGER feed_t AFTER INSERT ON feed REFERENCING NEW TABLE AS new_rows"
        " FOR EACH STATEMENT EXECUTE FUNCTION feed_trg()"
    )
    db.execute(
        "CREATE FUNCTION add_src(n int) RETURNS void LANGUAGE sql"
        " AS $$INSERT INTO src SELECT generate_series(1, n)$$"
    )
    t = connect(autocommit=False)
    t.execute("INSERT INTO feed VALUES (1), (2)")
    t.execute("SELECT add_src(2)")
    assert poll(t, "gs", "t") == []
    t.execute("TRUNCATE src")
    t.execute("INSERT INTO src VALUES (7)")
    t.commit()
    got = drain(db, "gs", "c")
    assert offsets(got) == [1, 2, 3, 4]
    assert [(p["op"], [r["id"] for r in p["inserted"]]) for _, p in got] == [
        ("INSERT", [10, 20]),
        ("INSERT", [1, 2]),
        ("TRUNCATE", []),
        ("INSERT", [7]),
    ]


def test_latest_group_receives_rows_of_a_transaction_open_at_its_creation(db, connect):
    """'latest' starts at the head when created: a producer transaction still open then and
    committed later is delivered to the new group; rows committed before are not."""
    db.execute("SELECT mailbox.create_outbox('e')")
    publish(db, "e", 2, "before")
    p = connect(autocommit=False)
    publish(p, "e", 1, "inflight")
    connect().execute("SELECT mailbox.create_consumer_group('gl', 'e', 'latest')")
    publish(db, "e", 1, "after")
    p.commit()
    got = drain(db, "gl", "c")
    assert offsets(got) == [3, 4] and sorted(tags(got)) == ["after", "inflight"]


# ----------------------------------------------------- isolation levels, stalls, liveness


def test_repeatable_read_and_serializable_polls_never_lose_or_duplicate(outbox, connect):
    """Polls in REPEATABLE READ / SERIALIZABLE transactions whose snapshot is older than the
    numbering, interleaved with a READ COMMITTED consumer: every row exactly once (a
    serialization failure is retried, as any client does)."""
    db = outbox
    rc = connect()
    others = []
    for level in (psycopg.IsolationLevel.REPEATABLE_READ, psycopg.IsolationLevel.SERIALIZABLE):
        conn = connect(autocommit=False)
        conn.isolation_level = level
        others.append(conn)
    seen, failures = [], 0
    for r in range(8):
        publish(db, "e", 3, f"r{r}")
        for i, conn in enumerate(others):
            conn.execute("SELECT 1")  # the snapshot is taken now
            got = poll(rc, "g", "rc", 2)
            seen += got
            if got:
                commit(rc, "g", "rc", got[-1][0])
            try:
                got = poll(conn, "g", f"x{i}", 2)
                if got:
                    commit(conn, "g", f"x{i}", got[-1][0])
                conn.commit()
                seen += got
            except psycopg.errors.SerializationFailure:
                conn.rollback()
                failures += 1
    seen += drain(rc, "g", "rc")
    assert sorted(offsets(seen)) == list(range(1, 25))
    assert group_state(db, "g")[0] == 24


def test_consumers_in_repeatable_read_still_receive_rows(outbox, connect):
    """SPEC §2.2.1: every group receives every committed row. A deployment whose consumers
    run at REPEATABLE READ (default_transaction_isolation, or a framework that sets it) must
    still get rows -- or an error telling it to use READ COMMITTED. Today _sequence_outbox
    returns 0 for such callers (sql/18_outbox_sequencer.sql, the isolation check at the top of
    _sequence_outbox) and nothing else numbers an outbox that has groups
    (outbox_maintenance.drain_outbox sequences only group-less outboxes), so poll_outbox
    silently returns nothing, forever."""
    db = outbox
    c = connect(autocommit=False)
    c.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    publish(db, "e", 3)
    db.execute("SELECT mailbox.run_maintenance()")
    got = []
    for _ in range(10):
        got += poll(c, "g", "c")
        c.commit()
        if len(got) >= 3:
            break
        time.sleep(0.1)
    assert offsets(got) == [1, 2, 3]


def test_dropping_an_outbox_does_not_stall_other_outboxes(db, connect):
    """SPEC §2.2.4 / design §3.1 (creating an outbox blocks nobody). Dropping outbox b must
    not make producers of outbox c wait behind an unrelated open transaction on outbox a.
    disable_outbox (sql/12_outbox_ddl.sql, the DETACH PARTITION statements) detaches the
    partitions without CONCURRENTLY, which takes ACCESS EXCLUSIVE on the shared parents
    mailbox._outbox_log / _outbox_delta_rows: it queues behind every open producer or poll
    of any outbox, and every later publish/poll of every outbox queues behind it."""
    for n in ("a", "b", "c"):
        db.execute("SELECT mailbox.create_outbox(%s)", [n])
    p = connect(autocommit=False)
    publish(p, "a", 1)  # an open producer transaction on an unrelated outbox
    d = connect()
    d.execute("SET lock_timeout = '4s'")
    dropper = Bg(lambda: d.execute("SELECT mailbox.drop_outbox('b')"))
    wait_blocked(db, d, dropper)
    q = connect()
    q.execute("SET lock_timeout = '1s'")
    try:
        publish(q, "c", 1)
        blocked = None
    except psycopg.errors.LockNotAvailable as exc:
        blocked = exc
    finally:
        p.commit()
        try:
            dropper.result()
        except psycopg.Error:
            pass
    assert blocked is None, f"publishing to outbox c waited for drop_outbox('b'): {blocked}"


# --------------------------------------------------------- leases, commits, fencing, seek


def test_extend_lease_racing_a_takeover_never_revives_the_lost_lease(outbox, connect):
    """extend_lease by the old holder whose transaction started before its lease expired,
    racing another consumer's takeover: it waits for the takeover, then extends nothing
    (NULL); its late commit acknowledges nothing and warns; the new holder's commit counts."""
    db = outbox
    publish(db, "e", 4)
    a, b = connect(autocommit=False), connect(autocommit=False)
    poll(a, "g", "a", batch=4, visibility=1)
    a.commit()
    a.execute("SELECT now()")  # a's transaction (and its now()) starts before the expiry
    time.sleep(1.3)
    assert offsets(poll(b, "g", "b", batch=4)) == [1, 2, 3, 4]  # open: holds the lease row
    ext = Bg(lambda: scalar(a, "SELECT mailbox.extend_lease('g', 'a', 30)"))
    wait_blocked(db, a, ext)
    b.commit()
    assert ext.result() is None
    a.commit()
    notices = Notices(a)
    assert commit(a, "g", "a", 4) == 0
    a.commit()
    assert any(w.startswith("lease lost") for w in notices.warnings())
    assert commit(b, "g", "b", 4) == 4
    b.commit()
    assert group_state(db, "g")[0] == 4


def test_commit_beyond_delivered_acks_only_own_rows_and_does_not_poison(outbox, connect):
    """A commit past everything delivered acknowledges only the caller's own leases, leaves
    the other consumer's lease alone, and does not stop the caller from acknowledging the
    rows it polls afterwards."""
    db = outbox
    publish(db, "e", 6)
    a, b = connect(), connect()
    assert offsets(poll(a, "g", "a", 3)) == [1, 2, 3]
    assert offsets(poll(b, "g", "b", 3)) == [4, 5, 6]
    assert commit(a, "g", "a", 1000) == 3
    assert group_state(db, "g")[0] == 3
    publish(db, "e", 3)
    assert offsets(poll(a, "g", "a", 3)) == [7, 8, 9]
    assert commit(a, "g", "a", 9) == 3
    assert commit(b, "g", "b", 6) == 3
    assert group_state(db, "g")[0] == 9


def test_takeover_below_the_takers_committed_offset_can_be_committed(outbox, connect):
    """B committed 20, then takes over A's expired lease 1..10 and commits 10: those rows
    are B's now and must be acknowledged, or they are redelivered forever."""
    db = outbox
    publish(db, "e", 20)
    a, b = connect(), connect()
    assert offsets(poll(a, "g", "a", 10, 1)) == list(range(1, 11))
    assert offsets(poll(b, "g", "b", 10)) == list(range(11, 21))
    assert commit(b, "g", "b", 20) == 10
    time.sleep(1.2)
    assert offsets(poll(b, "g", "b", 10)) == list(range(1, 11))
    assert commit(b, "g", "b", 10) == 10
    assert group_state(db, "g")[0] == 20


def test_a_batch_committed_after_a_seek_back_does_not_block_the_replay(outbox, connect):
    """A consumer that commits its in-flight batch after an admin's seek back (the seek
    cleared its lease) must still be able to acknowledge the replayed rows."""
    db = outbox
    publish(db, "e", 10)
    a = connect()
    assert offsets(poll(a, "g", "a", 10)) == list(range(1, 11))
    db.execute("SELECT mailbox.seek_offset('g', 'admin', 0)")
    assert commit(a, "g", "a", 10) == 0  # its lease is gone
    assert offsets(poll(a, "g", "a", 5)) == [1, 2, 3, 4, 5]
    assert commit(a, "g", "a", 5) == 5
    assert drain(a, "g", "a") and group_state(db, "g")[0] == 10


def test_seek_while_a_poll_transaction_is_open_waits_and_replays(outbox, connect):
    """seek_offset concurrent with an open poll transaction waits for it, then clears its
    lease: the consumer's late commit acknowledges nothing and every row after the seek
    target is delivered again."""
    db = outbox
    publish(db, "e", 6)
    a = connect(autocommit=False)
    assert offsets(poll(a, "g", "a", 4)) == [1, 2, 3, 4]
    s = connect()
    seek = Bg(lambda: s.execute("SELECT mailbox.seek_offset('g', 'admin', 2)"))
    assert wait_blocked(db, s, seek)
    assert commit(a, "g", "a", 4) == 4  # still before the seek
    a.commit()
    seek.result()
    assert commit(a, "g", "a", 4) == 0
    got = drain(a, "g", "a")
    assert offsets(got) == [3, 4, 5, 6]


def test_drop_consumer_group_while_a_consumer_polls(db, connect):
    """drop_consumer_group waits for an open poll of the group; afterwards the consumer's
    commit is 42704 and another group of the outbox is unaffected."""
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('h', 'e', 'earliest')")
    publish(db, "e", 3)
    a = connect(autocommit=False)
    assert offsets(poll(a, "g", "a")) == [1, 2, 3]
    d = connect()
    dropper = Bg(lambda: d.execute("SELECT mailbox.drop_consumer_group('g')"))
    assert wait_blocked(db, d, dropper)
    a.commit()
    dropper.result()
    with raises("42704"):
        commit(a, "g", "a", 3)
    a.rollback()
    assert offsets(drain(db, "h", "c")) == [1, 2, 3]


def test_same_consumer_id_in_two_sessions_share_one_batch(outbox, connect):
    """Two sessions polling with one consumer id concurrently are one consumer: the second
    poll is handed the batch the id already holds (the rule that makes a same-id restart
    safe, docs/consumer-groups.md#restarts), so neither session's commit can acknowledge a
    row it was not given; the rows after that batch come once it is committed."""
    db = outbox
    publish(db, "e", 10)
    s1, s2 = connect(), connect()
    barrier = threading.Barrier(2)

    def run(conn):
        barrier.wait()
        return offsets(poll(conn, "g", "same", 5))

    j1, j2 = Bg(lambda: run(s1)), Bg(lambda: run(s2))
    assert j1.result() == j2.result() == [1, 2, 3, 4, 5]
    assert commit(s1, "g", "same", 5) == 5
    assert commit(s2, "g", "same", 5) == 0
    assert offsets(poll(s2, "g", "same", 5)) == [6, 7, 8, 9, 10]
    assert commit(s2, "g", "same", 10) == 5


def test_exactly_once_under_concurrent_producers_and_consumers(outbox, connect):
    """SPEC §2.2.7: producers (some with several statements per transaction, some rolling
    back) and consumers with random batch sizes and sleeps, no lease expiring: every
    committed row is delivered exactly once, offsets gapless."""
    db = outbox
    rng = random.Random(7)
    produced, lock = [], threading.Lock()
    delivered = []
    done = threading.Event()

    def producer(i):
        conn = connect(autocommit=False)
        r = random.Random(i)
        for n in range(40):
            for k in range(r.randint(1, 3)):
                publish(conn, "e", 1, f"p{i}-{n}-{k}")
                time.sleep(r.random() * 0.003)
            if r.random() < 0.15:
                conn.rollback()
            else:
                conn.commit()
                with lock:
                    produced.extend(f"p{i}-{n}-{k}" for k in range(k + 1))

    def consumer(i):
        conn = connect()
        r = random.Random(100 + i)
        idle = 0
        while idle < 5:
            got = poll(conn, "g", f"c{i}", r.randint(1, 15), 60)
            if got:
                idle = 0
                time.sleep(r.random() * 0.005)
                commit(conn, "g", f"c{i}", got[-1][0])
                with lock:
                    delivered.extend(got)
            else:
                idle += 1 if done.is_set() else 0
                time.sleep(0.01)

    producers = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
    consumers = [threading.Thread(target=consumer, args=(i,)) for i in range(4)]
    for t in producers + consumers:
        t.start()
    for t in producers:
        t.join(60)
    done.set()
    for t in consumers:
        t.join(60)
    rng.shuffle(delivered)
    assert sorted(offsets(delivered)) == list(range(1, len(produced) + 1))
    assert sorted(tags(delivered)) == sorted(produced)
    assert group_state(db, "g")[0] == len(produced)


def test_a_huge_batch_over_dense_and_sparse_chunks(outbox, connect):
    """p_batch_size 100000 over 3000 rows: dense chunks (one batch) and sparse ones (two
    producers' ids interleaved): every row once, in offset order, gapless."""
    db = outbox
    publish(db, "e", 1000, "dense")
    p1, p2 = connect(autocommit=False), connect(autocommit=False)
    for _ in range(500):
        publish(p1, "e", 1, "one")
        publish(p2, "e", 1, "two")
    p1.commit()
    p2.commit()
    publish(db, "e", 1000, "dense2")
    got = poll(db, "g", "c", 100000)
    assert offsets(got) == list(range(1, 3001))
    assert [p["n"] for _, p in got[:1000]] == list(range(1, 1001))
    assert tags(got[1000:2000]) == ["one"] * 500 + ["two"] * 500
    assert commit(db, "g", "c", 3000) == 3000


# ------------------------------------------------------------- maintenance vs consumers


def test_a_consumer_forgotten_by_maintenance_while_it_polls_can_commit(outbox, connect):
    """SPEC §2.1: poll_outbox registers an unknown consumer. Maintenance forgets a consumer
    silent for consumer_stale_offset_threshold_days (consumer_maintenance.py)
    while that consumer's poll is already running: the poll read its row, then its heartbeat
    UPDATE waited for maintenance and found the row gone. poll_outbox
    (sql/22_groups_api.sql: it registers only when the first SELECT found no row) then leases
    rows to a consumer that does not exist, and its commit_offset fails with 42704 -- the
    batch cannot be acknowledged and is redelivered after the lease expires."""
    db = outbox
    x = connect()
    assert poll(x, "g", "x") == []  # registers x
    db.execute(
        "UPDATE mailbox._consumer SET registered_at = now() - interval '8 days',"
        " last_heartbeat_at = now() - interval '8 days' WHERE consumer_id = 'x'"
    )
    publish(db, "e", 3)
    m = connect(autocommit=False)
    assert scalar(m, "SELECT mailbox.run_maintenance()")["consumers_forgotten"] == 1
    polling = Bg(lambda: offsets(poll(x, "g", "x")))
    assert wait_blocked(db, x, polling)
    m.commit()
    assert polling.result() == [1, 2, 3]
    assert commit(x, "g", "x", 3) == 3
    assert group_state(db, "g")[0] == 3


def test_a_consumer_reaped_while_it_polls_keeps_working(outbox, connect):
    """Maintenance reaps a silent consumer (releasing its live lease) while that consumer
    polls: the poll waits, takes its released rows back, and its commit acknowledges them."""
    db = outbox
    publish(db, "e", 3)
    x = connect()
    assert offsets(poll(x, "g", "x", 2)) == [1, 2]
    db.execute(
        "UPDATE mailbox._consumer SET last_heartbeat_at = now() - interval '2 days'"
        " WHERE consumer_id = 'x'"
    )
    m = connect(autocommit=False)
    result = scalar(m, "SELECT mailbox.run_maintenance()")
    assert result["consumers_reaped"] == 1 and result["consumer_rows_released"] == 2
    polling = Bg(lambda: offsets(poll(x, "g", "x", 5)))
    assert wait_blocked(db, x, polling)
    m.commit()
    assert polling.result() == [1, 2]
    assert commit(x, "g", "x", 2) == 2
    assert offsets(drain(x, "g", "x")) == [3]
    assert scalar(db, "SELECT reaped_at IS NULL FROM mailbox._consumer WHERE consumer_id = 'x'")


def test_seek_back_racing_a_retention_drain_never_leaves_a_group_below_low(db, connect):
    """SPEC §2.2.6 / §4: a seek back to a retained offset redelivers the rows after it, and
    retention drains only rows at or below every group's offset. Maintenance reads the
    groups' minimum offset once (OUTBOXES_SQL in outbox_maintenance.py) and then drains
    chunks up to it without re-checking; a seek_offset that commits in between (here the
    drain's DELETE waits on a row lock while the seek runs) moves the group back, and the
    drain still deletes the rows the group now needs: afterwards group_offset < low_offset
    and the replay returns nothing (the poll leases offsets whose rows are gone)."""
    db.execute("SELECT mailbox.create_outbox('e', 0)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    publish(db, "e", 10)
    a = connect()
    assert len(drain(a, "g", "a")) == 10
    h = connect(autocommit=False)
    h.execute("SELECT _id FROM mailbox._outbox_log_e FOR UPDATE")
    m = connect()
    maint = Bg(lambda: scalar(m, "SELECT mailbox.run_maintenance()"))
    assert wait_blocked(db, m, maint)
    s = connect()
    seek = Bg(lambda: s.execute("SELECT mailbox.seek_offset('g', 'admin', 0)"))
    wait_blocked(db, s, seek, timeout=2) if not seek.done() else None
    h.rollback()
    seek.result()
    maint.result()
    group_offset, _, head, low = group_state(db, "g")
    got = offsets(drain(a, "g", "a"))
    assert group_offset >= low, f"group at {group_offset} but rows up to {low} were drained"
    assert got == list(range(group_offset + 1, head + 1))


def test_force_retention_with_outstanding_leases_does_not_stall_the_group(db, connect):
    """force_retention drains rows even under live leases; the holders' late commits do not
    fail, and the group goes on with new rows."""
    db.execute("SELECT mailbox.create_outbox('e', 0)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    publish(db, "e", 10)
    a, b = connect(), connect()
    assert offsets(poll(a, "g", "a", 4)) == [1, 2, 3, 4]
    assert offsets(poll(b, "g", "b", 4)) == [5, 6, 7, 8]
    db.execute("SET mailbox.outbox_force_retention = on")
    db.execute("SELECT mailbox.run_maintenance()")
    db.execute("RESET mailbox.outbox_force_retention")
    commit(a, "g", "a", 4)
    commit(b, "g", "b", 8)
    publish(db, "e", 2, "new")
    got = drain(a, "g", "a")
    assert offsets(got) == [11, 12] and tags(got) == ["new", "new"]
    assert group_state(db, "g")[0] == 12


def test_claim_check_rows_wait_for_every_group_even_past_their_offsets(db, connect):
    """A claim-check row past both groups' offsets stays (with its delta rows) until every
    group recorded reading it; then retention takes it."""
    db.execute("CREATE TABLE big (id int)")
    db.execute("SELECT mailbox.enable_outbox('big', 0, 2)")
    db.execute("SELECT mailbox.create_consumer_group('g1', 'big', 'earliest')")
    db.execute("SELECT mailbox.create_consumer_group('g2', 'big', 'earliest')")
    db.execute("INSERT INTO big SELECT generate_series(1, 5)")
    db.execute("INSERT INTO big VALUES (6)")
    for g in ("g1", "g2"):
        got = drain(db, g, "c")
        assert [p.get("claim_check", False) for _, p in got] == [True, False]
    db.execute("SELECT mailbox.outbox_rows_consumed('big', 1, 'g1')")
    db.execute("SELECT mailbox.run_maintenance()")
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_delta_rows('big', 1)") == 5
    db.execute("SELECT mailbox.outbox_rows_consumed('big', 1, 'g2')")
    db.execute("SELECT mailbox.run_maintenance()")
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_log") == 0


def test_earliest_group_created_during_a_retention_drain_is_not_below_low(db, connect):
    """SPEC §2.1: 'earliest' starts before the oldest retained row. A group created while a
    drain is running (maintenance already read the other groups' minimum offset) starts at
    the old low_offset, and the drain then deletes the rows it starts with: the new group
    ends below low_offset and leases offsets whose rows are gone (same cause as the seek
    race: outbox_maintenance.drain_outbox never re-checks the groups it drains for)."""
    db.execute("SELECT mailbox.create_outbox('e', 0)")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    publish(db, "e", 10)
    a = connect()
    assert len(drain(a, "g", "a")) == 10
    h = connect(autocommit=False)
    h.execute("SELECT _id FROM mailbox._outbox_log_e FOR UPDATE")
    m = connect()
    maint = Bg(lambda: scalar(m, "SELECT mailbox.run_maintenance()"))
    assert wait_blocked(db, m, maint)
    s = connect()
    create = Bg(lambda: s.execute("SELECT mailbox.create_consumer_group('g2', 'e', 'earliest')"))
    wait_blocked(db, s, create, timeout=2) if not create.done() else None
    h.rollback()
    create.result()
    maint.result()
    group_offset, _, head, low = group_state(db, "g2")
    got = offsets(drain(a, "g2", "a"))
    assert group_offset >= low, f"new group at {group_offset} but rows up to {low} were drained"
    assert got == list(range(group_offset + 1, head + 1))


def _old_heartbeat(db, consumer):
    db.execute(
        "UPDATE mailbox._consumer SET last_heartbeat_at = now() - interval '1 second'"
        " WHERE consumer_id = %s",
        [consumer],
    )


def test_seek_offset_does_not_deadlock_with_a_polling_consumer(outbox, connect):
    """Design §4 'Lock order': every function takes the consumer row before the group row.
    seek_offset (sql/22_groups_api.sql) locks the group first (_lock_group in its DECLARE)
    and then updates consumer rows (_register_consumer, then committed_offset of every
    consumer of the group). A poll updates its own consumer row (heartbeat) and then waits
    for the group row. With the seek holding the group while the poll holds its consumer
    row, each waits for the other: deadlock, one of them fails with 40P01. Here the seek is
    held up (after taking the group) by an open heartbeat of its own consumer id."""
    db = outbox
    publish(db, "e", 6)
    x = connect()
    poll(x, "g", "x", 1)
    _old_heartbeat(db, "x")
    h = connect(autocommit=False)
    h.execute("SELECT mailbox.seek_offset('g', 'admin', 0)")  # registers admin
    h.commit()
    h.execute("SELECT mailbox.consumer_heartbeat('g', 'admin')")  # holds admin's row
    s = connect()
    seek = Bg(lambda: s.execute("SELECT mailbox.seek_offset('g', 'admin', 0)"))
    assert wait_blocked(db, s, seek)  # waits for admin's row
    polling = Bg(lambda: offsets(poll(x, "g", "x", 2)))
    # Before the fix the poll blocked here (holding x's row, waiting for the group row) and
    # one of the two died with 40P01. With one lock order (consumer rows first) the seek
    # waits before it takes the group, so the poll may simply go through: no assertion.
    wait_blocked(db, x, polling)
    h.commit()
    errors = []
    for name, job in (("seek", seek), ("poll", polling)):
        try:
            job.result()
        except psycopg.Error as exc:
            errors.append(f"{name}: {exc.sqlstate}: {exc}")
    assert errors == []


def test_drop_consumer_group_does_not_deadlock_with_a_polling_consumer(outbox, connect):
    """drop_consumer_group deletes the group row and, through ON DELETE CASCADE, its
    consumers' rows: group row first, consumer rows second -- the reverse of a poll's order
    (own consumer row, then group). A drop holding the group row while a poll holds its
    consumer row and waits for the group deadlocks (40P01). Expected: the drop succeeds and
    the poll fails cleanly with 42704. Here the drop's cascade is held up by an open
    heartbeat of consumer 'w' (deleted before 'x')."""
    db = outbox
    publish(db, "e", 6)
    w, x = connect(autocommit=False), connect()
    poll(w, "g", "w", 1)
    w.commit()
    poll(x, "g", "x", 1)
    _old_heartbeat(db, "x")
    w.execute("SELECT mailbox.consumer_heartbeat('g', 'w')")  # holds w's row
    d = connect()
    dropper = Bg(lambda: d.execute("SELECT mailbox.drop_consumer_group('g')"))
    assert wait_blocked(db, d, dropper)  # waits for w's row
    polling = Bg(lambda: offsets(poll(x, "g", "x", 2)))
    # see the seek test above: with consumer rows locked first, the poll may go through
    wait_blocked(db, x, polling)
    w.commit()
    errors = []
    try:
        dropper.result()
    except psycopg.Error as exc:
        errors.append(f"drop: {exc.sqlstate}: {exc}")
    try:
        polling.result()
    except psycopg.Error as exc:
        if exc.sqlstate != "42704":
            errors.append(f"poll: {exc.sqlstate}: {exc}")
    assert errors == []
    assert scalar(db, "SELECT count(*) FROM mailbox._consumer_group WHERE group_name = 'g'") == 0
