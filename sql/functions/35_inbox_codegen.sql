-- Part 35: per-inbox functions, the only code that reads or writes an inbox table.
--
-- An inbox's table and columns are known only from its catalog row, so a generic function
-- must build its SQL at run time, and PostgreSQL parses and plans dynamic SQL on every call.
-- Instead, whenever an inbox is created, adopted or reconfigured (ordering, priority), the
-- functions below are (re)generated for it: mailbox._inbox_<key>_receive, _claim,
-- _processed and _failed hold STATIC SQL with the inbox's identifiers written in through
-- format('%I') (values stay parameters), so PL/pgSQL caches their plans per session. The
-- public functions check their arguments and dispatch with one trivial dynamic call
-- (SELECT mailbox._inbox_<key>_<kind>($1, ...)), which plans in microseconds. The control
-- plane (replay, drains, counts, gaps, ordering seed) builds its SQL from the catalog as
-- before and runs it through the fifth, mailbox._inbox_<key>_query.
--
-- Whose rights (docs/inbox.md, "Whose rights run what"): a table runs its owner's code
-- (triggers, defaults, check constraints, index expressions, domain checks, casts, RLS
-- policies) with the rights of whoever touches it. The public inbox functions are SECURITY
-- DEFINER (the extension owner, a superuser), so they never touch an inbox table themselves:
-- the generated functions are SECURITY DEFINER functions OWNED BY THE TABLE'S OWNER, hold
-- only this file's fixed SQL, take values as parameters and touch nothing but that table and
-- three per-inbox views of the inbox's own lease, ordering and settings rows (part 31).
-- Leases, ordering state and the catalog are written only by extension-owned code, from
-- values the generated functions return; those values are data the table owner could have
-- chosen, so they are only ever bind parameters, and only for that inbox's own key.
-- For a managed inbox (create_inbox) the table's owner is the extension owner.
--
-- The table owner may ALTER its functions (SECURITY INVOKER, SET search_path, ...) though
-- it cannot replace their bodies (that needs CREATE on schema mailbox). A function made
-- SECURITY INVOKER would run our SQL, and so the table's code, as the extension owner: so
-- every body starts by checking that it runs as the table owner (CURRENT_USER, an explicit
-- pg_catalog operator and pg_catalog types, so no search_path it was given is consulted
-- first) and raises 42501 otherwise. Every declared variable has a pg_catalog type for the
-- same reason (PL/pgSQL checks a domain's constraints when it initialises a variable).
--
-- Generated functions:
--   * take the inbox's catalog row as their first argument; besides carrying max_retries and
--     the name, that argument type makes them depend on the extension, so
--     DROP EXTENSION pg_mailbox CASCADE drops them like the inbox views;
--   * have unnamed parameters ($n) and #variable_conflict use_column, so no column name of an
--     inbox table can ever be taken for a variable;
--   * are executable by nobody but their owner (the extension owner is a superuser);
--   * are dropped by drop_inbox.

-- The names of an inbox's generated functions (_inbox_define builds the same names).
CREATE FUNCTION mailbox._inbox_fn_names(p_inbox mailbox._inbox)
RETURNS text[]
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY(SELECT '_inbox_' || p_inbox.inbox_key || '_' || kind
                   FROM pg_catalog.unnest(ARRAY['receive', 'claim', 'processed', 'failed', 'query', 'receive_batch',
                                                      'processed_batch', 'unsettled']) AS kind);
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

-- Creates (or replaces) one generated function, owned by the table's owner. p_args,
-- p_returns, p_declare and p_set are fixed text written in _inbox_generate; p_body is built
-- there from the catalog through format('%I'). The owner check comes first (see above).
CREATE FUNCTION mailbox._inbox_define(
    p_inbox mailbox._inbox, p_kind text, p_args text, p_returns text, p_declare text, p_body text,
    p_set text DEFAULT ''
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_owner name := mailbox._inbox_owner(p_inbox);
    v_sig text := pg_catalog.format('mailbox.%I(mailbox._inbox, %s)',
                                    '_inbox_' || p_inbox.inbox_key || '_' || p_kind, p_args);
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %s RETURNS %s LANGUAGE plpgsql VOLATILE SECURITY DEFINER'
        ' SET search_path = pg_catalog, mailbox, pg_temp%s AS %s',
        v_sig, p_returns, p_set, pg_catalog.quote_literal(pg_catalog.format($b$
#variable_conflict use_column
DECLARE%1$s
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) %2$s::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function %% must run as %%', %3$s, %2$s::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %%s: its SECURITY DEFINER property or owner was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;%4$s
END$b$, p_declare, pg_catalog.quote_literal(v_owner),
            pg_catalog.quote_literal(pg_catalog.format('%s of inbox %s', p_kind, p_inbox.inbox_name)), p_body)));
    EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', v_sig, v_owner);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_sig);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %s', v_sig, pg_catalog.quote_literal(
        pg_catalog.format('pg_mailbox: %s of inbox %s, generated from its catalog row; runs as the table owner',
                          p_kind, p_inbox.inbox_name)));
