-- Part 38: inbox health and status (SPEC §3.1), and the retention drain of one inbox.
--
-- Each reads (or deletes from) the inbox's own table under its current name (after a rename
-- too; see part 30) with the table owner's rights, through mailbox._inbox_as_owner. What
-- comes back is data the table owner could have chosen: counts reported as they are, and ids
-- that are only ever bind parameters for this inbox's own leases.

-- One inbox's counts as jsonb: pending, dead, processed, oldest_age; with p_detail also
-- avg_sec and last_minute (processed in the last hour / minute), in_flight, and for an
-- ordered inbox blocked (aggregates behind a dead letter) and gaps. NULL when the table was
-- dropped.
CREATE FUNCTION mailbox._inbox_counts(p_inbox mailbox._inbox, p_detail boolean)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_current_table(p_inbox);
    v_proc text := mailbox._inbox_col(c, 'processed_at');
    v_retry text := mailbox._inbox_col(c, 'retry_count');
    v_recv text := mailbox._inbox_col(c, 'received_at');
    v_sql text := 'SELECT pg_catalog.jsonb_build_object(''pending'', u.pending, ''dead'', u.dead,'
                  ' ''processed'', u.processed, ''oldest_age'', u.oldest_age)';
    v_from text;
    v_gaps int;
    v_kept bigint[];
BEGIN
    IF v_table IS NULL THEN
        RETURN NULL;
    END IF;
    -- a managed ordered inbox keeps its gaps and counts (part 34, gap fold): fold first, then
    -- the kept gaps are counted by index and the kept counts are current
    -- (docs/inbox-ordering.md, "How gaps are kept"); any other ordered inbox lists its gaps
    IF p_detail AND p_inbox.ordering_first_sequence IS NOT NULL THEN
        IF mailbox._inbox_gap_tracked(p_inbox) AND mailbox._inbox_gap_refresh(p_inbox) THEN
            SELECT pg_catalog.count(*) INTO v_gaps FROM mailbox._inbox_gap AS g WHERE g.inbox_key = p_inbox.inbox_key;
        ELSE
            v_gaps := pg_catalog.jsonb_array_length(mailbox._inbox_gap_list(p_inbox));
        END IF;
    END IF;
    IF mailbox._inbox_gap_tracked(p_inbox) THEN
        SELECT ARRAY[(k.c ->> 'unprocessed')::bigint, (k.c ->> 'processed')::bigint] INTO v_kept
          FROM (SELECT mailbox._inbox_kept_counts(p_inbox) AS c) AS k;
    END IF;
    IF p_inbox.is_managed THEN
        -- a managed table's retry_count is NOT NULL, so pending = unprocessed - dead; each count
        -- is its own index-only scan (pending, dead-letter and processed partial indexes; the
        -- dead-letter one was made with max_retries written in, hence the literal)
        v_from := pg_catalog.format(
            ' FROM (SELECT c.unprocessed - c.dead AS pending, c.dead, c.processed, c.oldest_age FROM (SELECT'
            ' %6$s AS unprocessed,'
            ' (SELECT pg_catalog.count(*) FROM %1$s AS t WHERE %2$s IS NULL AND %3$s >= %5$s) AS dead,'
            ' %7$s AS processed,'
            ' (SELECT pg_catalog.date_part(''epoch'', pg_catalog.now() - %4$s::pg_catalog.timestamptz) FROM %1$s AS t'
            ' WHERE %2$s IS NULL AND %3$s < %5$s AND %4$s IS NOT NULL ORDER BY %4$s LIMIT 1) AS oldest_age) AS c) AS u',
            v_table, v_proc, v_retry, v_recv, p_inbox.max_retries,
            CASE WHEN v_kept IS NULL THEN pg_catalog.format('(SELECT pg_catalog.count(*) FROM %s AS t WHERE %s IS NULL)',
                                                            v_table, v_proc) ELSE '$2[1]' END,
            CASE WHEN v_kept IS NULL THEN pg_catalog.format('(SELECT pg_catalog.count(*) FROM %s AS t WHERE %s IS NOT NULL)',
                                                            v_table, v_proc) ELSE '$2[2]' END);
    ELSE
        v_from := pg_catalog.format(
            ' FROM (SELECT pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s < ($1).max_retries) AS pending,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s >= ($1).max_retries) AS dead,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NOT NULL) AS processed,'
            ' pg_catalog.date_part(''epoch'', pg_catalog.now() - pg_catalog.min(%4$s::pg_catalog.timestamptz)'
            ' FILTER (WHERE %2$s IS NULL AND %3$s < ($1).max_retries)) AS oldest_age FROM %1$s AS t) AS u',
            v_table, v_proc, v_retry, v_recv);
    END IF;
    IF p_detail THEN
        v_sql := v_sql || pg_catalog.format(
            ' || (SELECT pg_catalog.jsonb_build_object(''avg_sec'', pg_catalog.avg(pg_catalog.date_part(''epoch'','
            ' %2$s::pg_catalog.timestamptz - %4$s::pg_catalog.timestamptz)), ''last_minute'','
            ' pg_catalog.count(*) FILTER (WHERE %2$s >= pg_catalog.now() - interval ''1 minute''))'
            ' FROM %1$s AS t WHERE %2$s >= pg_catalog.now() - interval ''1 hour'')'
            ' || pg_catalog.jsonb_build_object(''in_flight'', (SELECT pg_catalog.count(*) FROM mailbox.%5$I AS l'
            ' WHERE l.lease_until > pg_catalog.clock_timestamp() AND EXISTS (SELECT 1 FROM %1$s AS t'
            ' WHERE %6$s = %7$s AND %2$s IS NULL AND %3$s < ($1).max_retries)))',
            v_table, v_proc, v_retry, v_recv, '_inbox_' || p_inbox.inbox_key || '_lease',
            mailbox._inbox_col(c, 'event_id'),
            CASE WHEN p_inbox.casts ? 'event_id'
                 THEN pg_catalog.format('CAST(l.event_id AS %s)', p_inbox.casts ->> 'event_id')
                 ELSE 'l.event_id' END);
        IF p_inbox.ordering_first_sequence IS NOT NULL THEN
            -- a dead letter at or before an aggregate's next position blocks that aggregate
            v_sql := v_sql || pg_catalog.format(
                ' || pg_catalog.jsonb_build_object(''blocked'', (SELECT pg_catalog.count(DISTINCT %4$s)'
                ' FROM %1$s AS t WHERE %2$s IS NULL AND %3$s AND %4$s IS NOT NULL'
                ' AND %5$s <= coalesce((SELECT s.last_seq FROM mailbox.%6$I AS s'
                ' WHERE s.aggregate_id = %4$s::pg_catalog.text), ($1).ordering_first_sequence - 1) + 1))',
                v_table, v_proc,
                CASE WHEN p_inbox.is_managed THEN pg_catalog.format('%s >= %s', v_retry, p_inbox.max_retries)
                     ELSE pg_catalog.format('%s >= ($1).max_retries', v_retry) END,
                mailbox._inbox_col(c, 'aggregate_id'), mailbox._inbox_col(c, 'sequence_num'),
                '_inbox_' || p_inbox.inbox_key || '_aggregate');
            -- the gaps themselves, counted above
            RETURN mailbox._inbox_as_owner(p_inbox, v_sql || v_from, v_kept)
                   || pg_catalog.jsonb_build_object('gaps', v_gaps);
        END IF;
    END IF;
    RETURN mailbox._inbox_as_owner(p_inbox, v_sql || v_from, v_kept);
