-- Part 36: the batch forms of receive and mark (issue 11): many messages per call, in the
-- caller's transaction, with the semantics and errors of the per-message forms (part 33).
--
-- A per-message call pays its fixed costs (catalog lookup, grant probe, table-name check,
-- dispatch to the generated function, a statement per side table) once per message; a batch
-- pays them once per call and touches the inbox table with one set-based statement. The
-- per-inbox generated functions _inbox_<key>_receive_batch and _processed_batch (made here,
-- by mailbox._inbox_define like the others of part 35, owned by the table's owner and
-- refusing to run as anyone else) alone touch the inbox table; leases, ordering state and
-- notifications are written here from what they return (data: bind parameters only, for
-- this inbox's own key). inbox_mark_failed's batch form runs the per-message logic for each
-- id in turn (failures are rare; one code path keeps the fencing rules of part 33 exact).

-- (Re)generates an inbox's batch functions from its catalog row (called by
-- _inbox_generate, part 35).
CREATE FUNCTION mailbox._inbox_generate_batch(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_table_sql(p_inbox);
    -- (the marks' and the settle's test by id: part 35, builders, _inbox_sql_unprocessed)
    v_unprocessed text := mailbox._inbox_sql_unprocessed(p_inbox.columns ->> 'processed_at');
    v_roles text[] := mailbox._inbox_receive_roles();
    v_tests text[] := ARRAY[]::text[];
    v_raise text := '';
    v_cols text[] := ARRAY[]::text[];
    v_vals text[] := ARRAY[]::text[];
    v_id text := 'm.p_event_id';
    v_priority_type text;
    -- an adopted table's unordered receive re-reads the ordering (part 35, builders, receive)
    v_recheck boolean := NOT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NULL;
BEGIN
    IF p_inbox.casts ? 'event_id' THEN
        v_id := pg_catalog.format('CAST(m.p_event_id AS %s)', p_inbox.casts ->> 'event_id');
    END IF;
    v_priority_type := mailbox._inbox_column_base_type(p_inbox, 'priority');
    -- the checks of the generated receive (part 35) over the whole batch, computed by the
    -- statement that inserts it (v_tests[i] is true when some message breaks check i): a
    -- failed check raises, which undoes the insert, so the batch is parsed only once. A
    -- priority out of range is inserted as NULL first, so the check raises, not the cast.
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        v_tests := v_tests || 'pg_catalog.bool_or(m.p_aggregate_id IS NULL OR m.p_sequence_num IS NULL)'::text;
        v_raise := v_raise || pg_catalog.format($c$
    IF v_bad[%s] THEN
        RAISE EXCEPTION 'inbox %% is ordered: p_aggregate_id and p_sequence_num must not be null', ($1).inbox_name
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;$c$, pg_catalog.cardinality(v_tests));
    END IF;
    FOR i IN 1 .. pg_catalog.array_length(v_roles, 1) LOOP
        IF c ? v_roles[i] THEN
            v_cols := v_cols || pg_catalog.quote_ident(c ->> v_roles[i]);
            v_vals := v_vals || CASE WHEN p_inbox.casts ? v_roles[i]
                                     THEN pg_catalog.format('CAST(m.%I AS %s)', 'p_' || v_roles[i],
                                                            p_inbox.casts ->> v_roles[i])
                                     WHEN v_roles[i] = 'priority' AND v_priority_type = 'int2'
                                     THEN 'CASE WHEN m.p_priority BETWEEN -32768 AND 32767 THEN m.p_priority END'
                                     ELSE 'm.p_' || v_roles[i] END;
        ELSE
            -- v_roles[i] is one of the fixed role names above, never caller text
            v_tests := v_tests || pg_catalog.format('pg_catalog.bool_or(m.p_%s IS NOT NULL)', v_roles[i]);
            v_raise := v_raise || pg_catalog.format($c$
    IF v_bad[%s] THEN
        RAISE EXCEPTION 'inbox %% has no column for %s', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;$c$, pg_catalog.cardinality(v_tests), v_roles[i]);
        END IF;
    END LOOP;
    IF v_priority_type = 'int2' THEN
        v_tests := v_tests || 'pg_catalog.bool_or(m.p_priority NOT BETWEEN -32768 AND 32767)'::text;
        v_raise := v_raise || pg_catalog.format($c$
    IF v_bad[%s] THEN
        RAISE EXCEPTION 'p_priority out of range for inbox %%: %%', ($1).inbox_name,
            (SELECT m.p_priority FROM pg_catalog.jsonb_to_recordset($2) AS m (p_priority pg_catalog.int4)
              WHERE m.p_priority NOT BETWEEN -32768 AND 32767 LIMIT 1)
            USING ERRCODE = '22023',
                  HINT = 'p_priority is -32768 to 32767 (the inbox''s priority column is a smallint); lower values are claimed first.';
    END IF;$c$, pg_catalog.cardinality(v_tests));
    END IF;
    v_tests := v_tests || 'FALSE'::text;
    v_cols := v_cols || pg_catalog.quote_ident(c ->> 'received_at') || pg_catalog.quote_ident(c ->> 'retry_count');
    v_vals := v_vals || 'pg_catalog.now()'::text || '0'::text;
    -- receive_batch(row, messages): the messages (a json array of objects keyed by the
    -- inbox_receive parameter names, checked by inbox_receive_batch) parsed in one pass; true
    -- for each message stored, in input order; of ids repeated in the batch only the first
    -- is stored (later ones are duplicates); refused when ordering was enabled while it
    -- waited (as the single receive, part 35, builders)
    PERFORM mailbox._inbox_define(p_inbox, 'receive_batch', 'jsonb', 'boolean[]', $d$
    v_bad pg_catalog.bool[];
    v_result pg_catalog.bool[];$d$ || CASE WHEN v_recheck THEN $d$
    v_ordered pg_catalog.bool;$d$ ELSE '' END,
        pg_catalog.format($b$
        WITH m AS (
            SELECT m.*, pg_catalog.row_number() OVER (PARTITION BY %5$s ORDER BY m.n) AS k
              FROM ROWS FROM (pg_catalog.jsonb_to_recordset($2) AS (%7$s)) WITH ORDINALITY AS m (%8$s, n)
        ), ins AS (
            INSERT INTO %2$s AS t (%3$s)
            SELECT %4$s FROM m WHERE m.k OPERATOR(pg_catalog.=) 1%12$s ORDER BY m.n
                ON CONFLICT (%6$I) DO NOTHING
            RETURNING t.%6$I AS id
        )
        SELECT pg_catalog.array_agg(m.k OPERATOR(pg_catalog.=) 1 AND ins.id IS NOT NULL ORDER BY m.n),
               ARRAY[%1$s]%10$s
          INTO v_result, v_bad%13$s
          FROM m LEFT JOIN ins ON ins.id = %5$s;%11$s%9$s
    RETURN v_result;$b$,
        pg_catalog.array_to_string(v_tests, ', '), v_table, pg_catalog.array_to_string(v_cols, ', '), pg_catalog.array_to_string(v_vals, ', '),
        v_id, c ->> 'event_id', mailbox._inbox_batch_columns(),
        (SELECT pg_catalog.string_agg('p_' || r, ', ') FROM pg_catalog.unnest(v_roles) AS r), v_raise,
        CASE WHEN v_recheck THEN ', ' || mailbox._inbox_build_ordered_now(p_inbox) ELSE '' END,
        CASE WHEN v_recheck THEN mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'receive') ELSE '' END,
        -- (ordered: a message without aggregate or sequence is not inserted, so the check
        -- above raises 22004, not the insert trigger of a managed inbox, part 34, gap state)
        CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL
             THEN ' AND m.p_aggregate_id IS NOT NULL AND m.p_sequence_num IS NOT NULL' ELSE '' END,
        CASE WHEN v_recheck THEN ', v_ordered' ELSE '' END));

    -- processed_batch(row, ids): marks those unprocessed (= ANY of the ids: one primary-key
    -- scan for the whole array, 0.65 us a message less than a join with unnest(ids), see
    -- docs/benchmarks.md; a repeated id is marked once); what it marked (id, and for ordering
    -- its aggregate and sequence), for inbox_mark_processed to settle leases; refused when
    -- ordering was enabled while it waited (part 34, ordering switch, _inbox_build_refuse_ordered)
    PERFORM mailbox._inbox_define(p_inbox, 'processed_batch', 'text[]', 'mailbox._inbox_done[]', $d$
    v_result mailbox._inbox_done[];
    v_ordered pg_catalog.bool;$d$,
        pg_catalog.format($b$
        WITH d AS (
            UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp()
             WHERE t.%3$I = ANY (%4$s) AND %9$s
            RETURNING ROW(t.%3$I::pg_catalog.text, %5$s, %6$s)::mailbox._inbox_done AS r
        )
        SELECT pg_catalog.array_agg(d.r), pg_catalog.bool_or(%7$s) INTO v_result, v_ordered FROM d;%8$s
    RETURN v_result;$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2, TRUE),
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.text'
             ELSE mailbox._inbox_item(c, 'aggregate_id', 'pg_catalog.text') END,
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.int8'
             ELSE mailbox._inbox_item(c, 'sequence_num', 'pg_catalog.int8') END,
        mailbox._inbox_build_ordered_now(p_inbox), mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'mark'),
        v_unprocessed));

    -- processed_count(row, ids): the same mark returning only how many it marked, for
    -- inbox_mark_processed when the ids are exactly a claim of its transaction on an unordered
    -- inbox (part 37, batch api): no lease to end, no ordering state, so nothing it marked need
    -- come back. A plain UPDATE, the ordering read again after it (in READ COMMITTED a later
    -- statement's snapshot postdates the lock the UPDATE may have waited for, as that
    -- statement's own does): a CTE returning a row per message, aggregated, cost 30-40 us a
    -- batch of 100 more (docs/benchmarks.md)
    PERFORM mailbox._inbox_define(p_inbox, 'processed_count', 'text[]', 'bigint', $d$
    v_result pg_catalog.int8;
    v_ordered pg_catalog.bool;$d$,
        pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp()
     WHERE t.%3$I = ANY (%4$s) AND %7$s;
    GET DIAGNOSTICS v_result = ROW_COUNT;
    IF v_result > 0 THEN
        v_ordered := %5$s;
    END IF;%6$s
    RETURN v_result;$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2, TRUE),
        mailbox._inbox_build_ordered_now(p_inbox), mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'mark'),
        v_unprocessed));

    -- unsettled(row, ids): those of the ids whose messages are still pending (neither
    -- processed nor dead letters), for the commit-time settling of a claim (part 37)
    PERFORM mailbox._inbox_define(p_inbox, 'unsettled', 'text[]', 'text[]', $d$
    v_result pg_catalog.text[];$d$,
        pg_catalog.format($b$
        SELECT pg_catalog.array_agg(t.%3$I::pg_catalog.text) INTO v_result
          FROM %1$s AS t
         WHERE t.%3$I = ANY (%4$s) AND %6$s AND t.%5$I < ($1).max_retries;
    RETURN v_result;$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2, TRUE),
        c ->> 'retry_count', v_unprocessed));
END
$$;
