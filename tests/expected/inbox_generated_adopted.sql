CREATE OR REPLACE FUNCTION mailbox._inbox_1_claim(mailbox._inbox, integer, timestamp with time zone, boolean)
 RETURNS mailbox._inbox_message[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'claim of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR (($1).priority_tiers IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"event_id": "id", "received_at": "got", "retry_count": "tries", "processed_at": "done"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    IF $4 IS FALSE THEN -- no lease row in the inbox a moment ago: no exclusion, no lease subplan
        RETURN ARRAY(
            SELECT ROW(t.id::pg_catalog.text, CAST(NULL AS text), CAST(NULL AS text), CAST(NULL AS text),
                   CAST(NULL AS bigint), CAST(NULL AS int), CAST(NULL AS jsonb), CAST(NULL AS jsonb), CAST(NULL AS text),
                   CAST(t.tries AS int), CAST(t.got AS timestamptz))::mailbox._inbox_message
              FROM (SELECT t.* FROM public.legacy AS t
                     WHERE t.done IS NULL AND t.tries < ($1).max_retries
                     ORDER BY t.got
                     LIMIT $2
                       FOR UPDATE OF t SKIP LOCKED) AS t);
    END IF;
    RETURN ARRAY(
        SELECT ROW(t.id::pg_catalog.text, CAST(NULL AS text), CAST(NULL AS text), CAST(NULL AS text),
                   CAST(NULL AS bigint), CAST(NULL AS int), CAST(NULL AS jsonb), CAST(NULL AS jsonb), CAST(NULL AS text),
                   CAST(t.tries AS int), CAST(t.got AS timestamptz))::mailbox._inbox_message
          FROM (SELECT t.* FROM public.legacy AS t
                 WHERE t.done IS NULL AND t.tries < ($1).max_retries
                   AND CASE WHEN $4 THEN t.id IS NULL OR t.id::pg_catalog.text NOT IN (
                                    SELECT pg_catalog.unnest(ARRAY(SELECT l.event_id FROM mailbox._inbox_1_lease AS l
                                     WHERE l.lease_until > $3 OR l.next_attempt_at > $3)))
                        ELSE NOT EXISTS (SELECT 1 FROM mailbox._inbox_1_lease AS l
                                    WHERE l.event_id = t.id::pg_catalog.text
                                      AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0) END
                 ORDER BY t.got
                 LIMIT $2
                   FOR UPDATE OF t SKIP LOCKED) AS t);
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_failed(mailbox._inbox, text, text)
 RETURNS mailbox._inbox_attempt
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_id pg_catalog.text;
    v_retries pg_catalog.int4;
    v_processed pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'failed of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    UPDATE public.legacy AS t SET tries = t.tries + 1
     WHERE t.id = $2 AND CASE WHEN t.done IS NULL THEN TRUE END AND t.tries < ($1).max_retries
    RETURNING t.id::pg_catalog.text, t.tries INTO v_id, v_retries;
    IF v_id IS NOT NULL THEN
        RETURN ROW(v_id, v_retries, 'counted')::mailbox._inbox_attempt;
    END IF;
    SELECT t.done IS NOT NULL INTO v_processed FROM public.legacy AS t WHERE t.id = $2;
    RETURN ROW(NULL, NULL, CASE WHEN v_processed IS NULL THEN 'missing' WHEN v_processed THEN 'processed'
                                ELSE 'dead' END)::mailbox._inbox_attempt;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_processed(mailbox._inbox, text)
 RETURNS mailbox._inbox_done
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_id pg_catalog.text;
    v_aggregate pg_catalog.text;
    v_seq pg_catalog.int8;
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'processed of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"event_id": "id", "received_at": "got", "retry_count": "tries", "processed_at": "done"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    UPDATE public.legacy AS t SET done = pg_catalog.clock_timestamp() WHERE t.id = $2 AND CASE WHEN t.done IS NULL THEN TRUE END
    RETURNING t.id::pg_catalog.text, NULL::pg_catalog.text, NULL::pg_catalog.int8, (SELECT c.ordering_first_sequence FROM mailbox._inbox_1_config AS c) IS NOT NULL INTO v_id, v_aggregate, v_seq, v_ordered;
    IF v_ordered THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This mark read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    RETURN ROW(v_id, v_aggregate, v_seq)::mailbox._inbox_done;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_processed_batch(mailbox._inbox, text[])
 RETURNS mailbox._inbox_done[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_result mailbox._inbox_done[];
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'processed_batch of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"event_id": "id", "received_at": "got", "retry_count": "tries", "processed_at": "done"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
        WITH d AS (
            UPDATE public.legacy AS t SET done = pg_catalog.clock_timestamp()
             WHERE t.id = ANY ($2) AND CASE WHEN t.done IS NULL THEN TRUE END
            RETURNING ROW(t.id::pg_catalog.text, NULL::pg_catalog.text, NULL::pg_catalog.int8)::mailbox._inbox_done AS r
        )
        SELECT pg_catalog.array_agg(d.r), pg_catalog.bool_or((SELECT c.ordering_first_sequence FROM mailbox._inbox_1_config AS c) IS NOT NULL) INTO v_result, v_ordered FROM d;
    IF v_ordered THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This mark read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    RETURN v_result;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_processed_count(mailbox._inbox, text[])
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_result pg_catalog.int8;
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'processed_count of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"event_id": "id", "received_at": "got", "retry_count": "tries", "processed_at": "done"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    UPDATE public.legacy AS t SET done = pg_catalog.clock_timestamp()
     WHERE t.id = ANY ($2) AND CASE WHEN t.done IS NULL THEN TRUE END;
    GET DIAGNOSTICS v_result = ROW_COUNT;
    IF v_result > 0 THEN
        v_ordered := (SELECT c.ordering_first_sequence FROM mailbox._inbox_1_config AS c) IS NOT NULL;
    END IF;
    IF v_ordered THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This mark read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    RETURN v_result;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_query(mailbox._inbox, text, bigint[], text[])
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_result pg_catalog.jsonb;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'query of inbox legacy', '<owner>'::pg_catalog.name
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
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'receive of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"event_id": "id", "received_at": "got", "retry_count": "tries", "processed_at": "done"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    IF $3 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for payload', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF $4 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for event_type', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF $5 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for source', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF $6 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for aggregate_id', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF $7 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for sequence_num', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF $8 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for headers', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF $9 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for trace_id', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF $10 IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % has no column for priority', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    INSERT INTO public.legacy AS t (id, got, tries) VALUES ($2, pg_catalog.now(), 0) ON CONFLICT (id) DO NOTHING RETURNING (SELECT c.ordering_first_sequence FROM mailbox._inbox_1_config AS c) IS NOT NULL INTO v_ordered;
    IF v_ordered THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This receive read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    RETURN FOUND;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_receive_batch(mailbox._inbox, jsonb)
 RETURNS boolean[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_bad pg_catalog.bool[];
    v_result pg_catalog.bool[];
    v_ordered pg_catalog.bool;
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'receive_batch of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) TRUE
       OR ($1).columns OPERATOR(pg_catalog.<>) '{"event_id": "id", "received_at": "got", "retry_count": "tries", "processed_at": "done"}'::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
        WITH m AS (
            SELECT m.*, pg_catalog.row_number() OVER (PARTITION BY m.p_event_id ORDER BY m.n) AS k
              FROM ROWS FROM (pg_catalog.jsonb_to_recordset($2) AS (p_event_id pg_catalog.text, p_payload pg_catalog.jsonb, p_event_type pg_catalog.text, p_source pg_catalog.text, p_aggregate_id pg_catalog.text, p_sequence_num pg_catalog.int8, p_headers pg_catalog.jsonb, p_trace_id pg_catalog.text, p_priority pg_catalog.int4)) WITH ORDINALITY AS m (p_event_id, p_payload, p_event_type, p_source, p_aggregate_id, p_sequence_num, p_headers, p_trace_id, p_priority, n)
        ), ins AS (
            INSERT INTO public.legacy AS t (id, got, tries)
            SELECT m.p_event_id, pg_catalog.now(), 0 FROM m WHERE m.k OPERATOR(pg_catalog.=) 1 ORDER BY m.n
                ON CONFLICT (id) DO NOTHING
            RETURNING t.id AS id
        )
        SELECT pg_catalog.array_agg(m.k OPERATOR(pg_catalog.=) 1 AND ins.id IS NOT NULL ORDER BY m.n),
               ARRAY[pg_catalog.bool_or(m.p_payload IS NOT NULL), pg_catalog.bool_or(m.p_event_type IS NOT NULL), pg_catalog.bool_or(m.p_source IS NOT NULL), pg_catalog.bool_or(m.p_aggregate_id IS NOT NULL), pg_catalog.bool_or(m.p_sequence_num IS NOT NULL), pg_catalog.bool_or(m.p_headers IS NOT NULL), pg_catalog.bool_or(m.p_trace_id IS NOT NULL), pg_catalog.bool_or(m.p_priority IS NOT NULL), FALSE], (SELECT c.ordering_first_sequence FROM mailbox._inbox_1_config AS c) IS NOT NULL
          INTO v_result, v_bad, v_ordered
          FROM m LEFT JOIN ins ON ins.id = m.p_event_id;
    IF v_ordered THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This receive read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
    IF v_bad[1] THEN
        RAISE EXCEPTION 'inbox % has no column for payload', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF v_bad[2] THEN
        RAISE EXCEPTION 'inbox % has no column for event_type', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF v_bad[3] THEN
        RAISE EXCEPTION 'inbox % has no column for source', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF v_bad[4] THEN
        RAISE EXCEPTION 'inbox % has no column for aggregate_id', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF v_bad[5] THEN
        RAISE EXCEPTION 'inbox % has no column for sequence_num', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF v_bad[6] THEN
        RAISE EXCEPTION 'inbox % has no column for headers', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF v_bad[7] THEN
        RAISE EXCEPTION 'inbox % has no column for trace_id', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    IF v_bad[8] THEN
        RAISE EXCEPTION 'inbox % has no column for priority', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;
    RETURN v_result;
END$function$

CREATE OR REPLACE FUNCTION mailbox._inbox_1_unsettled(mailbox._inbox, text[])
 RETURNS text[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'mailbox', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_result pg_catalog.text[];
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) '<owner>'::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function % must run as %', 'unsettled of inbox legacy', '<owner>'::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
        SELECT pg_catalog.array_agg(t.id::pg_catalog.text) INTO v_result
          FROM public.legacy AS t
         WHERE t.id = ANY ($2) AND CASE WHEN t.done IS NULL THEN TRUE END AND t.tries < ($1).max_retries;
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

CREATE VIEW public.dlq_legacy AS
 SELECT t.id,
    t.done,
    t.tries,
    t.got
   FROM legacy t
  WHERE ((t.done IS NULL) AND (t.tries >= ( SELECT i.max_retries
           FROM mailbox._inbox_1_config i)));

CREATE VIEW public.pending_legacy AS
 SELECT t.id,
    t.done,
    t.tries,
    t.got
   FROM legacy t
  WHERE ((t.done IS NULL) AND (t.tries < ( SELECT i.max_retries
           FROM mailbox._inbox_1_config i)));

CREATE VIEW public.stats_legacy AS
 SELECT NULL::text AS event_type,
    count(*) FILTER (WHERE ((t.done IS NULL) AND (t.tries < cfg.max_retries))) AS pending_count,
    count(*) FILTER (WHERE (t.done IS NOT NULL)) AS processed_count,
    count(*) FILTER (WHERE ((t.done IS NULL) AND (t.tries >= cfg.max_retries))) AS dead_letter_count,
    avg(date_part('epoch'::text, (t.done - t.got))) FILTER (WHERE (t.done IS NOT NULL)) AS avg_processing_seconds
   FROM (legacy t
     CROSS JOIN mailbox._inbox_1_config cfg)
  GROUP BY NULL::text;
