"""Kept gap state of managed ordered inboxes (issue 11, docs/inbox.md#how-gaps-are-kept).

inbox_ordering_gaps and inbox_health read the gaps kept in mailbox._inbox_gap, folded from the
aggregates the inbox table's triggers recorded as touched. Every test compares the answer with
a from-scratch recomputation (Python, from the table and the aggregate positions) and with the
gaps_<inbox> view (which still scans every unprocessed message), after random sequences of
every kind of write, and with connections interleaved on purpose.
"""

import random
import threading

import psycopg
import pytest
from mbx import rows, scalar


def receive(conn, event_id, aggregate, seq, inbox="g"):
    return scalar(
        conn,
        "SELECT mailbox.inbox_receive(%s, %s, '{}', NULL, NULL, %s, %s)",
        [inbox, event_id, aggregate, seq],
    )


def gaps(conn, inbox="g"):
    return [
        tuple(r[:3]) for r in rows(conn, "SELECT * FROM mailbox.inbox_ordering_gaps(%s)", [inbox])
    ]


def scratch(conn, inbox="g"):
    """Every gap recomputed from scratch: from each aggregate's position (or first - 1),
    every step greater than one among it and its unprocessed sequences above it."""
    first = scalar(
        conn, "SELECT ordering_first_sequence FROM mailbox._inbox WHERE inbox_name = %s", [inbox]
    )
    last = dict(
        rows(
            conn,
            "SELECT a.aggregate_id, a.last_seq FROM mailbox._inbox_aggregate AS a"
            " JOIN mailbox._inbox AS i USING (inbox_key) WHERE i.inbox_name = %s",
            [inbox],
        )
    )
    seqs = {}
    for agg, seq in rows(
        conn,
        f"SELECT aggregate_id, sequence_num FROM mailbox.{inbox}"
        " WHERE processed_at IS NULL AND aggregate_id IS NOT NULL AND sequence_num IS NOT NULL",
    ):
        seqs.setdefault(agg, []).append(seq)
    out = []
    for agg, found in seqs.items():
        prev = last.get(agg, first - 1)
        for seq in sorted(s for s in found if s > prev):
            if seq > prev + 1:
                out.append((agg, prev + 1, seq))
            prev = seq
    return sorted(out)


def view(conn, inbox="g"):
    return [
        tuple(r)
        for r in rows(
            conn,
            f"SELECT aggregate_id, expected_seq, found_seq FROM mailbox.gaps_{inbox}"
            " ORDER BY aggregate_id, expected_seq",
        )
    ]


def counts(conn, inbox="g"):
    """pending, dead letters and processed, counted from the table."""
    return tuple(
        rows(
            conn,
            f"SELECT count(*) FILTER (WHERE processed_at IS NULL AND retry_count < i.max_retries),"
            f" count(*) FILTER (WHERE processed_at IS NULL AND retry_count >= i.max_retries),"
            f" count(*) FILTER (WHERE processed_at IS NOT NULL)"
            f" FROM mailbox.{inbox} CROSS JOIN mailbox._inbox AS i WHERE i.inbox_name = %s",
            [inbox],
        )[0]
    )


def check(conn, inbox="g"):
    got = gaps(conn, inbox)
    assert got == view(conn, inbox)  # same rows, same order as the scan
    assert sorted(got) == scratch(conn, inbox)
    health = scalar(conn, "SELECT mailbox.inbox_health(%s)", [inbox])
    assert health["gap_count"] == len(got)
    # the kept counts (docs/inbox-ordering.md, "How gaps are kept") equal a count of the table
    assert (
        health["pending_count"],
        health["dead_letter_count"],
        health["processed_count"],
    ) == counts(conn, inbox)
    status = rows(
        conn,
        "SELECT pending_count, dead_letter_count, processed_count FROM mailbox.inbox_status(%s)",
        [inbox],
    )[0]
    assert tuple(status) == counts(conn, inbox)
    return got


@pytest.fixture
def g(db):
    db.execute("SELECT mailbox.create_inbox('g', p_max_retries => 2, p_retention_hours => 1)")
    db.execute("SELECT mailbox.enable_inbox_ordering('g')")
    return db


