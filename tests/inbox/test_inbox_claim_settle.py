"""Claims that write leases only when they outlive their transaction (issue 11, docs/design.md
§7.1): in READ COMMITTED an inbox_claim of an unordered inbox writes one
mailbox._inbox_open_claim row per call, and its commit turns the messages still pending
into lease rows. These tests prove that the cheaper path keeps every property of a lease:
nothing written for a claim marked in its own transaction, a lease for what is left at
commit, a failure report or replay in the claiming transaction leaving no lease behind, and
a claimer whose snapshot predates another worker's committed lease never winning the message.
"""

import threading
import time

import psycopg
import pytest
from groups import wait_blocked
from mbx import drop_gated_table, drop_role, make_gated_table, make_role, rows, scalar


def receive(conn, inbox, event_id):
    return scalar(conn, "SELECT mailbox.inbox_receive(%s, %s, '{}')", [inbox, event_id])


def claim(conn, inbox, worker="w", batch=10, visibility=30):
    return [
        r[0]
        for r in rows(
            conn,
            "SELECT event_id FROM mailbox.inbox_claim(%s, %s, %s, %s)",
            [inbox, worker, batch, visibility],
        )
    ]


def leases(conn):
    return rows(
        conn,
        "SELECT event_id, leased_by, lease_until IS NOT NULL, next_attempt_at IS NOT NULL"
        " FROM mailbox._inbox_lease ORDER BY event_id",
    )


@pytest.fixture
def q(db):
    db.execute("SELECT mailbox.create_inbox('q', p_max_retries => 3)")
    return db


def test_claim_and_mark_in_one_transaction_write_no_lease(q, connect):
    for i in range(3):
        receive(q, "q", f"m{i}")
    w = connect(autocommit=False)
    assert sorted(claim(w, "q")) == ["m0", "m1", "m2"]
    # the claim is one open-claim row of this transaction, not a lease row per message
    assert scalar(w, "SELECT count(*) FROM mailbox._inbox_lease") == 0
    assert rows(w, "SELECT cardinality(event_ids), leased_by FROM mailbox._inbox_open_claim") == [
        (3, "w")
    ]
    # other sessions never see it, and the row locks keep them off the messages
    assert scalar(q, "SELECT count(*) FROM mailbox._inbox_open_claim") == 0
    assert claim(connect(), "q", "other") == []
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', ARRAY['m0', 'm1'])") == 2
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'm2')") is True
    w.commit()
    assert leases(q) == []
    assert scalar(q, "SELECT count(*) FROM mailbox._inbox_open_claim") == 0
    assert scalar(q, "SELECT count(*) FROM mailbox.q WHERE processed_at IS NULL") == 0


def calls_in_transaction(conn, inbox, kinds):
    """{kind: calls of the inbox's generated _inbox_<key>_<kind> in this transaction so far}
    (the connection sets track_functions = 'all')."""
    key = scalar(conn, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = %s", [inbox])
    return {
        k: scalar(
            conn,
            "SELECT coalesce(pg_stat_get_xact_function_calls(%s::regprocedure), 0)",
            [f"mailbox._inbox_{key}_{k}(mailbox._inbox,text[])"],
        )
        for k in kinds
    }


MARK_KINDS = ("processed_count", "processed_batch")


def test_a_batch_mark_of_exactly_the_claim_settles_it_and_counts_what_it_marked(q, connect):
    """The documented worker (claim, process, mark the batch it claimed, commit) on an
    unordered inbox: the mark ends the open claim with one exact match and runs the generated
    mark that returns only a count (part 37, batch api). It counts only what it marked (one
    message marked alone before), leaves no open claim and no lease, and the next claim goes
    on after the marked messages."""
    for i in range(5):
        receive(q, "q", f"m{i}")
    w = connect(autocommit=False)
    w.execute("SET track_functions = 'all'")
    got = claim(w, "q", batch=3)
    assert got == ["m0", "m1", "m2"]
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'm1')") is True
    # the ids in the claim's order, as a worker sends back what it got
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', %s::text[])", [got]) == 2
    assert calls_in_transaction(w, "q", MARK_KINDS) == {"processed_count": 1, "processed_batch": 0}
    assert scalar(w, "SELECT count(*) FROM mailbox._inbox_open_claim") == 0
    w.commit()
    assert leases(q) == []
    assert scalar(q, "SELECT count(*) FROM mailbox.q WHERE processed_at IS NOT NULL") == 3
    assert claim(connect(), "q", "other") == ["m3", "m4"]


