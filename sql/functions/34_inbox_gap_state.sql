-- Part 34 (gap state): the ordering gaps of a managed ordered inbox, kept so that
-- inbox_ordering_gaps and inbox_health cost what changed since they last ran, not the whole
-- pending backlog (issue 11; docs/inbox.md, "How gaps are kept").
--
-- A hole can be anywhere among an aggregate's unprocessed sequences, so finding the gaps from
-- scratch reads every unprocessed message (part 31, _inbox_gaps_sql). Instead:
--   * statement triggers on the inbox table (AFTER INSERT / UPDATE / DELETE with transition
--     tables, AFTER TRUNCATE) record which aggregates a statement touched in
--     mailbox._inbox_gap_touched, in the writer's transaction: one insert-only row per
--     statement (the array of its aggregates, for an INSERT the lowest sequence it added to
--     each, and the statement's change of the unprocessed and processed counts), no lock on
--     anything shared, so racing
--     receivers never wait for each other, and a row commits (or aborts) with the messages
--     it stands for. Every writer is seen: inbox_receive, the batch forms, marks, replay,
--     retention, and plain INSERT / UPDATE / DELETE by hand. A row with NULL aggregates
--     means "every aggregate" (TRUNCATE, enabling ordering);
--   * mailbox._inbox_gap holds every gap of the inbox as of the last fold, _inbox_gap_head
--     each aggregate's highest unprocessed sequence and _inbox_count the message counts. A
--     fold (part 34, gap fold: when inbox_ordering_gaps, inbox_health or maintenance read the
--     gaps) deletes the touched rows it sees, adds their count changes, and reads again from
--     the table (as its owner) exactly the aggregates they name: from the head on for an
--     aggregate only appended to (every INSERT above its head), keeping its gaps; from its
--     position for any other, replacing its gaps and head.
-- Correct under concurrency because the touched rows are read (and deleted) by one statement
-- and the aggregates recomputed by a later one: whatever the first saw committed, the second
-- sees too, and a writer that commits after the first leaves its row for the next fold.
-- Folds of one inbox take a transaction advisory lock (try, never wait), so no fold can
-- overwrite a newer one with an older snapshot; a caller that cannot fold (lock busy,
-- REPEATABLE READ or SERIALIZABLE, a read-only transaction or a standby) computes the same
-- answer without writing: the stored gaps of untouched aggregates plus the touched ones
-- recomputed, the stored counts plus the changes of the touched rows its statement sees.
-- A count taken from the table during a fold subtracts, in the same statement, the changes
-- of the touched rows that statement sees but the fold did not take (a later fold adds
-- them), so nothing is counted twice. A head is only ever too high for an aggregate whose
-- touched row the fold did not take: that row's lowest sequence is then not above the head
-- and the next fold reads the aggregate from its position. Aggregate positions (last_seq)
-- move only when a message is marked processed, which updates its row (touched), or when
-- ordering is enabled (everything touched).
--
-- Only managed inboxes (create_inbox) get the triggers: pg_mailbox adds nothing to a table it
-- adopted (enable_inbox_tracking), so an adopted ordered inbox still finds its gaps by the
-- scan. The trigger function is generated per inbox with the inbox's columns written in
-- (static SQL, so PL/pgSQL caches its plans), owned by the table's owner (the extension owner
-- for a managed inbox), not an extension member (pg_dump dumps it with the table's triggers)
-- but dropped with the extension (DEPENDS ON EXTENSION), triggers and all.

-- Whether the inbox keeps its gaps (above) rather than scanning for them.
CREATE FUNCTION mailbox._inbox_gap_tracked(p_inbox mailbox._inbox)
RETURNS boolean
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NOT NULL;
$$;

-- The body of an inbox's trigger function: the aggregates of unprocessed messages a statement
-- added or removed, and every aggregate an UPDATE touched (a mark moves its position, a
-- replay brings a message back). Identifiers come from the catalog through format('%I').
CREATE FUNCTION mailbox._inbox_gap_touch_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
BEGIN
    RETURN pg_catalog.format($b$
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) %5$L::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function touch of inbox %% must run as %%', %6$L, %5$L::pg_catalog.name
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
        SELECT CASE WHEN x.bad THEN mailbox._inbox_refuse_unaggregated(%6$L) ELSE %4$s END,
               coalesce(x.aggs, '{}'), coalesce(x.mins, '{}'), x.du, x.dp FROM (
            SELECT pg_catalog.array_agg(y.agg) FILTER (WHERE y.agg IS NOT NULL) AS aggs,
                   pg_catalog.array_agg(y.mn) FILTER (WHERE y.agg IS NOT NULL) AS mins,
                   pg_catalog.sum(y.du)::pg_catalog.int8 AS du, pg_catalog.sum(y.dp)::pg_catalog.int8 AS dp,
                   pg_catalog.bool_or(y.bad) AS bad
              FROM (SELECT CASE WHEN n.%3$I IS NULL AND n.%2$I IS NOT NULL THEN n.%1$I::pg_catalog.text END AS agg,
                           pg_catalog.min(n.%2$I::pg_catalog.int8) AS mn,
                           pg_catalog.count(*) FILTER (WHERE n.%3$I IS NULL) AS du,
                           pg_catalog.count(*) FILTER (WHERE n.%3$I IS NOT NULL) AS dp,
                           pg_catalog.bool_or(n.%3$I IS NULL AND n.%8$I < %9$s AND (n.%1$I IS NULL OR n.%2$I IS NULL)) AS bad
                      FROM mailbox_new_rows AS n GROUP BY 1) AS y) AS x
         WHERE x.aggs IS NOT NULL OR x.du OPERATOR(pg_catalog.<>) 0 OR x.dp OPERATOR(pg_catalog.<>) 0;
    ELSIF TG_OP = 'UPDATE' THEN
        -- an UPDATE keeps the number of rows: processed changes by minus the unprocessed change
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT %4$s, coalesce(x.aggs, '{}'), NULL, c.du, -c.du FROM (
            SELECT pg_catalog.array_agg(DISTINCT y.agg) AS aggs FROM (
                SELECT o.%1$I::pg_catalog.text AS agg FROM mailbox_old_rows AS o WHERE o.%1$I IS NOT NULL
                UNION ALL
                SELECT n.%1$I::pg_catalog.text FROM mailbox_new_rows AS n WHERE n.%1$I IS NOT NULL) AS y) AS x,
            (SELECT (SELECT pg_catalog.count(*) FROM mailbox_new_rows AS n WHERE n.%3$I IS NULL)
                    OPERATOR(pg_catalog.-)
                    (SELECT pg_catalog.count(*) FROM mailbox_old_rows AS o WHERE o.%3$I IS NULL) AS du) AS c
         WHERE x.aggs IS NOT NULL OR c.du OPERATOR(pg_catalog.<>) 0;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT %4$s, coalesce(x.aggs, '{}'), NULL, -x.du, -x.dp FROM (
            SELECT pg_catalog.array_agg(DISTINCT o.%1$I::pg_catalog.text)
                       FILTER (WHERE o.%3$I IS NULL AND o.%1$I IS NOT NULL AND o.%2$I IS NOT NULL) AS aggs,
                   pg_catalog.count(*) FILTER (WHERE o.%3$I IS NULL) AS du,
                   pg_catalog.count(*) FILTER (WHERE o.%3$I IS NOT NULL) AS dp
              FROM mailbox_old_rows AS o) AS x
         WHERE x.aggs IS NOT NULL OR x.du OPERATOR(pg_catalog.<>) 0 OR x.dp OPERATOR(pg_catalog.<>) 0;
    ELSE
        -- TRUNCATE: every aggregate, and count again
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids) VALUES (%4$s, NULL);
    END IF;
    RETURN NULL;
