"""Ordered inboxes: heads per aggregate, blocking, gaps, ordered claims (SPEC §3.2)."""

import random
import threading

import psycopg
import pytest
from mbx import raises, rows, scalar


def receive(db, event_id, aggregate, seq, inbox="ev"):
    return scalar(
        db,
        "SELECT mailbox.inbox_receive(%s, %s, '{}', NULL, NULL, %s, %s)",
        [inbox, event_id, aggregate, seq],
    )


def claim(conn, inbox="ev", worker="w", batch=10):
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute(
        "SELECT * FROM mailbox.inbox_claim(%s, %s, %s)", [inbox, worker, batch]
    ).fetchall()


def heads(db, inbox="ev"):
    return sorted(
        (r[0], r[1])
        for r in rows(db, f"SELECT aggregate_id, sequence_num FROM mailbox.next_{inbox}")
    )


def gaps(db, inbox="ev"):
    return [
        tuple(r[:3]) for r in rows(db, "SELECT * FROM mailbox.inbox_ordering_gaps(%s)", [inbox])
    ]


@pytest.fixture
def ev(db):
    db.execute("SELECT mailbox.create_inbox('ev', p_max_retries => 2)")
    db.execute("SELECT mailbox.enable_inbox_ordering('ev')")
    return db


def test_next_view_shows_only_last_processed_plus_one(ev):
    db = ev
    for seq in (3, 1, 2):
        receive(db, f"a{seq}", "A", seq)
    receive(db, "b2", "B", 2)  # B's first message (1) has not arrived
    assert heads(db) == [("A", 1)]
    db.execute("SELECT mailbox.inbox_mark_processed('ev', 'a1')")
    assert heads(db) == [("A", 2)]
    assert scalar(db, "SELECT last_seq FROM mailbox._inbox_aggregate WHERE aggregate_id = 'A'") == 1
    receive(db, "b1", "B", 1)
    assert heads(db) == [("A", 2), ("B", 1)]


def test_first_sequence_is_configurable(db):
    db.execute("SELECT mailbox.create_inbox('zero')")
    db.execute("SELECT mailbox.enable_inbox_ordering('zero', p_first_sequence => 0)")
    receive(db, "z1", "Z", 1, inbox="zero")
    assert heads(db, "zero") == []
    assert gaps(db, "zero") == [("Z", 0, 1)]
    receive(db, "z0", "Z", 0, inbox="zero")
    assert heads(db, "zero") == [("Z", 0)]


def test_claim_takes_only_heads_and_one_per_aggregate(ev):
    db = ev
    for agg in ("A", "B"):
        for seq in (1, 2, 3):
            receive(db, f"{agg}{seq}", agg, seq)
    got = claim(db, batch=10)
    assert sorted((m["aggregate_id"], m["sequence_num"]) for m in got) == [("A", 1), ("B", 1)]
    assert claim(db, worker="w2") == []  # heads are in flight, successors withheld
    db.execute("SELECT mailbox.inbox_mark_processed('ev', 'A1')")
    assert [(m["aggregate_id"], m["sequence_num"]) for m in claim(db, worker="w3")] == [("A", 2)]


def test_a_dead_lettered_message_blocks_its_aggregate_until_replayed(ev):
    db = ev
    for seq in (1, 2, 3):
        receive(db, f"a{seq}", "A", seq)
    receive(db, "b1", "B", 1)
    db.execute("SELECT mailbox.inbox_mark_processed('ev', 'a1')")
    for _ in range(2):
        assert [m["event_id"] for m in claim(db, batch=1)] == ["a2"]
        db.execute("SELECT mailbox.inbox_mark_failed('ev', 'a2', 'poison')")
    # a3 is pending and is the lowest *pending* sequence of A, yet A is blocked
    assert heads(db) == [("B", 1)]
    assert [m["event_id"] for m in claim(db)] == ["b1"]
    db.execute("SELECT mailbox.inbox_mark_processed('ev', 'b1')")
    health = scalar(db, "SELECT mailbox.inbox_health('ev')")
    assert health["blocked_aggregates"] == 1 and health["health_status"] == "degraded"
    assert health["gap_count"] == 0  # a dead letter is not a hole
    assert scalar(db, "SELECT mailbox.replay_inbox_messages('ev', ARRAY['a2'])") == 1
    assert heads(db) == [("A", 2)]
    assert scalar(db, "SELECT mailbox.inbox_health('ev')")["blocked_aggregates"] == 0
    db.execute("SELECT mailbox.inbox_mark_processed('ev', 'a2')")
    assert heads(db) == [("A", 3)]


