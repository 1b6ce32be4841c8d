-- Part 33: the inbox data plane (SPEC §3.1): receive, claim (marks: part 33, marks; replay:
-- part 33, replay).
--
-- The per-message functions check their arguments and dispatch to the inbox's generated
-- functions (part 35), whose static SQL has cached plans and which alone touch the inbox
-- table, with its owner's rights; leases and ordering state are written here, from what they
-- return (bind parameters, this inbox's key only). The hot path inlines the lookup and
-- checks (a helper with a SET clause costs a GUC save and restore). Leases and retry
-- times live in mailbox._inbox_lease (part 30; docs/design.md §7.1: why a claim is safe).
-- Every function checks that the inbox's stored table name still names its table: a renamed
-- table is refused (55000), never replaced by whatever took the old name. A claim locks
-- candidate rows FOR UPDATE SKIP LOCKED; its leases are upserted from the latest committed
-- lease rows, so two claimers never both win a message. Claim,
-- business logic and mark in one transaction: the row lock keeps other workers off a
-- message until commit, and a crash rolls the lease back with everything else. Receivers
-- notify only while a worker waits (part 33, wake-ups).

-- The full path of inbox_receive (below): every inbox, every argument; the only one for an
-- inbox with grants of its own or an adopted table, and the one that raises every error.
CREATE FUNCTION mailbox._inbox_receive_full(
    p_inbox text,
    p_event_id text,
    p_payload jsonb,
    p_event_type text,
    p_source text,
    p_aggregate_id text,
    p_sequence_num bigint,
    p_headers jsonb,
    p_trace_id text,
    p_priority int
)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- calls any inbox's generated functions (which run as the table owner) for mailbox_producer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
BEGIN
    -- one statement: the catalog row; whether the inbox has grants of its own (without, the
    -- role-level grants decide); whether its stored table name still names its table;
    -- whether a worker waits for a wake-up (_inbox_has_waiter)
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved,
           EXISTS (SELECT 1 FROM mailbox._inbox_waiter AS w
                    WHERE w.inbox_key = i.inbox_key AND w.waiting_until > pg_catalog.now()) AS waited
      INTO v_found
      FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        PERFORM mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    v_inbox := v_found.inbox;
    IF v_found.granted THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, 'receive');
    END IF;
    IF v_found.moved THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    IF p_event_id IS NULL THEN
        RAISE EXCEPTION 'event id must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the message''s unique id (the broker''s message id, say).';
    END IF;
    -- an id is a key of unique indexes (entries up to about 2700 bytes): a fixed, documented
    -- limit names the argument instead
    IF pg_catalog.octet_length(p_event_id) > 1000 THEN
        RAISE EXCEPTION 'p_event_id too long: % bytes', pg_catalog.octet_length(p_event_id)
            USING ERRCODE = '22023',
                  HINT = 'p_event_id is at most 1000 bytes; pass the broker''s message id, not the message.';
    END IF;
    -- the generated function (through its router, part 35) checks ordering, unmapped roles
    -- and the priority's range, and inserts as the table's owner
    IF mailbox._inbox_route_receive(v_inbox, p_event_id, p_payload, p_event_type, p_source, p_aggregate_id,
                                    p_sequence_num, p_headers, p_trace_id, p_priority) THEN
        IF v_found.waited THEN
            PERFORM pg_catalog.pg_notify('mailbox_inbox_new', v_inbox.inbox_name);
        END IF;
        RETURN TRUE;
    END IF;
    RETURN FALSE;
END
$$;
COMMENT ON FUNCTION mailbox._inbox_receive_full(text, text, jsonb, text, text, text, bigint, jsonb, text, int) IS
'pg_mailbox: inbox_receive for any inbox, checking everything (inbox_receive calls it when no named receive applies)';

