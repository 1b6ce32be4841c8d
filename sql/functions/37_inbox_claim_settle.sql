-- Part 37 (claim settle): claims whose leases are written only if they outlive their
-- transaction (issue 11).
--
-- A claim must keep other workers off its messages for its visibility timeout. While the
-- claiming transaction is open, its row locks (FOR UPDATE, taken by the generated claim)
-- already do that: every claimer skips locked rows. A lease row is needed only once the
-- transaction commits with messages still pending (claim in one transaction, mark in a
-- later one). So in READ COMMITTED, for an inbox without ordering, inbox_claim writes one
-- mailbox._inbox_open_claim row per call (the ids, holder and lease end) instead of a
-- lease row per message, and the deferred constraint trigger below settles it at commit:
-- the ids still pending (neither processed nor dead letters, asked of the generated
-- unsettled function as the table owner) become lease rows, and the claim row is deleted.
-- A claim whose messages are marked in its own transaction (the documented exactly-once
-- pattern) so writes no lease row at all, and its mark deletes none.
--
-- Why no other claimer can win a message in between (docs/design.md §7.1): the lease
-- rows are written before the commit releases the row locks and become visible with it. A
-- claimer whose statement snapshot predates that commit can still lock the row after it,
-- so inbox_claim re-reads the leases of the rows it locked in a new statement (a new
-- snapshot in READ COMMITTED, taken after the lock was granted, so after that commit) and
-- keeps only those without a live lease or pending retry time (that statement is skipped
-- when a probe after the locks finds no lease row of the inbox at all). Under REPEATABLE READ or
-- SERIALIZABLE a statement cannot see past the transaction's snapshot, so there (and for
-- ordered inboxes, whose claim reads other messages' leases to keep one message of an
-- aggregate in flight) inbox_claim writes the lease rows at once and the ON CONFLICT
-- upsert decides, as before.
--
-- Only extension-owned code writes mailbox._inbox_open_claim, so the ids a commit leases are
-- ids its transaction claimed; a failure report (part 37, _inbox_fail_one) and a replay
-- take their ids out of the open claims of their own transaction, so those messages are
-- claimable again at once rather than leased at commit.
--
-- Marks without a lease. The named mark (part 35, named receive) ends a message's lease with
-- a DELETE, an executor start-up on another table that cost about a tenth of a mark. A
-- message this transaction claimed has no lease row to end when no lease row of the inbox
-- existed after the claim's locks: no other transaction can lease a row this one holds
-- locked, and this one writes lease rows only by settling, by a claim that leases at once
-- (step 2b, after ordering was enabled in the same transaction) or by a failure report. So
-- inbox_claim, step 2a, sets the transaction-local setting mailbox.claim_unleased_<key> to
-- 'on' when that probe found none (and clears it when it found some), and every writer of
-- this transaction's lease rows (_inbox_settle and _inbox_claim_leases below,
-- _inbox_fail_one) clears it; the named mark skips its DELETE while it is 'on'. A mark of a
-- message that another transaction claimed, made while the setting is on, leaves that
-- lease, which holds nothing (as above, a processed message is never claimed, counted in
-- flight or replayed with its lease) and is deleted by maintenance once it has expired.
-- Setting it by hand only does the same.