@pytest.mark.parametrize("ids", [["m0", "m1"], ["m1", "m0"]], ids=["exact", "reordered"])
def test_a_batch_mark_that_marked_nothing_leaves_the_claim_to_its_commit(q, connect, ids):
    """A table owner's trigger can refuse every row a mark updates: the mark returns 0 and the
    messages stay pending. Then, on either path, the claim is not settled by the mark: its
    commit leases the messages to the claimer, so no other worker gets them before the
    visibility timeout (found by a review: the count-only mark deleted the claim first)."""
    q.execute(
        "CREATE FUNCTION public.refuse_all() RETURNS trigger LANGUAGE plpgsql"
        " AS $$BEGIN RETURN NULL; END$$"
    )
    q.execute(
        "CREATE TRIGGER refuse_all BEFORE UPDATE ON mailbox.q"
        " FOR EACH ROW EXECUTE FUNCTION public.refuse_all()"
    )
    for i in range(3):
        receive(q, "q", f"m{i}")
    w = connect(autocommit=False)
    assert claim(w, "q", batch=2) == ["m0", "m1"]
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', %s::text[])", [ids]) == 0
    w.commit()
    assert [(r[0], r[1]) for r in leases(q)] == [("m0", "w"), ("m1", "w")]
    assert claim(connect(), "q", "other") == ["m2"]


@pytest.mark.parametrize(
    "ids",
    [["m0", "m1"], ["m0", "m1", "m2", "m3"], ["m2", "m1", "m0"], ["m0", "m1", "m1", "m2"]],
    ids=["subset", "superset", "reordered", "repeated"],
)
def test_a_batch_mark_that_is_not_exactly_the_claim_takes_the_general_path(q, connect, ids):
    """Only the claim's ids in its order take the count-only mark; a subset, a superset, another
    order or a repeated id go the general way (what it marked comes back, leases of what it
    marked are ended) and settle the claim as before: what the mark covered is processed,
    what is left of the claim is leased to the claimer at commit."""
    for i in range(4):
        receive(q, "q", f"m{i}")
    w = connect(autocommit=False)
    w.execute("SET track_functions = 'all'")
    assert claim(w, "q", batch=3) == ["m0", "m1", "m2"]
    marked = scalar(w, "SELECT mailbox.inbox_mark_processed('q', %s::text[])", [ids])
    assert marked == len(set(ids))
    assert calls_in_transaction(w, "q", MARK_KINDS) == {"processed_count": 0, "processed_batch": 1}
    w.commit()
    left = sorted({"m0", "m1", "m2"} - set(ids))
    assert [r[0] for r in leases(q)] == left
    assert scalar(q, "SELECT count(*) FROM mailbox._inbox_open_claim") == 0


def test_a_batch_mark_of_an_ordered_claim_takes_the_general_path(db, connect):
    """An ordered inbox's claim writes its leases at once and its mark keeps the aggregates'
    positions: the exact match finds no open claim, so the mark goes the general way."""
    db.execute("SELECT mailbox.create_inbox('o')")
    db.execute("SELECT mailbox.enable_inbox_ordering('o')")
    for s in (1, 2):
        db.execute(
            "SELECT mailbox.inbox_receive('o', %s, '{}', p_aggregate_id => 'A',"
            " p_sequence_num => %s)",
            [f"a{s}", s],
        )
    db.execute(
        "SELECT mailbox.inbox_receive('o', 'b1', '{}', p_aggregate_id => 'B', p_sequence_num => 1)"
    )
    w = connect(autocommit=False)
    w.execute("SET track_functions = 'all'")
    got = claim(w, "o", batch=10)
    assert got == ["a1", "b1"]
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('o', %s::text[])", [got]) == 2
    assert calls_in_transaction(w, "o", MARK_KINDS) == {"processed_count": 0, "processed_batch": 1}
    w.commit()
    assert leases(db) == []
    assert claim(connect(), "o", "other") == ["a2"]


