-- Part 31: the views of an inbox, always built from its catalog row and column mapping.
--
-- pending_<i>, dlq_<i>, stats_<i>, next_<i> and gaps_<i> (ordering), pending_<i>_<tier>
-- (priority) live in the inbox table's schema and are OWNED BY THE TABLE'S OWNER: a view
-- reads its tables with its owner's rights, so a view owned by the extension owner (a
-- superuser) would read past the table's row-level security. They read the inbox's settings
-- and ordering state through two of the three per-inbox views below (in schema mailbox,
-- owned by the extension owner, security barriers that show only that inbox's rows, and
-- readable by the table owner alone), which (a) keeps them current without rebuilding and
-- (b) makes them depend on the extension: DROP EXTENSION refuses while they exist and
-- DROP EXTENSION ... CASCADE drops them, so no view outlives pg_mailbox (docs/inbox.md).
-- inbox_key is an integer from the catalog, never caller text, so it is formatted with %s.

-- The per-inbox views of the inbox's own rows of the extension's tables, for the views above
-- and the generated functions (part 35), which run as the table owner. The table owner gets
-- SELECT on them (and USAGE on schema mailbox, which holds nothing else it may use).
-- The lease view alone is also re-made by an upgrade (regenerate.sql): no view of
-- pg_mailbox reads it, so it can gain columns (aggregate_id: the aggregate a lease carries,
-- which ordered claims probe, part 35, builders).
CREATE FUNCTION mailbox._inbox_create_lease_view(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_view text := '_inbox_' || p_inbox.inbox_key || '_lease';
    v_owner name := mailbox._inbox_owner(p_inbox);
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I WITH (security_barrier) AS SELECT l.event_id, l.lease_until, l.next_attempt_at,'
        ' l.aggregate_id FROM mailbox._inbox_lease AS l WHERE l.inbox_key = %s', v_view, p_inbox.inbox_key);
    IF v_owner <> CURRENT_USER THEN
        EXECUTE pg_catalog.format('GRANT SELECT ON mailbox.%I TO %I', v_view, v_owner);
    END IF;
END
$$;

CREATE FUNCTION mailbox._inbox_create_state_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_prefix text := '_inbox_' || p_inbox.inbox_key || '_';
    v_owner name := mailbox._inbox_owner(p_inbox);
BEGIN
    PERFORM mailbox._inbox_create_lease_view(p_inbox);
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I WITH (security_barrier) AS SELECT a.aggregate_id, a.last_seq'
        ' FROM mailbox._inbox_aggregate AS a WHERE a.inbox_key = %s', v_prefix || 'aggregate', p_inbox.inbox_key);
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I WITH (security_barrier) AS SELECT i.max_retries, i.ordering_first_sequence'
        ' FROM mailbox._inbox AS i WHERE i.inbox_key = %s', v_prefix || 'config', p_inbox.inbox_key);
    IF v_owner <> CURRENT_USER THEN
        EXECUTE pg_catalog.format('GRANT SELECT ON mailbox.%I, mailbox.%I TO %I',
                                  v_prefix || 'aggregate', v_prefix || 'config', v_owner);
        IF NOT pg_catalog.has_schema_privilege(v_owner, 'mailbox', 'USAGE') THEN
            EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA mailbox TO %I', v_owner);
        END IF;
    END IF;
END
$$;

CREATE FUNCTION mailbox._inbox_drop_state_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_kind text;
BEGIN
    -- the lease view first: a worker's claim reads it before its marks read the config
    -- view (adopted tables), so a drop waits for the claim's transaction holding no other
    FOREACH v_kind IN ARRAY ARRAY['lease', 'aggregate', 'config'] LOOP
        EXECUTE pg_catalog.format('DROP VIEW IF EXISTS mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_' || v_kind);
    END LOOP;
END
$$;

