-- Part 27 (continued): committing in partitioned groups, and per-partition lag (SPEC §2.3;
-- part 26 has the tables, docs/ordering.md the guarantees).

-- commit_offset for a partitioned group (its caller locked the consumer row and checked it).
CREATE FUNCTION mailbox._commit_partitioned(
    p_group text, p_consumer text, p_last_offset bigint, p_key int, p_committed bigint
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
-- offsets are read in index order and rows by index probes: a backlog numbered moments ago
-- has no statistics yet, and the planner's bitmap scans, sorts and hash joins over the whole
-- outbox cost far more than the batch
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_n bigint;
    v_unparked bigint;
    v_rec record;
    v_ack bigint[];
    v_del bigint[];
    v_parts int[] := '{}';
    v_min bigint;
    v_last bigint;
    v_parts_n int;
BEGIN
    PERFORM mailbox._require(p_last_offset, 'p_last_offset');
    IF p_last_offset < 0 THEN
        RAISE EXCEPTION 'invalid p_last_offset: %', p_last_offset
            USING ERRCODE = '22023',
                  HINT = 'Pass the offset (outbox_id) of the last row processed; offsets start at 1.';
    END IF;
    -- each partition this consumer holds acknowledges its in-flight rows up to the offset,
    -- counted in one index range scan
    v_ack := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_del := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    FOR v_rec IN
        SELECT pl.part, pl.acked_offset, pl.delivered_offset FROM mailbox._partition_lease AS pl
         WHERE pl.group_name = p_group AND pl.consumer_id = p_consumer
           AND pl.delivered_offset > pl.acked_offset AND pl.acked_offset < p_last_offset
         ORDER BY pl.part
           FOR UPDATE
    LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_del[v_rec.part + 1] := least(v_rec.delivered_offset, p_last_offset);
        v_parts := v_parts || v_rec.part;
        v_min := least(v_min, v_rec.acked_offset);
    END LOOP;
    v_n := 0;
    IF v_min IS NOT NULL THEN
        -- the group's count (_group_partitions of part 28, inlined)
        v_parts_n := coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                              (SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = p_key));
        v_last := (SELECT pg_catalog.max(d) FROM pg_catalog.unnest(v_del) AS d);
        IF pg_catalog.cardinality(v_parts) = v_parts_n
           AND v_min = (SELECT pg_catalog.max(a) FROM pg_catalog.unnest(v_ack) AS a)
           AND v_last = (SELECT pg_catalog.min(d) FROM pg_catalog.unnest(v_del) AS d) THEN
            -- it holds every partition, all with the same range in flight: every offset of
            -- the range is a row it acknowledges now, except the parked ones
            v_n := v_last - v_min
                   - (SELECT pg_catalog.count(*) FROM mailbox._outbox_parked AS k
                       WHERE k.group_name = p_group AND k.outbox_id > v_min AND k.outbox_id <= v_last);
        ELSE
            v_n := (SELECT pg_catalog.count(*) FROM mailbox._partition_rows(p_key, v_parts_n, v_min, v_last) AS x
                     WHERE x.outbox_id > v_ack[x.partition + 1] AND x.outbox_id <= v_del[x.partition + 1]
                       -- a parked row was acknowledged by outbox_park (an unparked one below)
                       AND NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                        WHERE k.group_name = p_group AND k.outbox_id = x.outbox_id));
        END IF;
        UPDATE mailbox._partition_lease AS pl SET acked_offset = least(pl.delivered_offset, p_last_offset)
         WHERE pl.group_name = p_group AND pl.part = ANY (v_parts);
    END IF;
    WITH gone AS (
        DELETE FROM mailbox._outbox_parked AS k
         WHERE k.group_name = p_group AND k.consumer_id = p_consumer AND k.unparked_at IS NOT NULL
           AND k.outbox_id <= p_last_offset
        RETURNING 1
    )
    SELECT pg_catalog.count(*) INTO v_unparked FROM gone;
    v_n := v_n + v_unparked;
    DELETE FROM mailbox._lost_lease AS x
     WHERE x.group_name = p_group AND x.consumer_id = p_consumer AND x.first_offset <= p_last_offset;
    IF FOUND THEN
        RAISE WARNING 'lease lost: consumer % of group % no longer holds some offsets up to %',
            p_consumer, p_group, p_last_offset
            USING DETAIL = 'Its partition lease expired and the partition moved to another consumer.',
                  HINT = 'Extend leases with mailbox.extend_lease() while a batch takes longer than its visibility timeout.';
    END IF;
    IF v_n = 0 AND p_last_offset < p_committed THEN
        PERFORM mailbox._touch_consumer(p_group, p_consumer);
        RAISE WARNING 'commit below committed offset: consumer % of group % is at %, got %',
            p_consumer, p_group, p_committed, p_last_offset
            USING HINT = 'Nothing was acknowledged; offsets only move forward (use mailbox.seek_offset() to move back).';
        RETURN 0;
    END IF;
    UPDATE mailbox._consumer
       SET committed_offset = greatest(committed_offset,
                                       least(p_last_offset, (SELECT o.head_offset FROM mailbox._outbox AS o
                                                               WHERE o.outbox_key = p_key))),
           last_commit_at = pg_catalog.now(),
           last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
     WHERE group_name = p_group AND consumer_id = p_consumer;
    -- the stored group offset (retention, consumer_group_lag) follows every few thousand
    -- offsets and every numberer pass; consumer_lag() computes it afresh
    IF v_n > 0 AND p_last_offset / 5000 <> p_committed / 5000 THEN
        PERFORM mailbox._store_partitioned_group_offset(p_group, p_key);
    END IF;
    RETURN v_n;
END
$$;

CREATE VIEW mailbox.consumer_partition_lag AS
SELECT pl.group_name, pl.part AS partition, pl.consumer_id,
       pl.lease_until > pg_catalog.now() AS leased, pl.lease_until, pl.acked_offset, pl.delivered_offset,
       n.in_flight, n.lag
  FROM mailbox._consumer_group AS g
 CROSS JOIN LATERAL mailbox._partition_counts(g.group_name) AS n
  JOIN mailbox._partition_lease AS pl ON pl.group_name = g.group_name AND pl.part = n.part;
COMMENT ON VIEW mailbox.consumer_partition_lag IS
'per partition of each partitioned group: holder, acknowledged and delivered offsets, rows in flight, lag';