def test_a_message_without_aggregate_is_not_replayed_into_an_ordered_inbox(db):
    """An ordered claim never takes a message without aggregate or sequence, so replaying one
    into an ordered inbox would leave it pending for ever (found by a review). The replay is
    refused (55000, DETAIL naming it, HINT), and nothing of the call is replayed; the other
    ids alone go through, and after disabling ordering it does too."""
    db.execute("SELECT mailbox.create_inbox('h', p_max_retries => 1)")
    scalar(db, "SELECT mailbox.inbox_receive('h', 'n1', '{}')")
    receive(db, "a1", "A", 1, inbox="h")
    for event_id in ("n1", "a1"):
        assert scalar(db, "SELECT mailbox.inbox_mark_failed('h', %s, 'x')", [event_id]) == (
            "dead_letter"
        )
    db.execute("SELECT mailbox.enable_inbox_ordering('h')")
    with raises("55000") as info:
        db.execute("SELECT mailbox.replay_inbox_messages('h', ARRAY['a1', 'n1'])")
    assert "cannot be replayed" in str(info.value)
    assert "n1 lacks one" in info.value.diag.message_detail and info.value.diag.message_hint
    assert rows(db, "SELECT event_id, retry_count FROM mailbox.h ORDER BY 1") == [
        ("a1", 1),
        ("n1", 1),
    ]
    assert scalar(db, "SELECT mailbox.replay_inbox_messages('h', ARRAY['a1'])") == 1
    assert heads(db, "h") == [("A", 1)]
    db.execute("SELECT mailbox.disable_inbox_ordering('h')")
    assert scalar(db, "SELECT mailbox.replay_inbox_messages('h', ARRAY['n1'])") == 1


def test_gaps_include_the_hole_after_the_last_processed_message(ev):
    db = ev
    for seq in (1, 2):
        receive(db, f"a{seq}", "A", seq)
    db.execute("SELECT mailbox.inbox_mark_processed('ev', 'a1')")
    db.execute("SELECT mailbox.inbox_mark_processed('ev', 'a2')")
    # 3 never arrives; 4 and 5 wait, then 6 missing, 7 waits
    for seq in (4, 5, 7):
        receive(db, f"a{seq}", "A", seq)
    receive(db, "b3", "B", 3)  # a new aggregate starting late: hole 1..2
    db.execute(
        "UPDATE mailbox.ev SET received_at = now() - interval '90 seconds' WHERE event_id = 'a4'"
    )
    got = rows(db, "SELECT * FROM mailbox.inbox_ordering_gaps('ev')")
    assert [tuple(g[:3]) for g in got] == [("A", 3, 4), ("A", 6, 7), ("B", 1, 3)]
    assert 89 < got[0][3] < 120 and got[1][3] < 30
    assert [
        tuple(r)
        for r in rows(
            db, "SELECT aggregate_id, expected_seq, found_seq FROM mailbox.gaps_ev ORDER BY 1, 2"
        )
    ] == [("A", 3, 4), ("A", 6, 7), ("B", 1, 3)]
    assert heads(db) == []
    assert scalar(db, "SELECT mailbox.inbox_health('ev')")["gap_count"] == 3
    receive(db, "a3", "A", 3)
    assert gaps(db) == [("A", 6, 7), ("B", 1, 3)]
    assert heads(db) == [("A", 3)]


def test_gaps_need_ordering(db):
    db.execute("SELECT mailbox.create_inbox('plain')")
    with raises("55000"):
        db.execute("SELECT * FROM mailbox.inbox_ordering_gaps('plain')")
    with raises("42704"):
        db.execute("SELECT * FROM mailbox.inbox_ordering_gaps('nope')")


