-- Part 34 (gap fold): reading the gap state of a managed ordered inbox (part 34, gap state,
-- says how it is kept and why it is correct under concurrency). A fold takes the touched
-- rows, adds their count changes to mailbox._inbox_count, and reads the table again only for
-- the aggregates they name: an aggregate that only INSERTs touched, every one of them above
-- its head (mailbox._inbox_gap_head: its highest unprocessed sequence at the last fold), is
-- read from its head on and keeps its stored gaps (appending costs what was appended); any
-- other touched aggregate is read from its position, its gaps and head replaced.

-- The fold's read of the inbox table (run as its owner): for each aggregate of $3 (or, with
-- p_all, each aggregate with an unprocessed sequenced message), its unprocessed sequences above
-- a start, $2 (the aggregate's highest sequence at the last fold when only sequences above it
-- were added since), or where $2 is NULL its position (last processed, else first - 1). One row
-- per gap above the start (g) and one for the highest sequence (h, the aggregate's new head),
-- as a jsonb array of {a, e, f, r, g, h}.
CREATE FUNCTION mailbox._inbox_gap_scan_sql(p_inbox mailbox._inbox, p_all boolean, p_write boolean)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_aggs text;
    v_rows text;
BEGIN
    IF p_all THEN
        v_aggs := mailbox._inbox_pending_aggs_sql(p_inbox, mailbox._inbox_current_table(p_inbox)) || ', k AS (SELECT a.agg, NULL::pg_catalog.int8 AS start FROM aggs AS a)';
    ELSE
        -- the aggregates as the column's type, so the ordering index is used
        v_aggs := pg_catalog.format('WITH k AS (SELECT CAST(d.agg AS %s) AS agg, d.start'
                                    ' FROM ROWS FROM (pg_catalog.unnest($3), pg_catalog.unnest($2)) AS d (agg, start))',
                                    (mailbox._inbox_role_column(p_inbox.table_rel, 'aggregate_id',
                                                                c ->> 'aggregate_id')).full_type);
    END IF;
    v_rows := pg_catalog.format($q$
SELECT k.agg::pg_catalog.text AS a, x.prev + 1 AS e, x.seq AS f, x.recv AS r, x.seq > x.prev + 1 AS g, x.last AS h,
       k.start IS NOT NULL AS appended
  FROM k
 CROSS JOIN mailbox.%6$I AS cfg
 CROSS JOIN LATERAL (SELECT coalesce(k.start, (SELECT s.last_seq FROM mailbox.%7$I AS s WHERE s.aggregate_id = k.agg::text),
                                     cfg.ordering_first_sequence - 1) AS start) AS s
 CROSS JOIN LATERAL (
        SELECT t.%2$I::bigint AS seq, t.%5$I::timestamptz AS recv,
               coalesce(pg_catalog.lag(t.%2$I::bigint) OVER (ORDER BY t.%2$I), s.start) AS prev,
               pg_catalog.lead(t.%2$I) OVER (ORDER BY t.%2$I) IS NULL AS last
          FROM %3$s AS t
         WHERE t.%1$I = k.agg AND t.%4$I IS NULL AND t.%2$I > s.start) AS x
 WHERE x.seq > x.prev + 1 OR x.last$q$,
        c ->> 'aggregate_id', c ->> 'sequence_num', mailbox._inbox_current_table(p_inbox), c ->> 'processed_at',
        c ->> 'received_at', '_inbox_' || p_inbox.inbox_key || '_config', '_inbox_' || p_inbox.inbox_key || '_aggregate');
    IF NOT p_write THEN
        RETURN v_aggs || ' SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''a'', y.a, ''e'', y.e,'
               ' ''f'', y.f, ''r'', y.r, ''g'', y.g)), ''[]'') FROM (' || v_rows || ') AS y';
    END IF;
    -- the fold itself (a tracked inbox is managed: its owner is the extension owner): the new
    -- gaps are added, an appended aggregate's head moved, any other's head made anew
    RETURN v_aggs || pg_catalog.format(', y AS MATERIALIZED (%s),'
        ' gi AS (INSERT INTO mailbox._inbox_gap (inbox_key, aggregate_id, expected_seq, found_seq, found_received_at)'
        '        SELECT %2$s, y.a, y.e, y.f, y.r FROM y WHERE y.g RETURNING 1),'
        ' hu AS (UPDATE mailbox._inbox_gap_head AS h SET high_seq = y.f FROM y'
        '         WHERE y.h AND y.appended AND h.inbox_key = %2$s AND h.aggregate_id = y.a RETURNING 1),'
        ' hi AS (INSERT INTO mailbox._inbox_gap_head (inbox_key, aggregate_id, high_seq)'
        '        SELECT %2$s, y.a, y.f FROM y WHERE y.h AND NOT y.appended RETURNING 1)'
        ' SELECT pg_catalog.to_jsonb((SELECT pg_catalog.count(*) FROM gi) + (SELECT pg_catalog.count(*) FROM hu)'
        '                            + (SELECT pg_catalog.count(*) FROM hi))', v_rows, p_inbox.inbox_key);
END
$$;

-- Folds what was touched since the last fold (see above) when it can: returns TRUE when the
-- stored gaps, heads and counts are now current. A caller that cannot fold gets FALSE and
-- computes the answer without writing (_inbox_gap_fold, _inbox_kept_counts).
CREATE FUNCTION mailbox._inbox_gap_refresh(p_inbox mailbox._inbox)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := p_inbox.inbox_key;
    v_all boolean;
    v_recount boolean;
    v_du bigint;
    v_dp bigint;
    v_aggs text[];
    v_mins bigint[];
    v_starts bigint[];
    v_full text[];
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR pg_catalog.current_setting('transaction_read_only') <> 'off'
       -- one fold of an inbox at a time: (7168635, inbox_key), see part 05
       OR NOT pg_catalog.pg_try_advisory_xact_lock(7168635, v_key) THEN
        RETURN FALSE;
    END IF;
    -- 1. what was touched, taken (per aggregate: the lowest sequence added if only INSERTs
    -- touched it, else NULL), and the count changes
    WITH gone AS (DELETE FROM mailbox._inbox_gap_touched AS t WHERE t.inbox_key = v_key
                  RETURNING t.aggregate_ids, t.min_seqs, t.d_unprocessed, t.d_processed),
    per AS (SELECT u.agg, CASE WHEN pg_catalog.bool_and(u.mn IS NOT NULL) THEN pg_catalog.min(u.mn) END AS mn
              FROM gone AS g, ROWS FROM (pg_catalog.unnest(g.aggregate_ids), pg_catalog.unnest(g.min_seqs)) AS u (agg, mn)
             WHERE u.agg IS NOT NULL
             GROUP BY u.agg)
    SELECT coalesce((SELECT pg_catalog.bool_or(g.aggregate_ids IS NULL) FROM gone AS g), FALSE),
           coalesce((SELECT pg_catalog.bool_or(g.d_unprocessed IS NULL OR g.d_processed IS NULL) FROM gone AS g), FALSE),
           (SELECT pg_catalog.sum(g.d_unprocessed) FROM gone AS g), (SELECT pg_catalog.sum(g.d_processed) FROM gone AS g),
           (SELECT pg_catalog.array_agg(p.agg ORDER BY p.agg) FROM per AS p),
           (SELECT pg_catalog.array_agg(p.mn ORDER BY p.agg) FROM per AS p)
      INTO v_all, v_recount, v_du, v_dp, v_aggs, v_mins;
    -- 2. the counts
    IF v_all OR v_recount OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_count AS n WHERE n.inbox_key = v_key) THEN
        INSERT INTO mailbox._inbox_count AS n (inbox_key, unprocessed, processed)
        SELECT v_key, (x.c ->> 'unprocessed')::bigint, (x.c ->> 'processed')::bigint
          FROM (SELECT mailbox._inbox_count_rows(p_inbox, TRUE) AS c) AS x
            ON CONFLICT (inbox_key) DO UPDATE SET unprocessed = excluded.unprocessed, processed = excluded.processed;
    ELSIF v_du <> 0 OR v_dp <> 0 THEN
        UPDATE mailbox._inbox_count AS n SET unprocessed = n.unprocessed + v_du, processed = n.processed + v_dp
         WHERE n.inbox_key = v_key;
    END IF;
    -- 3. the gaps and heads, read in a later statement than the touched rows: it sees every
    -- message they stand for. An aggregate only INSERTs touched, all above its head, is read
    -- from its head on and keeps its gaps; any other is read again from its position.
    IF v_all THEN
        DELETE FROM mailbox._inbox_gap AS g WHERE g.inbox_key = v_key;
        DELETE FROM mailbox._inbox_gap_head AS h WHERE h.inbox_key = v_key;
        PERFORM mailbox._inbox_as_owner(p_inbox, mailbox._inbox_gap_scan_sql(p_inbox, TRUE, TRUE));
    ELSIF v_aggs IS NOT NULL THEN
        -- the head of each (one index probe each), kept as the start when only appended to
        SELECT pg_catalog.array_agg(CASE WHEN u.mn > u.high THEN u.high END ORDER BY u.ord),
               pg_catalog.array_agg(u.agg) FILTER (WHERE NOT coalesce(u.mn > u.high, FALSE))
          INTO v_starts, v_full
          FROM (SELECT u.agg, u.mn, u.ord,
                       (SELECT h.high_seq FROM mailbox._inbox_gap_head AS h
                         WHERE h.inbox_key = v_key AND h.aggregate_id = u.agg) AS high
                  FROM ROWS FROM (pg_catalog.unnest(v_aggs), pg_catalog.unnest(v_mins)) WITH ORDINALITY
                       AS u (agg, mn, ord)) AS u;
        IF v_full IS NOT NULL THEN
            DELETE FROM mailbox._inbox_gap AS g WHERE g.inbox_key = v_key AND g.aggregate_id = ANY (v_full);
            DELETE FROM mailbox._inbox_gap_head AS h WHERE h.inbox_key = v_key AND h.aggregate_id = ANY (v_full);
        END IF;
        PERFORM mailbox._inbox_as_owner(p_inbox, mailbox._inbox_gap_scan_sql(p_inbox, FALSE, TRUE), v_starts, v_aggs);
    END IF;
    RETURN TRUE;