-- A managed inbox without grants of its own: its named receive (part 35, named receive), with
-- no lookup; NULL for any other inbox and for arguments it would refuse, and then the full
-- path. One expression, SECURITY INVOKER and without SET, so that the planner inlines it (and
-- the router inside it) into the caller's statement: the named receive, itself SECURITY
-- DEFINER with a pinned search_path, is then the call's only function frame (a PL/pgSQL
-- frame around it cost about 7.5 us of backend CPU, docs/benchmarks.md). Every name in it is
-- schema-qualified and every argument has its exact type, so the caller's search_path, under
-- which an inlined body is parsed, can redirect nothing. A caller needs EXECUTE on the two
-- functions it calls as well (mailbox_producer has it; part 90).
CREATE FUNCTION mailbox.inbox_receive(
    p_inbox text,
    p_event_id text,
    p_payload jsonb,
    p_event_type text DEFAULT NULL,
    p_source text DEFAULT NULL,
    p_aggregate_id text DEFAULT NULL,
    p_sequence_num bigint DEFAULT NULL,
    p_headers jsonb DEFAULT NULL,
    p_trace_id text DEFAULT NULL,
    p_priority int DEFAULT NULL
)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT COALESCE(mailbox._inbox_route_receive_named($1, $2, $3, $4, $5, $6, $7, $8, $9, $10),
                    mailbox._inbox_receive_full($1, $2, $3, $4, $5, $6, $7, $8, $9, $10));
$$;
COMMENT ON FUNCTION mailbox.inbox_receive(text, text, jsonb, text, text, text, bigint, jsonb, text, int) IS
'store a message once per event id; true when new, false for a duplicate';

-- Raises inbox_claim's error for its first bad argument (inbox_claim calls it only then).
CREATE FUNCTION mailbox._inbox_claim_refuse(p_worker text, p_batch_size int, p_visibility_seconds int)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_id('worker', p_worker);
    PERFORM mailbox._require(p_batch_size, 'p_batch_size');
    PERFORM mailbox._require(p_visibility_seconds, 'p_visibility_seconds');
    IF p_batch_size < 1 OR p_batch_size > 10000 THEN
        RAISE EXCEPTION 'invalid batch size: %', p_batch_size
            USING ERRCODE = '22023', HINT = 'p_batch_size is 1 to 10000.';
    END IF;
    IF p_visibility_seconds < 1 THEN
        RAISE EXCEPTION 'invalid visibility timeout: % seconds', p_visibility_seconds
            USING ERRCODE = '22023', HINT = 'p_visibility_seconds is 1 or more: how long the lease lasts.';
    END IF;
END
$$;

