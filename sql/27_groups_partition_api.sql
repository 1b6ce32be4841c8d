-- Part 27: polling, committing and parking in partitioned groups (SPEC §2.3; part 26 has
-- the tables and docs/ordering.md the guarantees).

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
    v_inflight boolean;
    v_offs bigint[];
    v_rows bigint[];
    v_sel int[];
    v_unparked bigint[];
    v_parked boolean;
BEGIN
    INSERT INTO mailbox._consumer AS c (group_name, consumer_id)
    VALUES (p_group, p_consumer)
    ON CONFLICT (group_name, consumer_id) DO NOTHING;
    -- without a numberer, number when the group is near the head (as part 22 does)
    IF (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = p_key)
       < (SELECT pg_catalog.max(pl.delivered_offset) FROM mailbox._partition_lease AS pl
           WHERE pl.group_name = p_group) + p_batch_size
       AND NOT mailbox._numberer_alive() THEN
        PERFORM mailbox._sequence_outbox(p_key, greatest(p_batch_size, 1000));
    END IF;
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
    ELSIF pg_catalog.cardinality(v_mine) < v_share THEN
        -- free partitions and those of a silent consumer (lease expired) up to the share
        FOR v_rec IN
            SELECT pl.part, pl.consumer_id, pl.acked_offset, pl.delivered_offset
              FROM mailbox._partition_lease AS pl
             WHERE pl.group_name = p_group AND pl.consumer_id IS DISTINCT FROM p_consumer
               AND (pl.consumer_id IS NULL OR pl.lease_until <= v_now)
             ORDER BY pl.part
             LIMIT v_share - pg_catalog.cardinality(v_mine)
               FOR UPDATE SKIP LOCKED
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
    -- new. A partition whose in-flight rows were all parked is acknowledged up to them.
    SELECT pg_catalog.min(u.a), pg_catalog.max(u.d) INTO v_min, v_max
      FROM ROWS FROM (pg_catalog.unnest(v_ack), pg_catalog.unnest(v_del)) AS u (a, d) WHERE u.d > u.a;
    IF v_min IS NOT NULL THEN
        SELECT pg_catalog.array_agg(w.outbox_id ORDER BY w.outbox_id), pg_catalog.array_agg(w.row_id ORDER BY w.outbox_id),
               pg_catalog.array_agg(w.part ORDER BY w.outbox_id)
          INTO v_offs, v_rows, v_sel
          FROM (SELECT x.outbox_id, x.row_id, x.part::int AS part FROM mailbox._outbox_part AS x
                 WHERE x.outbox_key = p_key AND x.outbox_id > v_min AND x.outbox_id <= v_max
                   AND x.outbox_id > v_ack[x.part + 1] AND x.outbox_id <= v_del[x.part + 1]
                   AND (NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                                     WHERE k.group_name = p_group AND k.outbox_id = x.outbox_id))
                 ORDER BY x.outbox_id LIMIT p_batch_size) AS w;
    END IF;
    v_inflight := v_offs IS NOT NULL;
    IF v_inflight THEN
        UPDATE mailbox._partition_lease AS pl SET lease_until = v_until
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
    ELSE
        UPDATE mailbox._partition_lease AS pl SET acked_offset = pl.delivered_offset
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) AND pl.delivered_offset > pl.acked_offset;
        FOR v_rec IN SELECT pl.part, pl.acked_offset FROM mailbox._partition_lease AS pl
                      WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) LOOP
            v_ack[v_rec.part + 1] := v_rec.acked_offset;
        END LOOP;
        v_min := (SELECT pg_catalog.min(a) FROM pg_catalog.unnest(v_ack) AS a);
        -- the next rows of this consumer's partitions, in offset order (one index range
        -- scan of the outbox's offsets from the lowest acknowledged one)
        SELECT pg_catalog.array_agg(w.outbox_id ORDER BY w.outbox_id), pg_catalog.array_agg(w.row_id ORDER BY w.outbox_id),
               pg_catalog.array_agg(w.part ORDER BY w.outbox_id)
          INTO v_offs, v_rows, v_sel
          FROM (SELECT x.outbox_id, x.row_id, x.part::int AS part FROM mailbox._outbox_part AS x
                 WHERE x.outbox_key = p_key AND x.outbox_id > v_min AND x.outbox_id > v_ack[x.part + 1]
                   AND (NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                                     WHERE k.group_name = p_group AND k.outbox_id = x.outbox_id))
                 ORDER BY x.outbox_id LIMIT p_batch_size) AS w;
        IF v_offs IS NULL THEN
            UPDATE mailbox._partition_lease AS pl SET lease_until = v_until
             WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
            INSERT INTO mailbox._outbox_waiter AS w (outbox_key, group_name, consumer_id, waiting_until)
            VALUES (p_key, p_group, p_consumer, v_now + least(mailbox._heartbeat_timeout(), interval '60 seconds'))
            ON CONFLICT (outbox_key, group_name, consumer_id) DO UPDATE SET waiting_until = excluded.waiting_until;
            RETURN;
        END IF;
        UPDATE mailbox._partition_lease AS pl
           SET delivered_offset = coalesce(m.last_offset, pl.delivered_offset), lease_until = v_until
          FROM pg_catalog.unnest(v_mine) AS mine (part)
          LEFT JOIN (SELECT u.part, pg_catalog.max(u.o) AS last_offset
                       FROM ROWS FROM (pg_catalog.unnest(v_sel), pg_catalog.unnest(v_offs)) AS u (part, o)
                      GROUP BY u.part) AS m ON m.part = mine.part
         WHERE pl.group_name = p_group AND pl.part = mine.part;
    END IF;
    DELETE FROM mailbox._outbox_waiter AS w
     WHERE w.outbox_key = p_key AND w.group_name = p_group AND w.consumer_id = p_consumer;
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
        v_n := (SELECT pg_catalog.count(*) FROM mailbox._outbox_part AS x
                 WHERE x.outbox_key = p_key AND x.outbox_id > v_min AND x.outbox_id <= p_last_offset
                   AND x.outbox_id > v_ack[x.part + 1] AND x.outbox_id <= v_del[x.part + 1]
                   -- a parked row was acknowledged by outbox_park (an unparked one below)
                   AND NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                    WHERE k.group_name = p_group AND k.outbox_id = x.outbox_id));
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
       (SELECT pg_catalog.count(*) FROM mailbox._outbox_part AS x
         WHERE x.outbox_key = g.outbox_key AND x.outbox_id > pl.acked_offset
           AND x.outbox_id <= pl.delivered_offset AND x.part = pl.part) AS in_flight,
       (SELECT pg_catalog.count(*) FROM mailbox._outbox_part AS x
         WHERE x.outbox_key = g.outbox_key AND x.outbox_id > pl.acked_offset AND x.part = pl.part
           AND NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                            WHERE k.group_name = pl.group_name AND k.outbox_id = x.outbox_id)) AS lag
  FROM mailbox._partition_lease AS pl
  JOIN mailbox._consumer_group AS g ON g.group_name = pl.group_name;
COMMENT ON VIEW mailbox.consumer_partition_lag IS
'per partition of each partitioned group: holder, acknowledged and delivered offsets, rows in flight, lag';

GRANT SELECT ON mailbox.consumer_partition_lag, mailbox.outbox_parked TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox._readable_group_outboxes() TO mailbox_consumer;
