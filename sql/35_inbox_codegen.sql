-- Part 35: per-inbox functions for the per-message path (receive, claim, mark).
--
-- An inbox's table and columns are known only from its catalog row, so a generic function
-- must build its SQL at run time, and PostgreSQL parses and plans dynamic SQL on every call.
-- Instead, whenever an inbox is created, adopted or reconfigured (ordering, priority), the
-- functions below are (re)generated for it: mailbox._inbox_<key>_receive, _claim,
-- _processed and _failed hold STATIC SQL with the inbox's identifiers written in through
-- format('%I') (values stay parameters), so PL/pgSQL caches their plans per session. The
-- public functions check their arguments and dispatch with one trivial dynamic call
-- (SELECT mailbox._inbox_<key>_<kind>($1, ...)), which plans in microseconds.
--
-- Generated functions:
--   * take the inbox's catalog row as their first argument; besides carrying max_retries and
--     the name, that argument type makes them depend on the extension, so
--     DROP EXTENSION pg_mailbox CASCADE drops them like the inbox views;
--   * have unnamed parameters ($n) and #variable_conflict use_column, so no column name of an
--     inbox table can ever be taken for a variable; statements that touch the inbox table
--     reference no local variable at all;
--   * are SECURITY INVOKER, owned by the extension owner and executable by nobody else (the
--     public SECURITY DEFINER functions call them as that owner);
--   * are dropped by drop_inbox.

-- One claimed message with its lease, as inbox_claim returns it.
CREATE TYPE mailbox._inbox_claimed AS (
    event_id text, event_type text, source text, aggregate_id text, sequence_num bigint, priority int,
    payload jsonb, headers jsonb, trace_id text, retry_count int, received_at timestamptz,
    lease_until timestamptz
);

-- The names of an inbox's generated functions (_inbox_define builds the same names).
CREATE FUNCTION mailbox._inbox_fn_names(p_inbox mailbox._inbox)
RETURNS text[]
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY(SELECT '_inbox_' || p_inbox.inbox_key || '_' || kind
                   FROM pg_catalog.unnest(ARRAY['receive', 'claim', 'processed', 'failed']) AS kind);
$$;

CREATE FUNCTION mailbox._inbox_drop_functions(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN
        SELECT p.oid FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname = ANY (mailbox._inbox_fn_names(p_inbox))
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', v_fn);
    END LOOP;
END
$$;

-- Creates (or replaces) one generated function. p_args, p_returns and p_set are fixed text
-- written in _inbox_generate; p_body is built there from the catalog through format('%I').
CREATE FUNCTION mailbox._inbox_define(
    p_inbox mailbox._inbox, p_kind text, p_args text, p_returns text, p_body text, p_set text DEFAULT ''
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_sig text := pg_catalog.format('mailbox.%I(mailbox._inbox, %s)',
                                    '_inbox_' || p_inbox.inbox_key || '_' || p_kind, p_args);
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %s RETURNS %s LANGUAGE plpgsql VOLATILE SECURITY INVOKER'
        ' SET search_path = pg_catalog, mailbox, pg_temp%s AS %s',
        v_sig, p_returns, p_set, pg_catalog.quote_literal(p_body));
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_sig);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %s', v_sig, pg_catalog.quote_literal(
        pg_catalog.format('pg_mailbox: %s of inbox %s, generated from its catalog row', p_kind, p_inbox.inbox_name)));
END
$$;

