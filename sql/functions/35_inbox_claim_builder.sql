-- Part 35 (claim builder): the generated claim's query (issue 11), one of the builders of
-- part 35 (builders), which writes the other generated functions' SQL: an ordered inbox's
-- heads, the claimed message's fields, and the claim itself, with its exclusion of leased
-- messages.

-- For an ordered inbox, the claim's extra condition: only aggregate heads, oldest first (at
-- most 4 x batch + 16 of them), collected by an InitPlan so the claim itself is a
-- primary-key lookup. At most one in flight per aggregate: a head that is leased (or waits
-- for its retry time) is skipped, and so is a head whose aggregate has another message under
-- a live lease: a lower sequence that arrived (or was replayed) after its successor was
-- claimed is the head again, but waits until that successor is settled. A message in flight
-- was a head when it was claimed, so its sequence is at most last_seq + 1 (last_seq never
-- decreases): the probe reads only the aggregate's unprocessed rows up to there (the
-- ordering index), usually the head alone. Empty for an unordered inbox.
-- The heads come from one of two reads that give the same answer (issue 11):
--   * the walk: next_<i>'s SQL (written in here: a view in the table's schema may be
--     replaced by that schema's owner), one skip-scan step per aggregate with unprocessed
--     messages, so a claim costs per busy aggregate;
--   * for a managed inbox (whose pending index is known) with more busy aggregates than the
--     claim wants heads (a skip scan that stops there counts them), the arrival read:
--     unprocessed messages oldest first (the pending index), dead letters passed over (they
--     are never heads, and they stay oldest for days), keeping each that is its aggregate's
--     head by the walk's rule (no unprocessed message of the aggregate, dead letters
--     included, with a lower sequence, or the same sequence and a lower id; its sequence at
--     most last_seq + 1; free), until 4 x batch + 16 are kept or
--     2 x (4 x batch + 16) were read (the inner LIMIT; the outer one stops the read early, so
--     the kept heads are the first in the inner subquery's received_at order). Any head
--     older than the last message read is among those read, so when the read keeps enough,
--     or reads every unprocessed message, its heads are the walk's oldest (up to ties in
--     received_at); when it does not (heads thinly spread over arrival order), the walk runs.
-- The walk is written once, as the fallback of coalesce: the read gives NULL when it is not
-- tried (few busy aggregates) or does not answer.
-- The head test's NOT EXISTS is fenced (OFFSET 0): left to the planner it becomes a hash
-- anti-join over the whole table; and it reads in the ordering index's order, as the head
-- test of part 35, builders (_inbox_build_head_free), says why. So is the array (h) fenced:
-- pulled up, the planner copies it into both places that use it and runs the read twice.
CREATE FUNCTION mailbox._inbox_build_claim_heads(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN ''
                WHEN NOT p_inbox.is_managed THEN pg_catalog.format(' AND t.%I = ANY (%s)', c ->> 'event_id', walk)
                ELSE pg_catalog.format(
        ' AND t.%1$I = ANY (coalesce(CASE WHEN (%2$s SELECT pg_catalog.count(*) FROM (SELECT 1 FROM aggs LIMIT $2 * 4 + 17) AS b)'
        ' > $2 * 4 + 16 THEN (SELECT CASE WHEN pg_catalog.cardinality(h.heads) >= $2 * 4 + 16'
        ' OR (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM %9$s AS t WHERE t.%10$I IS NULL'
        ' AND t.%7$I < ($1).max_retries LIMIT ($2 * 4 + 16) * 2) AS c) < ($2 * 4 + 16) * 2 THEN h.heads END'
        ' FROM (SELECT ARRAY(SELECT r.%1$I FROM (SELECT t.%1$I, t.%5$I, t.%6$I, t.%4$I FROM %9$s AS t'
        ' WHERE t.%10$I IS NULL AND t.%7$I < ($1).max_retries ORDER BY t.%4$I LIMIT ($2 * 4 + 16) * 2) AS r'
        ' WHERE r.%5$I IS NOT NULL AND r.%6$I IS NOT NULL'
        ' AND r.%6$I <= coalesce((SELECT a.last_seq FROM mailbox.%8$I AS a WHERE a.aggregate_id = r.%5$I::text),'
        ' ($1).ordering_first_sequence - 1) + 1'
        ' AND NOT EXISTS (SELECT 1 FROM %9$s AS s WHERE s.%5$I = r.%5$I AND s.%10$I IS NULL'
        ' AND s.%6$I <= r.%6$I AND (s.%6$I < r.%6$I OR s.%1$I < r.%1$I) ORDER BY s.%5$I, s.%6$I OFFSET 0)'
        ' AND %11$s LIMIT $2 * 4 + 16) AS heads OFFSET 0) AS h) END, %3$s))',
        c ->> 'event_id', mailbox._inbox_pending_aggs_sql(p_inbox, mailbox._inbox_table_sql(p_inbox)), walk,
        c ->> 'received_at', c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'retry_count',
        '_inbox_' || p_inbox.inbox_key || '_aggregate', mailbox._inbox_table_sql(p_inbox), c ->> 'processed_at',
        mailbox._inbox_build_head_free(p_inbox, 'r')) END
      FROM (SELECT p_inbox.columns AS c,
                   pg_catalog.format('ARRAY(SELECT n.%1$I FROM (%2$s) AS n WHERE %3$s ORDER BY n.%4$I LIMIT $2 * 4 + 16)',
                                     p_inbox.columns ->> 'event_id', mailbox._inbox_next_sql(p_inbox),
                                     mailbox._inbox_build_head_free(p_inbox, 'n'),
                                     p_inbox.columns ->> 'received_at') AS walk) AS x;
$$;

-- The claimed message's fields (_inbox_message, in its order) read from the inbox table t:
-- each mapped column cast to the API type, or a typed NULL.
CREATE FUNCTION mailbox._inbox_build_message_items(p_columns jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format(
        't.%1$I::pg_catalog.text, %2$s, %3$s, %4$s,
                   %5$s, %6$s, %7$s, %8$s, %9$s,
                   %10$s, %11$s',
        p_columns ->> 'event_id', mailbox._inbox_item(p_columns, 'event_type', 'text'),
        mailbox._inbox_item(p_columns, 'source', 'text'), mailbox._inbox_item(p_columns, 'aggregate_id', 'text'),
        mailbox._inbox_item(p_columns, 'sequence_num', 'bigint'), mailbox._inbox_item(p_columns, 'priority', 'int'),
        mailbox._inbox_item(p_columns, 'payload', 'jsonb'), mailbox._inbox_item(p_columns, 'headers', 'jsonb'),
        mailbox._inbox_item(p_columns, 'trace_id', 'text'), mailbox._inbox_item(p_columns, 'retry_count', 'int'),
        mailbox._inbox_item(p_columns, 'received_at', 'timestamptz'));
$$;

-- claim(row, batch size, now, leases exist): the candidates, locked, oldest (lowest priority)
-- first; inbox_claim then leases them, and that upsert (or, in READ COMMITTED, its re-read of
-- the leases) decides who wins a message (see part 33). The lease exclusion only spares
-- locking a leased message: inbox_claim passes FALSE as $4 when the inbox had no lease row at
-- all a moment before (the documented claim-and-mark-in-one-transaction pattern writes none),
-- and then it is skipped: that case is a statement of its own, whose plan has no lease
-- subplan to start (their start-up cost about 8 us of every claim while they were one
-- statement with an OR, docs/benchmarks.md). A lease committed in between is
-- caught by what decides; the claim then returns fewer rows, which a claim may. TRUE excludes
-- with the hashed set where there is one (below); NULL always with a lookup per row:
-- inbox_claim passes NULL under SERIALIZABLE, where reading the whole set (a sequential scan
-- of mailbox._inbox_lease once the planner expects most of it to be the inbox's) would take a
-- predicate lock on the whole table, and every transaction writing a lease would then be in
-- conflict with the claim. (CASE runs one arm, so only the chosen exclusion is evaluated.)
-- How it excludes (the per-inbox lease views are security barriers, which a join cannot see
-- into):
--   * without ordering or priority, leased messages are the oldest pending ones (claims take
--     the oldest, and new messages arrive behind them), so every claim passes over all of
--     them: a NOT IN against the inbox's live leases, read once per claim into an array and
--     hashed (a hashed SubPlan: a hash probe per row passed over, not an index lookup). The
--     array's unnest keeps the planner's estimate of the set at its default for a
--     non-constant array (10 rows), so the plan is always the hashed one, whatever the
--     statistics of the lease table say: a NOT IN over the view itself would fall back to a
--     scan of the whole set per row once the planner expected it to exceed hash_mem. Leases
--     are NOT NULL (primary key); an adopted table's id may be NULL (a UNIQUE column), and
--     such a row is not leased, as before (IS NULL OR: NULL NOT IN a set is NULL). (4,000
--     leased messages at the head: 5.9 ms per claim of 10 + batch mark instead of 11.7 with
--     a lookup per row, docs/benchmarks.md);
--   * with priority, a message of a better priority arrives ahead of the leased ones, which
--     a claim then need not pass, and an ordered inbox's candidates are a few heads (below),
--     whose aggregates may have many leases between them: reading the whole set would cost
--     more than one primary-key lookup per row (a subquery kept apart by OFFSET 0): 12.9 ms
--     against 1.6 for a claim of 10 priority-1 messages with 20,000 priority-9 ones leased.
-- The array takes the rows as the locking scan returns them, in the subquery's order (an empty array
-- when there are none): no window, aggregate or sort of whole messages on top, which cost
-- about a third of the function. (So the rows keep the order in which they were sorted
-- before they were locked: a row whose priority or received_at another transaction changed
-- just before the lock comes back with its new value in its old place, as with any
-- ORDER BY ... FOR UPDATE.) It always uses the generic plan (inbox_claim sets
-- plan_cache_mode, and _inbox_define for another role's SECURITY DEFINER function): with LIMIT $2 the
-- planner costs it for 10% of the pending rows, far above a custom plan for a batch of 10, so
-- the plan cache would never pick it and would plan every claim again (about 100 us); the
-- generic plan has the same shape (index order, lease exclusion per row). That cost grows with
-- the backlog and passes jit_above_cost (with a lookup per row, at some 120,000 pending rows;
-- with the hashed set, at some 26 million), so the same SET clauses turn jit off: compiling
-- the query cost every claim about 8 ms.
CREATE FUNCTION mailbox._inbox_build_claim(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    IF $4 IS FALSE THEN -- no lease row in the inbox a moment ago: no exclusion, no lease subplan
        RETURN ARRAY(
            SELECT ROW(%1$s)::mailbox._inbox_message
              FROM (SELECT t.* FROM %3$s AS t
                     WHERE %4$s AND t.%5$I < ($1).max_retries%6$s
                     ORDER BY %2$s
                     LIMIT $2
                       FOR UPDATE OF t SKIP LOCKED) AS t);
    END IF;
    RETURN ARRAY(
        SELECT ROW(%1$s)::mailbox._inbox_message
          FROM (SELECT t.* FROM %3$s AS t
                 WHERE %4$s AND t.%5$I < ($1).max_retries%6$s
                   AND %7$s
                 ORDER BY %2$s
                 LIMIT $2
                   FOR UPDATE OF t SKIP LOCKED) AS t);$b$,
        mailbox._inbox_build_message_items(c),
        CASE WHEN p_inbox.priority_tiers IS NOT NULL THEN mailbox._inbox_col(c, 'priority') || ', ' ELSE '' END
            || mailbox._inbox_col(c, 'received_at'),
        mailbox._inbox_table_sql(p_inbox),
        -- an ordered claim takes its heads by id: by the primary key, never a partial index
        -- read whole and filtered (part 35, builders, _inbox_sql_unprocessed)
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN pg_catalog.format('t.%I IS NULL', c ->> 'processed_at')
             ELSE mailbox._inbox_sql_unprocessed(c ->> 'processed_at') END,
        c ->> 'retry_count', mailbox._inbox_build_claim_heads(p_inbox),
        CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL OR p_inbox.priority_tiers IS NOT NULL THEN lookup
             ELSE pg_catalog.format($x$CASE WHEN $4 THEN t.%2$I IS NULL OR t.%2$I::pg_catalog.text NOT IN (
                                    SELECT pg_catalog.unnest(ARRAY(SELECT l.event_id FROM %1$s AS l
                                     WHERE l.lease_until > $3 OR l.next_attempt_at > $3)))
                        ELSE %3$s END$x$, mailbox._inbox_lease_sql(p_inbox), c ->> 'event_id', lookup) END)
      FROM (SELECT p_inbox.columns AS c,
                   -- the lookup per row (ordering, priority, and TRUE's alternative)
                   pg_catalog.format($x$NOT EXISTS (SELECT 1 FROM %1$s AS l
                                    WHERE l.event_id = t.%2$I::pg_catalog.text
                                      AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0)$x$,
                                     mailbox._inbox_lease_sql(p_inbox), p_inbox.columns ->> 'event_id') AS lookup) AS x;
$$;
