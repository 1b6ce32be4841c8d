-- Part 38: inbox health and status (SPEC §3.1).

CREATE FUNCTION mailbox._inbox_health_py(p_name text)
RETURNS jsonb
LANGUAGE plpython3u STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "@EXTVERSION@":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, inbox_health
return errors.envelope(plpy, inbox_health.inbox_health, p_name)
$$;

CREATE FUNCTION mailbox.inbox_health(p_name text)
RETURNS jsonb
LANGUAGE sql STABLE
SECURITY DEFINER -- reads any inbox table and the extension catalogs for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._unwrap(mailbox._inbox_health_py(p_name));
$$;
COMMENT ON FUNCTION mailbox.inbox_health(text) IS
'counts and health (healthy, degraded, critical) of one inbox as jsonb (see docs/inbox.md)';
GRANT EXECUTE ON FUNCTION mailbox.inbox_health(text) TO mailbox_admin;

CREATE FUNCTION mailbox.inbox_status(p_name text DEFAULT NULL)
RETURNS TABLE (
    inbox_name text, inbox_schema text, table_name text, max_retries int, pending_count bigint,
    dead_letter_count bigint, processed_count bigint, is_managed boolean, ordering boolean, priority boolean,
    created_at timestamptz
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads any inbox table and the catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_table text;
BEGIN
    IF p_name IS NOT NULL THEN
        PERFORM mailbox._inbox_get(p_name); -- 42704 for an unknown inbox
    END IF;
    FOR v_inbox IN
        SELECT * FROM mailbox._inbox AS i WHERE p_name IS NULL OR i.inbox_name = p_name ORDER BY i.inbox_name
    LOOP
        -- the inbox's own table (table_rel) under its current name: after a rename another
        -- table may carry the stored name (the per-message functions then refuse, 55000)
        v_table := NULL;
        SELECT c.relname, pg_catalog.format('%I.%I', n.nspname, c.relname) INTO table_name, v_table
          FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
         WHERE c.oid = v_inbox.table_rel;
        inbox_name := v_inbox.inbox_name;
        inbox_schema := v_inbox.schema_name;
        table_name := coalesce(table_name, v_inbox.table_name);
        max_retries := v_inbox.max_retries;
        is_managed := v_inbox.is_managed;
        ordering := v_inbox.ordering_first_sequence IS NOT NULL;
        priority := v_inbox.priority_tiers IS NOT NULL;
        created_at := v_inbox.created_at;
        pending_count := NULL;
        dead_letter_count := NULL;
        processed_count := NULL;
        IF v_table IS NOT NULL THEN -- NULL counts when the table was dropped by hand
            EXECUTE pg_catalog.format(
                'SELECT pg_catalog.count(*) FILTER (WHERE t.%1$I IS NULL AND t.%2$I < $1),'
                ' pg_catalog.count(*) FILTER (WHERE t.%1$I IS NULL AND t.%2$I >= $1),'
                ' pg_catalog.count(*) FILTER (WHERE t.%1$I IS NOT NULL) FROM %3$s AS t',
                v_inbox.columns ->> 'processed_at', v_inbox.columns ->> 'retry_count', v_table)
                INTO pending_count, dead_letter_count, processed_count
                USING v_inbox.max_retries;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_status(text) IS
'every inbox (or one) with its table, settings and message counts';
GRANT EXECUTE ON FUNCTION mailbox.inbox_status(text) TO mailbox_admin;
