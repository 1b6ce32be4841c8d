"""Claims pass over messages in flight with one read of the leases, not one per message
(issue 11, docs/inbox.md "Messages in flight").

Claims take the oldest pending messages, so in the two-transaction pattern (claim and
commit, process, mark later) the messages in flight sit at the head of the queue and every
other claim passes over them. The generated claim of an inbox without ordering or priority
excludes them with a NOT IN over the inbox's live leases, read once per claim and hashed;
before, it looked each passed message up in the lease table's primary key (one index scan
each, about twice what a plain SKIP LOCKED queue pays to pass a locked row). PostgreSQL
counts this transaction's scans of mailbox._inbox_lease's indexes
(pg_stat_get_xact_numscans), so the tests read how many lookups a claim made without timing
anything; the control asks the generated claim for each exclusion in turn, which shows that
the count can fail.
"""

import pytest
from mbx import scalar

IN_FLIGHT = 2_000


@pytest.fixture
def held(db, connect):
    """An inbox whose 2,000 oldest messages are leased by another worker (a claim committed
    with a 600 s lease), and 200 more behind them."""
    db.execute("SELECT mailbox.create_inbox('fl')")
    db.execute(
        "INSERT INTO mailbox.fl (event_id, payload, received_at)"
        " SELECT 'm-' || g, '{}', now() - interval '1 hour' + g * interval '1 ms'"
        " FROM generate_series(1, %s) g",
        [IN_FLIGHT + 200],
    )
    holder = connect()
    got = scalar(
        holder, "SELECT count(*) FROM mailbox.inbox_claim('fl', 'holder', %s, 600)", [IN_FLIGHT]
    )
    assert got == IN_FLIGHT
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease") == IN_FLIGHT
    return db


def lease_scans(conn):
    """(index scans, index entries read) of mailbox._inbox_lease's indexes in this transaction."""
    return conn.execute(
        "SELECT coalesce(sum(pg_catalog.pg_stat_get_xact_numscans(i.indexrelid)), 0),"
        " coalesce(sum(pg_catalog.pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)"
        " FROM pg_catalog.pg_index AS i WHERE i.indrelid = 'mailbox._inbox_lease'::regclass"
    ).fetchone()


def claim_ten(conn):
    before = lease_scans(conn)
    ids = [r[0] for r in conn.execute("SELECT event_id FROM mailbox.inbox_claim('fl', 'w', 10)")]
    after = lease_scans(conn)
    return ids, after[0] - before[0], after[1] - before[1]


def test_a_claim_reads_the_leases_once_not_once_per_message_in_flight(held, connect):
    w = connect(autocommit=False)
    ids, scans, _ = claim_ten(w)
    # the ten messages behind the ones in flight, oldest first
    assert ids == [f"m-{IN_FLIGHT + k}" for k in range(1, 11)]
    # one read of the live leases, then one lookup per claimed message (inbox_claim's re-read
    # after the locks) and the EXISTS probes: far fewer than one per message passed over
    assert scans < 50, scans
    w.rollback()


def test_the_re_read_after_the_locks_looks_up_the_claimed_messages_only(held, connect):
    # inbox_claim's re-read of the leases (step 2a) keeps the claimed messages without a live
    # lease; left to the planner it became a hash anti-join over every lease row of the
    # inbox, on every claim. OFFSET 0 keeps it a lookup per claimed message (a SubPlan),
    # whatever the lease table's statistics (auto_explain shows the nested plans).
    w = connect(autocommit=False)
    plans = []
    w.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    for analyzed in (False, True):
        if analyzed:
            held.execute("ANALYZE mailbox._inbox_lease")
        w.execute("LOAD 'auto_explain'")
        w.execute("SET LOCAL auto_explain.log_min_duration = 0")
        w.execute("SET LOCAL auto_explain.log_nested_statements = on")
        w.execute("SET LOCAL auto_explain.log_level = notice")
        del plans[:]
        w.execute("SELECT count(*) FROM mailbox.inbox_claim('fl', 'w', 10)")
        reread = [p for p in plans if "unnest(v_rows) AS m" in p and "_inbox_lease" in p]
        assert len(reread) == 1, plans
        assert "SubPlan" in reread[0] and "Anti Join" not in reread[0], reread[0]
        # and the generated claim's set is hashed, not scanned again for every row passed
        claim = [p for p in plans if "SKIP LOCKED" in p and "mailbox.fl" in p]
        assert len(claim) == 1 and "hashed SubPlan" in claim[0], claim
        w.rollback()


