-- Part 33: the inbox data plane (SPEC §3.1): receive, claim, mark, replay.
--
-- PL/pgSQL with dynamic SQL: the table and its columns come from the catalog mapping through
-- format('%I'), every value is a bind parameter (EXECUTE ... USING). Leases and retry times
-- live in mailbox._inbox_lease (see part 30 and docs/inbox.md for why a claim is safe):
--   * a claim locks candidate rows FOR UPDATE SKIP LOCKED, then upserts their lease rows;
--     the upsert only takes a row whose lease and retry time have passed, and ON CONFLICT
--     always sees the latest committed lease, so two claimers never both win a message;
--   * claim, business logic and mark in one transaction: the row lock keeps other workers
--     off the message until commit, and a crash rolls the lease back with everything else.

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
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes any inbox table for mailbox_producer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_inbox);
    -- the order of the USING list below: role i is bound as $i
    v_roles text[] := ARRAY['event_id', 'payload', 'event_type', 'source', 'aggregate_id', 'sequence_num',
                            'headers', 'trace_id', 'priority'];
    v_given boolean[] := ARRAY[TRUE, p_payload IS NOT NULL, p_event_type IS NOT NULL, p_source IS NOT NULL,
                               p_aggregate_id IS NOT NULL, p_sequence_num IS NOT NULL, p_headers IS NOT NULL,
                               p_trace_id IS NOT NULL, p_priority IS NOT NULL];
    v_cols text[] := ARRAY[]::text[];
    v_vals text[] := ARRAY[]::text[];
    v_count int;
BEGIN
    IF p_event_id IS NULL THEN
        RAISE EXCEPTION 'event id must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the message''s unique id (the broker''s message id, say).';
    END IF;
    IF v_inbox.ordering_first_sequence IS NOT NULL AND (p_aggregate_id IS NULL OR p_sequence_num IS NULL) THEN
        RAISE EXCEPTION 'inbox % is ordered: p_aggregate_id and p_sequence_num must not be null', p_inbox
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;
    FOR i IN 1 .. pg_catalog.array_length(v_roles, 1) LOOP
        IF v_inbox.columns ? v_roles[i] THEN
            v_cols := v_cols || pg_catalog.quote_ident(v_inbox.columns ->> v_roles[i]);
            v_vals := v_vals || mailbox._inbox_param(v_inbox, v_roles[i], i);
        ELSIF v_given[i] THEN
            RAISE EXCEPTION 'inbox % has no column for %', p_inbox, v_roles[i]
                USING ERRCODE = '22023',
                      HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
        END IF;
    END LOOP;
    -- an adopted table's columns may lack defaults: a new message is unprocessed, never tried
    v_cols := v_cols || pg_catalog.quote_ident(v_inbox.columns ->> 'received_at')
                     || pg_catalog.quote_ident(v_inbox.columns ->> 'retry_count');
    v_vals := v_vals || 'pg_catalog.now()'::text || '0'::text;
    EXECUTE pg_catalog.format('INSERT INTO %I.%I AS t (%s) VALUES (%s) ON CONFLICT (%I) DO NOTHING',
                              v_inbox.schema_name, v_inbox.table_name,
                              pg_catalog.array_to_string(v_cols, ', '), pg_catalog.array_to_string(v_vals, ', '),
                              v_inbox.columns ->> 'event_id')
        USING p_event_id, p_payload, p_event_type, p_source, p_aggregate_id, p_sequence_num, p_headers,
              p_trace_id, p_priority;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        PERFORM pg_catalog.pg_notify('mailbox_inbox_new', p_inbox);
    END IF;
    RETURN v_count > 0;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_receive(text, text, jsonb, text, text, text, bigint, jsonb, text, int) IS
'store a message once per event id; true when new, false for a duplicate';
GRANT EXECUTE ON FUNCTION mailbox.inbox_receive(text, text, jsonb, text, text, text, bigint, jsonb, text, int)
TO mailbox_producer;

-- One claimed message, as inbox_claim returns it (without the lease).
CREATE TYPE mailbox._inbox_message AS (
    event_id text, event_type text, source text, aggregate_id text, sequence_num bigint, priority int,
    payload jsonb, headers jsonb, trace_id text, retry_count int, received_at timestamptz
);