def test_what_is_left_at_commit_is_leased_to_the_claimer(q, connect):
    for i in range(3):
        receive(q, "q", f"m{i}")
    w = connect(autocommit=False)
    got = rows(w, "SELECT event_id, lease_until FROM mailbox.inbox_claim('q', 'w1', 10, 30)")
    assert sorted(g[0] for g in got) == ["m0", "m1", "m2"]
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'm1')") is True
    w.commit()
    # m0 and m2 outlive the transaction: leased to w1 until the lease_until claim returned
    assert leases(q) == [("m0", "w1", True, False), ("m2", "w1", True, False)]
    until = dict(got)
    for event_id, lease_until in rows(q, "SELECT event_id, lease_until FROM mailbox._inbox_lease"):
        assert lease_until == until[event_id]
    assert claim(connect(), "q", "w2") == []
    # a later transaction's mark ends the lease as before
    assert scalar(q, "SELECT mailbox.inbox_mark_processed('q', ARRAY['m0', 'm2'])") == 2
    assert leases(q) == []


def test_a_failure_report_in_the_claiming_transaction_leaves_no_lease(q, connect):
    receive(q, "q", "now")
    receive(q, "q", "later")
    w = connect(autocommit=False)
    assert sorted(claim(w, "q")) == ["later", "now"]
    assert scalar(w, "SELECT mailbox.inbox_mark_failed('q', 'now', 'boom', 0)") == "retry"
    assert scalar(w, "SELECT mailbox.inbox_mark_failed('q', 'later', 'boom', 60)") == "retry"
    w.commit()
    # 'now' is claimable at once; 'later' waits for its retry time, leased by nobody
    assert leases(q) == [("later", None, False, True)]
    assert claim(connect(), "q", "w2") == ["now"]


def test_a_replay_in_the_claiming_transaction_leaves_no_lease(q, connect):
    receive(q, "q", "r")
    w = connect(autocommit=False)
    assert claim(w, "q") == ["r"]
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'r')") is True
    assert scalar(w, "SELECT mailbox.replay_inbox_messages('q', ARRAY['r'])") == 1
    w.commit()
    assert leases(q) == []
    assert claim(connect(), "q", "w2") == ["r"]


def test_a_second_claim_in_one_transaction_gets_the_next_messages(q, connect):
    """Within its own transaction a claim's row locks do not keep it off its own messages:
    the second claim settles the first one into lease rows and skips them, as it did when
    every claim wrote leases."""
    for i in range(5):
        receive(q, "q", f"m{i}")
    w = connect(autocommit=False)
    first = claim(w, "q", batch=2)
    second = claim(w, "q", batch=2)
    assert len(first) == 2 and len(second) == 2 and not set(first) & set(second)
    assert [r[0] for r in leases(w)] == sorted(first)  # the first claim, settled early
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', %s::text[])", [second]) == 2
    w.commit()
    assert [r[0] for r in leases(q)] == sorted(first)  # still pending: leased to w
    assert claim(connect(), "q", "other") == sorted(
        {f"m{i}" for i in range(5)} - set(first) - set(second)
    )


def test_a_rolled_back_claim_leaves_nothing(q, connect):
    receive(q, "q", "m")
    w = connect(autocommit=False)
    assert claim(w, "q") == ["m"]
    w.rollback()
    assert leases(q) == []
    assert claim(connect(), "q", "w2") == ["m"]