def key(db, inbox="g"):
    return scalar(db, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox])


def test_gaps_are_kept_and_folded(g):
    db = g
    receive(db, "a1", "A", 1)
    receive(db, "a3", "A", 3)
    receive(db, "b5", "B", 5)
    assert check(db) == [("A", 2, 3), ("B", 1, 5)]
    # the fold stored them and consumed what the triggers recorded
    assert (
        scalar(db, "SELECT count(*) FROM mailbox._inbox_gap WHERE inbox_key = %s", [key(db)]) == 2
    )
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_gap_touched") == 0
    # an untouched inbox is answered from the stored gaps alone
    assert check(db) == [("A", 2, 3), ("B", 1, 5)]
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_gap_touched") == 0


@pytest.mark.parametrize("seed", range(6))
def test_random_writes_match_a_recomputation(g, seed):
    """receive (one and batch), mark processed in and out of turn (skipping a hole), fail into
    the DLQ, replay, retention of processed rows and dead letters, plain INSERT / UPDATE /
    DELETE by hand; checked after every few steps, inside REPEATABLE READ (no fold) too."""
    db = g
    rnd = random.Random(seed)
    aggs = ["a", "b", "c", "d", "e"]
    n = 0

    def ids(where="processed_at IS NULL"):
        return [r[0] for r in rows(db, f"SELECT event_id FROM mailbox.g WHERE {where}")]

    for step in range(120):
        op = rnd.choice(
            ["receive"] * 5
            + ["batch"] * 2
            + ["process"] * 3
            + ["fail", "replay", "retention", "plain", "delete", "skip"]
        )
        if op == "receive":
            n += 1
            receive(db, f"m{n}", rnd.choice(aggs), rnd.randint(1, 12))
        elif op == "batch":
            msgs = []
            for _ in range(rnd.randint(1, 6)):
                n += 1
                msgs.append(
                    {
                        "p_event_id": f"m{n}",
                        "p_payload": {},
                        "p_aggregate_id": rnd.choice(aggs),
                        "p_sequence_num": rnd.randint(1, 12),
                    }
                )
            db.execute(
                "SELECT * FROM mailbox.inbox_receive_batch('g', %s)",
                [psycopg.types.json.Jsonb(msgs)],
            )
        elif op == "process":
            got = rows(db, "SELECT event_id FROM mailbox.inbox_claim('g', 'w', 3)")
            if got:
                db.execute(
                    "SELECT mailbox.inbox_mark_processed('g', %s::text[])", [[r[0] for r in got]]
                )
        elif op == "skip" and ids():
            # processed out of turn (without a claim): the position jumps past holes
            db.execute("SELECT mailbox.inbox_mark_processed('g', %s)", [rnd.choice(ids())])
        elif op == "fail" and ids():
            db.execute("SELECT mailbox.inbox_mark_failed('g', %s, 'boom')", [rnd.choice(ids())])
        elif op == "replay":
            done = ids("processed_at IS NOT NULL OR retry_count >= 2")
            if done:
                db.execute("SELECT mailbox.replay_inbox_messages('g', %s)", [rnd.sample(done, 1)])
        elif op == "retention":
            db.execute(
                "UPDATE mailbox.g SET received_at = received_at - interval '3 hours',"
                " processed_at = processed_at - interval '3 hours'"
                " WHERE event_id = ANY (%s)",
                [rnd.sample(ids("true"), min(3, len(ids("true"))))],
            )
            db.execute("SET mailbox.inbox_dlq_retention_hours = 1")
            db.execute("SELECT mailbox.run_maintenance()")
            db.execute("RESET mailbox.inbox_dlq_retention_hours")
        elif op == "plain":
            n += 1
            db.execute(
                "INSERT INTO mailbox.g (event_id, payload, aggregate_id, sequence_num)"
                " VALUES (%s, '{}', %s, %s) ON CONFLICT (event_id) DO NOTHING",
                [f"m{n}", rnd.choice(aggs), rnd.randint(1, 12)],
            )
        elif op == "delete" and ids():
            db.execute("DELETE FROM mailbox.g WHERE event_id = %s", [rnd.choice(ids())])
        if step % 4 == 3:
            if rnd.random() < 0.3:
                # REPEATABLE READ cannot fold: the same answer without writing
                db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                before = scalar(db, "SELECT count(*) FROM mailbox._inbox_gap_touched")
                check(db)
                assert scalar(db, "SELECT count(*) FROM mailbox._inbox_gap_touched") == before
                db.execute("COMMIT")
            else:
                check(db)
    check(db)