CREATE FUNCTION mailbox._inbox_view_names(p_inbox mailbox._inbox)
RETURNS text[]
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT ARRAY(SELECT 'pending_' || p_inbox.inbox_name || '_' || (tier ->> 'name')
                   FROM pg_catalog.jsonb_array_elements(coalesce(p_inbox.priority_tiers, '[]')) AS tier)
           || ARRAY['next_' || p_inbox.inbox_name, 'gaps_' || p_inbox.inbox_name,
                    'stats_' || p_inbox.inbox_name, 'dlq_' || p_inbox.inbox_name,
                    'pending_' || p_inbox.inbox_name];
$$;

CREATE FUNCTION mailbox._inbox_drop_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_view text;
BEGIN
    FOREACH v_view IN ARRAY mailbox._inbox_view_names(p_inbox) LOOP
        -- only views that read this inbox's settings view are ours to drop
        IF EXISTS (
            SELECT 1 FROM pg_catalog.pg_class AS c
              JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
             WHERE n.nspname = p_inbox.schema_name AND c.relname = v_view AND c.relkind = 'v'
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                             JOIN pg_catalog.pg_rewrite AS r ON r.oid = d.objid
                            WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND r.ev_class = c.oid
                              AND d.refobjid = pg_catalog.to_regclass(
                                      pg_catalog.format('mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_config')))
        ) THEN
            EXECUTE pg_catalog.format('DROP VIEW %I.%I', p_inbox.schema_name, v_view);
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION mailbox._inbox_create_view(p_inbox mailbox._inbox, p_view text, p_query text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_inbox.schema_name, p_view)) IS NOT NULL THEN
        RAISE EXCEPTION 'relation already exists: %', pg_catalog.format('%I.%I', p_inbox.schema_name, p_view)
            USING ERRCODE = '42710',
                  DETAIL = pg_catalog.format('Inbox %s needs this name for one of its views.', p_inbox.inbox_name),
                  HINT = 'Rename or drop that relation, or choose another inbox name.';
    END IF;
    EXECUTE pg_catalog.format('CREATE VIEW %I.%I AS %s', p_inbox.schema_name, p_view, p_query);
    EXECUTE pg_catalog.format('ALTER VIEW %I.%I OWNER TO %I', p_inbox.schema_name, p_view,
                              mailbox._inbox_owner(p_inbox));
    EXECUTE pg_catalog.format('COMMENT ON VIEW %I.%I IS %s', p_inbox.schema_name, p_view,
                              pg_catalog.quote_literal('pg_mailbox view of inbox ' || p_inbox.inbox_name));
    EXECUTE pg_catalog.format('GRANT SELECT ON %I.%I TO mailbox_admin', p_inbox.schema_name, p_view);
    EXECUTE pg_catalog.format('GRANT SELECT ON %I.%I TO mailbox_consumer', p_inbox.schema_name, p_view);
END
$$;

-- The SQL of next_<i> (ordering on): per aggregate with unprocessed messages, its lowest
-- unprocessed sequence, found by a skip scan over (aggregate, sequence) of unprocessed rows;
-- that message is the head when it is pending (not a dead letter) and its sequence is at most
-- last processed + 1. A hole or a dead-lettered predecessor therefore blocks the aggregate.
CREATE FUNCTION mailbox._inbox_next_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_table_sql(p_inbox);
    v_agg text := pg_catalog.quote_ident(c ->> 'aggregate_id');
    v_seq text := pg_catalog.quote_ident(c ->> 'sequence_num');
    v_proc text := pg_catalog.quote_ident(c ->> 'processed_at');
    v_retry text := pg_catalog.quote_ident(c ->> 'retry_count');
    v_id text := pg_catalog.quote_ident(c ->> 'event_id');
