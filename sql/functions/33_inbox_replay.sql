-- Part 33 (replay): replay_inbox_messages (SPEC §3.1), the one rare write of the inbox data
-- plane: it builds its SQL from the catalog and runs it through mailbox._inbox_as_owner
-- (part 35), so the inbox table is touched only with its owner's rights; the table and its
-- columns come from the catalog mapping through format('%I'), every value is a bind parameter.

CREATE FUNCTION mailbox.replay_inbox_messages(p_name text, p_event_ids text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- resets messages (as the table owner) and their leases of any inbox for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_name);
    c jsonb := v_inbox.columns;
    v_set text := '';
    v_unordered text := 'NULL::pg_catalog.text';
    v_result jsonb;
    v_ids text[];
BEGIN
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    PERFORM mailbox._inbox_check_table(v_inbox);
    IF c ? 'error' THEN
        v_set := pg_catalog.format(', %I = NULL', c ->> 'error');
    END IF;
    -- an ordered claim never takes a message without aggregate or sequence: on an ordered
    -- inbox such a message is not replayed, and if one is listed nothing is (55000, below)
    IF v_inbox.ordering_first_sequence IS NOT NULL THEN
        v_unordered := pg_catalog.format(
            '(SELECT t.%1$I::pg_catalog.text FROM %2$I.%3$I AS t WHERE t.%1$I = ANY (%4$s)'
            ' AND (t.%5$I IS NOT NULL OR t.%6$I >= ($1).max_retries) AND (t.%7$I IS NULL OR t.%8$I IS NULL)'
            ' ORDER BY 1 LIMIT 1)',
            c ->> 'event_id', v_inbox.schema_name, v_inbox.table_name,
            mailbox._inbox_param(v_inbox, 'event_id', 3, TRUE), c ->> 'processed_at', c ->> 'retry_count',
            c ->> 'aggregate_id', c ->> 'sequence_num');
    END IF;
    v_result := mailbox._inbox_as_owner(v_inbox, pg_catalog.format(
        'WITH u AS (SELECT %8$s AS id),'
        ' r AS (UPDATE %1$I.%2$I AS t SET %3$I = NULL, %4$I = 0%5$s'
        ' WHERE t.%6$I = ANY (%7$s) AND (t.%3$I IS NOT NULL OR t.%4$I >= ($1).max_retries)'
        ' AND (SELECT u.id FROM u) IS NULL'
        ' RETURNING t.%6$I::pg_catalog.text AS id)'
        ' SELECT pg_catalog.jsonb_build_object(''ids'', coalesce(pg_catalog.jsonb_agg(r.id), ''[]''),'
        ' ''unordered'', (SELECT u.id FROM u)) FROM r',
        v_inbox.schema_name, v_inbox.table_name, c ->> 'processed_at', c ->> 'retry_count', v_set,
        c ->> 'event_id', mailbox._inbox_param(v_inbox, 'event_id', 3, TRUE), v_unordered), NULL, p_event_ids);
    IF v_result ->> 'unordered' IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % is ordered: a message without aggregate or sequence cannot be replayed', p_name
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('An ordered claim takes only messages with both (%s and %s); %s lacks one. Nothing was replayed.',
                                             c ->> 'aggregate_id', c ->> 'sequence_num', v_result ->> 'unordered'),
                  HINT = 'Give it an aggregate and a sequence, or disable ordering, then replay it; or leave it out.';
    END IF;
    SELECT coalesce(pg_catalog.array_agg(x.id ORDER BY x.id), ARRAY[]::text[]) INTO v_ids
      FROM pg_catalog.jsonb_array_elements_text(v_result -> 'ids') AS x (id);
    IF pg_catalog.cardinality(v_ids) > 0 THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = ANY (v_ids);
        PERFORM mailbox._inbox_unclaim(v_inbox.inbox_key, v_ids);
        PERFORM mailbox._alert('inbox_replay', pg_catalog.jsonb_build_object(
            'inbox', p_name, 'count', pg_catalog.cardinality(v_ids),
            'event_ids', pg_catalog.to_jsonb(v_ids[1:100])));
    END IF;
    RETURN pg_catalog.cardinality(v_ids);
END
$$;
COMMENT ON FUNCTION mailbox.replay_inbox_messages(text, text[]) IS
'reset processed or dead-lettered messages (by id) so they are processed again; alerts inbox_replay';
