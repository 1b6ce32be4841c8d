CREATE OR REPLACE FUNCTION mailbox._inbox_1_claim(mailbox._inbox, integer, timestamp with time zone, boolean)
 RETURNS mailbox._inbox_message[]
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'claim of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) FALSE
       OR (($1).priority_tiers IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"error": "error", "source": "source", "headers": "headers", "payload": "payload", "event_id": "event_id", "priority": "priority", "trace_id": "trace_id", "event_type": "event_type", "received_at": "received_at", "retry_count": "retry_count", "aggregate_id": "aggregate_id", "processed_at": "processed_at", "sequence_num": "sequence_num"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    IF $4 IS FALSE THEN -- no lease row in the inbox a moment ago: no exclusion, no lease subplan
        RETURN ARRAY(
            SELECT ROW(t.event_id::pg_catalog.text, CAST(t.event_type AS text), CAST(t.source AS text), CAST(t.aggregate_id AS text),
                   CAST(t.sequence_num AS bigint), CAST(t.priority AS int), CAST(t.payload AS jsonb), CAST(t.headers AS jsonb), CAST(t.trace_id AS text),
                   CAST(t.retry_count AS int), CAST(t.received_at AS timestamptz))::mailbox._inbox_message
              FROM (SELECT t.* FROM mailbox.gen AS t
                     WHERE CASE WHEN t.processed_at IS NULL THEN TRUE END AND t.retry_count < ($1).max_retries AND t.event_id = ANY (coalesce(CASE WHEN (
WITH RECURSIVE aggs AS (
    (SELECT t.aggregate_id AS agg FROM mailbox.gen AS t
      WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL
      ORDER BY t.aggregate_id LIMIT 1)
    UNION ALL
    SELECT n.agg FROM aggs AS a CROSS JOIN LATERAL (
        SELECT t.aggregate_id AS agg FROM mailbox.gen AS t
         WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL AND t.aggregate_id > a.agg
         ORDER BY t.aggregate_id LIMIT 1) AS n
) SELECT pg_catalog.count(*) FROM (SELECT 1 FROM aggs LIMIT $2 * 4 + 17) AS b) > $2 * 4 + 16 THEN (SELECT CASE WHEN pg_catalog.cardinality(h.heads) >= $2 * 4 + 16 OR (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM mailbox.gen AS t WHERE t.processed_at IS NULL AND t.retry_count < ($1).max_retries LIMIT ($2 * 4 + 16) * 2) AS c) < ($2 * 4 + 16) * 2 THEN h.heads END FROM (SELECT ARRAY(SELECT r.event_id FROM (SELECT t.event_id, t.aggregate_id, t.sequence_num, t.received_at FROM mailbox.gen AS t WHERE t.processed_at IS NULL AND t.retry_count < ($1).max_retries ORDER BY t.received_at LIMIT ($2 * 4 + 16) * 2) AS r WHERE r.aggregate_id IS NOT NULL AND r.sequence_num IS NOT NULL AND r.sequence_num <= coalesce((SELECT a.last_seq FROM mailbox._inbox_1_aggregate AS a WHERE a.aggregate_id = r.aggregate_id::text), ($1).ordering_first_sequence - 1) + 1 AND NOT EXISTS (SELECT 1 FROM mailbox.gen AS s WHERE s.aggregate_id = r.aggregate_id AND s.processed_at IS NULL AND s.sequence_num <= r.sequence_num AND (s.sequence_num < r.sequence_num OR s.event_id < r.event_id) ORDER BY s.aggregate_id, s.sequence_num OFFSET 0) AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = r.event_id::text AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0) AND NOT EXISTS (SELECT 1 FROM mailbox.gen AS s WHERE s.aggregate_id = r.aggregate_id AND s.processed_at IS NULL AND s.sequence_num <= coalesce((SELECT a.last_seq FROM mailbox._inbox_1_aggregate AS a WHERE a.aggregate_id = r.aggregate_id::text), ($1).ordering_first_sequence - 1) + 1 AND EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = s.event_id::text AND l.lease_until > $3 OFFSET 0) ORDER BY s.aggregate_id, s.sequence_num OFFSET 0) AND (($1).held_until IS NULL OR ($1).held_until <= $3 OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.aggregate_id = r.aggregate_id::text AND l.lease_until > $3 OFFSET 0)) LIMIT $2 * 4 + 16) AS heads OFFSET 0) AS h) END, ARRAY(SELECT n.event_id FROM (
WITH RECURSIVE heads AS (
    (SELECT t.aggregate_id AS agg, t.sequence_num AS seq FROM mailbox.gen AS t
      WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL
      ORDER BY t.aggregate_id, t.sequence_num LIMIT 1)
    UNION ALL
    SELECT n.agg, n.seq FROM heads AS h CROSS JOIN LATERAL (
        SELECT t.aggregate_id AS agg, t.sequence_num AS seq FROM mailbox.gen AS t
         WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL AND t.aggregate_id > h.agg
         ORDER BY t.aggregate_id, t.sequence_num LIMIT 1) AS n
)
SELECT m.* FROM heads AS h
 CROSS JOIN mailbox._inbox_1_config AS cfg
 CROSS JOIN LATERAL (SELECT t.* FROM mailbox.gen AS t
                      WHERE t.aggregate_id = h.agg AND t.sequence_num = h.seq AND t.processed_at IS NULL
                      ORDER BY t.event_id LIMIT 1) AS m
 WHERE h.seq <= coalesce((SELECT s.last_seq FROM mailbox._inbox_1_aggregate AS s WHERE s.aggregate_id = h.agg::text),
                         cfg.ordering_first_sequence - 1) + 1
   AND m.retry_count < cfg.max_retries) AS n WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = n.event_id::text AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0) AND NOT EXISTS (SELECT 1 FROM mailbox.gen AS s WHERE s.aggregate_id = n.aggregate_id AND s.processed_at IS NULL AND s.sequence_num <= coalesce((SELECT a.last_seq FROM mailbox._inbox_1_aggregate AS a WHERE a.aggregate_id = n.aggregate_id::text), ($1).ordering_first_sequence - 1) + 1 AND EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = s.event_id::text AND l.lease_until > $3 OFFSET 0) ORDER BY s.aggregate_id, s.sequence_num OFFSET 0) AND (($1).held_until IS NULL OR ($1).held_until <= $3 OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.aggregate_id = n.aggregate_id::text AND l.lease_until > $3 OFFSET 0)) ORDER BY n.received_at LIMIT $2 * 4 + 16)))
                     ORDER BY t.received_at
                     LIMIT $2
                       FOR UPDATE OF t SKIP LOCKED) AS t);
    END IF;
    RETURN ARRAY(
        SELECT ROW(t.event_id::pg_catalog.text, CAST(t.event_type AS text), CAST(t.source AS text), CAST(t.aggregate_id AS text),
                   CAST(t.sequence_num AS bigint), CAST(t.priority AS int), CAST(t.payload AS jsonb), CAST(t.headers AS jsonb), CAST(t.trace_id AS text),
                   CAST(t.retry_count AS int), CAST(t.received_at AS timestamptz))::mailbox._inbox_message
          FROM (SELECT t.* FROM mailbox.gen AS t
                 WHERE CASE WHEN t.processed_at IS NULL THEN TRUE END AND t.retry_count < ($1).max_retries AND t.event_id = ANY (coalesce(CASE WHEN (
WITH RECURSIVE aggs AS (
    (SELECT t.aggregate_id AS agg FROM mailbox.gen AS t
      WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL
      ORDER BY t.aggregate_id LIMIT 1)
    UNION ALL
    SELECT n.agg FROM aggs AS a CROSS JOIN LATERAL (
        SELECT t.aggregate_id AS agg FROM mailbox.gen AS t
         WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL AND t.aggregate_id > a.agg
         ORDER BY t.aggregate_id LIMIT 1) AS n
) SELECT pg_catalog.count(*) FROM (SELECT 1 FROM aggs LIMIT $2 * 4 + 17) AS b) > $2 * 4 + 16 THEN (SELECT CASE WHEN pg_catalog.cardinality(h.heads) >= $2 * 4 + 16 OR (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM mailbox.gen AS t WHERE t.processed_at IS NULL AND t.retry_count < ($1).max_retries LIMIT ($2 * 4 + 16) * 2) AS c) < ($2 * 4 + 16) * 2 THEN h.heads END FROM (SELECT ARRAY(SELECT r.event_id FROM (SELECT t.event_id, t.aggregate_id, t.sequence_num, t.received_at FROM mailbox.gen AS t WHERE t.processed_at IS NULL AND t.retry_count < ($1).max_retries ORDER BY t.received_at LIMIT ($2 * 4 + 16) * 2) AS r WHERE r.aggregate_id IS NOT NULL AND r.sequence_num IS NOT NULL AND r.sequence_num <= coalesce((SELECT a.last_seq FROM mailbox._inbox_1_aggregate AS a WHERE a.aggregate_id = r.aggregate_id::text), ($1).ordering_first_sequence - 1) + 1 AND NOT EXISTS (SELECT 1 FROM mailbox.gen AS s WHERE s.aggregate_id = r.aggregate_id AND s.processed_at IS NULL AND s.sequence_num <= r.sequence_num AND (s.sequence_num < r.sequence_num OR s.event_id < r.event_id) ORDER BY s.aggregate_id, s.sequence_num OFFSET 0) AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = r.event_id::text AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0) AND NOT EXISTS (SELECT 1 FROM mailbox.gen AS s WHERE s.aggregate_id = r.aggregate_id AND s.processed_at IS NULL AND s.sequence_num <= coalesce((SELECT a.last_seq FROM mailbox._inbox_1_aggregate AS a WHERE a.aggregate_id = r.aggregate_id::text), ($1).ordering_first_sequence - 1) + 1 AND EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = s.event_id::text AND l.lease_until > $3 OFFSET 0) ORDER BY s.aggregate_id, s.sequence_num OFFSET 0) AND (($1).held_until IS NULL OR ($1).held_until <= $3 OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.aggregate_id = r.aggregate_id::text AND l.lease_until > $3 OFFSET 0)) LIMIT $2 * 4 + 16) AS heads OFFSET 0) AS h) END, ARRAY(SELECT n.event_id FROM (
WITH RECURSIVE heads AS (
    (SELECT t.aggregate_id AS agg, t.sequence_num AS seq FROM mailbox.gen AS t
      WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL
      ORDER BY t.aggregate_id, t.sequence_num LIMIT 1)
    UNION ALL
    SELECT n.agg, n.seq FROM heads AS h CROSS JOIN LATERAL (
        SELECT t.aggregate_id AS agg, t.sequence_num AS seq FROM mailbox.gen AS t
         WHERE t.processed_at IS NULL AND t.aggregate_id IS NOT NULL AND t.sequence_num IS NOT NULL AND t.aggregate_id > h.agg
         ORDER BY t.aggregate_id, t.sequence_num LIMIT 1) AS n
)
SELECT m.* FROM heads AS h
 CROSS JOIN mailbox._inbox_1_config AS cfg
 CROSS JOIN LATERAL (SELECT t.* FROM mailbox.gen AS t
                      WHERE t.aggregate_id = h.agg AND t.sequence_num = h.seq AND t.processed_at IS NULL
                      ORDER BY t.event_id LIMIT 1) AS m
 WHERE h.seq <= coalesce((SELECT s.last_seq FROM mailbox._inbox_1_aggregate AS s WHERE s.aggregate_id = h.agg::text),
                         cfg.ordering_first_sequence - 1) + 1
   AND m.retry_count < cfg.max_retries) AS n WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = n.event_id::text AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0) AND NOT EXISTS (SELECT 1 FROM mailbox.gen AS s WHERE s.aggregate_id = n.aggregate_id AND s.processed_at IS NULL AND s.sequence_num <= coalesce((SELECT a.last_seq FROM mailbox._inbox_1_aggregate AS a WHERE a.aggregate_id = n.aggregate_id::text), ($1).ordering_first_sequence - 1) + 1 AND EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.event_id = s.event_id::text AND l.lease_until > $3 OFFSET 0) ORDER BY s.aggregate_id, s.sequence_num OFFSET 0) AND (($1).held_until IS NULL OR ($1).held_until <= $3 OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l WHERE l.aggregate_id = n.aggregate_id::text AND l.lease_until > $3 OFFSET 0)) ORDER BY n.received_at LIMIT $2 * 4 + 16)))
                   AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l
                                    WHERE l.event_id = t.event_id::pg_catalog.text
                                      AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0)
                 ORDER BY t.received_at
                 LIMIT $2
                   FOR UPDATE OF t SKIP LOCKED) AS t);
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_failed(mailbox._inbox, text, text)
 RETURNS mailbox._inbox_attempt
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_id pg_catalog.text;
    v_retries pg_catalog.int4;
    v_processed pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'failed of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    UPDATE mailbox.gen AS t SET retry_count = t.retry_count + 1, error = $3
     WHERE t.event_id = $2 AND CASE WHEN t.processed_at IS NULL THEN TRUE END AND t.retry_count < ($1).max_retries
    RETURNING t.event_id::pg_catalog.text, t.retry_count INTO v_id, v_retries;
    IF v_id IS NOT NULL THEN
        RETURN ROW(v_id, v_retries, 'counted')::mailbox._inbox_attempt;
    END IF;
    SELECT t.processed_at IS NOT NULL INTO v_processed FROM mailbox.gen AS t WHERE t.event_id = $2;
    RETURN ROW(NULL, NULL, CASE WHEN v_processed IS NULL THEN 'missing' WHEN v_processed THEN 'processed'
                                ELSE 'dead' END)::mailbox._inbox_attempt;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_processed(mailbox._inbox, text)
 RETURNS mailbox._inbox_done
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_id pg_catalog.text;
    v_aggregate pg_catalog.text;
    v_seq pg_catalog.int8;
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'processed of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) FALSE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"error": "error", "source": "source", "headers": "headers", "payload": "payload", "event_id": "event_id", "priority": "priority", "trace_id": "trace_id", "event_type": "event_type", "received_at": "received_at", "retry_count": "retry_count", "aggregate_id": "aggregate_id", "processed_at": "processed_at", "sequence_num": "sequence_num"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    UPDATE mailbox.gen AS t SET processed_at = pg_catalog.clock_timestamp() WHERE t.event_id = $2 AND CASE WHEN t.processed_at IS NULL THEN TRUE END
    RETURNING t.event_id::pg_catalog.text, CAST(t.aggregate_id AS pg_catalog.text), CAST(t.sequence_num AS pg_catalog.int8), FALSE INTO v_id, v_aggregate, v_seq, v_ordered;
    RETURN ROW(v_id, v_aggregate, v_seq)::mailbox._inbox_done;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_processed_batch(mailbox._inbox, text[])
 RETURNS mailbox._inbox_done[]
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_result mailbox._inbox_done[];
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'processed_batch of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) FALSE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"error": "error", "source": "source", "headers": "headers", "payload": "payload", "event_id": "event_id", "priority": "priority", "trace_id": "trace_id", "event_type": "event_type", "received_at": "received_at", "retry_count": "retry_count", "aggregate_id": "aggregate_id", "processed_at": "processed_at", "sequence_num": "sequence_num"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
        WITH d AS (
            UPDATE mailbox.gen AS t SET processed_at = pg_catalog.clock_timestamp()
             WHERE t.event_id = ANY ($2) AND CASE WHEN t.processed_at IS NULL THEN TRUE END
            RETURNING ROW(t.event_id::pg_catalog.text, CAST(t.aggregate_id AS pg_catalog.text), CAST(t.sequence_num AS pg_catalog.int8))::mailbox._inbox_done AS r
        )
        SELECT pg_catalog.array_agg(d.r), pg_catalog.bool_or(FALSE) INTO v_result, v_ordered FROM d;
    RETURN v_result;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_processed_count(mailbox._inbox, text[])
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_result pg_catalog.int8;
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'processed_count of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) FALSE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"error": "error", "source": "source", "headers": "headers", "payload": "payload", "event_id": "event_id", "priority": "priority", "trace_id": "trace_id", "event_type": "event_type", "received_at": "received_at", "retry_count": "retry_count", "aggregate_id": "aggregate_id", "processed_at": "processed_at", "sequence_num": "sequence_num"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    UPDATE mailbox.gen AS t SET processed_at = pg_catalog.clock_timestamp()
     WHERE t.event_id = ANY ($2) AND CASE WHEN t.processed_at IS NULL THEN TRUE END;
    GET DIAGNOSTICS v_result = ROW_COUNT;
    IF v_result > 0 THEN
        v_ordered := FALSE;
    END IF;
    RETURN v_result;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_processed_named(mailbox._inbox, text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
    v_done pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'processed_named of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    RETURN NULL; -- ordered: inbox_mark_processed's full path records the aggregate's position
    -- version '<version>'
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_query(mailbox._inbox, text, bigint[], text[])
 RETURNS jsonb
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_result pg_catalog.jsonb;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'query of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    EXECUTE $2 INTO v_result USING $1, $3, $4;
    RETURN v_result;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_receive(mailbox._inbox, text, jsonb, text, text, text, bigint, jsonb, text, integer)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'receive of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) FALSE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"error": "error", "source": "source", "headers": "headers", "payload": "payload", "event_id": "event_id", "priority": "priority", "trace_id": "trace_id", "event_type": "event_type", "received_at": "received_at", "retry_count": "retry_count", "aggregate_id": "aggregate_id", "processed_at": "processed_at", "sequence_num": "sequence_num"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    IF $6 IS NULL OR $7 IS NULL THEN
        RAISE EXCEPTION 'inbox % is ordered: p_aggregate_id and p_sequence_num must not be null', ($1).inbox_name
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;
    IF $10 NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'p_priority out of range for inbox %: %', ($1).inbox_name, $10
            USING ERRCODE = '22023',
                  HINT = 'p_priority is -32768 to 32767 (the inbox''s priority column is a smallint); lower values are claimed first.';
    END IF;
    INSERT INTO mailbox.gen AS t (event_id, payload, event_type, source, aggregate_id, sequence_num, headers, trace_id, priority, received_at, retry_count) VALUES ($2, $3, $4, $5, $6, $7, $8, $9, $10, pg_catalog.now(), 0) ON CONFLICT (event_id) DO NOTHING;
    RETURN FOUND;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_receive_batch(mailbox._inbox, jsonb)
 RETURNS boolean[]
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_bad pg_catalog.bool[];
    v_result pg_catalog.bool[];
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'receive_batch of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) FALSE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"error": "error", "source": "source", "headers": "headers", "payload": "payload", "event_id": "event_id", "priority": "priority", "trace_id": "trace_id", "event_type": "event_type", "received_at": "received_at", "retry_count": "retry_count", "aggregate_id": "aggregate_id", "processed_at": "processed_at", "sequence_num": "sequence_num"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
        WITH m AS (
            SELECT m.*, pg_catalog.row_number() OVER (PARTITION BY m.p_event_id ORDER BY m.n) AS k
              FROM ROWS FROM (pg_catalog.jsonb_to_recordset($2) AS (p_event_id pg_catalog.text, p_payload pg_catalog.jsonb, p_event_type pg_catalog.text, p_source pg_catalog.text, p_aggregate_id pg_catalog.text, p_sequence_num pg_catalog.int8, p_headers pg_catalog.jsonb, p_trace_id pg_catalog.text, p_priority pg_catalog.int4)) WITH ORDINALITY AS m (p_event_id, p_payload, p_event_type, p_source, p_aggregate_id, p_sequence_num, p_headers, p_trace_id, p_priority, n)
        ), ins AS (
            INSERT INTO mailbox.gen AS t (event_id, payload, event_type, source, aggregate_id, sequence_num, headers, trace_id, priority, received_at, retry_count)
            SELECT m.p_event_id, m.p_payload, m.p_event_type, m.p_source, m.p_aggregate_id, m.p_sequence_num, m.p_headers, m.p_trace_id, CASE WHEN m.p_priority BETWEEN -32768 AND 32767 THEN m.p_priority END, pg_catalog.now(), 0 FROM m WHERE m.k OPERATOR(pg_catalog.=) 1 AND m.p_aggregate_id IS NOT NULL AND m.p_sequence_num IS NOT NULL ORDER BY m.n
                ON CONFLICT (event_id) DO NOTHING
            RETURNING t.event_id AS id
        )
        SELECT pg_catalog.array_agg(m.k OPERATOR(pg_catalog.=) 1 AND ins.id IS NOT NULL ORDER BY m.n),
               ARRAY[pg_catalog.bool_or(m.p_aggregate_id IS NULL OR m.p_sequence_num IS NULL), pg_catalog.bool_or(m.p_priority NOT BETWEEN -32768 AND 32767), FALSE]
          INTO v_result, v_bad
          FROM m LEFT JOIN ins ON ins.id = m.p_event_id;
    IF v_bad[1] THEN
        RAISE EXCEPTION 'inbox % is ordered: p_aggregate_id and p_sequence_num must not be null', ($1).inbox_name
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;
    IF v_bad[2] THEN
        RAISE EXCEPTION 'p_priority out of range for inbox %: %', ($1).inbox_name,
            (SELECT m.p_priority FROM pg_catalog.jsonb_to_recordset($2) AS m (p_priority pg_catalog.int4)
              WHERE m.p_priority NOT BETWEEN -32768 AND 32767 LIMIT 1)
            USING ERRCODE = '22023',
                  HINT = 'p_priority is -32768 to 32767 (the inbox''s priority column is a smallint); lower values are claimed first.';
    END IF;
    RETURN v_result;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_receive_named(mailbox._inbox, text, jsonb, text, text, text, bigint, jsonb, text, integer)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_new pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'receive_named of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF pg_catalog.pg_relation_is_updatable(<oid>::pg_catalog.regclass, FALSE) OPERATOR(pg_catalog.=) 0
       OR pg_catalog.to_regclass('mailbox.gen') IS DISTINCT FROM <oid>::pg_catalog.regclass
       OR $2 IS NULL
       OR pg_catalog.octet_length($2) OPERATOR(pg_catalog.>) 1000
       OR $6 IS NULL
       OR $7 IS NULL
       OR $10 NOT BETWEEN -32768 AND 32767 THEN
        RETURN NULL; -- inbox_receive's full path raises the error
    END IF;
    INSERT INTO mailbox.gen AS t (event_id, payload, event_type, source, aggregate_id, sequence_num, headers, trace_id, priority, received_at, retry_count) VALUES ($2, $3, $4, $5, $6, $7, $8, $9, $10, pg_catalog.now(), 0) ON CONFLICT (event_id) DO NOTHING;
    v_new := FOUND;
    IF mailbox._inbox_route_named_version('gen') IS DISTINCT FROM '<version>' THEN
        RAISE EXCEPTION 'inbox % changed while this transaction was open', 'gen'
            USING ERRCODE = '40001',
                  DETAIL = 'It was granted, reconfigured, dropped or made again after this session last read the catalog.',
                  HINT = 'Retry the transaction.';
    END IF;
    -- (part 33, wake-ups: no worker waits past the bound every wait raises)
    -- (an unset bound, NULL, is no wait: COALESCE, or AND would go on to the probe)
    IF v_new AND COALESCE(pg_catalog.pg_sequence_last_value('mailbox._inbox_waiting_until'::pg_catalog.regclass), 0)
                 OPERATOR(pg_catalog.>) pg_catalog.date_part('epoch', pg_catalog.now())
       AND mailbox._inbox_has_waiter(1) THEN
        PERFORM pg_catalog.pg_notify('mailbox_inbox_new', 'gen');
    END IF;
    RETURN v_new;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_touch()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function touch of inbox % must run as %', 'gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501', HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    -- per statement: the aggregates whose gaps may change (for an INSERT with the lowest
    -- sequence it added to each) and the change of the unprocessed and processed counts. An
    -- INSERT of a pending message (neither processed nor a dead letter: max_retries never
    -- changes) without aggregate or sequence, which no ordered claim takes, is refused: a
    -- receive that ran the previous configuration's code after waiting for the enable that
    -- made this trigger (part 34, ordering switch)
    IF TG_OP = 'INSERT' THEN
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT CASE WHEN x.bad THEN mailbox._inbox_refuse_unaggregated('gen') ELSE 1 END,
               coalesce(x.aggs, '{}'), coalesce(x.mins, '{}'), x.du, x.dp FROM (
            SELECT pg_catalog.array_agg(y.agg) FILTER (WHERE y.agg IS NOT NULL) AS aggs,
                   pg_catalog.array_agg(y.mn) FILTER (WHERE y.agg IS NOT NULL) AS mins,
                   pg_catalog.sum(y.du)::pg_catalog.int8 AS du, pg_catalog.sum(y.dp)::pg_catalog.int8 AS dp,
                   pg_catalog.bool_or(y.bad) AS bad
              FROM (SELECT CASE WHEN n.processed_at IS NULL AND n.sequence_num IS NOT NULL THEN n.aggregate_id::pg_catalog.text END AS agg,
                           pg_catalog.min(n.sequence_num::pg_catalog.int8) AS mn,
                           pg_catalog.count(*) FILTER (WHERE n.processed_at IS NULL) AS du,
                           pg_catalog.count(*) FILTER (WHERE n.processed_at IS NOT NULL) AS dp,
                           pg_catalog.bool_or(n.processed_at IS NULL AND n.retry_count < 3 AND (n.aggregate_id IS NULL OR n.sequence_num IS NULL)) AS bad
                      FROM mailbox_new_rows AS n GROUP BY 1) AS y) AS x
         WHERE x.aggs IS NOT NULL OR x.du OPERATOR(pg_catalog.<>) 0 OR x.dp OPERATOR(pg_catalog.<>) 0;
    ELSIF TG_OP = 'UPDATE' THEN
        -- an UPDATE keeps the number of rows: processed changes by minus the unprocessed change
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT 1, coalesce(x.aggs, '{}'), NULL, c.du, -c.du FROM (
            SELECT pg_catalog.array_agg(DISTINCT y.agg) AS aggs FROM (
                SELECT o.aggregate_id::pg_catalog.text AS agg FROM mailbox_old_rows AS o WHERE o.aggregate_id IS NOT NULL
                UNION ALL
                SELECT n.aggregate_id::pg_catalog.text FROM mailbox_new_rows AS n WHERE n.aggregate_id IS NOT NULL) AS y) AS x,
            (SELECT (SELECT pg_catalog.count(*) FROM mailbox_new_rows AS n WHERE n.processed_at IS NULL)
                    OPERATOR(pg_catalog.-)
                    (SELECT pg_catalog.count(*) FROM mailbox_old_rows AS o WHERE o.processed_at IS NULL) AS du) AS c
         WHERE x.aggs IS NOT NULL OR c.du OPERATOR(pg_catalog.<>) 0;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT 1, coalesce(x.aggs, '{}'), NULL, -x.du, -x.dp FROM (
            SELECT pg_catalog.array_agg(DISTINCT o.aggregate_id::pg_catalog.text)
                       FILTER (WHERE o.processed_at IS NULL AND o.aggregate_id IS NOT NULL AND o.sequence_num IS NOT NULL) AS aggs,
                   pg_catalog.count(*) FILTER (WHERE o.processed_at IS NULL) AS du,
                   pg_catalog.count(*) FILTER (WHERE o.processed_at IS NOT NULL) AS dp
              FROM mailbox_old_rows AS o) AS x
         WHERE x.aggs IS NOT NULL OR x.du OPERATOR(pg_catalog.<>) 0 OR x.dp OPERATOR(pg_catalog.<>) 0;
    ELSE
        -- TRUNCATE: every aggregate, and count again
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids) VALUES (1, NULL);
    END IF;
    RETURN NULL;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_unsettled(mailbox._inbox, text[])
 RETURNS text[]
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_result pg_catalog.text[];
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) 'postgres'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'unsettled of inbox gen', 'postgres'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
        SELECT pg_catalog.array_agg(t.event_id::pg_catalog.text) INTO v_result
          FROM mailbox.gen AS t
         WHERE t.event_id = ANY ($2) AND CASE WHEN t.processed_at IS NULL THEN TRUE END AND t.retry_count < ($1).max_retries;
    RETURN v_result;