BEGIN
    RETURN pg_catalog.format($q$
WITH RECURSIVE heads AS (
    (SELECT t.%1$s AS agg, t.%2$s AS seq FROM %3$s AS t
      WHERE t.%4$s IS NULL AND t.%1$s IS NOT NULL AND t.%2$s IS NOT NULL
      ORDER BY t.%1$s, t.%2$s LIMIT 1)
    UNION ALL
    SELECT n.agg, n.seq FROM heads AS h CROSS JOIN LATERAL (
        SELECT t.%1$s AS agg, t.%2$s AS seq FROM %3$s AS t
         WHERE t.%4$s IS NULL AND t.%1$s IS NOT NULL AND t.%2$s IS NOT NULL AND t.%1$s > h.agg
         ORDER BY t.%1$s, t.%2$s LIMIT 1) AS n
)
SELECT m.* FROM heads AS h
 CROSS JOIN mailbox.%6$I AS cfg
 CROSS JOIN LATERAL (SELECT t.* FROM %3$s AS t
                      WHERE t.%1$s = h.agg AND t.%2$s = h.seq AND t.%4$s IS NULL
                      ORDER BY t.%7$s LIMIT 1) AS m
 WHERE h.seq <= coalesce((SELECT s.last_seq FROM mailbox.%8$I AS s WHERE s.aggregate_id = h.agg::text),
                         cfg.ordering_first_sequence - 1) + 1
   AND m.%5$s < cfg.max_retries$q$,
        v_agg, v_seq, v_table, v_proc, v_retry, '_inbox_' || p_inbox.inbox_key || '_config', v_id,
        '_inbox_' || p_inbox.inbox_key || '_aggregate');
END
$$;

-- The per-inbox state views are security barriers, which a join cannot see into: they are
-- read by scalar subqueries (one primary-key lookup each) in next_<i> and gaps_<i>.

