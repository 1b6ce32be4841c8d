-- Part 33 (replay): replay_inbox_messages (SPEC §3.1), the one rare write of the inbox data
-- plane: it builds its SQL from the catalog and runs it through mailbox._inbox_as_owner
-- (part 35), so the inbox table is touched only with its owner's rights; the table and its
-- columns come from the catalog mapping through format('%I'), every value is a bind parameter.

CREATE FUNCTION mailbox.replay_inbox_messages(p_name text, p_event_ids text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- resets messages (as the table owner) and their leases of any inbox for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_name);
    c jsonb := v_inbox.columns;
    v_set text := '';
    v_ids text[];
BEGIN
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    PERFORM mailbox._inbox_check_table(v_inbox);
    IF c ? 'error' THEN
        v_set := pg_catalog.format(', %I = NULL', c ->> 'error');
    END IF;
    SELECT coalesce(pg_catalog.array_agg(x.id ORDER BY x.id), ARRAY[]::text[]) INTO v_ids
      FROM pg_catalog.jsonb_array_elements_text(mailbox._inbox_as_owner(v_inbox, pg_catalog.format(
        'WITH r AS (UPDATE %1$I.%2$I AS t SET %3$I = NULL, %4$I = 0%5$s'
        ' WHERE t.%6$I = ANY (%7$s) AND (t.%3$I IS NOT NULL OR t.%4$I >= ($1).max_retries)'
        ' RETURNING t.%6$I::pg_catalog.text AS id)'
        ' SELECT coalesce(pg_catalog.jsonb_agg(r.id), ''[]'') FROM r',
        v_inbox.schema_name, v_inbox.table_name, c ->> 'processed_at', c ->> 'retry_count', v_set,
        c ->> 'event_id', mailbox._inbox_param(v_inbox, 'event_id', 3, TRUE)), NULL, p_event_ids)) AS x (id);
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