CREATE FUNCTION mailbox.inbox_claim(
    p_inbox text, p_worker text, p_batch_size int DEFAULT 10, p_visibility_seconds int DEFAULT 30
)
RETURNS TABLE (
    event_id text, event_type text, source text, aggregate_id text, sequence_num bigint, priority int,
    payload jsonb, headers jsonb, trace_id text, retry_count int, received_at timestamptz,
    lease_until timestamptz
)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes leases of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
-- the generated claim's LIMIT and times are parameters: one generic plan, never a custom
-- plan per call (an extension owner's generated function has no SET of its own, part 35)
SET plan_cache_mode = force_generic_plan
-- and never JIT-compiled: that generic plan is costed for a share of the pending rows, so
-- above some 120,000 of them its cost passes jit_above_cost (100,000 by default) and every
-- claim compiled its query again, about 8 ms, eight times a claim of 100 (docs/inbox.md)
SET jit = off
-- and never a sequential scan. A session keeps the plans of a function's statements until
-- the tables they read change in the catalog (a VACUUM or ANALYZE, or DDL). So a worker that
-- polled an empty inbox just vacuumed (a drained queue's table is cut to no pages) planned
-- its claim, its marks and its lookups in the lease and open-claim tables as scans of empty
-- tables, and kept scanning the whole table through the burst that followed: 1,400 instead
-- of 12,000 messages a second at 200,000 pending, and a third of its rate beside 50,000
-- lease rows of another inbox (docs/inbox.md, "Plans made on an empty queue"). Every
-- statement of these paths finds its rows by an index (the inbox table's pending, ordering,
-- priority or primary-key index, the side tables' keys), so with sequential scans off the
-- plan is the same whatever the tables' size when it was made. The functions each worker
-- calls per message or batch set it (the inbox_mark_* forms, the commit's settle, replay, and
-- the named mark); the generated functions they call, and the triggers of an adopted table,
-- run under their setting. A statement with no index to read by (an adopted table without
-- the indexes docs/inbox.md recommends) still scans, now costed 1e10 higher: past every JIT
-- threshold, so each of these functions also sets jit = off.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
    v_again record;
    v_now timestamptz;
    v_until timestamptz;
    v_rows mailbox._inbox_message[];
    v_claimed bigint;
    v_won text[];
    v_index text;
BEGIN
    -- one statement, as in inbox_receive; also whether this transaction has an open claim of
    -- the inbox (part 37, claim settle), whether the inbox has a lease row at all, and whether
    -- this connection waits for a wake-up (part 33, wake-ups)
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved,
           EXISTS (SELECT 1 FROM mailbox._inbox_open_claim AS o
                    WHERE o.inbox_key = i.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()) AS open,
           EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l WHERE l.inbox_key = i.inbox_key) AS leased,
           EXISTS (SELECT 1 FROM mailbox._inbox_waiter AS w
                    WHERE w.inbox_key = i.inbox_key AND w.backend_pid = pg_catalog.pg_backend_pid()) AS waiting
      INTO v_found
      FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        PERFORM mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    v_inbox := v_found.inbox;
    IF v_found.granted THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, 'process');
    END IF;
    IF v_found.moved THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    -- one test of the arguments (each PL/pgSQL expression is set up once per transaction)
    IF p_worker IS NULL OR p_worker = '' OR pg_catalog.char_length(p_worker) > 200 OR p_batch_size IS NULL
       OR p_visibility_seconds IS NULL OR p_batch_size < 1 OR p_batch_size > 10000 OR p_visibility_seconds < 1 THEN
        PERFORM mailbox._inbox_claim_refuse(p_worker, p_batch_size, p_visibility_seconds);
    END IF;
    -- a second claim in one transaction: the first one's messages get their lease rows now,
    -- so this claim skips them as it skips every leased message (part 37, claim settle)
    IF v_found.open THEN
        PERFORM mailbox._inbox_settle(o.claim_no) FROM mailbox._inbox_open_claim AS o
          WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned();
    END IF;
    v_now := pg_catalog.clock_timestamp();
    v_until := v_now + pg_catalog.make_interval(secs => p_visibility_seconds);
    -- 1. the candidates, locked (the generated function through its router, as the table
    -- owner); without a lease row in the inbox it skips its lease exclusion (only an
    -- optimisation: what decides is step 2; a settled open claim has just written some), and
    -- under SERIALIZABLE it excludes with a lookup per row, never by reading every lease
    -- (a predicate lock on the whole lease table: part 35, claim builder)
    v_rows := mailbox._inbox_route_claim(v_inbox, p_batch_size, v_now,
                  CASE WHEN NOT (v_found.leased OR v_found.open) THEN FALSE
                       WHEN pg_catalog.current_setting('transaction_isolation') = 'serializable' THEN NULL
                       ELSE TRUE END);
    IF coalesce(pg_catalog.cardinality(v_rows), 0) = 0 THEN
        PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, TRUE); -- nothing: wake me (part 33, wake-ups)
        RETURN;
    END IF;
    -- 2a. READ COMMITTED, no ordering: the row locks hold the messages while this transaction
    -- is open; keep those without a live lease or retry time now (this statement's snapshot
    -- postdates the locks, so it sees any lease committed before them) and record the claim in
    -- one row, which becomes lease rows at commit for what is still pending (part 37, claim
    -- settle). When that statement finds no lease row of the inbox at all, it would find none
    -- for any of these rows: one index probe then stands for the per-row re-read.
    IF v_inbox.ordering_first_sequence IS NULL
       AND pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        -- (and a configuration change that committed while step 1 waited: part 37)
        SELECT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key) AS leased,
               EXISTS (SELECT 1 FROM mailbox._inbox AS i WHERE i.inbox_key = v_inbox.inbox_key
                          AND (i.ordering_first_sequence, i.columns, i.priority_tiers) IS DISTINCT FROM
                              (v_inbox.ordering_first_sequence, v_inbox.columns, v_inbox.priority_tiers)) AS changed
          INTO v_again;
        IF v_again.changed THEN
            PERFORM mailbox._inbox_check_unchanged(v_inbox); -- raises 40001
        END IF;
        IF v_again.leased THEN
            -- (a filtered scan of the array keeps its order; one primary-key lookup per
            -- claimed message, fenced by OFFSET 0: left to the planner, it became a hash
            -- anti-join that read every lease row of the inbox on every claim)
            v_rows := ARRAY(SELECT m FROM pg_catalog.unnest(v_rows) AS m
                             WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l
                                                WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = m.event_id
                                                  AND (l.lease_until > v_now OR l.next_attempt_at > v_now)
                                                OFFSET 0));
            IF pg_catalog.cardinality(v_rows) = 0 THEN
                PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, TRUE);
                RETURN;
            END IF;
        END IF;
        IF v_found.waiting THEN
            PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, FALSE); -- busy: no wake-up
        END IF;
        -- whether the messages this transaction claimed from the inbox have no lease row
        -- (none of the inbox had one after the locks): then the named mark has no lease to
        -- end (part 37, claim settle, "Marks without a lease")
        PERFORM pg_catalog.set_config('mailbox.claim_unleased_' || v_inbox.inbox_key,
                                      CASE WHEN v_again.leased THEN '' ELSE 'on' END, TRUE);
        RETURN QUERY -- (one statement: each costs an executor start-up)
        WITH claim AS (
            INSERT INTO mailbox._inbox_open_claim (inbox_key, event_ids, lease_until, leased_by, leased_by_pid)
            VALUES (v_inbox.inbox_key, ARRAY(SELECT m.event_id FROM pg_catalog.unnest(v_rows) AS m), v_until,
                    p_worker, pg_catalog.pg_backend_pid())
        )
        SELECT m.event_id, m.event_type, m.source, m.aggregate_id, m.sequence_num, m.priority, m.payload,
               m.headers, m.trace_id, m.retry_count, m.received_at, v_until
          FROM pg_catalog.unnest(v_rows) AS m;
        RETURN;
    END IF;
    -- 2b. otherwise their leases now (part 37, _inbox_claim_leases): the upsert takes a message
    -- whose lease and retry time have passed. Ordered: one message of an aggregate in flight
    -- also while another's claim is open: a claim holds its aggregates' advisory locks (part
    -- 05) and drops a message whose aggregate another open claim holds; one that committed
    -- since step 1's snapshot is seen by the upsert, or under REPEATABLE READ by its unique
    -- index on the aggregate (a serialization failure here) (docs/design.md §7.3)
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM mailbox._inbox_check_unchanged(v_inbox); -- (as in 2a)
    END IF;
    IF v_inbox.ordering_first_sequence IS NOT NULL THEN
        v_rows := ARRAY(SELECT m FROM pg_catalog.unnest(v_rows) AS m
                         WHERE pg_catalog.pg_try_advisory_xact_lock(7168636,
                                   pg_catalog.hashtext(v_inbox.inbox_key || '/' || m.aggregate_id)));
    END IF;
    IF v_inbox.ordering_first_sequence IS NOT NULL
       AND pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        BEGIN -- (a subtransaction: only where the unique index can decide)
            v_won := mailbox._inbox_claim_leases(v_inbox, v_rows, p_worker, v_now, v_until);
        EXCEPTION WHEN unique_violation THEN
            GET STACKED DIAGNOSTICS v_index = CONSTRAINT_NAME;
            IF v_index IS DISTINCT FROM '_inbox_lease_aggregate_idx' THEN
                RAISE;
            END IF;
            RAISE EXCEPTION 'inbox %: another worker claimed a message of an aggregate this claim would take, after this transaction''s snapshot', v_inbox.inbox_name
                USING ERRCODE = '40001', HINT = 'Retry the transaction, or claim from an ordered inbox in READ COMMITTED.';
        END;
    ELSE
        v_won := mailbox._inbox_claim_leases(v_inbox, v_rows, p_worker, v_now, v_until);
    END IF;
    RETURN QUERY
    SELECT m.event_id, m.event_type, m.source, m.aggregate_id, m.sequence_num, m.priority, m.payload,
           m.headers, m.trace_id, m.retry_count, m.received_at, v_until
      FROM pg_catalog.unnest(v_rows) WITH ORDINALITY AS m
      JOIN pg_catalog.unnest(v_won) AS w (id) ON w.id = m.event_id
     ORDER BY m.ordinality;
    GET DIAGNOSTICS v_claimed = ROW_COUNT;
    IF v_claimed = 0 OR v_found.waiting THEN
        PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, v_claimed = 0);
    END IF;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_claim(text, text, int, int) IS
'lease up to p_batch_size pending messages (SKIP LOCKED; honours ordering and priority)';