END$function$

CREATE VIEW mailbox._inbox_1_aggregate AS
 SELECT a.aggregate_id,
    a.last_seq
   FROM mailbox._inbox_aggregate a
  WHERE (a.inbox_key = 1);

CREATE VIEW mailbox._inbox_1_config AS
 SELECT i.max_retries,
    i.ordering_first_sequence
   FROM mailbox._inbox i
  WHERE (i.inbox_key = 1);

CREATE VIEW mailbox._inbox_1_lease AS
 SELECT l.event_id,
    l.lease_until,
    l.next_attempt_at,
    l.aggregate_id
   FROM mailbox._inbox_lease l
  WHERE (l.inbox_key = 1);

CREATE VIEW mailbox.dlq_gen AS
 SELECT t.event_id,
    t.event_type,
    t.source,
    t.aggregate_id,
    t.sequence_num,
    t.priority,
    t.payload,
    t.headers,
    t.trace_id,
    t.received_at,
    t.processed_at,
    t.error,
    t.retry_count
   FROM mailbox.gen t
  WHERE ((t.processed_at IS NULL) AND (t.retry_count >= ( SELECT i.max_retries
           FROM mailbox._inbox_1_config i)));

CREATE VIEW mailbox.gaps_gen AS
 WITH RECURSIVE aggs AS (
        ( SELECT t.aggregate_id AS agg
           FROM mailbox.gen t
          WHERE ((t.processed_at IS NULL) AND (t.aggregate_id IS NOT NULL) AND (t.sequence_num IS NOT NULL))
          ORDER BY t.aggregate_id
         LIMIT 1)
        UNION ALL
         SELECT n.agg
           FROM (aggs a_1
             CROSS JOIN LATERAL ( SELECT t.aggregate_id AS agg
                   FROM mailbox.gen t
                  WHERE ((t.processed_at IS NULL) AND (t.aggregate_id IS NOT NULL) AND (t.sequence_num IS NOT NULL) AND (t.aggregate_id > a_1.agg))
                  ORDER BY t.aggregate_id
                 LIMIT 1) n)
        )
 SELECT a.agg AS aggregate_id,
    (x.prev + 1) AS expected_seq,
    x.seq AS found_seq,
    date_part('epoch'::text, (now() - x.recv)) AS gap_age_sec
   FROM (((aggs a
     CROSS JOIN mailbox._inbox_1_config cfg)
     CROSS JOIN LATERAL ( SELECT COALESCE(( SELECT s_1.last_seq
                   FROM mailbox._inbox_1_aggregate s_1
                  WHERE (s_1.aggregate_id = a.agg)), (cfg.ordering_first_sequence - 1)) AS last_seq) s)
     CROSS JOIN LATERAL ( SELECT t.sequence_num AS seq,
            t.received_at AS recv,
            COALESCE(lag(t.sequence_num) OVER (ORDER BY t.sequence_num), s.last_seq) AS prev
           FROM mailbox.gen t
          WHERE ((t.aggregate_id = a.agg) AND (t.processed_at IS NULL) AND (t.sequence_num > s.last_seq))) x)
  WHERE (x.seq > (x.prev + 1));