CREATE FUNCTION mailbox.inbox_claim(
    p_inbox text, p_worker text, p_batch_size int DEFAULT 10, p_visibility_seconds int DEFAULT 30
)
RETURNS TABLE (
    event_id text, event_type text, source text, aggregate_id text, sequence_num bigint, priority int,
    payload jsonb, headers jsonb, trace_id text, retry_count int, received_at timestamptz,
    lease_until timestamptz
)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- leases messages of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_inbox);
    c jsonb := v_inbox.columns;
    v_now timestamptz := pg_catalog.clock_timestamp();
    v_filter text := '';
    v_heads text[];
    v_order text;
    v_rows mailbox._inbox_message[];
    v_until timestamptz := v_now + pg_catalog.make_interval(secs => p_visibility_seconds);
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
    IF v_inbox.ordering_first_sequence IS NOT NULL THEN
        -- only the head of each aggregate (next_<i>), oldest first; one in flight per
        -- aggregate, since a leased head is skipped and its successor is not a head yet.
        -- Heads are collected first so the claim below is a plain primary-key lookup.
        EXECUTE pg_catalog.format(
            'SELECT coalesce(pg_catalog.array_agg(h.id), ARRAY[]::text[]) FROM ('
            ' SELECT n.%1$I::text AS id FROM %2$I.%3$I AS n'
            '  WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l'
            '                     WHERE l.inbox_key = $1 AND l.event_id = n.%1$I::text'
            '                       AND (l.lease_until > $2 OR l.next_attempt_at > $2))'
            '  ORDER BY n.%4$I LIMIT $3) AS h',
            c ->> 'event_id', v_inbox.schema_name, 'next_' || v_inbox.inbox_name, c ->> 'received_at')
            INTO v_heads
            USING v_inbox.inbox_key, v_now, p_batch_size * 4 + 16;
        v_filter := pg_catalog.format(' AND t.%I = ANY (%s)', c ->> 'event_id',
                                      mailbox._inbox_param(v_inbox, 'event_id', 5, TRUE));
    END IF;
    IF v_inbox.priority_tiers IS NOT NULL THEN
        v_order := pg_catalog.format('%s, %s', mailbox._inbox_col(c, 'priority'), mailbox._inbox_col(c, 'received_at'));
    ELSE
        v_order := mailbox._inbox_col(c, 'received_at');
    END IF;
    -- 1. candidates, locked: dynamic, since the table and columns come from the mapping
    EXECUTE pg_catalog.format($q$
SELECT pg_catalog.array_agg(ROW(c.event_id, c.event_type, c.source, c.aggregate_id, c.sequence_num, c.priority,
                                 c.payload, c.headers, c.trace_id, c.retry_count, c.received_at
                             )::mailbox._inbox_message ORDER BY c.n) FROM (
    SELECT t.%1$I::text AS event_id, %2$s AS event_type, %3$s AS source, %4$s AS aggregate_id,
           %5$s AS sequence_num, %6$s AS priority, %7$s AS payload, %8$s AS headers, %9$s AS trace_id,
           %10$s AS retry_count, %11$s AS received_at,
           pg_catalog.row_number() OVER (ORDER BY %17$s) AS n
      FROM (SELECT t.* FROM %12$I.%13$I AS t
             WHERE t.%14$I IS NULL AND t.%15$I < $1%16$s
               AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l
                                WHERE l.inbox_key = $2 AND l.event_id = t.%1$I::text
                                  AND (l.lease_until > $3 OR l.next_attempt_at > $3))
             ORDER BY %17$s
             LIMIT $4
               FOR UPDATE OF t SKIP LOCKED) AS t
) AS c$q$,
        c ->> 'event_id', mailbox._inbox_item(c, 'event_type', 'text'), mailbox._inbox_item(c, 'source', 'text'),
        mailbox._inbox_item(c, 'aggregate_id', 'text'), mailbox._inbox_item(c, 'sequence_num', 'bigint'),
        mailbox._inbox_item(c, 'priority', 'int'), mailbox._inbox_item(c, 'payload', 'jsonb'),
        mailbox._inbox_item(c, 'headers', 'jsonb'), mailbox._inbox_item(c, 'trace_id', 'text'),
        mailbox._inbox_item(c, 'retry_count', 'int'), mailbox._inbox_item(c, 'received_at', 'timestamptz'),
        v_inbox.schema_name, v_inbox.table_name, c ->> 'processed_at', c ->> 'retry_count', v_filter,
        v_order)
        INTO v_rows
        USING v_inbox.max_retries, v_inbox.inbox_key, v_now, p_batch_size, v_heads;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    -- 2. leases: static SQL (its plan is cached), the upsert decides who wins a message
    RETURN QUERY
    WITH won AS (
        INSERT INTO mailbox._inbox_lease AS x (inbox_key, event_id, lease_until, leased_by, next_attempt_at)
        SELECT v_inbox.inbox_key, m.event_id, v_until, p_worker, NULL FROM pg_catalog.unnest(v_rows) AS m
            ON CONFLICT ON CONSTRAINT _inbox_lease_pkey DO UPDATE
           SET lease_until = excluded.lease_until, leased_by = excluded.leased_by, next_attempt_at = NULL
         WHERE (x.lease_until IS NULL OR x.lease_until <= v_now)
           AND (x.next_attempt_at IS NULL OR x.next_attempt_at <= v_now)
        RETURNING x.event_id AS won_id, x.lease_until AS won_until
    )
    SELECT m.event_id, m.event_type, m.source, m.aggregate_id, m.sequence_num, m.priority, m.payload,
           m.headers, m.trace_id, m.retry_count, m.received_at, won.won_until
      FROM pg_catalog.unnest(v_rows) WITH ORDINALITY AS m
      JOIN won ON won.won_id = m.event_id
     ORDER BY m.ordinality;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_claim(text, text, int, int) IS