def test_ordered_receive_needs_aggregate_and_sequence(ev):
    with raises("22004"):
        ev.execute("SELECT mailbox.inbox_receive('ev', 'x', '{}')")


def test_processed_history_is_not_scanned(ev):
    """Ordering reads per-aggregate state: deleting the processed history changes nothing."""
    db = ev
    for seq in (1, 2, 3):
        receive(db, f"a{seq}", "A", seq)
    for seq in (1, 2):
        db.execute("SELECT mailbox.inbox_mark_processed('ev', %s)", [f"a{seq}"])
    db.execute("DELETE FROM mailbox.ev WHERE processed_at IS NOT NULL")
    assert heads(db) == [("A", 3)] and gaps(db) == []


def test_disable_ordering_restores_plain_views_and_claims(ev):
    db = ev
    receive(db, "a2", "A", 2)
    assert claim(db) == []
    db.execute("SELECT mailbox.disable_inbox_ordering('ev')")
    assert scalar(
        db,
        "SELECT to_regclass('mailbox.next_ev') IS NULL AND to_regclass('mailbox.gaps_ev') IS NULL",
    )
    assert [m["event_id"] for m in claim(db)] == ["a2"]
    with raises("55000"):
        db.execute("SELECT mailbox.disable_inbox_ordering('ev')")
    db.execute("SELECT mailbox.disable_inbox_ordering('ev', true)")


def test_enable_ordering_errors(db):
    db.execute("SELECT mailbox.create_inbox('x')")
    with raises("42703"):
        db.execute("SELECT mailbox.enable_inbox_ordering('x', 'no_such_column')")
    with raises("42804"):
        db.execute("SELECT mailbox.enable_inbox_ordering('x', 'aggregate_id', 'payload')")
    with raises("22023"):
        db.execute("SELECT mailbox.enable_inbox_ordering('x', 'sequence_num', 'sequence_num')")
    with raises("42704"):
        db.execute("SELECT mailbox.enable_inbox_ordering('nope')")
    assert scalar(db, "SELECT to_regclass('mailbox.next_x')") is None


def test_four_workers_process_100_aggregates_strictly_in_sequence(ev, connect):
    db = ev
    messages = [
        (f"{agg}-{seq}", f"agg{agg:03d}", seq) for agg in range(100) for seq in range(1, 11)
    ]
    random.Random(4).shuffle(messages)
    with db.cursor() as cur:
        cur.executemany(
            "SELECT mailbox.inbox_receive('ev', %s, '{}', NULL, NULL, %s, %s)", messages
        )
    db.execute("CREATE TABLE public.done (n bigserial, aggregate_id text, seq bigint, worker int)")
    conns = [connect(autocommit=False) for _ in range(4)]
    barrier = threading.Barrier(4)
    errors = []

    def worker(n):
        conn = conns[n]
        try:
            barrier.wait(timeout=10)
            idle = 0
            while idle < 20:
                got = claim(conn, worker=f"w{n}", batch=5)
                conn.commit()
                if not got:
                    idle += 1
                    threading.Event().wait(0.02)
                    continue
                idle = 0
                for m in got:
                    # the log row and the mark commit together, so log order = processing order
                    conn.execute(
                        "INSERT INTO public.done (aggregate_id, seq, worker) VALUES (%s, %s, %s)",
                        [m["aggregate_id"], m["sequence_num"], n],
                    )
                    assert (
                        scalar(
                            conn, "SELECT mailbox.inbox_mark_processed('ev', %s)", [m["event_id"]]
                        )
                        is True
                    )
                    conn.commit()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    done = rows(db, "SELECT aggregate_id, seq, worker FROM public.done ORDER BY n")
    assert len(done) == 1000
    per_aggregate = {}
    for aggregate, seq, _ in done:
        per_aggregate.setdefault(aggregate, []).append(seq)
    assert len(per_aggregate) == 100
    assert all(seqs == list(range(1, 11)) for seqs in per_aggregate.values())
    assert len({w for _, _, w in done}) > 1
    assert scalar(db, "SELECT count(*) FROM mailbox.pending_ev") == 0