END
$$;

-- Every gap of a tracked inbox as the jsonb array of _inbox_gap_list (part 34), ordered by
-- aggregate and expected sequence: folds what was touched since the last fold when it can,
-- else computes the same answer without writing (the stored gaps of the aggregates nobody
-- touched, the touched ones read again from their positions).
CREATE FUNCTION mailbox._inbox_gap_fold(p_inbox mailbox._inbox)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := p_inbox.inbox_key;
    v_all boolean := FALSE;
    v_aggs text[];
    v_fresh jsonb := '[]';
BEGIN
    IF NOT mailbox._inbox_gap_refresh(p_inbox) THEN
        WITH seen AS (SELECT t.aggregate_ids FROM mailbox._inbox_gap_touched AS t WHERE t.inbox_key = v_key)
        SELECT coalesce(pg_catalog.bool_or(seen.aggregate_ids IS NULL), FALSE),
               (SELECT pg_catalog.array_agg(DISTINCT a.agg) FROM seen AS s2, pg_catalog.unnest(s2.aggregate_ids) AS a (agg))
          INTO v_all, v_aggs FROM seen;
        IF v_all OR v_aggs IS NOT NULL THEN
            v_fresh := mailbox._inbox_as_owner(p_inbox, mailbox._inbox_gap_scan_sql(p_inbox, v_all, FALSE), NULL, v_aggs);
        END IF;
    END IF;
    RETURN (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                        'aggregate_id', g.a, 'expected_seq', g.e, 'found_seq', g.f,
                        'gap_age_sec', pg_catalog.date_part('epoch', pg_catalog.now() - g.r))
                        ORDER BY g.a, g.e), '[]')
              FROM (SELECT s.aggregate_id AS a, s.expected_seq AS e, s.found_seq AS f, s.found_received_at AS r
                      FROM mailbox._inbox_gap AS s
                     WHERE s.inbox_key = v_key AND NOT v_all
                       AND (v_aggs IS NULL OR s.aggregate_id <> ALL (v_aggs))
                    UNION ALL
                    SELECT f.a, f.e, f.f, f.r
                      FROM pg_catalog.jsonb_to_recordset(v_fresh) AS f (a text, e bigint, f bigint, r timestamptz, g boolean)
                     WHERE f.g) AS g);