'lease up to p_batch_size pending messages (SKIP LOCKED; honours ordering and priority)';
GRANT EXECUTE ON FUNCTION mailbox.inbox_claim(text, text, int, int) TO mailbox_consumer;

CREATE FUNCTION mailbox.inbox_mark_processed(p_inbox text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates any inbox table and its lease/ordering state for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_inbox);
    c jsonb := v_inbox.columns;
    v_id text;
    v_aggregate text;
    v_seq bigint;
BEGIN
    PERFORM mailbox._require(p_event_id, 'p_event_id');
    EXECUTE pg_catalog.format(
        'UPDATE %I.%I AS t SET %I = pg_catalog.clock_timestamp() WHERE t.%I = %s AND t.%I IS NULL'
        ' RETURNING t.%I::text, %s, %s',
        v_inbox.schema_name, v_inbox.table_name, c ->> 'processed_at', c ->> 'event_id',
        mailbox._inbox_param(v_inbox, 'event_id', 1), c ->> 'processed_at', c ->> 'event_id',
        mailbox._inbox_item(c, 'aggregate_id', 'text'), mailbox._inbox_item(c, 'sequence_num', 'bigint'))
        INTO v_id, v_aggregate, v_seq
        USING p_event_id;
    IF v_id IS NULL THEN
        RETURN FALSE;
    END IF;
    DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = v_id;
    IF v_inbox.ordering_first_sequence IS NOT NULL AND v_aggregate IS NOT NULL AND v_seq IS NOT NULL THEN
        -- the highest processed sequence: a replayed older message does not move it back
        INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq, updated_at)
        VALUES (v_inbox.inbox_key, v_aggregate, v_seq, pg_catalog.clock_timestamp())
            ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
           SET last_seq = pg_catalog.int8larger(a.last_seq, excluded.last_seq), updated_at = excluded.updated_at;
    END IF;
    RETURN TRUE;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_processed(text, text) IS
'mark a message processed; false when it does not exist or is already processed';
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_processed(text, text) TO mailbox_consumer;

CREATE FUNCTION mailbox.inbox_mark_failed(
    p_inbox text, p_event_id text, p_error text, p_retry_after_seconds int DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates any inbox table and its lease state for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_inbox);
    c jsonb := v_inbox.columns;
    v_delay int := coalesce(p_retry_after_seconds,
                            mailbox._setting_int('inbox_retry_delay_seconds', 0, 0, 31536000));
    v_set text := '';
    v_id text;
    v_retries int;
    v_processed boolean;