-- Settles one open claim now: the ids still pending (neither processed nor dead letters, as
-- the table owner sees them) become lease rows and the claim row is deleted. Called at commit
-- by the deferred trigger below, and by inbox_claim for the open claims of its own
-- transaction before it claims again (so the new claim, like every claim, skips them by
-- their lease rows), and by _inbox_hold_in_flight (part 34).
-- No SET clause: its callers are those three, SECURITY DEFINER or pinned themselves, whose
-- search_path it runs with (nobody else may execute it). At commit a SET of search_path here
-- cost about 40 us of backend CPU per claim, a tenth of what a claim of 10 adds to a plain
-- SKIP LOCKED claim (docs/benchmarks.md). Even so its body names nothing a search_path could
-- redirect, as the routers' (part 35, routes): every function, operator and type qualified.
CREATE FUNCTION mailbox._inbox_settle(p_claim_no bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
    v_claim record;
    v_inbox mailbox._inbox;
    v_left pg_catalog.text[];
    v_won pg_catalog.int8;
BEGIN
    -- one statement: the row as it is now (a failure report may have taken ids out since the
    -- insert), deleted, with its inbox (drop_inbox deletes the open claims of its transaction)
    -- and the ids still pending (part 35, routes). No row: settled already (by a batch mark
    -- or an earlier call), or nothing is left.
    WITH d AS (
        DELETE FROM mailbox._inbox_open_claim AS o WHERE o.claim_no OPERATOR(pg_catalog.=) p_claim_no
        RETURNING o.inbox_key, o.event_ids, o.lease_until, o.leased_by, o.leased_by_pid
    )
    SELECT d.inbox_key, d.lease_until, d.leased_by, d.leased_by_pid, i AS inbox,
           mailbox._inbox_route_unsettled(i, d.event_ids) AS pending
      INTO v_claim
      FROM d JOIN mailbox._inbox AS i ON i.inbox_key OPERATOR(pg_catalog.=) d.inbox_key
     WHERE pg_catalog.cardinality(d.event_ids) OPERATOR(pg_catalog.>) 0;
    IF v_claim.pending IS NULL THEN
        RETURN;
    END IF;
    v_inbox := v_claim.inbox;
    v_left := v_claim.pending;
    -- this transaction now has lease rows of the inbox (Marks without a lease, above)
    PERFORM pg_catalog.set_config(pg_catalog.concat('mailbox.claim_unleased_', v_claim.inbox_key), '', TRUE);
    -- the claim held these rows locked since it re-read their leases, so no live lease or
    -- retry time of another worker can be in the way; the WHERE only keeps that true
    WITH won AS (
        INSERT INTO mailbox._inbox_lease AS x (inbox_key, event_id, lease_until, leased_by, next_attempt_at,
                                               leased_by_pid)
        SELECT v_claim.inbox_key, m.id, v_claim.lease_until, v_claim.leased_by, NULL, v_claim.leased_by_pid
          FROM pg_catalog.unnest(v_left) AS m (id)
            ON CONFLICT ON CONSTRAINT _inbox_lease_pkey DO UPDATE
           SET lease_until = excluded.lease_until, leased_by = excluded.leased_by, next_attempt_at = NULL,
               leased_by_pid = excluded.leased_by_pid
         WHERE (x.lease_until IS NULL OR x.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
           AND (x.next_attempt_at IS NULL OR x.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
        RETURNING 1
    )
    SELECT pg_catalog.count(*) INTO v_won FROM won;
    IF v_won OPERATOR(pg_catalog.<>) pg_catalog.cardinality(v_left) THEN
        RAISE EXCEPTION 'inbox claim of % could not be settled: % of % leases are held by another worker',
            v_inbox.inbox_name, pg_catalog.cardinality(v_left) OPERATOR(pg_catalog.-) v_won,
            pg_catalog.cardinality(v_left)
            USING ERRCODE = 'XX000',
                  HINT = 'This is a bug in pg_mailbox; the transaction was rolled back, so no message was lost.';
    END IF;
END
$$;

-- The lease rows of a claim that writes them at once (inbox_claim, step 2b: an ordered inbox,
-- or REPEATABLE READ and SERIALIZABLE): the ids of p_rows it won. The upsert takes a message
-- whose lease and retry time have passed; ON CONFLICT judges the latest committed lease row.
-- An ordered inbox's leases carry their aggregate, at most one row per aggregate (a unique
-- index): the row of the message in flight. So, first, other messages' rows of these
-- aggregates whose lease ended (expired, or a failure's retry time) give their aggregate back
-- (a claimed message's own row keeps it: the upsert sets it again, and a REPEATABLE READ
-- claim would fail on a row maintenance deleted since its snapshot); then the upsert leaves
-- out a message whose aggregate another message's row still carries: a live lease, or one
-- that ended after the give-back's snapshot (it is claimable next time). In READ
-- COMMITTED its snapshot is taken after inbox_claim holds the aggregates' locks, so it sees
-- the lease of a claim that held one and committed since the claim's scan; under REPEATABLE
-- READ it cannot, and that lease's row fails the unique index instead (inbox_claim turns
-- that into a serialization failure). docs/design.md §7.3.
CREATE FUNCTION mailbox._inbox_claim_leases(
    p_inbox mailbox._inbox, p_rows mailbox._inbox_message[], p_worker text, p_now timestamptz,
    p_until timestamptz
)
RETURNS text[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_ordered boolean := p_inbox.ordering_first_sequence IS NOT NULL;
    v_won text[];
BEGIN
    -- this transaction writes lease rows of the inbox (Marks without a lease, above): a claim
    -- of this transaction may have set the setting before ordering was enabled in it
    PERFORM pg_catalog.set_config('mailbox.claim_unleased_' || p_inbox.inbox_key, '', TRUE);
    IF v_ordered THEN
        UPDATE mailbox._inbox_lease AS o SET aggregate_id = NULL
         WHERE o.inbox_key = p_inbox.inbox_key
           AND o.aggregate_id = ANY (ARRAY(SELECT m.aggregate_id FROM pg_catalog.unnest(p_rows) AS m))
           AND o.event_id <> ALL (ARRAY(SELECT m.event_id FROM pg_catalog.unnest(p_rows) AS m))
           AND (o.lease_until IS NULL OR o.lease_until <= p_now);
    END IF;
    WITH won AS (
        INSERT INTO mailbox._inbox_lease AS x (inbox_key, event_id, lease_until, leased_by, next_attempt_at,
                                               leased_by_pid, aggregate_id)
        SELECT p_inbox.inbox_key, m.event_id, p_until, p_worker, NULL, pg_catalog.pg_backend_pid(),
               CASE WHEN v_ordered THEN m.aggregate_id END
          FROM pg_catalog.unnest(p_rows) AS m
         WHERE NOT v_ordered OR m.aggregate_id IS NULL
            OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS o
                            WHERE o.inbox_key = p_inbox.inbox_key AND o.aggregate_id = m.aggregate_id
                              AND o.event_id <> m.event_id)
            ON CONFLICT ON CONSTRAINT _inbox_lease_pkey DO UPDATE
           SET lease_until = excluded.lease_until, leased_by = excluded.leased_by, next_attempt_at = NULL,
               leased_by_pid = excluded.leased_by_pid, aggregate_id = excluded.aggregate_id
         WHERE (x.lease_until IS NULL OR x.lease_until <= p_now)
           AND (x.next_attempt_at IS NULL OR x.next_attempt_at <= p_now)
        RETURNING x.event_id
    )
    SELECT pg_catalog.array_agg(won.event_id) INTO v_won FROM won;
    RETURN coalesce(v_won, '{}');
END
$$;

-- Raises 40001 when the inbox's configuration (ordering, column mapping, priority) differs
-- from p_inbox, the catalog row inbox_claim looked up. In READ COMMITTED, called after the
-- claim's scan (a later statement, so a newer snapshot), it stops a claim that ran the old
-- configuration's generated code: one that looked the inbox up before a change committed and
-- then waited for the change's lock (enable_inbox_ordering's on the table) before it scanned.
-- Such a claim must not hand out what it found (docs/inbox-ordering.md, switching while
-- workers run). The generated functions raise the same error when their own check, before
-- they run, finds the change. (PL/pgSQL: its statement's plan is kept for the session; a SQL
-- function with a SET clause would be planned again at every call.)
CREATE FUNCTION mailbox._inbox_check_unchanged(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM mailbox._inbox AS i
                WHERE i.inbox_key = p_inbox.inbox_key
                  AND (i.ordering_first_sequence, i.columns, i.priority_tiers)
                      IS DISTINCT FROM (p_inbox.ordering_first_sequence, p_inbox.columns, p_inbox.priority_tiers)) THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', p_inbox.inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This claim read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
END
$$;

-- The deferred trigger on mailbox._inbox_open_claim: settles one claim at commit (or at
-- SET CONSTRAINTS ... IMMEDIATE, after which later marks delete the lease rows as usual).
CREATE FUNCTION mailbox._inbox_settle_claim()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the leases of any inbox at the commit of a mailbox_consumer's claim
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
BEGIN
    -- a claim marked in full by a batch mark was settled (deleted) there: nothing to call
    -- (one index probe; without it such a claim pays a call and the settle's statement.
    -- bench/inbox_variants.py --batch 100 --batch-mark read 70 and 119 us more per claim
    -- without it, but 44 for the same code in a third run: this mode's noise; it stays)
    IF EXISTS (SELECT 1 FROM mailbox._inbox_open_claim AS o WHERE o.claim_no = NEW.claim_no) THEN
        PERFORM mailbox._inbox_settle(NEW.claim_no);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION mailbox._inbox_settle_claim() IS
'pg_mailbox: at commit, turns the still pending messages of an inbox claim into lease rows';

CREATE CONSTRAINT TRIGGER _inbox_settle_claim
AFTER INSERT ON mailbox._inbox_open_claim
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION mailbox._inbox_settle_claim();

-- Takes ids out of the open claims of the caller's own transaction (the only claim rows it
-- can see), so its commit does not lease them: a failure report or replay settles them.
CREATE FUNCTION mailbox._inbox_unclaim(p_inbox_key int, p_event_ids text[])
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    UPDATE mailbox._inbox_open_claim AS o
       SET event_ids = ARRAY(SELECT e.id FROM pg_catalog.unnest(o.event_ids) AS e (id)
                              WHERE e.id <> ALL (p_event_ids))
     WHERE o.inbox_key = p_inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned() AND o.event_ids && p_event_ids;
$$;