-- (Re)generates the four functions of an inbox from its (current) catalog row.
CREATE FUNCTION mailbox._inbox_generate(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_key int := p_inbox.inbox_key;
    v_table text := pg_catalog.format('%I.%I', p_inbox.schema_name, p_inbox.table_name);
    v_id_param text := mailbox._inbox_param(p_inbox, 'event_id', 2);
    -- receive's arguments after the catalog row, in order: role i is $(i + 1)
    v_roles text[] := ARRAY['event_id', 'payload', 'event_type', 'source', 'aggregate_id', 'sequence_num',
                            'headers', 'trace_id', 'priority'];
    v_checks text := '';
    v_cols text[] := ARRAY[]::text[];
    v_vals text[] := ARRAY[]::text[];
    v_heads text := '';
    v_order text := mailbox._inbox_col(c, 'received_at');
    v_ordering text := '';
    v_error text := '';
BEGIN
    -- receive(row, event_id, payload, event_type, source, aggregate_id, sequence_num, headers,
    -- trace_id, priority): the checks in the order the generic code made them, then the insert
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        v_checks := $c$
    IF $6 IS NULL OR $7 IS NULL THEN
        RAISE EXCEPTION 'inbox % is ordered: p_aggregate_id and p_sequence_num must not be null', ($1).inbox_name
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;$c$;
    END IF;
    FOR i IN 1 .. pg_catalog.array_length(v_roles, 1) LOOP
        IF c ? v_roles[i] THEN
            v_cols := v_cols || pg_catalog.quote_ident(c ->> v_roles[i]);
            v_vals := v_vals || mailbox._inbox_param(p_inbox, v_roles[i], i + 1);
        ELSE
            -- v_roles[i] is one of the fixed role names above, never caller text
            v_checks := v_checks || pg_catalog.format($c$
    IF $%s IS NOT NULL THEN
        RAISE EXCEPTION 'inbox %% has no column for %s', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;$c$, i + 1, v_roles[i]);
        END IF;
    END LOOP;
    -- an adopted table's columns may lack defaults: a new message is unprocessed, never tried
    v_cols := v_cols || pg_catalog.quote_ident(c ->> 'received_at') || pg_catalog.quote_ident(c ->> 'retry_count');
    v_vals := v_vals || 'pg_catalog.now()'::text || '0'::text;
    PERFORM mailbox._inbox_define(p_inbox, 'receive', 'text, jsonb, text, text, text, bigint, jsonb, text, int',
        'boolean', pg_catalog.format($b$
#variable_conflict use_column
BEGIN%1$s
    INSERT INTO %2$s AS t (%3$s) VALUES (%4$s) ON CONFLICT (%5$I) DO NOTHING;
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('mailbox_inbox_new', ($1).inbox_name);
        RETURN TRUE;
    END IF;
    RETURN FALSE;
END$b$,
        v_checks, v_table, pg_catalog.array_to_string(v_cols, ', '), pg_catalog.array_to_string(v_vals, ', '),
        c ->> 'event_id'));

    -- claim(row, worker, batch size, now, lease until): 1. candidates, locked; 2. leases, the
    -- upsert decides who wins a message (see part 33). Always the generic plan: with LIMIT
    -- $3 the planner costs it for 10% of the pending rows, far above a custom plan for a
    -- batch of 10, so the plan cache would never pick it and would plan every claim again
    -- (about 100 us); the generic plan has the same shape (index order, anti-join per row).
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        -- only aggregate heads (next_<i>), oldest first, collected by an InitPlan so the
        -- claim itself is a primary-key lookup. At most one in flight per aggregate: a head
        -- that is leased (or waits for its retry time) is skipped, and so is a head whose
        -- aggregate has another message under a live lease: a lower sequence that arrived
        -- (or was replayed) after its successor was claimed is the head again, but waits
        -- until that successor is settled. A message in flight was a head when it was
        -- claimed, so its sequence is at most last_seq + 1 (last_seq never decreases): the
        -- probe reads only the aggregate's unprocessed rows up to there (the ordering index),
        -- usually the head alone.
        v_heads := pg_catalog.format(
            ' AND t.%1$I = ANY (ARRAY(SELECT n.%1$I FROM %2$I.%3$I AS n'
            ' WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l'
            ' WHERE l.inbox_key = %5$s AND l.event_id = n.%1$I::text AND (l.lease_until > $4 OR l.next_attempt_at > $4))'
            ' AND NOT EXISTS (SELECT 1 FROM %6$s AS s JOIN mailbox._inbox_lease AS l'
            ' ON l.inbox_key = %5$s AND l.event_id = s.%1$I::text AND l.lease_until > $4'
            ' WHERE s.%7$I = n.%7$I AND s.%9$I IS NULL AND s.%8$I <= coalesce((SELECT a.last_seq'
            ' FROM mailbox._inbox_aggregate AS a WHERE a.inbox_key = %5$s AND a.aggregate_id = n.%7$I::text),'
            ' ($1).ordering_first_sequence - 1) + 1)'
            ' ORDER BY n.%4$I LIMIT $3 * 4 + 16))',
            c ->> 'event_id', p_inbox.schema_name, 'next_' || p_inbox.inbox_name, c ->> 'received_at', v_key,
            v_table, c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at');
    END IF;
    IF p_inbox.priority_tiers IS NOT NULL THEN
        v_order := mailbox._inbox_col(c, 'priority') || ', ' || v_order;
    END IF;
    PERFORM mailbox._inbox_define(p_inbox, 'claim', 'text, int, timestamptz, timestamptz',
        'SETOF mailbox._inbox_claimed', pg_catalog.format($b$
#variable_conflict use_column
DECLARE
    v_rows mailbox._inbox_message[];
BEGIN
    SELECT pg_catalog.array_agg(ROW(c.event_id, c.event_type, c.source, c.aggregate_id, c.sequence_num,
                                     c.priority, c.payload, c.headers, c.trace_id, c.retry_count, c.received_at
                                 )::mailbox._inbox_message ORDER BY c.n) INTO v_rows FROM (
        SELECT t.%1$I::text AS event_id, %2$s AS event_type, %3$s AS source, %4$s AS aggregate_id,
               %5$s AS sequence_num, %6$s AS priority, %7$s AS payload, %8$s AS headers, %9$s AS trace_id,
               %10$s AS retry_count, %11$s AS received_at,
               pg_catalog.row_number() OVER (ORDER BY %17$s) AS n
          FROM (SELECT t.* FROM %12$s AS t
                 WHERE t.%13$I IS NULL AND t.%14$I < ($1).max_retries%15$s
                   AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l
                                    WHERE l.inbox_key = %16$s AND l.event_id = t.%1$I::text
                                      AND (l.lease_until > $4 OR l.next_attempt_at > $4))
                 ORDER BY %17$s
                 LIMIT $3
                   FOR UPDATE OF t SKIP LOCKED) AS t
    ) AS c;
    IF v_rows IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH won AS (
        INSERT INTO mailbox._inbox_lease AS x (inbox_key, event_id, lease_until, leased_by, next_attempt_at,
                                               leased_by_pid)
        SELECT %16$s, m.event_id, $5, $2, NULL, pg_catalog.pg_backend_pid() FROM pg_catalog.unnest(v_rows) AS m
            ON CONFLICT ON CONSTRAINT _inbox_lease_pkey DO UPDATE
           SET lease_until = excluded.lease_until, leased_by = excluded.leased_by, next_attempt_at = NULL,
               leased_by_pid = excluded.leased_by_pid
         WHERE (x.lease_until IS NULL OR x.lease_until <= $4)
           AND (x.next_attempt_at IS NULL OR x.next_attempt_at <= $4)
        RETURNING x.event_id AS won_id, x.lease_until AS won_until
    )
    SELECT m.event_id, m.event_type, m.source, m.aggregate_id, m.sequence_num, m.priority, m.payload,
           m.headers, m.trace_id, m.retry_count, m.received_at, won.won_until
      FROM pg_catalog.unnest(v_rows) WITH ORDINALITY AS m
      JOIN won ON won.won_id = m.event_id
     ORDER BY m.ordinality;
END$b$,
        c ->> 'event_id', mailbox._inbox_item(c, 'event_type', 'text'), mailbox._inbox_item(c, 'source', 'text'),
        mailbox._inbox_item(c, 'aggregate_id', 'text'), mailbox._inbox_item(c, 'sequence_num', 'bigint'),
        mailbox._inbox_item(c, 'priority', 'int'), mailbox._inbox_item(c, 'payload', 'jsonb'),
        mailbox._inbox_item(c, 'headers', 'jsonb'), mailbox._inbox_item(c, 'trace_id', 'text'),
        mailbox._inbox_item(c, 'retry_count', 'int'), mailbox._inbox_item(c, 'received_at', 'timestamptz'),
        v_table, c ->> 'processed_at', c ->> 'retry_count', v_heads, v_key, v_order),
        ' SET plan_cache_mode = force_generic_plan');

    -- processed(row, event_id)
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        -- the highest processed sequence: a replayed older message does not move it back, and
        -- a new aggregate starts at first sequence - 1 even if a stray lower sequence is
        -- processed first (an existing aggregate only ever moves up to what was processed)
        v_ordering := pg_catalog.format($o$
    IF v_aggregate IS NOT NULL AND v_seq IS NOT NULL THEN
        INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq, updated_at)
        VALUES (%1$s, v_aggregate, pg_catalog.int8larger(v_seq, ($1).ordering_first_sequence - 1),
                pg_catalog.clock_timestamp())
            ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
           SET last_seq = pg_catalog.int8larger(a.last_seq, v_seq), updated_at = excluded.updated_at;
    END IF;$o$, v_key);
    END IF;
    PERFORM mailbox._inbox_define(p_inbox, 'processed', 'text', 'boolean', pg_catalog.format($b$
#variable_conflict use_column
DECLARE
    v_id text;
    v_aggregate text;
    v_seq bigint;
BEGIN
    UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp() WHERE t.%3$I = %4$s AND t.%2$I IS NULL
    RETURNING t.%3$I::text, %5$s, %6$s INTO v_id, v_aggregate, v_seq;
    IF v_id IS NULL THEN
        RETURN FALSE;
    END IF;
    DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = %7$s AND l.event_id = v_id;%8$s
    RETURN TRUE;
END$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', v_id_param,
        CASE WHEN v_ordering = '' THEN 'NULL::text' ELSE mailbox._inbox_item(c, 'aggregate_id', 'text') END,
        CASE WHEN v_ordering = '' THEN 'NULL::bigint' ELSE mailbox._inbox_item(c, 'sequence_num', 'bigint') END,
        v_key, v_ordering));

    -- failed(row, event_id, error, delay seconds): the delay is already resolved and checked
    IF c ? 'error' THEN
        v_error := pg_catalog.format(', %I = $3', c ->> 'error');
    END IF;
    PERFORM mailbox._inbox_define(p_inbox, 'failed', 'text, text, int', 'text', pg_catalog.format($b$
#variable_conflict use_column
DECLARE
    v_id text;
    v_retries int;
    v_processed boolean;
BEGIN
    UPDATE %1$s AS t SET %2$I = t.%2$I + 1%3$s
     WHERE t.%4$I = %5$s AND t.%6$I IS NULL AND t.%2$I < ($1).max_retries
    RETURNING t.%4$I::text, t.%2$I INTO v_id, v_retries;
    IF v_id IS NULL THEN
        SELECT t.%6$I IS NOT NULL INTO v_processed FROM %1$s AS t WHERE t.%4$I = %5$s;
        IF v_processed IS NULL THEN
            RAISE EXCEPTION 'inbox message not found: %%', $2
                USING ERRCODE = '42704', DETAIL = pg_catalog.format('Inbox %%s has no message with this id.', ($1).inbox_name);
        ELSIF v_processed THEN
            RAISE EXCEPTION 'inbox message already processed: %%', $2
                USING ERRCODE = '55000',
                      HINT = 'Replay it with mailbox.replay_inbox_messages() to process it again.';
        END IF;
        RETURN 'dead_letter'; -- already in the DLQ: nothing changes
    END IF;
    IF v_retries >= ($1).max_retries THEN
        -- a dead letter is not claimable; another backend's live lease still says it is in
        -- flight (see below) and expires by itself
        DELETE FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key = %7$s AND l.event_id = v_id
           AND (l.lease_until IS NULL OR l.lease_until <= pg_catalog.clock_timestamp()
                OR l.leased_by_pid IS NOT DISTINCT FROM pg_catalog.pg_backend_pid());
        INSERT INTO mailbox._inbox_dlq_event (inbox_key, event_id, error, retry_count)
        VALUES (%7$s, v_id, $3, v_retries);
        RETURN 'dead_letter';
    END IF;
    -- a live lease taken by another backend is not the caller's to end: this is a late
    -- report of a worker whose lease expired (the message was reclaimed). The failure counts,
    -- the holder keeps its lease, and the retry comes due no earlier than that lease ends.
    UPDATE mailbox._inbox_lease AS l
       SET next_attempt_at = GREATEST(l.lease_until, pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $4))
     WHERE l.inbox_key = %7$s AND l.event_id = v_id AND l.lease_until > pg_catalog.clock_timestamp()
       AND l.leased_by_pid IS DISTINCT FROM pg_catalog.pg_backend_pid();
    IF FOUND THEN
        RETURN 'retry';
    END IF;
    IF $4 > 0 THEN
        INSERT INTO mailbox._inbox_lease AS l (inbox_key, event_id, lease_until, leased_by, next_attempt_at)
        VALUES (%7$s, v_id, NULL, NULL, pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $4))
            ON CONFLICT (inbox_key, event_id) DO UPDATE
           SET lease_until = NULL, leased_by = NULL, next_attempt_at = excluded.next_attempt_at,
               leased_by_pid = NULL;
    ELSE
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = %7$s AND l.event_id = v_id;
    END IF;
    RETURN 'retry';
END$b$,
        v_table, c ->> 'retry_count', v_error, c ->> 'event_id', v_id_param, c ->> 'processed_at', v_key));
END
$$;