CREATE VIEW mailbox.next_gen AS
 WITH RECURSIVE heads AS (
        ( SELECT t.aggregate_id AS agg,
            t.sequence_num AS seq
           FROM mailbox.gen t
          WHERE ((t.processed_at IS NULL) AND (t.aggregate_id IS NOT NULL) AND (t.sequence_num IS NOT NULL))
          ORDER BY t.aggregate_id, t.sequence_num
         LIMIT 1)
        UNION ALL
         SELECT n.agg,
            n.seq
           FROM (heads h_1
             CROSS JOIN LATERAL ( SELECT t.aggregate_id AS agg,
                    t.sequence_num AS seq
                   FROM mailbox.gen t
                  WHERE ((t.processed_at IS NULL) AND (t.aggregate_id IS NOT NULL) AND (t.sequence_num IS NOT NULL) AND (t.aggregate_id > h_1.agg))
                  ORDER BY t.aggregate_id, t.sequence_num
                 LIMIT 1) n)
        )
 SELECT m.event_id,
    m.event_type,
    m.source,
    m.aggregate_id,
    m.sequence_num,
    m.priority,
    m.payload,
    m.headers,
    m.trace_id,
    m.received_at,
    m.processed_at,
    m.error,
    m.retry_count
   FROM ((heads h
     CROSS JOIN mailbox._inbox_1_config cfg)
     CROSS JOIN LATERAL ( SELECT t.event_id,
            t.event_type,
            t.source,
            t.aggregate_id,
            t.sequence_num,
            t.priority,
            t.payload,
            t.headers,
            t.trace_id,
            t.received_at,
            t.processed_at,
            t.error,
            t.retry_count
           FROM mailbox.gen t
          WHERE ((t.aggregate_id = h.agg) AND (t.sequence_num = h.seq) AND (t.processed_at IS NULL))
          ORDER BY t.event_id
         LIMIT 1) m)
  WHERE ((h.seq <= (COALESCE(( SELECT s.last_seq
           FROM mailbox._inbox_1_aggregate s
          WHERE (s.aggregate_id = h.agg)), (cfg.ordering_first_sequence - 1)) + 1)) AND (m.retry_count < cfg.max_retries));

