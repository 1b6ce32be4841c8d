"""Ordered claims that read heads in arrival order (issue 11): the same answer as the walk.

With more aggregates holding unprocessed messages than a claim wants candidate heads
(4 x batch + 16), a managed ordered inbox's claim reads the oldest 2 x (4 x batch + 16)
unprocessed messages by received_at and keeps those that are their aggregate's head; it
walks every aggregate only when that read does not find enough heads (docs/design.md §7.3).
These tests hold the claim to the walk's answer: the next_<inbox> view (the walk as a view)
with the leases applied, on random backlogs where the read does and does not answer, and
to the ordering rules (one in flight per aggregate, sequence order) under racing workers.
"""

import random
import threading

import psycopg
import pytest
from mbx import rows, scalar


@pytest.fixture
def ev(db):
    db.execute("SELECT mailbox.create_inbox('ev', p_max_retries => 2)")
    db.execute("SELECT mailbox.enable_inbox_ordering('ev')")
    return db


def key(db):
    return scalar(db, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = 'ev'")


def claim_ids(conn, batch, worker="w"):
    return [
        r[0]
        for r in rows(
            conn, "SELECT event_id FROM mailbox.inbox_claim('ev', %s, %s)", [worker, batch]
        )
    ]


# The walk's answer: the heads of next_ev (last processed + 1, not a dead letter) that are
# free (no live lease or retry time of their own, no message of their aggregate under a live
# lease), oldest first: what a claim of `batch` must return when nothing is locked.
EXPECTED = """
SELECT n.event_id FROM mailbox.next_ev AS n
 WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l
                    WHERE l.inbox_key = %(k)s AND l.event_id = n.event_id
                      AND (l.lease_until > now() OR l.next_attempt_at > now()))
   AND NOT EXISTS (SELECT 1 FROM mailbox.ev AS s JOIN mailbox._inbox_lease AS l
                       ON l.inbox_key = %(k)s AND l.event_id = s.event_id AND l.lease_until > now()
                    WHERE s.aggregate_id = n.aggregate_id AND s.processed_at IS NULL
                      AND s.sequence_num <= 1 + coalesce(
                          (SELECT a.last_seq FROM mailbox._inbox_aggregate AS a
                            WHERE a.inbox_key = %(k)s AND a.aggregate_id = n.aggregate_id), 0))
 ORDER BY n.received_at LIMIT %(b)s
"""

# Whether the arrival read answers a claim of `b`: more busy aggregates than 4b + 16, and at
# least 4b + 16 free heads among the oldest 2(4b + 16) unprocessed messages that are not dead
# letters (max_retries is 2), or fewer such messages than that.
ARRIVAL_ANSWERS = (
    """
SELECT (SELECT count(DISTINCT aggregate_id) FROM mailbox.ev
         WHERE processed_at IS NULL AND aggregate_id IS NOT NULL AND sequence_num IS NOT NULL)
       > 4 * %(b)s + 16
   AND ((SELECT count(*) FROM mailbox.ev WHERE processed_at IS NULL AND retry_count < 2)
          < 2 * (4 * %(b)s + 16)
        OR (SELECT count(*) FROM (SELECT event_id FROM mailbox.ev
                                   WHERE processed_at IS NULL AND retry_count < 2
                                   ORDER BY received_at LIMIT 2 * (4 * %(b)s + 16)) AS r
                                   JOIN ("""
    + EXPECTED.replace("LIMIT %(b)s", "")
    + """) AS h USING (event_id))
            >= 4 * %(b)s + 16)
"""
)


def load(db, rnd, k):
    """A random backlog: aggregates with sequences 1, 2, ... (some holes, some repeated or
    lower sequences), received in sequence order or shuffled, each at its own received_at;
    some processed prefixes, dead letters, and live, expired and retry-time leases."""
    db.execute("TRUNCATE mailbox.ev")
    db.execute("DELETE FROM mailbox._inbox_lease WHERE inbox_key = %s", [k])
    db.execute("DELETE FROM mailbox._inbox_aggregate WHERE inbox_key = %s", [k])
    aggregates = rnd.choice([5, 40, 300])
    seqs, messages = {}, []
    for g in range(rnd.choice([60, 600])):
        agg = f"a{rnd.randrange(aggregates)}" if rnd.random() < 0.97 else None
        seq = seqs.get(agg, 0) + (1 if rnd.random() < 0.95 else 2)
        if rnd.random() < 0.1:  # a repeated or lower sequence (a producer retry, a replay)
            seq = max(1, seq - rnd.randrange(3))
        seqs[agg] = seq
        messages.append([f"m{g:05d}-{rnd.randrange(100)}", agg, seq if agg else None])
    if rnd.random() < 0.4:
        rnd.shuffle(messages)
    # a message without aggregate goes in processed and is made unprocessed again, as a
    # replay makes one: the inbox's insert trigger refuses a pending row without aggregate
    with db.cursor() as cur:
        cur.executemany(
            "INSERT INTO mailbox.ev (event_id, payload, aggregate_id, sequence_num, received_at,"
            " retry_count, processed_at) VALUES (%s, '{}', %s, %s, '2026-01-01'::timestamptz"
            " + %s * interval '1 ms', %s, CASE WHEN %s::text IS NULL THEN now() END)",
            [
                (e, a, s, i, 2 if rnd.random() < 0.02 else 0, a)
                for i, (e, a, s) in enumerate(messages)
            ],
        )
    db.execute("UPDATE mailbox.ev SET processed_at = NULL WHERE aggregate_id IS NULL")
    db.execute(
        "INSERT INTO mailbox._inbox_aggregate (inbox_key, aggregate_id, last_seq, updated_at)"
        " SELECT %s, aggregate_id, min(sequence_num) - 1 + %s, now() FROM mailbox.ev"
        " WHERE aggregate_id IS NOT NULL GROUP BY aggregate_id HAVING min(sequence_num) %% 3 = %s",
        [k, rnd.randrange(3), rnd.randrange(3)],
    )
    db.execute(
        "UPDATE mailbox.ev AS t SET processed_at = now() FROM mailbox._inbox_aggregate AS a"
        " WHERE a.inbox_key = %s AND a.aggregate_id = t.aggregate_id"
        " AND t.sequence_num <= a.last_seq AND hashtext(t.event_id) %% 10 <> 0",
        [k],
    )
    leased = [
        r[0]
        for r in rows(db, "SELECT event_id FROM mailbox.ev WHERE processed_at IS NULL")
        if rnd.random() < 0.05
    ]
    for event_id in leased:
        live, retry = rnd.random() < 0.5, rnd.random() < 0.3
        db.execute(
            "INSERT INTO mailbox._inbox_lease"
            " (inbox_key, event_id, lease_until, leased_by, next_attempt_at)"
            " VALUES (%s, %s, now() + %s * interval '1 hour', 'w',"
            " CASE WHEN %s THEN now() + interval '1 hour' END)",
            [k, event_id, 1 if live else -1, retry],
        )
    # late lower sequences: received after everything else, at or below a processed position
    late = rows(
        db, "SELECT aggregate_id, last_seq FROM mailbox._inbox_aggregate WHERE inbox_key = %s", [k]
    )
    with db.cursor() as cur:
        cur.executemany(
            "INSERT INTO mailbox.ev (event_id, payload, aggregate_id, sequence_num, received_at)"
            " VALUES (%s, '{}', %s, %s, '2027-01-01'::timestamptz + %s * interval '1 ms')",
            [
                (f"late-{i}", a, max(1, last - rnd.randrange(2)), i)
                for i, (a, last) in enumerate(late)
                if rnd.random() < 0.2
            ],
        )
    db.execute("ANALYZE mailbox.ev")


def test_claims_equal_the_walk_on_random_backlogs(ev):
    k = key(ev)
    answered = walked = 0
    for trial in range(24):
        load(ev, random.Random(trial), k)
        for batch in (1, 5, 25):
            expected = [r[0] for r in rows(ev, EXPECTED, {"k": k, "b": batch})]
            if scalar(ev, ARRIVAL_ANSWERS, {"k": k, "b": batch}):
                answered += 1
            else:
                walked += 1
            with ev.transaction():
                got = claim_ids(ev, batch)
                # in the claim's order (oldest first), and then rolled back
                assert got == expected, (trial, batch)
                raise psycopg.Rollback()
    # both reads were exercised
    assert answered >= 10 and walked >= 10, (answered, walked)


def test_a_late_lower_sequence_waits_for_its_in_flight_successor_on_the_arrival_path(ev, connect):
    """The arrival read keeps a lower sequence that arrived late as its aggregate's head, and
    the in-flight test keeps it back while its successor is leased: as on the walk
    (test_inbox_races.py) but with 60 other busy aggregates, so a claim of 2 (24
    candidates wanted, up to 48 messages read) is answered by the arrival read."""
    receive = "SELECT mailbox.inbox_receive('ev', %s, '{}', NULL, NULL, %s, %s)"
    ev.execute(receive, ["a1", "A", 1])
    ev.execute(receive, ["a2", "A", 2])
    assert claim_ids(ev, 1, "w1") == ["a1"]
    assert scalar(ev, "SELECT mailbox.inbox_mark_processed('ev', 'a1')") is True
    assert claim_ids(ev, 1, "w1") == ["a2"]  # committed lease: a2 in flight
    with ev.cursor() as cur:
        cur.executemany(receive, [(f"f{i}", f"f{i:02d}", 1) for i in range(60)])
    ev.execute(receive, ["a1-again", "A", 1])
    worker = connect()
    seen = []
    while got := claim_ids(worker, 2, "w2"):
        seen += got
        scalar(worker, "SELECT mailbox.inbox_mark_processed('ev', %s::text[])", [got])
    assert sorted(seen) == sorted(f"f{i}" for i in range(60))
    # a2 settled: the late a1-again is the head now
    assert scalar(ev, "SELECT mailbox.inbox_mark_processed('ev', 'a2')") is True
    assert claim_ids(worker, 2, "w2") == ["a1-again"]


def test_a_replayed_older_message_waits_for_its_in_flight_successor_on_the_arrival_path(
    ev, connect
):
    """A replayed a1 is its aggregate's head again and the oldest unprocessed message, but a2
    is in flight (a committed claim's lease): the arrival read must skip a1 as the walk does
    (test_inbox_races.py), though it reads it first. 60 other busy aggregates make a claim of
    2 (24 candidates wanted, 48 read) an arrival-read claim."""
    receive = "SELECT mailbox.inbox_receive('ev', %s, '{}', NULL, NULL, %s, %s)"
    ev.execute(receive, ["a1", "A", 1])
    ev.execute(receive, ["a2", "A", 2])
    assert claim_ids(ev, 1, "w1") == ["a1"]
    assert scalar(ev, "SELECT mailbox.inbox_mark_processed('ev', 'a1')") is True
    with ev.cursor() as cur:
        cur.executemany(receive, [(f"f{i}", f"f{i:02d}", 1) for i in range(60)])
    assert claim_ids(ev, 1, "w1") == ["a2"]  # committed lease: a2 in flight
    assert scalar(ev, "SELECT mailbox.replay_inbox_messages('ev', ARRAY['a1'])") == 1
    worker = connect()
    assert claim_ids(worker, 2, "w2") == ["f0", "f1"]


def test_two_messages_with_one_sequence_are_never_in_flight_together(ev, connect):
    """Two messages with the same sequence: the one with the lower id is the head, the other
    waits for it. With 30 busy aggregates a claim of 1 (20 candidates wanted) is answered by
    the arrival read, which reads both: a second worker claiming while the first holds x00-a
    in its open transaction gets the next aggregate's head, not x00-b."""
    with ev.cursor() as cur:
        cur.executemany(
            "SELECT mailbox.inbox_receive('ev', %s, '{}', NULL, NULL, %s, 1)",
            [(f"x{i:02d}-{c}", f"x{i:02d}") for i in range(30) for c in "ab"],
        )
    first, second = connect(autocommit=False), connect(autocommit=False)
    assert claim_ids(first, 1, "w1") == ["x00-a"]
    assert claim_ids(second, 1, "w2") == ["x01-a"]
    second.rollback()
    assert scalar(first, "SELECT mailbox.inbox_mark_processed('ev', 'x00-a')") is True
    first.commit()
    assert claim_ids(second, 1, "w2") == ["x00-b"]
    second.rollback()


@pytest.mark.parametrize("shuffled", [False, True], ids=["in-order", "shuffled"])
def test_racing_workers_keep_every_aggregate_in_sequence(ev, connect, shuffled):
    """Four workers claim 3 at a time (28 candidates wanted) from 240 aggregates of 5
    messages; received in sequence order (the arrival read answers most claims) or
    shuffled (it mostly falls back to the walk). Every aggregate is processed 1..5 in
    order, exactly once."""
    messages = [(f"{agg}-{seq}", f"agg{agg:03d}", seq) for seq in range(1, 6) for agg in range(240)]
    if shuffled:
        random.Random(7).shuffle(messages)
    with ev.cursor() as cur:
        cur.executemany(
            "SELECT mailbox.inbox_receive('ev', %s, '{}', NULL, NULL, %s, %s)", messages
        )
    ev.execute("CREATE TABLE public.done (n bigserial, aggregate_id text, seq bigint)")
    conns = [connect(autocommit=False) for _ in range(4)]
    barrier = threading.Barrier(4)
    errors = []

    def worker(n):
        conn = conns[n]
        try:
            barrier.wait(timeout=10)
            idle = 0
            while idle < 20:
                got = rows(
                    conn,
                    "SELECT event_id, aggregate_id, sequence_num"
                    " FROM mailbox.inbox_claim('ev', %s, 3)",
                    [f"w{n}"],
                )
                if not got:
                    conn.commit()
                    idle += 1
                    threading.Event().wait(0.02)
                    continue
                idle = 0
                # the log rows and the marks commit with the claim: log order = processing order
                for event_id, aggregate, seq in got:
                    conn.execute(
                        "INSERT INTO public.done (aggregate_id, seq) VALUES (%s, %s)",
                        [aggregate, seq],
                    )
                    assert (
                        scalar(conn, "SELECT mailbox.inbox_mark_processed('ev', %s)", [event_id])
                        is True
                    )
                conn.commit()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    done = rows(ev, "SELECT aggregate_id, seq FROM public.done ORDER BY n")
    assert len(done) == 1200
    per_aggregate = {}
    for aggregate, seq in done:
        per_aggregate.setdefault(aggregate, []).append(seq)
    assert len(per_aggregate) == 240
    assert all(seqs == [1, 2, 3, 4, 5] for seqs in per_aggregate.values())
    assert scalar(ev, "SELECT count(*) FROM mailbox.pending_ev") == 0
