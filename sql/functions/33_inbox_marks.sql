-- Part 33 (marks): settling a message (SPEC §3.1): inbox_mark_processed and
-- inbox_mark_failed, the per-message calls a worker makes after its business logic (the
-- batch forms: part 37, batch API). They look the inbox up, check the caller's grants and
-- the table, and dispatch to the inbox's generated functions (part 35), then end the lease
-- (part 30's mailbox._inbox_lease) and, on an ordered inbox, record the aggregate's position.
-- The single mark of a managed, unordered inbox without grants is its named mark (part 35,
-- named receive), which looks nothing up: inbox_mark_processed(text, text) is inlined into its
-- caller, as inbox_receive is (part 33, messages).

-- The full path of inbox_mark_processed (below): every inbox, every argument; the only one for
-- an ordered inbox, an inbox with grants of its own or an adopted table, and the one that
-- raises every error.
CREATE FUNCTION mailbox._inbox_mark_processed_full(p_inbox text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease/ordering state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
    v_done mailbox._inbox_done;
BEGIN
    -- one statement, as in inbox_receive; also whether the message has a lease row (a claim
    -- of this transaction has none, part 37, claim settle)
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved,
           i.casts ? 'event_id' -- (a uuid or integer id: its lease has the canonical text)
             OR EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l
                         WHERE l.inbox_key = i.inbox_key AND l.event_id = p_event_id) AS leased
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
    IF p_event_id IS NULL THEN
        PERFORM mailbox._require(p_event_id, 'p_event_id');
    END IF;
    v_done := mailbox._inbox_route_processed(v_inbox, p_event_id); -- part 35, routes
    IF v_done.event_id IS NULL THEN
        RETURN FALSE;
    END IF;
    -- its lease ends with it. A lease written after the lookup (the commit of another
    -- worker's claim this mark waited for) is seen by this later statement; only an ordered
    -- inbox needs that (its lease rows carry the aggregate, which would hold the next head
    -- back, part 37); elsewhere such a lease holds nothing until it expires, as a processed
    -- message is never claimed, counted in flight, or replayed with its lease
    IF v_found.leased OR v_inbox.ordering_first_sequence IS NOT NULL THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = v_done.event_id;
    END IF;
    -- the highest processed sequence: a replayed older message does not move it back, and a
    -- new aggregate starts at first sequence - 1 even if a stray lower sequence is processed
    -- first (an existing aggregate only ever moves up to what was processed)
    IF v_inbox.ordering_first_sequence IS NOT NULL AND v_done.aggregate_id IS NOT NULL
       AND v_done.sequence_num IS NOT NULL THEN
        INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq, updated_at)
        VALUES (v_inbox.inbox_key, v_done.aggregate_id,
                pg_catalog.int8larger(v_done.sequence_num, v_inbox.ordering_first_sequence - 1),
                pg_catalog.clock_timestamp())
            ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
           SET last_seq = pg_catalog.int8larger(a.last_seq, v_done.sequence_num), updated_at = excluded.updated_at;
    END IF;
    RETURN TRUE;
END
$$;
COMMENT ON FUNCTION mailbox._inbox_mark_processed_full(text, text) IS
'pg_mailbox: inbox_mark_processed for any inbox, checking everything (when no named mark applies)';

-- A managed, unordered inbox without grants of its own: its named mark (part 35, named
-- receive), with no lookup; NULL for any other inbox and for arguments it would refuse, and
-- then the full path. One expression, SECURITY INVOKER and without SET, so that the planner
-- inlines it (and the router inside it) into the caller's statement: the named mark, itself
-- SECURITY DEFINER with a pinned search_path, is then the call's only function frame (a
-- PL/pgSQL frame around it cost about 7 us of backend CPU, docs/benchmarks.md). Every name in
-- it is schema-qualified and every argument has its exact type, so the caller's search_path,
-- under which an inlined body is parsed, can redirect nothing. The arguments are compared in
-- the database's default collation whatever collation the caller's expressions carry (a
-- nondeterministic one would match other ids). A caller needs EXECUTE on the two functions it
-- calls as well (mailbox_consumer has it; part 90).
CREATE FUNCTION mailbox.inbox_mark_processed(p_inbox text, p_event_id text)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT COALESCE(
        mailbox._inbox_route_processed_named($1 COLLATE pg_catalog."default", $2 COLLATE pg_catalog."default"),
        mailbox._inbox_mark_processed_full($1 COLLATE pg_catalog."default", $2 COLLATE pg_catalog."default"));
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_processed(text, text) IS
'mark a message processed; false when it does not exist or is already processed';

CREATE FUNCTION mailbox.inbox_mark_failed(
    p_inbox text, p_event_id text, p_error text, p_retry_after_seconds int DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
    v_delay int := p_retry_after_seconds;
BEGIN
    -- one statement, as in inbox_receive
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved
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
    IF v_delay IS NULL THEN
        v_delay := mailbox._setting_int('inbox_retry_delay_seconds');
    END IF;
    IF p_event_id IS NULL THEN
        PERFORM mailbox._require(p_event_id, 'p_event_id');
    END IF;
    IF v_delay < 0 THEN
        RAISE EXCEPTION 'invalid retry delay: % seconds', v_delay
            USING ERRCODE = '22023', HINT = 'p_retry_after_seconds is NULL (mailbox.inbox_retry_delay_seconds) or 0 or more.';
    END IF;
    RETURN mailbox._inbox_fail_one(v_inbox, p_event_id, p_error, v_delay);
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_failed(text, text, text, int) IS
'record a failed attempt: ''retry'' (after an optional delay) or ''dead_letter'' at max_retries';