CREATE VIEW mailbox.pending_gen AS
 SELECT t.event_id,
    t.event_type,
    t.source,
    t.aggregate_id,
    t.sequence_num,
    t.priority,
    t.payload,
    t.headers,
    t.trace_id,
    t.received_at,
    t.processed_at,
    t.error,
    t.retry_count
   FROM mailbox.gen t
  WHERE ((t.processed_at IS NULL) AND (t.retry_count < ( SELECT i.max_retries
           FROM mailbox._inbox_1_config i)));

CREATE VIEW mailbox.stats_gen AS
 SELECT t.event_type,
    count(*) FILTER (WHERE ((t.processed_at IS NULL) AND (t.retry_count < cfg.max_retries))) AS pending_count,
    count(*) FILTER (WHERE (t.processed_at IS NOT NULL)) AS processed_count,
    count(*) FILTER (WHERE ((t.processed_at IS NULL) AND (t.retry_count >= cfg.max_retries))) AS dead_letter_count,
    avg(date_part('epoch'::text, (t.processed_at - t.received_at))) FILTER (WHERE (t.processed_at IS NOT NULL)) AS avg_processing_seconds
   FROM (mailbox.gen t
     CROSS JOIN mailbox._inbox_1_config cfg)
  GROUP BY t.event_type;