@pytest.mark.parametrize("seed", range(4))
def test_appended_sequences_fold_from_the_head(g, connect, seed):
    """Mostly appending writers (the next sequence, sometimes one or two skipped: a new
    hole), as a fold reads them from each aggregate's head; now and then a late fill of a
    hole, a batch whose sequences straddle the head, a mark of the lowest message, and a
    second connection whose receive commits only after a fold: each must be read again from
    the aggregate's position. Checked against a recomputation after every step."""
    db = g
    late = connect()
    rnd = random.Random(seed)
    head = {a: 0 for a in "abcdef"}
    holes = []
    n = 0
    pending_late = None
    for step in range(80):
        agg = rnd.choice(list(head))
        op = rnd.choice(["append"] * 6 + ["batch"] * 2 + ["fill", "straddle", "process", "late"])
        n += 1
        if op == "append":
            skip = rnd.choice([0, 0, 0, 1, 2])
            holes += [(agg, head[agg] + 1 + i) for i in range(skip)]
            head[agg] += 1 + skip
            receive(db, f"m{n}", agg, head[agg])
        elif op == "batch":
            msgs = []
            for i in range(rnd.randint(1, 4)):
                head[agg] += rnd.choice([1, 1, 2])
                msgs.append(
                    {
                        "p_event_id": f"m{n}-{i}",
                        "p_payload": {},
                        "p_aggregate_id": agg,
                        "p_sequence_num": head[agg],
                    }
                )
            db.execute(
                "SELECT * FROM mailbox.inbox_receive_batch('g', %s)",
                [psycopg.types.json.Jsonb(msgs)],
            )
        elif op == "fill" and holes:
            a, seq = holes.pop(rnd.randrange(len(holes)))
            receive(db, f"m{n}", a, seq)
        elif op == "straddle":
            msgs = [
                {
                    "p_event_id": f"m{n}-{i}",
                    "p_payload": {},
                    "p_aggregate_id": agg,
                    "p_sequence_num": seq,
                }
                for i, seq in enumerate([max(head[agg], 1), head[agg] + 2])
            ]
            head[agg] += 2
            db.execute(
                "SELECT * FROM mailbox.inbox_receive_batch('g', %s)",
                [psycopg.types.json.Jsonb(msgs)],
            )
        elif op == "process":
            got = rows(db, "SELECT event_id FROM mailbox.inbox_claim('g', 'w', 2)")
            if got:
                db.execute(
                    "SELECT mailbox.inbox_mark_processed('g', %s::text[])", [[r[0] for r in got]]
                )
        elif op == "late" and pending_late is None:
            # received in an open transaction: a fold in between does not see it
            head[agg] += 1
            late.execute("BEGIN")
            receive(late, f"m{n}", agg, head[agg] + rnd.choice([0, 3]))
            pending_late = step
        if pending_late is not None and step - pending_late >= 2:
            late.execute("COMMIT")
            pending_late = None
        check(db)
    if pending_late is not None:
        late.execute("COMMIT")
    check(db)
    # the heads are current: the highest unprocessed sequence above each aggregate's position
    assert dict(
        rows(
            db,
            "SELECT aggregate_id, high_seq FROM mailbox._inbox_gap_head WHERE inbox_key = %s",
            [key(db)],
        )
    ) == dict(
        rows(
            db,
            "SELECT t.aggregate_id, max(t.sequence_num) FROM mailbox.g AS t"
            " LEFT JOIN mailbox._inbox_aggregate AS a"
            "   ON a.inbox_key = %s AND a.aggregate_id = t.aggregate_id"
            " WHERE t.processed_at IS NULL AND t.sequence_num > coalesce(a.last_seq, 0)"
            " GROUP BY t.aggregate_id",
            [key(db)],
        )
    )