def test_control_a_lookup_per_message_shows_in_the_count(held, connect):
    # the generated claim itself, asked for each exclusion: TRUE reads the set once, NULL
    # looks each passed message up (the exclusion before this change, and the one under
    # SERIALIZABLE); the count tells them apart
    w = connect(autocommit=False)
    key = scalar(w, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = 'fl'")
    for arg, per_row in (("TRUE", False), ("NULL", True)):
        before = lease_scans(w)[0]
        got = scalar(
            w,
            f"SELECT pg_catalog.cardinality(mailbox._inbox_{key}_claim(i, 10,"
            f" pg_catalog.clock_timestamp(), {arg})) FROM mailbox._inbox AS i"
            " WHERE i.inbox_name = 'fl'",
        )
        scans = lease_scans(w)[0] - before
        assert got == 10
        assert (scans >= IN_FLIGHT) if per_row else (scans < 10), (arg, scans)
        w.rollback()


def test_an_expired_lease_in_the_set_does_not_hide_its_message(held, connect):
    # the set holds live leases only: once the holder's lease runs out, its messages are the
    # oldest claimable again
    held.execute("UPDATE mailbox._inbox_lease SET lease_until = now() - interval '1 second'")
    w = connect(autocommit=False)
    ids, _, _ = claim_ten(w)
    assert ids == [f"m-{k}" for k in range(1, 11)]
    w.rollback()


def test_a_message_waiting_for_its_retry_time_is_in_the_set(held, connect):
    # a failed message with a retry time has a lease row with next_attempt_at and no live
    # lease_until: the set holds it too, so a claim passes it over
    db = held
    db.execute("UPDATE mailbox._inbox_lease SET lease_until = now() - interval '1 second'")
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('fl', 'm-1', 'boom', 600)") == "retry"
    w = connect(autocommit=False)
    ids, scans, _ = claim_ten(w)
    assert ids == [f"m-{k}" for k in range(2, 12)]
    assert scans < 50, scans
    w.rollback()


def test_a_priority_inbox_keeps_a_lookup_per_row(db):
    # with priority, a better message arrives ahead of the leased ones, which a claim then
    # need not pass: reading the whole set would cost more than the lookups (as for the few
    # heads of an ordered inbox)
    db.execute("SELECT mailbox.create_inbox('pri')")
    db.execute("SELECT mailbox.enable_inbox_priority('pri')")
    body = scalar(
        db,
        "SELECT p.prosrc FROM pg_catalog.pg_proc AS p, mailbox._inbox AS i"
        " WHERE i.inbox_name = 'pri' AND p.proname = '_inbox_' || i.inbox_key || '_claim'",
    )
    assert "NOT EXISTS (SELECT 1 FROM mailbox._inbox_" in body and "NOT IN (" not in body, body


def test_an_adopted_row_without_an_id_stays_claimable_beside_leases(db, connect):
    # an adopted table's id may be a nullable UNIQUE column; NULL NOT IN a non-empty set is
    # NULL, so without the IS NULL arm such a row would hide whenever another message is
    # leased (it never is itself: a lease needs an id)
    db.execute(
        "CREATE TABLE public.nullable_ids (id text UNIQUE, body jsonb, arrived timestamptz,"
        " done timestamptz, tries int NOT NULL DEFAULT 0)"
    )
    db.execute(
        "SELECT mailbox.enable_inbox_tracking('nid', 'public.nullable_ids', p_id_column => 'id',"
        " p_processed_at_column => 'done', p_retry_count_column => 'tries',"
        " p_received_at_column => 'arrived', p_payload_column => 'body')"
    )
    db.execute(
        "INSERT INTO public.nullable_ids (id, body, arrived) VALUES"
        " ('a', '{}', now() - interval '3 s'), (NULL, '{}', now() - interval '2 s'),"
        " ('b', '{}', now() - interval '1 s')"
    )
    holder = connect()
    assert (
        scalar(holder, "SELECT event_id FROM mailbox.inbox_claim('nid', 'holder', 1, 600)") == "a"
    )
    w = connect(autocommit=False)
    got = [r[0] for r in w.execute("SELECT event_id FROM mailbox.inbox_claim('nid', 'w', 3)")]
    assert got == [None, "b"], got
    w.rollback()


def test_under_serializable_a_claim_looks_up_each_message_instead(held, connect):
    # reading the whole set could be a sequential scan of mailbox._inbox_lease, whose
    # predicate lock would put every transaction that writes a lease in conflict with the
    # claim; under SERIALIZABLE inbox_claim asks for a lookup per row instead
    w = connect(autocommit=False)
    w.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    ids, scans, _ = claim_ten(w)
    assert ids == [f"m-{IN_FLIGHT + k}" for k in range(1, 11)]
    assert scans >= IN_FLIGHT, scans
    w.rollback()