@pytest.mark.parametrize("mark", ["batch", "single"])
def test_set_constraints_immediate_leases_at_once_and_the_mark_ends_it(q, connect, mark):
    receive(q, "q", "m")
    w = connect(autocommit=False)
    w.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert claim(w, "q") == ["m"]
    assert leases(w) == [("m", "w", True, False)]
    if mark == "batch":
        assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', ARRAY['m'])") == 1
    else:  # the named mark: the settling told it that this transaction has a lease now
        assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'm')") is True
    assert leases(w) == []
    w.commit()
    assert leases(q) == []


def unleased(conn):
    """this transaction's claim_unleased setting of inbox q (key 1)"""
    return scalar(conn, "SELECT current_setting('mailbox.claim_unleased_1', true)")


def test_a_mark_after_a_second_claim_ends_the_lease_the_second_claim_wrote(q, connect):
    """The named mark skips its lease DELETE while this transaction's claims found no lease
    row (part 37, "Marks without a lease"). A second claim settles the first into lease rows,
    so a mark of the first claim's message must end its lease again."""
    for i in range(3):
        receive(q, "q", f"m{i}")
    w = connect(autocommit=False)
    first = claim(w, "q", batch=2)
    assert unleased(w) == "on"  # no lease row of the inbox: marks have none to end
    second = claim(w, "q", batch=1)  # settles the first claim: two lease rows of this transaction
    assert unleased(w) == ""
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', %s)", [first[0]]) is True
    assert [r[0] for r in leases(w)] == [first[1]]
    w.commit()
    assert [r[0] for r in leases(q)] == sorted([first[1], *second])  # pending at commit


def test_a_claim_that_finds_an_expired_lease_lets_the_mark_end_it(q, connect):
    """A message whose lease expired is claimable with its lease row still there (the claim
    does not delete it; settling would overwrite it): that claim must not tell the mark
    that there is no lease to end."""
    receive(q, "q", "m")
    w1 = connect()
    assert claim(w1, "q", "w1") == ["m"]  # autocommit: leased to w1 at once
    q.execute("UPDATE mailbox._inbox_lease SET lease_until = now() - interval '1 second'")
    w2 = connect(autocommit=False)
    assert claim(w2, "q", "w2") == ["m"]
    assert unleased(w2) == ""
    assert scalar(w2, "SELECT mailbox.inbox_mark_processed('q', 'm')") is True
    assert leases(w2) == []
    w2.commit()
    assert leases(q) == []


def test_a_failure_report_with_a_retry_time_lets_a_later_mark_end_that_lease(q, connect):
    receive(q, "q", "m")
    w = connect(autocommit=False)
    assert claim(w, "q") == ["m"]
    assert unleased(w) == "on"
    assert scalar(w, "SELECT mailbox.inbox_mark_failed('q', 'm', 'boom', 60)") == "retry"
    assert leases(w) == [("m", None, False, True)]
    assert unleased(w) == ""
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'm')") is True
    assert leases(w) == []
    w.commit()
    assert leases(q) == []


def test_an_ordered_claim_after_ordering_was_enabled_in_the_transaction_lets_the_mark_end_it(
    q, connect
):
    """Found by an adversarial review: a claim of the unordered inbox says there is no lease,
    ordering is enabled in the same transaction, and the next claim writes its lease row at
    once (an ordered claim); after ordering is disabled again the named mark must end it."""
    for event_id, agg in (("a", "A"), ("b", "B")):
        q.execute(
            "SELECT mailbox.inbox_receive('q', %s, '{}',"
            " p_aggregate_id => %s, p_sequence_num => 1)",
            [event_id, agg],
        )
    w = connect(autocommit=False)
    assert claim(w, "q", batch=1) == ["a"]
    assert unleased(w) == "on"
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'a')") is True
    w.execute("SELECT mailbox.enable_inbox_ordering('q')")
    assert claim(w, "q", batch=1) == ["b"]
    assert leases(w) == [("b", "w", True, False)]  # written at once
    assert unleased(w) == ""
    w.execute("SELECT mailbox.disable_inbox_ordering('q')")
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'b')") is True
    assert leases(w) == []
    w.commit()
    assert leases(q) == []


