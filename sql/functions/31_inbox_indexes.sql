-- Part 31 (indexes): the indexes of a managed inbox table. Adopted tables are left alone:
-- indexing them is their owner's call (docs/inbox.md, enable_inbox_tracking).

-- The indexes every managed inbox table has: pending messages in claim order, dead letters,
-- and processed rows (retention, throughput).
CREATE FUNCTION mailbox._inbox_base_indexes(p_schema text, p_name text, p_max_retries int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    EXECUTE pg_catalog.format('CREATE INDEX %I ON %I.%I (received_at) WHERE processed_at IS NULL',
                              p_name || '_pending_idx', p_schema, p_name);
    EXECUTE pg_catalog.format(
        'CREATE INDEX %I ON %I.%I (received_at) WHERE processed_at IS NULL AND retry_count >= %s',
        p_name || '_dlq_idx', p_schema, p_name, p_max_retries);
    EXECUTE pg_catalog.format('CREATE INDEX %I ON %I.%I (processed_at) WHERE processed_at IS NOT NULL',
                              p_name || '_processed_idx', p_schema, p_name);
END
$$;

-- The indexes a managed inbox table gets for its current settings: ordering and priority.
CREATE FUNCTION mailbox._inbox_sync_indexes(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_ordering text := p_inbox.table_name || '_ordering_idx';
    v_priority text := p_inbox.table_name || '_priority_idx';
BEGIN
    IF NOT p_inbox.is_managed THEN
        RETURN;
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'CREATE INDEX IF NOT EXISTS %I ON %I.%I (%I, %I) INCLUDE (%I) WHERE %I IS NULL',
            v_ordering, p_inbox.schema_name, p_inbox.table_name, c ->> 'aggregate_id', c ->> 'sequence_num',
            c ->> 'received_at', c ->> 'processed_at');
    ELSIF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_inbox.schema_name, v_ordering)) IS NOT NULL THEN
        EXECUTE pg_catalog.format('DROP INDEX %I.%I', p_inbox.schema_name, v_ordering);
    END IF;
    IF p_inbox.priority_tiers IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'CREATE INDEX IF NOT EXISTS %I ON %I.%I (%I, %I) WHERE %I IS NULL',
            v_priority, p_inbox.schema_name, p_inbox.table_name, c ->> 'priority', c ->> 'received_at',
            c ->> 'processed_at');
    ELSIF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_inbox.schema_name, v_priority)) IS NOT NULL THEN
        EXECUTE pg_catalog.format('DROP INDEX %I.%I', p_inbox.schema_name, v_priority);
    END IF;
END
$$;
