-- Part 35 (builders): the bodies of an inbox's generated per-message functions, one builder
-- per function. Each takes the inbox's catalog row and returns the PL/pgSQL statements that
-- _inbox_define (part 35) wraps with the owner check. Identifiers come from the catalog
-- through format('%I'); values stay bind parameters ($1 is always the catalog row). What
-- they build for a managed and an adopted inbox is committed in
-- tests/expected/inbox_generated_*.sql.

-- The test "not processed yet" (`t.<processed_at> IS NULL`) of a statement that finds its
-- rows by id: a mark, a failure report, the commit's settle. Written as a CASE, which means the
-- same, so that the planner cannot prove from it the predicate of the pending index
-- (`WHERE processed_at IS NULL`): it could then read that index, filtered by id, instead of
-- the primary key. A plan made while the table was nearly empty, when both cost nothing, did
-- so, and read every pending message at each call once a burst had arrived (docs/inbox.md,
-- "Plans made on an empty queue"). Only the primary key can find these rows now.
CREATE FUNCTION mailbox._inbox_sql_unprocessed(p_column text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('CASE WHEN t.%I IS NULL THEN TRUE END', p_column);
$$;

-- What a receive's INSERT is made of, from the catalog row (see _inbox_build_receive).
CREATE FUNCTION mailbox._inbox_receive_parts(p_inbox mailbox._inbox)
RETURNS TABLE (cols text[], vals text[], unmapped int[], smallint_priority boolean)
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_roles text[] := mailbox._inbox_receive_roles();
BEGIN
    cols := ARRAY[]::text[];
    vals := ARRAY[]::text[];
    unmapped := ARRAY[]::int[];
    FOR i IN 1 .. pg_catalog.array_length(v_roles, 1) LOOP
        IF c ? v_roles[i] THEN
            cols := cols || pg_catalog.quote_ident(c ->> v_roles[i]);
            vals := vals || mailbox._inbox_param(p_inbox, v_roles[i], i + 1);
        ELSE
            unmapped := unmapped || (i + 1);
        END IF;
    END LOOP;
    -- an adopted table's columns may lack defaults: a new message is unprocessed, never tried
    cols := cols || pg_catalog.quote_ident(c ->> 'received_at') || pg_catalog.quote_ident(c ->> 'retry_count');
    vals := vals || 'pg_catalog.now()'::text || '0'::text;
    -- a priority that does not fit a smallint column is the caller's error, named as such
    smallint_priority := mailbox._inbox_column_base_type(p_inbox, 'priority') = 'int2';
    RETURN NEXT;
END
$$;

-- receive(row, event_id, payload, event_type, source, aggregate_id, sequence_num, headers,
-- trace_id, priority): its checks, then the insert. Role i of _inbox_receive_roles() is
-- parameter $(i + 1): the insert's columns and values, the roles the table has no column
-- for, and whether its priority is a smallint come from _inbox_receive_parts (above), which
-- the named receive (part 35, named receive) shares.
CREATE FUNCTION mailbox._inbox_build_receive(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_roles text[] := mailbox._inbox_receive_roles();
    v_parts record;
    v_checks text := '';
    n int;
BEGIN
    SELECT * INTO v_parts FROM mailbox._inbox_receive_parts(p_inbox);
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        v_checks := $c$
    IF $6 IS NULL OR $7 IS NULL THEN
        RAISE EXCEPTION 'inbox % is ordered: p_aggregate_id and p_sequence_num must not be null', ($1).inbox_name
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;$c$;
    END IF;
    FOREACH n IN ARRAY v_parts.unmapped LOOP
        -- v_roles[n - 1] is a role name of the registry (part 30), never caller text
        v_checks := v_checks || pg_catalog.format($c$
    IF $%s IS NOT NULL THEN
        RAISE EXCEPTION 'inbox %% has no column for %s', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;$c$, n, v_roles[n - 1]);
    END LOOP;
    IF v_parts.smallint_priority THEN
        v_checks := v_checks || $c$
    IF $10 NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'p_priority out of range for inbox %: %', ($1).inbox_name, $10
            USING ERRCODE = '22023',
                  HINT = 'p_priority is -32768 to 32767 (the inbox''s priority column is a smallint); lower values are claimed first.';
    END IF;$c$;
    END IF;
    -- a receive that looked the inbox up before enable_inbox_ordering committed and then
    -- waited for its lock runs this unordered code: it must not store a message without
    -- aggregate or sequence, which no ordered claim takes. On a managed inbox the insert
    -- trigger that the enable adds refuses it (part 34, gap state), at no cost before; an
    -- adopted table gets no trigger, so its receive reads the ordering again in its INSERT
    -- (a subquery of RETURNING, part 34, ordering switch)
    RETURN pg_catalog.format($b$%1$s
    INSERT INTO %2$s AS t (%3$s) VALUES (%4$s) ON CONFLICT (%5$I) DO NOTHING%6$s;%7$s
    RETURN FOUND;$b$,
        v_checks, mailbox._inbox_table_sql(p_inbox), pg_catalog.array_to_string(v_parts.cols, ', '),
        pg_catalog.array_to_string(v_parts.vals, ', '), c ->> 'event_id',
        CASE WHEN NOT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NULL
             THEN ' RETURNING ' || mailbox._inbox_build_ordered_now(p_inbox) || ' INTO v_ordered' ELSE '' END,
        CASE WHEN NOT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NULL
             THEN mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'receive') ELSE '' END);
END
$$;

-- The base type (pg_type.typname, through domains) of the column a role is mapped to; NULL
-- when the role is not mapped.
CREATE FUNCTION mailbox._inbox_column_base_type(p_inbox mailbox._inbox, p_role text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.typname::text
      FROM pg_catalog.pg_attribute AS a
      JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
      JOIN pg_catalog.pg_type AS b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
     WHERE a.attrelid = p_inbox.table_rel AND a.attname = p_inbox.columns ->> p_role AND NOT a.attisdropped;
$$;

-- The per-inbox view of the inbox's own lease rows (part 31), as written into generated SQL.
CREATE FUNCTION mailbox._inbox_lease_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_lease');
$$;

-- A head p_alias (a row of the inbox table) is free to claim: no live lease or pending retry
-- of its own, no other message of its aggregate up to the head under a live lease, and no
-- live lease carrying its aggregate: a message claimed beyond the head before ordering was
-- enabled carries it (part 34, _inbox_hold_in_flight). That index probe runs only while such
-- a lease may last (the catalog row's held_until); without it the head was taken as a
-- candidate and only dropped at the lease upsert (part 37), so a claim of one could come
-- back empty while other aggregates had heads. Otherwise every lease carrying an aggregate
-- is its head's, which the probes before already see. The aggregate's messages are read in
-- the ordering index's order (ORDER BY): the pending index, whose predicate is the same,
-- would need a sort, so the planner takes the ordering index even for a plan made on a
-- nearly empty table, where it took the pending index and read it whole at every head
-- (docs/inbox.md, "Plans made on an empty queue").
CREATE FUNCTION mailbox._inbox_build_head_free(p_inbox mailbox._inbox, p_alias text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format(
        'NOT EXISTS (SELECT 1 FROM %3$s AS l'
        ' WHERE l.event_id = %2$I.%1$I::text AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0)'
        ' AND NOT EXISTS (SELECT 1 FROM %4$s AS s'
        ' WHERE s.%5$I = %2$I.%5$I AND s.%7$I IS NULL AND s.%6$I <= coalesce((SELECT a.last_seq'
        ' FROM mailbox.%8$I AS a WHERE a.aggregate_id = %2$I.%5$I::text),'
        ' ($1).ordering_first_sequence - 1) + 1'
        ' AND EXISTS (SELECT 1 FROM %3$s AS l WHERE l.event_id = s.%1$I::text AND l.lease_until > $3 OFFSET 0)'
        ' ORDER BY s.%5$I, s.%6$I OFFSET 0)'
        ' AND (($1).held_until IS NULL OR ($1).held_until <= $3 OR NOT EXISTS (SELECT 1 FROM %3$s AS l'
        ' WHERE l.aggregate_id = %2$I.%5$I::text AND l.lease_until > $3 OFFSET 0))',
        c ->> 'event_id', p_alias, mailbox._inbox_lease_sql(p_inbox), mailbox._inbox_table_sql(p_inbox),
        c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at',
        '_inbox_' || p_inbox.inbox_key || '_aggregate')
      FROM (SELECT p_inbox.columns AS c) AS x;
$$;

-- processed(row, event_id): marks it and returns its id (with aggregate and sequence when the
-- inbox is ordered); inbox_mark_processed settles lease and ordering.
CREATE FUNCTION mailbox._inbox_build_processed(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp() WHERE t.%3$I = %4$s AND %9$s
    RETURNING t.%3$I::pg_catalog.text, %5$s, %6$s, %7$s INTO v_id, v_aggregate, v_seq, v_ordered;%8$s
    RETURN ROW(v_id, v_aggregate, v_seq)::mailbox._inbox_done;$b$,
        mailbox._inbox_table_sql(p_inbox), c ->> 'processed_at', c ->> 'event_id',
        mailbox._inbox_param(p_inbox, 'event_id', 2),
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.text'
             ELSE mailbox._inbox_item(c, 'aggregate_id', 'pg_catalog.text') END,
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.int8'
             ELSE mailbox._inbox_item(c, 'sequence_num', 'pg_catalog.int8') END,
        mailbox._inbox_build_ordered_now(p_inbox), mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'mark'),
        mailbox._inbox_sql_unprocessed(c ->> 'processed_at'))
      FROM (SELECT p_inbox.columns AS c) AS x;
$$;

-- failed(row, event_id, error): counts the failure (and records the error where the table
-- has a column for it), or says why not; inbox_mark_failed settles the lease.
CREATE FUNCTION mailbox._inbox_build_failed(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = t.%2$I + 1%3$s
     WHERE t.%4$I = %5$s AND %7$s AND t.%2$I < ($1).max_retries
    RETURNING t.%4$I::pg_catalog.text, t.%2$I INTO v_id, v_retries;
    IF v_id IS NOT NULL THEN
        RETURN ROW(v_id, v_retries, 'counted')::mailbox._inbox_attempt;
    END IF;
    SELECT t.%6$I IS NOT NULL INTO v_processed FROM %1$s AS t WHERE t.%4$I = %5$s;
    RETURN ROW(NULL, NULL, CASE WHEN v_processed IS NULL THEN 'missing' WHEN v_processed THEN 'processed'
                                ELSE 'dead' END)::mailbox._inbox_attempt;$b$,
        mailbox._inbox_table_sql(p_inbox), c ->> 'retry_count',
        CASE WHEN c ? 'error' THEN pg_catalog.format(', %I = $3', c ->> 'error') ELSE '' END,
        c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2), c ->> 'processed_at',
        mailbox._inbox_sql_unprocessed(c ->> 'processed_at'))
      FROM (SELECT p_inbox.columns AS c) AS x;
$$;
