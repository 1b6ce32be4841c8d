-- Part 37: the batch forms of receive and mark (issue 11), the public functions; their
-- generated halves are made by part 36, which explains the split of work.

-- The common start of every batch form: the inbox's catalog row after the checks the
-- per-message forms inline (grant, table-name check); p_privilege is 'receive' or 'process'.
CREATE FUNCTION mailbox._inbox_batch_start(p_inbox text, p_privilege text)
RETURNS mailbox._inbox
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
BEGIN
    SELECT i.* INTO v_inbox FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        v_inbox := mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    IF v_inbox.has_grants THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, p_privilege);
    END IF;
    IF pg_catalog.pg_relation_is_updatable(v_inbox.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
       OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', v_inbox.schema_name, v_inbox.table_name))
          IS DISTINCT FROM v_inbox.table_rel THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    RETURN v_inbox;
END
$$;

CREATE FUNCTION mailbox.inbox_receive_batch(p_inbox text, p_messages jsonb)
RETURNS TABLE (event_id text, inserted boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- calls any inbox's generated functions (which run as the table owner) for mailbox_producer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_batch_start(p_inbox, 'receive');
    v_bad record;
    v_ids text[];
    v_first_bad bigint;
    v_new boolean[];
    v_keys text[] := ARRAY(SELECT 'p_' || r FROM pg_catalog.unnest(mailbox._inbox_receive_roles()) AS r);
BEGIN
    PERFORM mailbox._require(p_messages, 'p_messages');
    IF pg_catalog.jsonb_typeof(p_messages) <> 'array' THEN
        RAISE EXCEPTION 'p_messages must be a json array, not %', pg_catalog.jsonb_typeof(p_messages)
            USING ERRCODE = '22023',
                  HINT = 'Pass [{"p_event_id": ..., "p_payload": ...}, ...]: one object per message, '
                         'keyed by the inbox_receive parameter names.';
    END IF;
    -- every element an object whose keys are inbox_receive parameters, every id present and
    -- at most 1000 bytes (the errors of inbox_receive, naming the first bad element); the
    -- same pass collects the ids, which the result reports as given
    SELECT pg_catalog.array_agg(e.m ->> 'p_event_id' ORDER BY e.n),
           pg_catalog.min(e.n) FILTER (WHERE CASE WHEN pg_catalog.jsonb_typeof(e.m) <> 'object' THEN TRUE
                                                  ELSE e.m - v_keys <> '{}' OR e.m ->> 'p_event_id' IS NULL
                                                       OR pg_catalog.octet_length(e.m ->> 'p_event_id') > 1000 END)
      INTO v_ids, v_first_bad
      FROM pg_catalog.jsonb_array_elements(p_messages) WITH ORDINALITY AS e (m, n);
    IF v_first_bad IS NOT NULL THEN
        SELECT v_first_bad AS n, p_messages -> (v_first_bad - 1)::int AS m INTO v_bad;
        IF pg_catalog.jsonb_typeof(v_bad.m) <> 'object' THEN
            RAISE EXCEPTION 'message % of the batch is not a json object', v_bad.n
                USING ERRCODE = '22023',
                      HINT = 'Each message is an object keyed by the inbox_receive parameter names (p_event_id, ...).';
        ELSIF v_bad.m - v_keys <> '{}' THEN
            RAISE EXCEPTION 'unknown key in message % of the batch: %', v_bad.n,
                (SELECT k.key FROM pg_catalog.jsonb_object_keys(v_bad.m - v_keys) AS k (key) ORDER BY 1 LIMIT 1)
                USING ERRCODE = '22023',
                      HINT = 'Keys are the inbox_receive parameter names: p_event_id, p_payload, p_event_type, '
                             'p_source, p_aggregate_id, p_sequence_num, p_headers, p_trace_id, p_priority.';
        ELSIF v_bad.m ->> 'p_event_id' IS NULL THEN
            RAISE EXCEPTION 'event id must not be null'
                USING ERRCODE = '22004', DETAIL = pg_catalog.format('Message %s of the batch has no p_event_id.', v_bad.n),
                      HINT = 'Pass the message''s unique id (the broker''s message id, say).';
        END IF;
        RAISE EXCEPTION 'p_event_id too long: % bytes', pg_catalog.octet_length(v_bad.m ->> 'p_event_id')
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('Message %s of the batch.', v_bad.n),
                  HINT = 'p_event_id is at most 1000 bytes; pass the broker''s message id, not the message.';
    END IF;
    IF pg_catalog.jsonb_array_length(p_messages) = 0 THEN
        RETURN;
    END IF;
    -- the generated function parses the batch, checks ordering, unmapped roles and the
    -- priority's range, and inserts with the table owner's rights
    v_new := mailbox._inbox_route_receive_batch(v_inbox, p_messages); -- part 35, routes
    IF TRUE = ANY (v_new) AND mailbox._inbox_has_waiter(v_inbox.inbox_key) THEN -- part 33, wake-ups
        PERFORM pg_catalog.pg_notify('mailbox_inbox_new', v_inbox.inbox_name);
    END IF;
    RETURN QUERY
    SELECT e.id, e.new
      FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_new)) WITH ORDINALITY AS e (id, new, n)
     ORDER BY e.n;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_receive_batch(text, jsonb) IS