def test_a_mark_while_no_lease_was_seen_leaves_a_later_foreign_lease_that_holds_nothing(q, connect):
    """The documented price of skipping the DELETE: a transaction whose claim saw no lease
    row marks a message that another worker leased after that claim. The lease stays until
    it expires; it holds nothing (not in flight, not claimable, cleared by a replay)."""
    receive(q, "q", "mine")
    receive(q, "q", "theirs")
    w = connect(autocommit=False)
    assert claim(w, "q", "w", batch=1) == ["mine"]
    assert unleased(w) == "on"
    other = connect()
    assert claim(other, "q", "other") == ["theirs"]  # autocommit: a lease row now
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'theirs')") is True
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', 'mine')") is True
    w.commit()
    assert leases(q) == [("theirs", "other", True, False)]
    assert scalar(q, "SELECT mailbox.inbox_health('q') -> 'in_flight_count'") == 0
    assert claim(connect(), "q", "third") == []
    assert scalar(q, "SELECT mailbox.replay_inbox_messages('q', ARRAY['theirs'])") == 1
    assert leases(q) == []


def test_a_consumer_setting_claim_unleased_by_hand_only_leaves_leases_that_hold_nothing(q, connect):
    """docs/configuration.md: a consumer that sets mailbox.claim_unleased_<key> itself (for its
    session) only makes its own marks leave leases, which hold nothing; other workers'
    claims and the inbox's health are not touched."""
    for event_id in ("a", "b", "c"):
        receive(q, "q", event_id)
    consumer = make_role(q, "mailbox_consumer")
    try:
        other = connect()
        assert claim(other, "q", "other", batch=2) == ["a", "b"]  # autocommit: leased
        hostile = connect()
        hostile.execute(f'SET ROLE "{consumer}"')
        hostile.execute("SET mailbox.claim_unleased_1 = 'on'")
        assert scalar(hostile, "SELECT mailbox.inbox_mark_processed('q', 'a')") is True
        assert leases(q) == [("a", "other", True, False), ("b", "other", True, False)]
        assert scalar(q, "SELECT mailbox.inbox_health('q') -> 'in_flight_count'") == 1  # b
        assert claim(connect(), "q", "third") == ["c"]  # a is processed, b still held
        assert scalar(other, "SELECT mailbox.inbox_mark_processed('q', 'b')") is True
        # other's own mark ends its lease: the setting is the hostile session's alone
        assert leases(q) == [("a", "other", True, False), ("c", "third", True, False)]
        assert scalar(q, "SELECT mailbox.replay_inbox_messages('q', ARRAY['a'])") == 1
        assert [r[0] for r in leases(q)] == ["c"]
    finally:
        drop_role(q, consumer)


def test_a_claimer_whose_scan_predates_a_committed_lease_does_not_win_the_message(db, connect):
    """B's claim statement takes its snapshot, then stops in its scan (a row-level security
    policy of the table owner, released by the test) before it reaches message m. A claims m
    and commits without marking it, so m is leased to A and A's row lock is gone. B then
    locks m (its snapshot cannot see A's lease); the re-read of the leases after the lock
    must drop it: B gets nothing and A keeps its lease."""
    owner = make_gated_table(db, "id = 'm'")
    try:
        db.execute("SELECT mailbox.enable_inbox_tracking('g', 'gated.inbox')")
        receive(db, "g", "m")
        control = connect(autocommit=False)
        control.execute("SELECT pg_advisory_lock(4242)")
        b = connect(application_name="gated")
        got = {}

        def run_b():
            got["b"] = claim(b, "g", "B")

        thread = threading.Thread(target=run_b, daemon=True)
        thread.start()
        deadline = time.monotonic() + 5
        while (
            scalar(
                db,
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                [b.info.backend_pid],
            )
            != "Lock"
        ):
            assert time.monotonic() < deadline, "B never reached the gate"
            time.sleep(0.02)
        assert claim(connect(), "g", "A") == ["m"]  # autocommit: leased to A at commit
        control.execute("SELECT pg_advisory_unlock(4242)")
        control.commit()
        thread.join(10)
        assert not thread.is_alive()
        assert got["b"] == []
        assert leases(db) == [("m", "A", True, False)]
    finally:
        db.execute("SELECT mailbox.drop_inbox('g', true)")
        drop_gated_table(db, owner)


