-- Part 41: outbox retention, the statements maintenance (plpython outbox_maintenance.py)
-- orchestrates.

-- Drains outbox p_key's numbered rows up to offset p_limit, oldest chunk first, about p_budget
-- rows at most, and returns how many rows it deleted. A row goes when it is older than
-- p_retention_hours and, if it is a claim-check row, every group (or '' = all) recorded
-- reading it; p_force drains regardless of reads. A chunk goes once all its rows are gone,
-- and the low mark (every offset at or below it drained) follows the chunks, in order: it
-- stops at the first chunk that keeps a row.
--
-- Set-based: three statements however many chunks there are. Under load a chunk is what one
-- poll or numberer pass numbered, often a few dozen rows, so a statement per chunk (as this
-- was first written) drained a few thousand rows a second and fell behind producers: the
-- outbox grew without bound (the soak in bench/outbox_bench.py).
CREATE FUNCTION mailbox._drain_outbox_rows(
    p_key int, p_limit bigint, p_retention_hours int, p_force boolean, p_budget bigint
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_last bigint;
    v_drained bigint;
    v_kept bigint;
    v_low bigint;
BEGIN
    -- the chunks in reach: wholly at or below the limit, oldest first, the first one always,
    -- then while the rows before them stay within the budget
    SELECT pg_catalog.max(e.base_offset) INTO v_last
      FROM (SELECT c.base_offset,
                   pg_catalog.sum(c.row_count) OVER (ORDER BY c.base_offset) - c.row_count AS before
              FROM mailbox._outbox_chunk AS c
             WHERE c.outbox_key = p_key AND c.base_offset + c.row_count <= p_limit) AS e
     WHERE e.before < p_budget;
    IF v_last IS NULL THEN
        RETURN 0;
    END IF;
    WITH ids AS (
        SELECT u.id FROM mailbox._outbox_chunk AS c CROSS JOIN LATERAL pg_catalog.unnest(c.ids) AS u (id)
         WHERE c.outbox_key = p_key AND c.base_offset <= v_last
    ), gone AS (
        DELETE FROM mailbox._outbox_log AS l
         USING ids
         WHERE l.outbox_key = p_key AND l._id = ids.id
           AND l.created_at < pg_catalog.now() - pg_catalog.make_interval(hours => p_retention_hours)
           AND (p_force OR NOT l.is_claim_check
                OR EXISTS (SELECT 1 FROM mailbox._claim_check_consumed AS cc
                            WHERE cc.outbox_key = p_key AND cc.row_key = l._id AND cc.group_name = '')
                OR (EXISTS (SELECT 1 FROM mailbox._consumer_group AS g WHERE g.outbox_key = p_key)
                    AND NOT EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                                     WHERE g.outbox_key = p_key
                                       AND NOT EXISTS (SELECT 1 FROM mailbox._claim_check_consumed AS cc
                                                        WHERE cc.outbox_key = p_key AND cc.row_key = l._id
                                                          AND cc.group_name = g.group_name))))
        RETURNING l._id
    ), forgotten AS (
        DELETE FROM mailbox._claim_check_consumed AS cc
         WHERE cc.outbox_key = p_key AND cc.row_key IN (SELECT gone._id FROM gone)
    )
    SELECT pg_catalog.count(*) INTO v_drained FROM gone;
    -- the first chunk in reach that keeps a row (too young, or a claim-check row not read)
    SELECT pg_catalog.min(c.base_offset) INTO v_kept
      FROM mailbox._outbox_chunk AS c
     WHERE c.outbox_key = p_key AND c.base_offset <= v_last
       AND EXISTS (SELECT 1 FROM pg_catalog.unnest(c.ids) AS u (id)
                    WHERE EXISTS (SELECT 1 FROM mailbox._outbox_log AS l
                                   WHERE l.outbox_key = p_key AND l._id = u.id));
    WITH dropped AS (
        DELETE FROM mailbox._outbox_chunk AS c
         WHERE c.outbox_key = p_key AND c.base_offset <= v_last
           AND (v_kept IS NULL OR c.base_offset < v_kept)
        RETURNING c.base_offset + c.row_count AS high
    )
    SELECT pg_catalog.max(d.high) INTO v_low FROM dropped AS d;
    IF v_low IS NOT NULL THEN
        UPDATE mailbox._outbox_retention SET low_offset = greatest(low_offset, v_low) WHERE outbox_key = p_key;
    END IF;
    RETURN v_drained;
END
$$;
