-- Part 27: polling in partitioned groups (SPEC §2.3; part 26 has the tables, the commit is
-- in 27_groups_partition_commit.sql and docs/ordering.md has the guarantees).

-- Unparked rows (outbox_unpark) that p_consumer may take now: of its partitions (NULL: any),
-- not leased to a live other consumer. Leases them to it and returns their offsets.
CREATE FUNCTION mailbox._take_unparked(p_group text, p_consumer text, p_parts int[], p_until timestamptz)
RETURNS bigint[]
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    WITH taken AS (
        UPDATE mailbox._outbox_parked AS k
           SET consumer_id = p_consumer, lease_until = p_until
          FROM (SELECT x.outbox_id FROM mailbox._outbox_parked AS x
                 WHERE x.group_name = p_group AND x.unparked_at IS NOT NULL
                   AND (p_parts IS NULL OR x.part = ANY (p_parts))
                   AND (x.consumer_id IS NULL OR x.consumer_id = p_consumer
                        OR x.lease_until <= pg_catalog.clock_timestamp())
                 ORDER BY x.outbox_id
                   FOR UPDATE SKIP LOCKED) AS t
         WHERE k.group_name = p_group AND k.outbox_id = t.outbox_id
        RETURNING k.outbox_id
    )
    SELECT pg_catalog.array_agg(taken.outbox_id ORDER BY taken.outbox_id) FROM taken;
$$;

CREATE FUNCTION mailbox._poll_partitioned(
    p_group text, p_consumer text, p_batch_size int, p_visibility_seconds int, p_key int, p_parts int
)
RETURNS TABLE (
    outbox_id bigint, event_id uuid, created_at timestamptz, source text, event_type text, key text,
    headers jsonb, inserted_count int, deleted_count int, is_claim_check boolean, full_refresh boolean,
    payload jsonb, partition int
)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
-- offsets are read in index order and rows by index probes: a backlog numbered moments ago
-- has no statistics yet, and the planner's bitmap scans, sorts and hash joins over the whole
-- outbox cost far more than the batch
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_until timestamptz;
    v_live int;
    v_share int;
    v_mine int[];
    v_released int[];
    v_rec record;
    v_ack bigint[];
    v_del bigint[];
    v_min bigint;
    v_max bigint;
    v_offs bigint[];
    v_rows bigint[];
    v_sel int[];
    v_unparked bigint[];
    v_parked boolean;
    v_head bigint;
    v_end bigint;
    v_from bigint;
    v_span bigint;
    v_numbered boolean;
    v_fast boolean := FALSE;
    v_take int[];