def test_workers_mixing_both_lease_paths_claim_every_message_once(q, connect):
    """Four workers claim in batches of 7: two in READ COMMITTED (open claims) and two in
    REPEATABLE READ (leases written at once, retried on a serialization failure); each
    commits its claim, marks in a second transaction, and every message is marked once."""
    q.execute(
        "SELECT mailbox.inbox_receive_batch('q', jsonb_agg(jsonb_build_object("
        "'p_event_id', 'e' || g, 'p_payload', '{}'::jsonb))) FROM generate_series(1, 300) g"
    )
    seen, errors = [], []
    barrier = threading.Barrier(4)

    def work(i):
        try:
            conn = connect(autocommit=False)
            if i >= 2:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            barrier.wait()
            while True:
                try:
                    got = claim(conn, "q", f"w{i}", 7)
                    conn.commit()
                except psycopg.errors.SerializationFailure:
                    conn.rollback()
                    continue
                if not got:
                    if scalar(conn, "SELECT count(*) FROM mailbox.pending_q") == 0:
                        conn.commit()
                        return
                    conn.commit()
                    continue
                marked = scalar(conn, "SELECT mailbox.inbox_mark_processed('q', %s::text[])", [got])
                conn.commit()
                assert marked == len(got)
                seen.extend(got)
        except Exception as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert sorted(seen) == sorted(f"e{g}" for g in range(1, 301))
    assert leases(q) == []


@pytest.mark.parametrize("path", ["named", "full"])
def test_a_mark_that_waited_for_another_claimers_commit_leaves_no_lease_that_holds_anything(
    q, connect, path
):
    """A mark that waits for another worker's claim to commit (that worker's open claim
    becomes a lease at commit, after the mark began). The named mark (a managed inbox
    without grants) ends that lease in a later statement, which sees it. The full path (here:
    an inbox with a grant) deletes a lease only when its lookup saw one, so it leaves that
    lease behind: it must hold nothing, as a processed message is never claimed nor counted
    in flight, and a replay clears it."""
    if path == "full":
        q.execute("SELECT mailbox.grant_inbox('q', 'mailbox_consumer', 'process')")
    receive(q, "q", "m0")
    holder = connect(autocommit=False)
    assert claim(holder, "q", "holder") == ["m0"]
    marker = connect()
    done = {}
    t = threading.Thread(
        target=lambda: done.update(
            v=scalar(marker, "SELECT mailbox.inbox_mark_processed('q', 'm0')")
        )
    )
    t.start()
    wait_blocked(q, marker)  # the mark waits for the claimer's row lock
    holder.commit()  # settles the claim: m0 is still pending, so it gets a lease
    t.join(10)
    assert done == {"v": True}
    if path == "named":
        assert leases(q) == []
        return
    assert leases(q) == [("m0", "holder", True, False)]  # left behind, expires by itself
    assert scalar(q, "SELECT mailbox.inbox_health('q') -> 'in_flight_count'") == 0
    assert claim(connect(), "q", "other") == []
    assert scalar(q, "SELECT mailbox.replay_inbox_messages('q', ARRAY['m0'])") == 1
    assert leases(q) == []
    assert claim(connect(), "q", "other") == ["m0"]


def open_claim_blocks(conn):
    """Blocks of mailbox._inbox_open_claim and its indexes this transaction has read so far."""
    return scalar(
        conn,
        "SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class AS c"
        " WHERE c.oid = 'mailbox._inbox_open_claim'::regclass"
        " OR c.oid IN (SELECT indexrelid FROM pg_index"
        " WHERE indrelid = 'mailbox._inbox_open_claim'::regclass)",
    )