END
$$;

-- The unprocessed and processed counts of a tracked inbox from its table (as the owner; a
-- managed inbox's owner is the extension owner). With p_unfolded, less the changes of the
-- touched rows the same statement sees, which a later fold adds: so a count taken while
-- writers commit is neither lost nor counted twice.
CREATE FUNCTION mailbox._inbox_count_rows(p_inbox mailbox._inbox, p_unfolded boolean)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
BEGIN
    RETURN mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'SELECT pg_catalog.jsonb_build_object(''unprocessed'', (SELECT pg_catalog.count(*) FROM %1$s AS t'
        ' WHERE t.%2$I IS NULL) - u.du, ''processed'', (SELECT pg_catalog.count(*) FROM %1$s AS t'
        ' WHERE t.%2$I IS NOT NULL) - u.dp) FROM (SELECT coalesce(pg_catalog.sum(x.d_unprocessed), 0) AS du,'
        ' coalesce(pg_catalog.sum(x.d_processed), 0) AS dp FROM mailbox._inbox_gap_touched AS x'
        ' WHERE x.inbox_key = %3$s AND %4$s) AS u',
        mailbox._inbox_current_table(p_inbox), c ->> 'processed_at', p_inbox.inbox_key,
        CASE WHEN p_unfolded THEN 'TRUE' ELSE 'FALSE' END));