END$b$,
        c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at', p_inbox.inbox_key,
        mailbox._inbox_owner(p_inbox), p_inbox.inbox_name, NULL, c ->> 'retry_count', p_inbox.max_retries);
END
$$;

-- Removes an inbox's gap triggers (when its table still exists), trigger function and gap rows.
CREATE FUNCTION mailbox._inbox_gap_untrack(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_trigger name;
    v_fn regprocedure := pg_catalog.to_regprocedure(
        pg_catalog.format('mailbox.%I()', '_inbox_' || p_inbox.inbox_key || '_touch'));
BEGIN
    FOR v_trigger IN
        SELECT t.tgname FROM pg_catalog.pg_trigger AS t
         WHERE t.tgrelid = p_inbox.table_rel
           AND t.tgname = ANY (ARRAY['mailbox_gap_insert', 'mailbox_gap_update', 'mailbox_gap_delete',
                                     'mailbox_gap_truncate'])
    LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', v_trigger, p_inbox.table_rel::regclass);
    END LOOP;
    IF v_fn IS NOT NULL THEN
        EXECUTE pg_catalog.format('DROP FUNCTION %s', v_fn);
    END IF;
    DELETE FROM mailbox._inbox_gap WHERE inbox_key = p_inbox.inbox_key;
    DELETE FROM mailbox._inbox_gap_touched WHERE inbox_key = p_inbox.inbox_key;
    DELETE FROM mailbox._inbox_gap_head WHERE inbox_key = p_inbox.inbox_key;
    DELETE FROM mailbox._inbox_count WHERE inbox_key = p_inbox.inbox_key;
END
$$;

-- After a settings change (part 34, _inbox_reconfigure): a managed ordered inbox gets its
-- trigger function and triggers (again), and its gaps are recomputed at the next read (every
-- aggregate touched: the columns or positions may have changed); any other inbox has none.
CREATE FUNCTION mailbox._inbox_gap_sync(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_fn text := pg_catalog.format('mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_touch');
    v_table regclass := p_inbox.table_rel;
BEGIN
    PERFORM mailbox._inbox_gap_untrack(p_inbox);
    IF NOT mailbox._inbox_gap_tracked(p_inbox) THEN
        RETURN;
    END IF;
    -- SECURITY DEFINER: it records touched aggregates for any writer of the table (a producer
    -- has no rights on mailbox's tables); it runs as the table's owner, like every generated
    -- function of the inbox, and writes only this inbox's own key
    EXECUTE pg_catalog.format(
        'CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER'
        ' SET search_path = pg_catalog, mailbox, pg_temp AS %s',
        v_fn, pg_catalog.quote_literal(mailbox._inbox_gap_touch_sql(p_inbox)));
    EXECUTE pg_catalog.format('ALTER FUNCTION %s() OWNER TO %I', v_fn, mailbox._inbox_owner(p_inbox));
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s() FROM PUBLIC', v_fn);
    -- not an extension member (pg_dump must dump it with the table's triggers), but dropped
    -- with the extension, triggers and all
    EXECUTE pg_catalog.format('ALTER FUNCTION %s() DEPENDS ON EXTENSION pg_mailbox', v_fn);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s() IS %s', v_fn, pg_catalog.quote_literal(
        'pg_mailbox: records the aggregates whose ordering gaps a statement may change, inbox '
        || p_inbox.inbox_name));
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS mailbox_new_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_update AFTER UPDATE ON %s'
        ' REFERENCING OLD TABLE AS mailbox_old_rows NEW TABLE AS mailbox_new_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS mailbox_old_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_truncate AFTER TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()',
        v_table, v_fn);
    INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids) VALUES (p_inbox.inbox_key, NULL);
END
$$;