BEGIN
    INSERT INTO mailbox._consumer AS c (group_name, consumer_id)
    VALUES (p_group, p_consumer)
    ON CONFLICT (group_name, consumer_id) DO NOTHING;
    v_now := pg_catalog.clock_timestamp();
    v_until := v_now + pg_catalog.make_interval(secs => p_visibility_seconds);

    -- Fair share: the partitions over the consumers heard from within this visibility
    -- timeout (a silent consumer's leases expire in that time too).
    v_live := (SELECT pg_catalog.count(*) FROM mailbox._consumer AS c
                WHERE c.group_name = p_group AND c.reaped_at IS NULL
                  AND (c.consumer_id = p_consumer
                       OR c.last_heartbeat_at > v_now - pg_catalog.make_interval(secs => p_visibility_seconds)));
    v_share := (p_parts + greatest(v_live, 1) - 1) / greatest(v_live, 1);
    -- Own partitions (sticky). One locked by another process under this id is left to it.
    v_mine := ARRAY(SELECT pl.part FROM mailbox._partition_lease AS pl
                     WHERE pl.group_name = p_group AND pl.consumer_id = p_consumer
                     ORDER BY pl.part FOR UPDATE SKIP LOCKED);
    IF pg_catalog.cardinality(v_mine) > v_share THEN
        -- a consumer joined: give up the highest partitions with nothing in flight
        WITH extra AS (
            SELECT pl.part FROM mailbox._partition_lease AS pl
             WHERE pl.group_name = p_group AND pl.part = ANY (v_mine)
               AND pl.delivered_offset = pl.acked_offset
             ORDER BY pl.part DESC
             LIMIT pg_catalog.cardinality(v_mine) - v_share
        ), freed AS (
            UPDATE mailbox._partition_lease AS pl SET consumer_id = NULL, lease_until = NULL
              FROM extra WHERE pl.group_name = p_group AND pl.part = extra.part
            RETURNING pl.part
        )
        SELECT pg_catalog.array_agg(freed.part) INTO v_released FROM freed;
        v_mine := ARRAY(SELECT m FROM pg_catalog.unnest(v_mine) AS m
                         WHERE NOT m = ANY (coalesce(v_released, '{}')) ORDER BY m);
    END IF;
    -- Free partitions up to the fair share, and every partition whose lease expired (its
    -- holder stopped polling, even if it still heartbeats: its rows are delivered again,
    -- SPEC §2.2.2; once nothing is in flight, the share rule hands extra ones back).
    v_take := ARRAY(SELECT pl.part FROM mailbox._partition_lease AS pl
                     WHERE pl.group_name = p_group AND pl.consumer_id <> p_consumer AND pl.lease_until <= v_now
                     ORDER BY pl.part
                       FOR UPDATE SKIP LOCKED);
    IF pg_catalog.cardinality(v_mine) < v_share THEN
        v_take := v_take || ARRAY(SELECT pl.part FROM mailbox._partition_lease AS pl
                                   WHERE pl.group_name = p_group AND pl.consumer_id IS NULL
                                   ORDER BY pl.part
                                   LIMIT v_share - pg_catalog.cardinality(v_mine)
                                     FOR UPDATE SKIP LOCKED);
    END IF;
    FOR v_rec IN
        SELECT pl.part, pl.consumer_id, pl.acked_offset, pl.delivered_offset
          FROM mailbox._partition_lease AS pl
         WHERE pl.group_name = p_group AND pl.part = ANY (v_take)
         ORDER BY pl.part
    LOOP
        IF v_rec.consumer_id IS NOT NULL AND v_rec.delivered_offset > v_rec.acked_offset THEN
            -- fencing: what the old holder had in flight is delivered again from here
            INSERT INTO mailbox._lost_lease AS x (group_name, consumer_id, first_offset, last_offset)
            SELECT p_group, v_rec.consumer_id, v_rec.acked_offset + 1, v_rec.delivered_offset
             WHERE EXISTS (SELECT 1 FROM mailbox._consumer AS c
                            WHERE c.group_name = p_group AND c.consumer_id = v_rec.consumer_id)
            ON CONFLICT (group_name, consumer_id, first_offset)
            DO UPDATE SET last_offset = greatest(x.last_offset, excluded.last_offset);
        END IF;
        UPDATE mailbox._partition_lease AS pl
           SET consumer_id = p_consumer, delivered_offset = pl.acked_offset
         WHERE pl.group_name = p_group AND pl.part = v_rec.part;
        v_mine := v_mine || v_rec.part;
    END LOOP;
    -- The partition count may have changed since the caller read it (part 28): a switch
    -- locks every partition row, so once this poll holds one, the count read now stays.
    IF pg_catalog.cardinality(v_mine) > 0
       AND coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                    (SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = p_key), 1) <> p_parts THEN
        RETURN QUERY SELECT * FROM mailbox._poll_partitioned(
            p_group, p_consumer, p_batch_size, p_visibility_seconds, p_key, mailbox._group_partitions(p_group, p_key));
        RETURN;
    END IF;
    IF pg_catalog.cardinality(v_mine) = 0 THEN
        INSERT INTO mailbox._outbox_waiter AS w (outbox_key, group_name, consumer_id, waiting_until)
        VALUES (p_key, p_group, p_consumer, v_now + least(mailbox._heartbeat_timeout(), interval '60 seconds'))
        ON CONFLICT (outbox_key, group_name, consumer_id) DO UPDATE SET waiting_until = excluded.waiting_until;
        RETURN;
    END IF;
    -- (every path below renews the leases of v_mine, in one UPDATE with what else it writes)

    -- rows an operator unparked come first, alone
    v_parked := EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k WHERE k.group_name = p_group);
    IF v_parked AND EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                             WHERE k.group_name = p_group AND k.unparked_at IS NOT NULL) THEN
        v_unparked := mailbox._take_unparked(p_group, p_consumer, v_mine, v_until);
    END IF;
    IF v_unparked IS NOT NULL THEN
        UPDATE mailbox._partition_lease AS pl SET lease_until = v_until
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
        RETURN QUERY
        SELECT k.outbox_id, k.event_id, k.created_at, k.source, k.event_type, k.key, k.headers,
               k.inserted_count, k.deleted_count, k.is_claim_check, k.full_refresh, k.payload, k.part
          FROM mailbox._outbox_parked AS k
         WHERE k.group_name = p_group AND k.outbox_id = ANY (v_unparked)
         ORDER BY k.outbox_id;
        RETURN;
    END IF;

    -- per partition (index part + 1): acknowledged and delivered offsets; NULL: not ours
    v_ack := pg_catalog.array_fill(NULL::bigint, ARRAY[p_parts]);
    v_del := pg_catalog.array_fill(NULL::bigint, ARRAY[p_parts]);
    FOR v_rec IN SELECT pl.part, pl.acked_offset, pl.delivered_offset FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_del[v_rec.part + 1] := v_rec.delivered_offset;
    END LOOP;
    -- In flight (delivered, not acknowledged, not parked): delivered again, before anything
    -- new. A partition whose in-flight range holds no such row is acknowledged up to it.
    SELECT pg_catalog.min(u.a), pg_catalog.max(u.d) INTO v_min, v_max
      FROM ROWS FROM (pg_catalog.unnest(v_ack), pg_catalog.unnest(v_del)) AS u (a, d) WHERE u.d > u.a;
    IF v_min IS NOT NULL THEN
        SELECT pg_catalog.array_agg(w.outbox_id ORDER BY w.outbox_id), pg_catalog.array_agg(w.row_id ORDER BY w.outbox_id),
               pg_catalog.array_agg(w.partition ORDER BY w.outbox_id)
          INTO v_offs, v_rows, v_sel
          FROM (SELECT r.outbox_id, r.row_id, r.partition
                  FROM mailbox._partition_rows(p_key, p_parts, v_min, v_max) AS r
                 WHERE r.outbox_id > v_ack[r.partition + 1] AND r.outbox_id <= v_del[r.partition + 1]
                   AND (NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                                     WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id))
                 ORDER BY r.outbox_id LIMIT p_batch_size) AS w;
    END IF;
    IF v_offs IS NOT NULL THEN
        UPDATE mailbox._partition_lease AS pl SET lease_until = v_until
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
    ELSE
        UPDATE mailbox._partition_lease AS pl SET acked_offset = pl.delivered_offset
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) AND pl.delivered_offset > pl.acked_offset;
        FOR v_rec IN SELECT pl.part, pl.acked_offset FROM mailbox._partition_lease AS pl
                      WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) LOOP
            v_ack[v_rec.part + 1] := v_rec.acked_offset;
        END LOOP;
        SELECT pg_catalog.min(a), pg_catalog.max(a) INTO v_min, v_max FROM pg_catalog.unnest(v_ack) AS a;
        -- without a numberer, this poll numbers when its own partitions are near the head
        -- (the head capped at the boundary of a partition change the group drains: _group_head
        -- of part 28, inlined as every read of the head below)
        v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                              WHERE x.group_name = p_group))
                     FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
        -- (and, below, when it read the log up to the head without filling its batch)
        v_numbered := mailbox._numberer_alive();
        IF NOT v_numbered AND v_head < v_min + p_batch_size THEN
            PERFORM mailbox._sequence_outbox(p_key, greatest(p_batch_size, 1000));
            v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                                  WHERE x.group_name = p_group))
                         FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
            v_numbered := TRUE;
        END IF;
        IF pg_catalog.cardinality(v_mine) = p_parts AND v_min = v_max THEN
            -- this consumer holds every partition, each acknowledged up to the same offset:
            -- its next rows are simply the next offsets, read as an unpartitioned poll does
            v_end := least(v_head, v_min + p_batch_size);
            v_fast := v_end > v_min;
        ELSE
            -- the next rows of this consumer's partitions, in offset order: the log is read
            -- forward from the lowest acknowledged offset, a span at a time (the span that
            -- holds a batch when the keys spread evenly), up to the head
            v_offs := '{}';
            v_span := greatest(p_batch_size, p_batch_size * p_parts / pg_catalog.cardinality(v_mine));
            v_from := v_min;
            LOOP
                v_end := least(v_head, v_from + v_span);
                IF v_end > v_from THEN
                    SELECT v_offs || pg_catalog.array_agg(w.outbox_id ORDER BY w.outbox_id),
                           v_rows || pg_catalog.array_agg(w.row_id ORDER BY w.outbox_id),
                           v_sel || pg_catalog.array_agg(w.partition ORDER BY w.outbox_id)
                      INTO v_offs, v_rows, v_sel
                      FROM (SELECT r.outbox_id, r.row_id, r.partition
                              FROM mailbox._partition_rows(p_key, p_parts, v_from, v_end) AS r
                             WHERE r.outbox_id > v_ack[r.partition + 1]
                               AND (NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                                                 WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id))
                             ORDER BY r.outbox_id LIMIT p_batch_size - pg_catalog.cardinality(v_offs)) AS w;
                END IF;
                IF pg_catalog.cardinality(v_offs) >= p_batch_size THEN
                    v_end := v_offs[pg_catalog.cardinality(v_offs)];
                    EXIT;
                END IF;
                v_from := v_end;
                IF v_from >= v_head THEN
                    -- read to the head: number what committed since (once), unless a numberer does
                    EXIT WHEN v_numbered;
                    v_numbered := TRUE;
                    EXIT WHEN mailbox._sequence_outbox(p_key, greatest(p_batch_size, 1000)) = 0;
                    v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                                          WHERE x.group_name = p_group))
                                 FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
                END IF;
            END LOOP;
            IF pg_catalog.cardinality(v_offs) = 0 THEN
                v_offs := NULL;
            END IF;
        END IF;
        IF NOT v_fast AND v_offs IS NULL THEN
            -- nothing new: none of its partitions has a row up to v_end
            UPDATE mailbox._partition_lease AS pl
               SET acked_offset = greatest(pl.acked_offset, v_end),
                   delivered_offset = greatest(pl.acked_offset, v_end), lease_until = v_until
             WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
            INSERT INTO mailbox._outbox_waiter AS w (outbox_key, group_name, consumer_id, waiting_until)
            VALUES (p_key, p_group, p_consumer, v_now + least(mailbox._heartbeat_timeout(), interval '60 seconds'))
            ON CONFLICT (outbox_key, group_name, consumer_id) DO UPDATE SET waiting_until = excluded.waiting_until;
            RETURN;
        END IF;
        IF v_fast THEN
            -- every partition is delivered up to v_end: its rows there are those returned
            UPDATE mailbox._partition_lease AS pl
               SET delivered_offset = v_end, lease_until = v_until
             WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
        ELSE
            -- a partition with rows in the batch is delivered up to its last one; one without
            -- has no row up to v_end, so it is acknowledged that far (its commit then leaves
            -- nothing in flight, and rebalancing may hand it over)
            UPDATE mailbox._partition_lease AS pl
               SET delivered_offset = coalesce(m.last_offset, greatest(pl.acked_offset, v_end)),
                   acked_offset = CASE WHEN m.last_offset IS NULL THEN greatest(pl.acked_offset, v_end)
                                       ELSE pl.acked_offset END,
                   lease_until = v_until
              FROM pg_catalog.unnest(v_mine) AS mine (part)
              LEFT JOIN (SELECT u.part, pg_catalog.max(u.o) AS last_offset
                           FROM ROWS FROM (pg_catalog.unnest(v_sel), pg_catalog.unnest(v_offs)) AS u (part, o)
                          GROUP BY u.part) AS m ON m.part = mine.part
             WHERE pl.group_name = p_group AND pl.part = mine.part;
        END IF;
    END IF;
    DELETE FROM mailbox._outbox_waiter AS w
     WHERE w.outbox_key = p_key AND w.group_name = p_group AND w.consumer_id = p_consumer;
    IF v_fast THEN
        RETURN QUERY
        SELECT r.outbox_id, r.event_id, r.created_at, r.source, r.event_type, r.key, r.headers,
               r.inserted_count, r.deleted_count, r.is_claim_check, r.full_refresh, r.payload, r.partition
          FROM mailbox._partition_rows(p_key, p_parts, v_min, v_end) AS r
         WHERE NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                            WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id)
         ORDER BY r.outbox_id;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.o, l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
           l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload, u.part
      FROM ROWS FROM (pg_catalog.unnest(v_offs), pg_catalog.unnest(v_rows), pg_catalog.unnest(v_sel)) AS u (o, row_id, part)
     CROSS JOIN LATERAL (
           -- one index probe per row (LIMIT keeps the planner from joining the whole log)
           SELECT x.* FROM mailbox._outbox_log AS x WHERE x.outbox_key = p_key AND x._id = u.row_id LIMIT 1
     ) AS l
     ORDER BY u.o;
END
$$;