@pytest.mark.parametrize("mark", ["batch", "single"])
def test_a_claim_reads_its_own_open_claims_only_however_many_dead_ones_wait_for_vacuum(
    q, connect, mark
):
    """Every claim asks whether its own transaction has an open claim of the inbox, and a batch
    mark looks its claim up. Each claim transaction leaves one dead row behind; until vacuum
    removes them, a lookup by inbox alone read them all (an index on the inbox merged them
    into posting lists it could not mark dead, and a snapshot older than they are, such as a
    long report's, keeps any index from marking them), about 150 us a claim at 2,000. The
    lookup by inbox and transaction reads a few blocks, whatever lies dead. (Always by the
    index: the claim and the marks run with sequential scans off, so not even a plan made
    after a VACUUM left the table empty scans its heap: tests/inbox/test_inbox_plans.py.)"""
    q.execute("ALTER TABLE mailbox._inbox_open_claim SET (autovacuum_enabled = false)")
    q.execute(
        "SELECT count(*) FROM mailbox.inbox_receive_batch('q', (SELECT jsonb_agg("
        "jsonb_build_object('p_event_id', 'm' || g, 'p_payload', '{}'::jsonb))"
        " FROM generate_series(1, 1510) AS g))"
    )
    report = connect(autocommit=False)  # a snapshot older than every dead claim row
    report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert scalar(report, "SELECT count(*) FROM mailbox.q") == 1510
    w = connect(autocommit=False)
    for _ in range(1500):
        (m,) = claim(w, "q", batch=1)
        w.execute("SELECT mailbox.inbox_mark_processed('q', %s::text[])", [[m]])
        w.commit()
    dead = scalar(q, "SELECT count(*) FROM mailbox._inbox_open_claim")  # (none visible)
    assert dead == 0
    before = open_claim_blocks(w)
    got = claim(w, "q", batch=5)
    assert len(got) == 5
    if mark == "batch":
        assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', %s::text[])", [got]) == 5
    else:
        for m in got:
            assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', %s)", [m]) is True
    used = open_claim_blocks(w) - before
    w.commit()
    report.rollback()
    assert used <= 16, used


def test_a_claim_committed_without_its_settle_holds_nothing_and_maintenance_forgets_it(q, connect):
    """A superuser session with session_replication_role = replica fires no triggers, so its
    claim commits unsettled: its messages have no lease and are claimable at once. Its row
    stays behind, committed; lookups pass it by (it names another transaction, so no claim
    settles it into leases for a holder that is gone), and maintenance deletes it, but never
    the open claim of the transaction that runs maintenance."""
    for i in range(3):
        receive(q, "q", f"m{i}")
    r = connect(autocommit=False)
    r.execute("SET session_replication_role = replica")
    assert claim(r, "q", "repl", batch=2, visibility=600) == ["m0", "m1"]
    r.commit()
    assert rows(q, "SELECT leased_by FROM mailbox._inbox_open_claim") == [("repl",)]
    w = connect(autocommit=False)
    assert claim(w, "q", "w2", batch=3) == ["m0", "m1", "m2"]
    assert scalar(w, "SELECT (mailbox.run_maintenance() ->> 'inbox_claims_forgotten')::int") == 1
    assert rows(w, "SELECT leased_by FROM mailbox._inbox_open_claim") == [("w2",)]
    assert scalar(w, "SELECT mailbox.inbox_mark_processed('q', ARRAY['m0', 'm1'])") == 2
    w.commit()
    assert leases(q) == [("m2", "w2", True, False)]
    assert scalar(q, "SELECT count(*) FROM mailbox._inbox_open_claim") == 0
    assert scalar(q, "SELECT (mailbox.run_maintenance() ->> 'inbox_claims_forgotten')::int") == 0