END
$$;

-- The unprocessed and processed counts of a tracked inbox now: those of the last fold plus
-- the changes of the touched rows this statement sees (exact for its snapshot), or counted
-- from the table when a touched row asks for it (TRUNCATE) or nothing was folded yet.
CREATE FUNCTION mailbox._inbox_kept_counts(p_inbox mailbox._inbox)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_counts jsonb;
BEGIN
    SELECT CASE WHEN NOT coalesce(pg_catalog.bool_or(t.inbox_key IS NOT NULL
                                                  AND (t.d_unprocessed IS NULL OR t.d_processed IS NULL)), FALSE)
                THEN pg_catalog.jsonb_build_object(
                    'unprocessed', n.unprocessed + coalesce(pg_catalog.sum(t.d_unprocessed), 0),
                    'processed', n.processed + coalesce(pg_catalog.sum(t.d_processed), 0)) END
      INTO v_counts
      FROM mailbox._inbox_count AS n
      LEFT JOIN mailbox._inbox_gap_touched AS t ON t.inbox_key = n.inbox_key
     WHERE n.inbox_key = p_inbox.inbox_key
     GROUP BY n.unprocessed, n.processed;
    RETURN coalesce(v_counts, mailbox._inbox_count_rows(p_inbox, FALSE));
END
$$;

-- The rows of inbox_ordering_gaps: a managed inbox that can fold reads its kept gaps in index
-- order (a volatile function, so the read sees the fold's writes); otherwise the gap list.
CREATE FUNCTION mailbox._inbox_gap_rows(p_inbox mailbox._inbox)
RETURNS TABLE (aggregate_id text, expected_seq bigint, found_seq bigint, gap_age_sec double precision)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF mailbox._inbox_gap_tracked(p_inbox) AND mailbox._inbox_gap_refresh(p_inbox) THEN
        RETURN QUERY
        SELECT g.aggregate_id, g.expected_seq, g.found_seq,
               pg_catalog.date_part('epoch', pg_catalog.now() - g.found_received_at)
          FROM mailbox._inbox_gap AS g
         WHERE g.inbox_key = p_inbox.inbox_key
         ORDER BY g.aggregate_id, g.expected_seq;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT g.aggregate_id, g.expected_seq, g.found_seq, g.gap_age_sec
      FROM pg_catalog.jsonb_to_recordset(mailbox._inbox_gap_list(p_inbox))
           AS g (aggregate_id text, expected_seq bigint, found_seq bigint, gap_age_sec double precision)
     ORDER BY g.aggregate_id, g.expected_seq;
END
$$;