def test_truncate_and_reenable_recompute_everything(g):
    db = g
    receive(db, "a1", "A", 1)
    receive(db, "a4", "A", 4)
    assert check(db) == [("A", 2, 4)]
    db.execute("TRUNCATE mailbox.g")
    assert check(db) == []
    receive(db, "b2", "B", 2)
    db.execute("SELECT mailbox.disable_inbox_ordering('g')")
    # no triggers, no state while ordering is off
    assert scalar(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'mailbox.g'::regclass") == 0
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_gap") == 0
    receive(db, "b4", "B", 4)
    db.execute("SELECT mailbox.enable_inbox_ordering('g')")
    assert check(db) == [("B", 1, 2), ("B", 3, 4)]


def test_a_late_commit_fills_a_hole_behind_later_sequences(g, connect):
    db = g
    late = connect(autocommit=False)
    receive(db, "a1", "A", 1)
    receive(late, "a2", "A", 2)  # not committed yet
    receive(db, "a3", "A", 3)
    receive(db, "a4", "A", 4)
    assert check(db) == [("A", 2, 3)]  # folded while a2 is invisible
    late.commit()
    assert check(db) == []


def test_an_aborted_receive_leaves_the_hole(g, connect):
    db = g
    other = connect(autocommit=False)
    receive(db, "a1", "A", 1)
    receive(db, "a3", "A", 3)
    receive(other, "a2", "A", 2)
    assert check(db) == [("A", 2, 3)]
    other.rollback()
    assert check(db) == [("A", 2, 3)]
    # and a fold that rolls back leaves the touched aggregates for the next one
    receive(db, "a2", "A", 2)
    db.execute("BEGIN")
    assert gaps(db) == []
    db.execute("ROLLBACK")
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_gap_touched") > 0
    assert check(db) == []


def test_receivers_of_one_aggregate_do_not_wait_for_each_other(g, connect):
    one, two = connect(autocommit=False), connect(autocommit=False)
    two.execute("SET lock_timeout = '2s'")
    receive(one, "a5", "A", 5)
    receive(two, "a6", "A", 6)  # would time out if the gap bookkeeping locked the aggregate
    two.execute(
        "SELECT * FROM mailbox.inbox_receive_batch('g', %s)",
        [
            psycopg.types.json.Jsonb(
                [{"p_event_id": "a8", "p_payload": {}, "p_aggregate_id": "A", "p_sequence_num": 8}]
            )
        ],
    )
    one.commit()
    two.commit()
    assert check(g) == [("A", 1, 5), ("A", 7, 8)]


def test_a_receive_committed_during_a_recount_is_counted_once(g, connect):
    """The first fold counts the table. A receive that commits after the fold took the touched
    rows but before its count runs is in both the table and an unfolded touched row: the count
    subtracts that row's change, so the message is counted once. The fold is held between the
    two by a lock on the counts table (the count waits for it, then takes its snapshot)."""
    db = g
    receive(db, "a1", "A", 1)  # ordering was just enabled: the next fold recounts
    locker = connect(autocommit=False)
    locker.execute("LOCK TABLE mailbox._inbox_count IN ACCESS EXCLUSIVE MODE")
    reader = connect()
    done = {}
    t = threading.Thread(
        target=lambda: done.setdefault("health", scalar(reader, "SELECT mailbox.inbox_health('g')"))
    )
    t.start()
    # the fold has taken the touched rows and waits for the lock
    for _ in range(200):
        waiting = scalar(
            db,
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%%inbox_health%%'",
        )
        if waiting:
            break
        threading.Event().wait(0.05)
    assert waiting == 1
    receive(db, "a2", "A", 2)  # commits while the fold waits
    locker.commit()
    t.join(30)
    assert done["health"]["pending_count"] == 2
    check(db)
    assert counts(db) == (2, 0, 0)


def test_a_reader_that_cannot_fold_sees_the_same_gaps(g, connect):
    db = g
    folder = connect(autocommit=False)
    receive(db, "a1", "A", 1)
    receive(db, "a3", "A", 3)
    assert gaps(folder) == [("A", 2, 3)]  # folds and holds the inbox's fold lock
    receive(db, "b2", "B", 2)  # committed while the fold is open
    receive(db, "a2", "A", 2)
    assert check(db) == [("B", 1, 2)]  # the lock is taken: computed without writing
    folder.commit()
    assert check(db) == [("B", 1, 2)]


def test_concurrent_receivers_marks_and_readers_end_consistent(g, dsn):
    stop = threading.Event()
    errors = []

    def writer(w):
        rnd = random.Random(w)
        with psycopg.connect(dsn, autocommit=False) as conn:
            for i in range(60):
                try:
                    receive(conn, f"w{w}-{i}", rnd.choice("AB"), rnd.randint(1, 25))
                    if rnd.random() < 0.2:
                        got = rows(conn, "SELECT event_id FROM mailbox.inbox_claim('g', 'w', 2)")
                        for (event_id,) in got:
                            conn.execute("SELECT mailbox.inbox_mark_processed('g', %s)", [event_id])
                    if rnd.random() < 0.2:
                        conn.rollback()
                    else:
                        conn.commit()
                except psycopg.Error as exc:  # pragma: no cover - reported below
                    errors.append(exc)
                    conn.rollback()

    def reader():
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                gaps(conn)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    check(g)


def test_gap_alerts_fire_once_per_gap_with_kept_state(g):
    db = g
    db.execute("SET mailbox.inbox_gap_alert_seconds = 0")
    receive(db, "a3", "A", 3)
    receive(db, "b2", "B", 2)
    first = scalar(db, "SELECT mailbox.run_maintenance()")
    assert first["inbox_gap_alerts"] == 2
    assert scalar(db, "SELECT mailbox.run_maintenance()")["inbox_gap_alerts"] == 0
    gaps(db)  # a read in between changes nothing
    receive(db, "a6", "A", 6)  # a new gap (4..5) next to the announced one
    assert scalar(db, "SELECT mailbox.run_maintenance()")["inbox_gap_alerts"] == 1
    receive(db, "b1", "B", 1)  # closes B's gap; it is forgotten, not announced again
    assert scalar(db, "SELECT mailbox.run_maintenance()")["inbox_gap_alerts"] == 0
    assert sorted(
        tuple(r)
        for r in rows(db, "SELECT aggregate_id, expected_seq FROM mailbox._inbox_gap_alert")
    ) == [("A", 1), ("A", 4)]


def test_drop_extension_cascade_keeps_a_writable_table(fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_mailbox CASCADE")
        conn.execute("SELECT mailbox.create_inbox('g', 'public')")
        conn.execute("SELECT mailbox.enable_inbox_ordering('g')")
        receive(conn, "a2", "A", 2)
        conn.execute("DROP EXTENSION pg_mailbox CASCADE")
        conn.execute(
            "INSERT INTO public.g (event_id, payload, aggregate_id, sequence_num)"
            " VALUES ('a3', '{}', 'A', 3)"
        )
        assert (
            scalar(conn, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.g'::regclass")
            == 0
        )
        assert (
            scalar(conn, "SELECT count(*) FROM pg_proc WHERE proname LIKE '\\_inbox\\_%\\_touch'")
            == 0
        )


def test_adopted_inboxes_keep_scanning(db):
    db.execute(
        "CREATE TABLE public.legacy (event_id text PRIMARY KEY, aggregate_id text,"
        " sequence_num bigint, received_at timestamptz DEFAULT now(), processed_at timestamptz,"
        " retry_count int DEFAULT 0)"
    )
    db.execute("SELECT mailbox.enable_inbox_tracking('legacy', 'public.legacy')")
    db.execute("SELECT mailbox.enable_inbox_ordering('legacy')")
    assert (
        scalar(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.legacy'::regclass") == 0
    )
    db.execute(
        "INSERT INTO public.legacy (event_id, aggregate_id, sequence_num) VALUES ('x', 'A', 3)"
    )
    assert gaps(db, "legacy") == [("A", 1, 3)]
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_gap") == 0