BEGIN
    PERFORM mailbox._require(p_event_id, 'p_event_id');
    IF v_delay < 0 THEN
        RAISE EXCEPTION 'invalid retry delay: % seconds', v_delay
            USING ERRCODE = '22023', HINT = 'p_retry_after_seconds is NULL (mailbox.inbox_retry_delay_seconds) or 0 or more.';
    END IF;
    IF c ? 'error' THEN
        v_set := pg_catalog.format(', %I = $2', c ->> 'error');
    END IF;
    EXECUTE pg_catalog.format(
        'UPDATE %1$I.%2$I AS t SET %3$I = t.%3$I + 1%4$s WHERE t.%5$I = %6$s AND t.%7$I IS NULL AND t.%3$I < $3'
        ' RETURNING t.%5$I::text, t.%3$I',
        v_inbox.schema_name, v_inbox.table_name, c ->> 'retry_count', v_set, c ->> 'event_id',
        mailbox._inbox_param(v_inbox, 'event_id', 1), c ->> 'processed_at')
        INTO v_id, v_retries
        USING p_event_id, p_error, v_inbox.max_retries;
    IF v_id IS NULL THEN
        EXECUTE pg_catalog.format('SELECT t.%I IS NOT NULL FROM %I.%I AS t WHERE t.%I = %s',
                                  c ->> 'processed_at', v_inbox.schema_name, v_inbox.table_name,
                                  c ->> 'event_id', mailbox._inbox_param(v_inbox, 'event_id', 1))
            INTO v_processed
            USING p_event_id;
        IF v_processed IS NULL THEN
            RAISE EXCEPTION 'inbox message not found: %', p_event_id
                USING ERRCODE = '42704', DETAIL = pg_catalog.format('Inbox %s has no message with this id.', p_inbox);
        ELSIF v_processed THEN
            RAISE EXCEPTION 'inbox message already processed: %', p_event_id
                USING ERRCODE = '55000',
                      HINT = 'Replay it with mailbox.replay_inbox_messages() to process it again.';
        END IF;
        RETURN 'dead_letter'; -- already in the DLQ: nothing changes
    END IF;
    IF v_retries >= v_inbox.max_retries THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = v_id;
        INSERT INTO mailbox._inbox_dlq_event (inbox_key, event_id, error, retry_count)
        VALUES (v_inbox.inbox_key, v_id, p_error, v_retries);
        RETURN 'dead_letter';
    END IF;
    IF v_delay > 0 THEN
        INSERT INTO mailbox._inbox_lease AS l (inbox_key, event_id, lease_until, leased_by, next_attempt_at)
        VALUES (v_inbox.inbox_key, v_id, NULL, NULL,
                pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => v_delay))
            ON CONFLICT (inbox_key, event_id) DO UPDATE
           SET lease_until = NULL, leased_by = NULL, next_attempt_at = excluded.next_attempt_at;
    ELSE
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = v_id;
    END IF;
    RETURN 'retry';
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_failed(text, text, text, int) IS
'record a failed attempt: ''retry'' (after an optional delay) or ''dead_letter'' at max_retries';
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_failed(text, text, text, int) TO mailbox_consumer;

CREATE FUNCTION mailbox.replay_inbox_messages(p_name text, p_event_ids text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- resets messages of any inbox for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_name);
    c jsonb := v_inbox.columns;
    v_set text := '';
    v_ids text[];
BEGIN
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    IF c ? 'error' THEN
        v_set := pg_catalog.format(', %I = NULL', c ->> 'error');
    END IF;
    EXECUTE pg_catalog.format(
        'WITH r AS (UPDATE %1$I.%2$I AS t SET %3$I = NULL, %4$I = 0%5$s'
        ' WHERE t.%6$I = ANY (%7$s) AND (t.%3$I IS NOT NULL OR t.%4$I >= $2) RETURNING t.%6$I::text AS id)'
        ' SELECT coalesce(pg_catalog.array_agg(r.id ORDER BY r.id), ARRAY[]::text[]) FROM r',
        v_inbox.schema_name, v_inbox.table_name, c ->> 'processed_at', c ->> 'retry_count', v_set,
        c ->> 'event_id', mailbox._inbox_param(v_inbox, 'event_id', 1, TRUE))
        INTO v_ids
        USING p_event_ids, v_inbox.max_retries;
    IF pg_catalog.cardinality(v_ids) > 0 THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = ANY (v_ids);
        PERFORM mailbox._alert('inbox_replay', pg_catalog.jsonb_build_object(
            'inbox', p_name, 'count', pg_catalog.cardinality(v_ids),
            'event_ids', pg_catalog.to_jsonb(v_ids[1:100])));
    END IF;
    RETURN pg_catalog.cardinality(v_ids);
END
$$;
COMMENT ON FUNCTION mailbox.replay_inbox_messages(text, text[]) IS
'reset processed or dead-lettered messages (by id) so they are processed again; alerts inbox_replay';
GRANT EXECUTE ON FUNCTION mailbox.replay_inbox_messages(text, text[]) TO mailbox_admin;