END
$$;

-- Deletes up to p_batch rows of the inbox table that retention lets go: processed more than
-- p_hours ago, or (p_dead) dead letters received more than p_hours ago, skipping rows locked
-- by a worker; then their leases. Returns how many rows it deleted (0 for a dropped table).
CREATE FUNCTION mailbox._inbox_drain(p_inbox mailbox._inbox, p_dead boolean, p_hours int, p_batch int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_current_table(p_inbox);
    v_proc text := mailbox._inbox_col(c, 'processed_at');
    v_ids text[];
BEGIN
    IF v_table IS NULL THEN
        RETURN 0;
    END IF;
    SELECT coalesce(pg_catalog.array_agg(x.id), ARRAY[]::text[]) INTO v_ids
      FROM pg_catalog.jsonb_array_elements_text(mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'WITH doomed AS (SELECT %2$s AS key FROM %1$s AS t WHERE %3$s'
        ' LIMIT $2[2] FOR UPDATE OF t SKIP LOCKED),'
        ' gone AS (DELETE FROM %1$s AS t USING doomed WHERE %2$s = doomed.key'
        ' RETURNING doomed.key::pg_catalog.text AS id)'
        ' SELECT coalesce(pg_catalog.jsonb_agg(gone.id), ''[]'') FROM gone',
        v_table, mailbox._inbox_col(c, 'event_id'),
        CASE WHEN p_dead
             THEN pg_catalog.format('%1$s IS NULL AND %2$s >= ($1).max_retries AND %3$s < pg_catalog.now()'
                                    ' - pg_catalog.make_interval(hours => $2[1]::pg_catalog.int4)',
                                    v_proc, mailbox._inbox_col(c, 'retry_count'), mailbox._inbox_col(c, 'received_at'))
             ELSE pg_catalog.format('%1$s IS NOT NULL AND %1$s < pg_catalog.now()'
                                    ' - pg_catalog.make_interval(hours => $2[1]::pg_catalog.int4)', v_proc) END),
        ARRAY[p_hours, p_batch]::bigint[])) AS x (id);
    IF pg_catalog.cardinality(v_ids) > 0 THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = ANY (v_ids);
    END IF;
    RETURN pg_catalog.cardinality(v_ids);
END
$$;

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
SECURITY DEFINER -- reads any inbox table (as its owner) and the extension catalogs for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._unwrap(mailbox._inbox_health_py(p_name));
$$;
COMMENT ON FUNCTION mailbox.inbox_health(text) IS
'counts and health (healthy, degraded, critical) of one inbox as jsonb (see docs/inbox.md)';

CREATE FUNCTION mailbox.inbox_status(p_name text DEFAULT NULL)
RETURNS TABLE (
    inbox_name text, inbox_schema text, table_name text, max_retries int, pending_count bigint,
    dead_letter_count bigint, processed_count bigint, is_managed boolean, ordering boolean, priority boolean,
    created_at timestamptz
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads any inbox table (as its owner) and the catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_table text;
    v_counts jsonb;
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
            -- read with the table owner's rights; listing every inbox, one whose table (or
            -- generated function) fails is shown with NULL counts and a WARNING, not an error
            BEGIN
                v_counts := mailbox._inbox_counts(v_inbox, FALSE);
            EXCEPTION WHEN OTHERS THEN
                IF p_name IS NOT NULL THEN
                    RAISE;
                END IF;
                RAISE WARNING 'counting messages of inbox % failed: %', v_inbox.inbox_name, SQLERRM
                    USING HINT = pg_catalog.format('SELECT * FROM mailbox.inbox_status(%s) shows the error.',
                                                   pg_catalog.quote_literal(v_inbox.inbox_name));
                v_counts := NULL;
            END;
            pending_count := (v_counts ->> 'pending')::bigint;
            dead_letter_count := (v_counts ->> 'dead')::bigint;
            processed_count := (v_counts ->> 'processed')::bigint;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_status(text) IS
'every inbox (or one) with its table, settings and message counts';