'store many messages (a json array of inbox_receive arguments) in one call; per message, true when new';

CREATE FUNCTION mailbox.inbox_mark_processed(p_inbox text, p_event_ids text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease/ordering state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_batch_start(p_inbox, 'process');
    v_done mailbox._inbox_done[];
    v_exact boolean;
    v_count bigint;
BEGIN
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    IF pg_catalog.array_position(p_event_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'p_event_ids must not contain null'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('Element %s is null.', pg_catalog.array_position(p_event_ids, NULL)),
                  HINT = 'Pass the ids of the messages to mark.';
    END IF;
    IF pg_catalog.cardinality(p_event_ids) = 0 THEN
        RETURN 0;
    END IF;
    -- A worker marking exactly the batch it claimed in this transaction, from an unordered
    -- inbox (the documented pattern): its messages have no lease rows to end (part 37, claim
    -- settle) and there is no ordering state to keep, so the generated mark returns only how
    -- many it marked; then, as in the general path below, the claim is settled by deleting
    -- it if the mark marked something, and left to its commit if it marked nothing (a table
    -- owner's trigger can refuse every row). (An exact match is an index probe; the
    -- containment test below initialises a hashed subplan even when it is not needed. A
    -- transaction has at most one open claim per inbox: a claim settles the earlier ones.)
    IF v_inbox.ordering_first_sequence IS NULL THEN
        SELECT mailbox._inbox_route_processed_count(v_inbox, p_event_ids) INTO v_count -- part 35, routes
         WHERE EXISTS (SELECT 1 FROM mailbox._inbox_open_claim AS o
                        WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()
                          AND o.event_ids OPERATOR(pg_catalog.=) p_event_ids);
        IF FOUND THEN
            IF v_count > 0 THEN
                DELETE FROM mailbox._inbox_open_claim AS o
                 WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()
                   AND o.event_ids OPERATOR(pg_catalog.=) p_event_ids;
            END IF;
            RETURN v_count;
        END IF;
    END IF;
    v_done := mailbox._inbox_route_processed_batch(v_inbox, p_event_ids); -- part 35, routes
    IF v_done IS NULL THEN
        RETURN 0;
    END IF;
    -- A claim of this transaction whose ids are all in p_event_ids has nothing left to lease
    -- (part 37, claim settle: every id is now processed), so it is settled here and its
    -- commit looks nothing up. When one such claim is exactly p_event_ids (a worker marking
    -- the batch it claimed), the messages have no lease rows to delete; otherwise their
    -- leases are deleted. (Containment by hashing: the array operators compare every
    -- element with every other.)
    WITH settled AS (
        DELETE FROM mailbox._inbox_open_claim AS o
         WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()
           AND (o.event_ids OPERATOR(pg_catalog.=) p_event_ids
                OR NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(o.event_ids) AS e (id)
                                WHERE e.id NOT IN (SELECT pg_catalog.unnest(p_event_ids))))
        RETURNING o.event_ids OPERATOR(pg_catalog.=) p_event_ids AS exact
    )
    SELECT coalesce(pg_catalog.bool_or(s.exact), FALSE) INTO v_exact FROM settled AS s;
    IF NOT v_exact THEN
        DELETE FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key = v_inbox.inbox_key
           AND l.event_id = ANY (ARRAY(SELECT d.event_id FROM pg_catalog.unnest(v_done) AS d));
    END IF;
    -- the ordering state exactly as inbox_mark_processed keeps it (a new aggregate starts at
    -- no less than first sequence - 1, an existing one only moves up to what was processed),
    -- one upsert per aggregate, in aggregate order so concurrent batches lock alike
    IF v_inbox.ordering_first_sequence IS NOT NULL THEN
        INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq, updated_at)
        SELECT v_inbox.inbox_key, d.aggregate_id,
               pg_catalog.int8larger(pg_catalog.max(d.sequence_num), v_inbox.ordering_first_sequence - 1),
               pg_catalog.clock_timestamp()
          FROM pg_catalog.unnest(v_done) AS d
         WHERE d.aggregate_id IS NOT NULL AND d.sequence_num IS NOT NULL
         GROUP BY d.aggregate_id
         ORDER BY d.aggregate_id
            ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
           SET last_seq = pg_catalog.int8larger(a.last_seq, (SELECT pg_catalog.max(d.sequence_num)
                                                               FROM pg_catalog.unnest(v_done) AS d
                                                              WHERE d.aggregate_id = a.aggregate_id)),
               updated_at = excluded.updated_at;
    END IF;
    RETURN pg_catalog.cardinality(v_done);
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_processed(text, text[]) IS
'mark many messages processed in one call; how many were marked (missing or processed ids are skipped)';