-- "WITH RECURSIVE aggs AS (...)" over the table p_table: every aggregate with an unprocessed
-- sequenced message, one index probe each (a skip scan of the ordering index).
CREATE FUNCTION mailbox._inbox_pending_aggs_sql(p_inbox mailbox._inbox, p_table text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT pg_catalog.format($a$
WITH RECURSIVE aggs AS (
    (SELECT t.%1$I AS agg FROM %3$s AS t
      WHERE t.%4$I IS NULL AND t.%1$I IS NOT NULL AND t.%2$I IS NOT NULL
      ORDER BY t.%1$I LIMIT 1)
    UNION ALL
    SELECT n.agg FROM aggs AS a CROSS JOIN LATERAL (
        SELECT t.%1$I AS agg FROM %3$s AS t
         WHERE t.%4$I IS NULL AND t.%1$I IS NOT NULL AND t.%2$I IS NOT NULL AND t.%1$I > a.agg
         ORDER BY t.%1$I LIMIT 1) AS n
)$a$, p_inbox.columns ->> 'aggregate_id', p_inbox.columns ->> 'sequence_num',
          p_table, p_inbox.columns ->> 'processed_at');
$$;

-- The SQL of gaps_<i>: every hole in each aggregate's sequence, counting from the last
-- processed sequence, among its unprocessed messages (dead letters are not holes). p_table
-- is the table's name when it differs from the stored one (the control plane after a rename).
CREATE FUNCTION mailbox._inbox_gaps_sql(p_inbox mailbox._inbox, p_table text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := coalesce(p_table, mailbox._inbox_table_sql(p_inbox));
BEGIN
    RETURN mailbox._inbox_pending_aggs_sql(p_inbox, v_table) || pg_catalog.format($q$
SELECT a.agg::text AS aggregate_id, x.prev + 1 AS expected_seq, x.seq AS found_seq,
       pg_catalog.date_part('epoch', pg_catalog.now() - x.recv) AS gap_age_sec
  FROM aggs AS a
 CROSS JOIN mailbox.%6$I AS cfg
 CROSS JOIN LATERAL (SELECT coalesce((SELECT s.last_seq FROM mailbox.%7$I AS s WHERE s.aggregate_id = a.agg::text),
                                     cfg.ordering_first_sequence - 1) AS last_seq) AS s
 CROSS JOIN LATERAL (
        SELECT t.%2$I::bigint AS seq, t.%5$I::timestamptz AS recv,
               coalesce(pg_catalog.lag(t.%2$I::bigint) OVER (ORDER BY t.%2$I), s.last_seq) AS prev
          FROM %3$s AS t
         WHERE t.%1$I = a.agg AND t.%4$I IS NULL AND t.%2$I > s.last_seq) AS x
 WHERE x.seq > x.prev + 1$q$,
        c ->> 'aggregate_id', c ->> 'sequence_num', v_table, c ->> 'processed_at', c ->> 'received_at',
        '_inbox_' || p_inbox.inbox_key || '_config', '_inbox_' || p_inbox.inbox_key || '_aggregate');
END
$$;

-- (Re)creates every view the catalog row calls for. Callers drop the old ones first.
CREATE FUNCTION mailbox._inbox_create_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_table_sql(p_inbox);
    v_proc text := mailbox._inbox_col(c, 'processed_at');
    v_retry text := mailbox._inbox_col(c, 'retry_count');
    v_max text := pg_catalog.format('(SELECT i.max_retries FROM mailbox.%I AS i)',
                                    '_inbox_' || p_inbox.inbox_key || '_config');
    v_tier jsonb;
BEGIN
    PERFORM mailbox._inbox_create_view(p_inbox, 'pending_' || p_inbox.inbox_name,
        pg_catalog.format('SELECT t.* FROM %s AS t WHERE %s IS NULL AND %s < %s', v_table, v_proc, v_retry, v_max));
    IF p_inbox.with_dead_letter THEN
        PERFORM mailbox._inbox_create_view(p_inbox, 'dlq_' || p_inbox.inbox_name,
            pg_catalog.format('SELECT t.* FROM %s AS t WHERE %s IS NULL AND %s >= %s', v_table, v_proc, v_retry, v_max));
    END IF;
    IF p_inbox.with_stats THEN
        PERFORM mailbox._inbox_create_view(p_inbox, 'stats_' || p_inbox.inbox_name, pg_catalog.format(
            'SELECT %1$s AS event_type,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s < cfg.max_retries) AS pending_count,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NOT NULL) AS processed_count,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s >= cfg.max_retries) AS dead_letter_count,'
            ' pg_catalog.avg(pg_catalog.date_part(''epoch'', %2$s::timestamptz - %4$s::timestamptz))'
            '   FILTER (WHERE %2$s IS NOT NULL) AS avg_processing_seconds'
            ' FROM %5$s AS t CROSS JOIN mailbox.%6$I AS cfg'
            ' GROUP BY 1',
            mailbox._inbox_item(c, 'event_type', 'text'), v_proc, v_retry, mailbox._inbox_col(c, 'received_at'),
            v_table, '_inbox_' || p_inbox.inbox_key || '_config'));
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        PERFORM mailbox._inbox_create_view(p_inbox, 'next_' || p_inbox.inbox_name, mailbox._inbox_next_sql(p_inbox));
        PERFORM mailbox._inbox_create_view(p_inbox, 'gaps_' || p_inbox.inbox_name, mailbox._inbox_gaps_sql(p_inbox));
    END IF;
    IF p_inbox.priority_tiers IS NOT NULL THEN
        FOR v_tier IN SELECT tier FROM pg_catalog.jsonb_array_elements(p_inbox.priority_tiers) AS tier LOOP
            -- tier bounds are validated integers; the tier name a validated identifier
            PERFORM mailbox._inbox_create_view(p_inbox, 'pending_' || p_inbox.inbox_name || '_' || (v_tier ->> 'name'),
                pg_catalog.format('SELECT t.* FROM %s AS t WHERE %s IS NULL AND %s < %s AND %s BETWEEN %s AND %s',
                                  v_table, v_proc, v_retry, v_max, mailbox._inbox_col(c, 'priority'),
                                  (v_tier ->> 'min')::bigint, (v_tier ->> 'max')::bigint));
        END LOOP;
    END IF;
END
$$;