END
$$;

-- Runs control-plane SQL built from the catalog (never from a generated function's output)
-- with the rights of the inbox table's owner, through the inbox's generated query function.
-- The SQL sees the catalog row as $1, p_ints as $2 and p_texts as $3, and returns one jsonb.
CREATE FUNCTION mailbox._inbox_as_owner(
    p_inbox mailbox._inbox, p_sql text, p_ints bigint[] DEFAULT NULL, p_texts text[] DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_result jsonb;
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2, $3, $4)', '_inbox_' || p_inbox.inbox_key || '_query')
        INTO v_result
        USING p_inbox, p_sql, p_ints, p_texts;
    RETURN v_result;
END
$$;

-- (Re)generates the five functions of an inbox from its (current) catalog row.
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
    v_lease text := pg_catalog.format('mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_lease');
    -- receive's arguments after the catalog row, in order: role i is $(i + 1)
    v_roles text[] := mailbox._inbox_receive_roles(); -- part 36
    v_checks text := '';
    v_cols text[] := ARRAY[]::text[];
    v_vals text[] := ARRAY[]::text[];
    v_heads text := '';
    v_order text := mailbox._inbox_col(c, 'received_at');
    v_error text := '';
    v_priority_type text;
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
    -- a priority that does not fit a smallint column is the caller's error, named as such
    SELECT b.typname INTO v_priority_type
      FROM pg_catalog.pg_attribute AS a
      JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
      JOIN pg_catalog.pg_type AS b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
     WHERE a.attrelid = p_inbox.table_rel AND a.attname = c ->> 'priority' AND NOT a.attisdropped;
    IF v_priority_type = 'int2' THEN
        v_checks := v_checks || $c$
    IF $10 NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'p_priority out of range for inbox %: %', ($1).inbox_name, $10
            USING ERRCODE = '22023',
                  HINT = 'p_priority is -32768 to 32767 (the inbox''s priority column is a smallint); lower values are claimed first.';
    END IF;$c$;
    END IF;
    -- an adopted table's columns may lack defaults: a new message is unprocessed, never tried
    v_cols := v_cols || pg_catalog.quote_ident(c ->> 'received_at') || pg_catalog.quote_ident(c ->> 'retry_count');
    v_vals := v_vals || 'pg_catalog.now()'::text || '0'::text;
    PERFORM mailbox._inbox_define(p_inbox, 'receive', 'text, jsonb, text, text, text, bigint, jsonb, text, int',
        'boolean', '', pg_catalog.format($b$%1$s
    INSERT INTO %2$s AS t (%3$s) VALUES (%4$s) ON CONFLICT (%5$I) DO NOTHING;
    RETURN FOUND;$b$,
        v_checks, v_table, pg_catalog.array_to_string(v_cols, ', '), pg_catalog.array_to_string(v_vals, ', '),
        c ->> 'event_id'));

    -- claim(row, batch size, now): the candidates, locked, oldest (lowest priority) first;
    -- inbox_claim then leases them, and that upsert decides who wins a message (see part 33).
    -- The per-inbox views are security barriers, which a join cannot see into: their probes are
-- subqueries kept apart by OFFSET 0, so each is one primary-key lookup per row. Always the
-- generic plan: with LIMIT $2 the planner costs it for 10% of the pending rows,
    -- far above a custom plan for a batch of 10, so the plan cache would never pick it and
    -- would plan every claim again (about 100 us); the generic plan has the same shape (index
    -- order, anti-join per row).
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        -- only aggregate heads (next_<i>, its SQL written in here: a view in the table's schema
        -- may be replaced by that schema's owner), oldest first, collected by an InitPlan so the
        -- claim itself is a primary-key lookup. At most one in flight per aggregate: a head
        -- that is leased (or waits for its retry time) is skipped, and so is a head whose
        -- aggregate has another message under a live lease: a lower sequence that arrived
        -- (or was replayed) after its successor was claimed is the head again, but waits
        -- until that successor is settled. A message in flight was a head when it was
        -- claimed, so its sequence is at most last_seq + 1 (last_seq never decreases): the
        -- probe reads only the aggregate's unprocessed rows up to there (the ordering index),
        -- usually the head alone.
        v_heads := pg_catalog.format(
            ' AND t.%1$I = ANY (ARRAY(SELECT n.%1$I FROM (%2$s) AS n'
            ' WHERE NOT EXISTS (SELECT 1 FROM %3$s AS l'
            ' WHERE l.event_id = n.%1$I::text AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0)'
            ' AND NOT EXISTS (SELECT 1 FROM %5$s AS s'
            ' WHERE s.%6$I = n.%6$I AND s.%8$I IS NULL AND s.%7$I <= coalesce((SELECT a.last_seq'
            ' FROM mailbox.%9$I AS a WHERE a.aggregate_id = n.%6$I::text),'
            ' ($1).ordering_first_sequence - 1) + 1'
            ' AND EXISTS (SELECT 1 FROM %3$s AS l WHERE l.event_id = s.%1$I::text AND l.lease_until > $3 OFFSET 0)'
            ' OFFSET 0)'
            ' ORDER BY n.%4$I LIMIT $2 * 4 + 16))',
            c ->> 'event_id', mailbox._inbox_next_sql(p_inbox), v_lease, c ->> 'received_at',
            v_table, c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at',
            '_inbox_' || v_key || '_aggregate');
    END IF;
    IF p_inbox.priority_tiers IS NOT NULL THEN
        v_order := mailbox._inbox_col(c, 'priority') || ', ' || v_order;
    END IF;
    PERFORM mailbox._inbox_define(p_inbox, 'claim', 'int, timestamptz', 'mailbox._inbox_message[]', '',
        pg_catalog.format($b$
    RETURN (SELECT pg_catalog.array_agg(ROW(c.event_id, c.event_type, c.source, c.aggregate_id, c.sequence_num,
                                            c.priority, c.payload, c.headers, c.trace_id, c.retry_count,
                                            c.received_at)::mailbox._inbox_message ORDER BY c.n) FROM (
        SELECT t.%1$I::pg_catalog.text AS event_id, %2$s AS event_type, %3$s AS source, %4$s AS aggregate_id,
               %5$s AS sequence_num, %6$s AS priority, %7$s AS payload, %8$s AS headers, %9$s AS trace_id,
               %10$s AS retry_count, %11$s AS received_at,
               pg_catalog.row_number() OVER (ORDER BY %17$s) AS n
          FROM (SELECT t.* FROM %12$s AS t
                 WHERE t.%13$I IS NULL AND t.%14$I < ($1).max_retries%15$s
                   AND NOT EXISTS (SELECT 1 FROM %16$s AS l
                                    WHERE l.event_id = t.%1$I::pg_catalog.text
                                      AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0)
                 ORDER BY %17$s
                 LIMIT $2
                   FOR UPDATE OF t SKIP LOCKED) AS t
    ) AS c);$b$,
        c ->> 'event_id', mailbox._inbox_item(c, 'event_type', 'text'), mailbox._inbox_item(c, 'source', 'text'),
        mailbox._inbox_item(c, 'aggregate_id', 'text'), mailbox._inbox_item(c, 'sequence_num', 'bigint'),
        mailbox._inbox_item(c, 'priority', 'int'), mailbox._inbox_item(c, 'payload', 'jsonb'),
        mailbox._inbox_item(c, 'headers', 'jsonb'), mailbox._inbox_item(c, 'trace_id', 'text'),
        mailbox._inbox_item(c, 'retry_count', 'int'), mailbox._inbox_item(c, 'received_at', 'timestamptz'),
        v_table, c ->> 'processed_at', c ->> 'retry_count', v_heads, v_lease, v_order),
        ' SET plan_cache_mode = force_generic_plan');

    -- processed(row, event_id): marks it; inbox_mark_processed settles lease and ordering
    PERFORM mailbox._inbox_define(p_inbox, 'processed', 'text', 'mailbox._inbox_done', $d$
    v_id pg_catalog.text;
    v_aggregate pg_catalog.text;
    v_seq pg_catalog.int8;$d$, pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp() WHERE t.%3$I = %4$s AND t.%2$I IS NULL
    RETURNING t.%3$I::pg_catalog.text, %5$s, %6$s INTO v_id, v_aggregate, v_seq;
    RETURN ROW(v_id, v_aggregate, v_seq)::mailbox._inbox_done;$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', v_id_param,
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.text'
             ELSE mailbox._inbox_item(c, 'aggregate_id', 'pg_catalog.text') END,
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.int8'
             ELSE mailbox._inbox_item(c, 'sequence_num', 'pg_catalog.int8') END));

    -- failed(row, event_id, error): counts the failure; inbox_mark_failed settles the lease
    IF c ? 'error' THEN
        v_error := pg_catalog.format(', %I = $3', c ->> 'error');
    END IF;
    PERFORM mailbox._inbox_define(p_inbox, 'failed', 'text, text', 'mailbox._inbox_attempt', $d$
    v_id pg_catalog.text;
    v_retries pg_catalog.int4;
    v_processed pg_catalog.bool;$d$, pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = t.%2$I + 1%3$s
     WHERE t.%4$I = %5$s AND t.%6$I IS NULL AND t.%2$I < ($1).max_retries
    RETURNING t.%4$I::pg_catalog.text, t.%2$I INTO v_id, v_retries;
    IF v_id IS NOT NULL THEN
        RETURN ROW(v_id, v_retries, 'counted')::mailbox._inbox_attempt;
    END IF;
    SELECT t.%6$I IS NOT NULL INTO v_processed FROM %1$s AS t WHERE t.%4$I = %5$s;
    RETURN ROW(NULL, NULL, CASE WHEN v_processed IS NULL THEN 'missing' WHEN v_processed THEN 'processed'
                                ELSE 'dead' END)::mailbox._inbox_attempt;$b$,
        v_table, c ->> 'retry_count', v_error, c ->> 'event_id', v_id_param, c ->> 'processed_at'));

    -- query(row, sql, ints, texts): the control plane's SQL (mailbox._inbox_as_owner)
    PERFORM mailbox._inbox_define(p_inbox, 'query', 'text, bigint[], text[]', 'jsonb', $d$
    v_result pg_catalog.jsonb;$d$, $b$
    EXECUTE $2 INTO v_result USING $1, $3, $4;
    RETURN v_result;$b$);

    -- the batch forms' receive_batch and processed_batch (part 36)
    PERFORM mailbox._inbox_generate_batch(p_inbox);
END
$$;