-- One failed attempt of one message (inbox_mark_failed, both forms), after the argument
-- checks: counts it (the generated function, as the table owner) and settles its lease: the
-- fencing rules of docs/inbox.md, "A late failure report".
CREATE FUNCTION mailbox._inbox_fail_one(p_inbox mailbox._inbox, p_event_id text, p_error text, p_delay int)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_attempt mailbox._inbox_attempt;
    v_id text;
    v_retries int;
    v_state text;
BEGIN
    v_attempt := mailbox._inbox_route_failed(p_inbox, p_event_id, p_error); -- part 35, routes
    v_id := v_attempt.event_id;
    v_retries := v_attempt.retry_count;
    v_state := v_attempt.state;
    IF v_id IS NULL THEN
        IF v_state = 'missing' THEN
            RAISE EXCEPTION 'inbox message not found: %', p_event_id
                USING ERRCODE = '42704', DETAIL = pg_catalog.format('Inbox %s has no message with this id.',
                                                                    p_inbox.inbox_name);
        ELSIF v_state = 'processed' THEN
            RAISE EXCEPTION 'inbox message already processed: %', p_event_id
                USING ERRCODE = '55000',
                      HINT = 'Replay it with mailbox.replay_inbox_messages() to process it again.';
        END IF;
        RETURN 'dead_letter'; -- already in the DLQ: nothing changes
    END IF;
    -- a claim of this transaction does not lease it at commit (part 37, claim settle)
    PERFORM mailbox._inbox_unclaim(p_inbox.inbox_key, ARRAY[v_id]);
    IF v_retries >= p_inbox.max_retries THEN
        -- a dead letter is not claimable; another backend's live lease still says it is in
        -- flight (see below) and expires by itself
        DELETE FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = v_id
           AND (l.lease_until IS NULL OR l.lease_until <= pg_catalog.clock_timestamp()
                OR l.leased_by_pid IS NOT DISTINCT FROM pg_catalog.pg_backend_pid());
        INSERT INTO mailbox._inbox_dlq_event (inbox_key, event_id, error, retry_count)
        VALUES (p_inbox.inbox_key, v_id, p_error, v_retries);
        RETURN 'dead_letter';
    END IF;
    -- a live lease taken by another backend is not the caller's to end: this is a late
    -- report of a worker whose lease expired (the message was reclaimed). The failure counts,
    -- the holder keeps its lease, and the retry comes due no earlier than that lease ends.
    UPDATE mailbox._inbox_lease AS l
       SET next_attempt_at = GREATEST(l.lease_until,
                                      pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_delay))
     WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = v_id AND l.lease_until > pg_catalog.clock_timestamp()
       AND l.leased_by_pid IS DISTINCT FROM pg_catalog.pg_backend_pid();
    IF FOUND THEN
        RETURN 'retry';
    END IF;
    IF p_delay > 0 THEN
        -- a lease row of this transaction (part 37, claim settle, "Marks without a lease")
        PERFORM pg_catalog.set_config('mailbox.claim_unleased_' || p_inbox.inbox_key, '', TRUE);
        INSERT INTO mailbox._inbox_lease AS l (inbox_key, event_id, lease_until, leased_by, next_attempt_at)
        VALUES (p_inbox.inbox_key, v_id, NULL, NULL,
                pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_delay))
            ON CONFLICT (inbox_key, event_id) DO UPDATE
           SET lease_until = NULL, leased_by = NULL, next_attempt_at = excluded.next_attempt_at,
               leased_by_pid = NULL;
    ELSE
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = v_id;
    END IF;
    RETURN 'retry';
END
$$;

CREATE FUNCTION mailbox.inbox_mark_failed(
    p_inbox text, p_event_ids text[], p_error text, p_retry_after_seconds int DEFAULT NULL
)
RETURNS TABLE (event_id text, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_batch_start(p_inbox, 'process');
    v_delay int := p_retry_after_seconds;
BEGIN
    IF v_delay IS NULL THEN
        v_delay := mailbox._setting_int('inbox_retry_delay_seconds');
    END IF;
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    IF pg_catalog.array_position(p_event_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'p_event_ids must not contain null'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('Element %s is null.', pg_catalog.array_position(p_event_ids, NULL)),
                  HINT = 'Pass the ids of the messages whose attempt failed.';
    END IF;
    IF v_delay < 0 THEN
        RAISE EXCEPTION 'invalid retry delay: % seconds', v_delay
            USING ERRCODE = '22023', HINT = 'p_retry_after_seconds is NULL (mailbox.inbox_retry_delay_seconds) or 0 or more.';
    END IF;
    -- each id in turn, exactly as inbox_mark_failed(text, text, ...) would: an id listed
    -- twice is two failed attempts
    FOR i IN 1 .. coalesce(pg_catalog.array_length(p_event_ids, 1), 0) LOOP
        event_id := p_event_ids[i];
        outcome := mailbox._inbox_fail_one(v_inbox, p_event_ids[i], p_error, v_delay);
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_failed(text, text[], text, int) IS
'record a failed attempt of many messages: per id ''retry'' or ''dead_letter'' (as the one-id form)';
