-- Part 22: the consumer-group data plane (SPEC §2.1, §2.2): poll, commit, extend, seek,
-- heartbeat. Lag and the monitoring views are part 23.

CREATE FUNCTION mailbox._check_positive(p_value int, p_param text, p_max int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION '% must not be null', p_param
            USING ERRCODE = '22004', HINT = pg_catalog.format('Pass %s from 1 to %s.', p_param, p_max);
    END IF;
    IF p_value < 1 OR p_value > p_max THEN
        RAISE EXCEPTION 'invalid %: %', p_param, p_value
            USING ERRCODE = '22023', HINT = pg_catalog.format('Pass %s from 1 to %s.', p_param, p_max);
    END IF;
    RETURN p_value;
END
$$;

CREATE FUNCTION mailbox.poll_outbox(
    p_group text, p_consumer text, p_batch_size int DEFAULT 100, p_visibility_seconds int DEFAULT 30
)
RETURNS TABLE (
    outbox_id bigint, event_id uuid, created_at timestamptz, source text, event_type text, key text,
    headers jsonb, inserted_count int, deleted_count int, is_claim_check boolean, full_refresh boolean,
    payload jsonb, partition int
)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers read the outbox and write leases only through this function
SET search_path = pg_catalog, mailbox, pg_temp
-- a batch is at most a few thousand index-scanned rows: starting parallel workers for it
-- (the planner's estimates can suggest it) costs more than the whole poll
SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
DECLARE
    v_group mailbox._consumer_group;
    v_until timestamptz;
    v_first bigint;
    v_last bigint;
    v_holder text;
    v_held_until timestamptz;
    v_head bigint;
    v_from_chunk bigint;
    v_beat timestamptz;
    v_now timestamptz;
    v_key int;
    v_numberer boolean;
    v_next_last bigint;
    v_parts int;
    v_unparked bigint[];
BEGIN
    PERFORM mailbox._check_positive(p_batch_size, 'p_batch_size', 100000);
    PERFORM mailbox._check_positive(p_visibility_seconds, 'p_visibility_seconds', 604800);
    -- The hot path inlines what helpers do elsewhere (PL/pgSQL caches these plans); the
    -- helpers run only to raise the right error.
    IF p_consumer IS NULL OR p_consumer = '' OR pg_catalog.char_length(p_consumer) > 200 THEN
        PERFORM mailbox._check_id('consumer id', p_consumer);
    END IF;
    -- Authority before anything is written (the heartbeat below writes). The common case --
    -- an outbox without grants, open to mailbox_consumer -- costs one index probe here.
    SELECT g.outbox_key INTO v_key FROM mailbox._consumer_group AS g WHERE g.group_name = p_group;
    IF NOT FOUND THEN
        v_key := mailbox._group_outbox(p_group); -- raises 22004, 22023 or 42704
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._object_grant AS x WHERE x.object_kind = 'outbox' AND x.object_key = v_key) THEN
        PERFORM mailbox._authorize('outbox', v_key, 'consume');
    END IF;
    -- The poll is a heartbeat: a known consumer's row is refreshed here, before the group
    -- lock, at most every 100 ms (unhealthy or reaped consumers are always older than that).
    -- Lock order is own consumer row, then group row, everywhere.
    SELECT c.last_heartbeat_at INTO v_beat FROM mailbox._consumer AS c
     WHERE c.group_name = p_group AND c.consumer_id = p_consumer;
    IF FOUND AND v_beat < pg_catalog.now() - interval '100 milliseconds' THEN
        UPDATE mailbox._consumer AS c
           SET last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
         WHERE c.group_name = p_group AND c.consumer_id = p_consumer;
    END IF;
    -- A group draining a change of the partition count (part 28) uses its old count until it
    -- drained, then switches (the numberer does that while one runs). (_group_partitions,
    -- inlined.)
    v_parts := (SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group);
    IF v_parts IS NOT NULL AND NOT mailbox._numberer_alive()
       AND mailbox._finish_partition_change(p_group, v_key, TRUE) THEN
        v_parts := NULL;
    END IF;
    -- A partitioned outbox (part 27): partitions are leased, not offset ranges.
    v_parts := coalesce(v_parts, (SELECT x.partitions FROM mailbox._outbox_partitioning AS x
                                   WHERE x.outbox_key = v_key));
    IF v_parts > 1 THEN
        RETURN QUERY SELECT * FROM mailbox._poll_partitioned(
            p_group, p_consumer, p_batch_size, p_visibility_seconds, v_key, v_parts);
        RETURN;
    END IF;
    -- With a numberer running (part 24) the group's new rows wait in slots it committed, and
    -- polls only claim lease rows with FOR UPDATE SKIP LOCKED: a poll never waits for another
    -- consumer, and one whose transaction stays open holds back only the rows it claimed
    -- (SPEC §2.2.4). Without one, this poll numbers and allocates itself, and from here to the
    -- caller's commit the consumers of this group take turns, as the group row is locked.
    v_numberer := mailbox._numberer_alive();
    IF v_numberer THEN
        SELECT * INTO v_group FROM mailbox._consumer_group AS g WHERE g.group_name = p_group;
    ELSE
        SELECT * INTO v_group FROM mailbox._consumer_group AS g WHERE g.group_name = p_group FOR NO KEY UPDATE;
    END IF;
    IF NOT FOUND THEN
        v_group := mailbox._lock_group(p_group);
    END IF;
    IF NOT v_numberer AND EXISTS (SELECT 1 FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key)
       AND mailbox._group_partitions(p_group, v_key) > 1 THEN
        -- the group switched to partitions while this poll waited for its row (part 28)
        RETURN QUERY SELECT * FROM mailbox._poll_partitioned(
            p_group, p_consumer, p_batch_size, p_visibility_seconds, v_key, mailbox._group_partitions(p_group, v_key));
        RETURN;
    END IF;
    -- A new consumer registers under the group lock: its foreign key takes a share lock on the
    -- group row, which taken before the lock would deadlock with another newcomer. Always, not
    -- only when unseen above: maintenance may have forgotten it meanwhile. (An existing row
    -- costs one index probe and no write.)
    INSERT INTO mailbox._consumer AS c (group_name, consumer_id)
    VALUES (p_group, p_consumer)
    ON CONFLICT (group_name, consumer_id) DO NOTHING;
    -- Lease times count from now, not from the start of the transaction: this poll may have
    -- waited for the group longer than the visibility timeout.
    v_now := pg_catalog.clock_timestamp();
    v_until := v_now + pg_catalog.make_interval(secs => p_visibility_seconds);
    -- rows an operator unparked (part 27) come first, alone
    IF EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k WHERE k.group_name = p_group AND k.unparked_at IS NOT NULL) THEN
        v_unparked := mailbox._take_unparked(p_group, p_consumer, NULL, v_until);
        IF v_unparked IS NOT NULL THEN
            RETURN QUERY
            SELECT k.outbox_id, k.event_id, k.created_at, k.source, k.event_type, k.key, k.headers,
                   k.inserted_count, k.deleted_count, k.is_claim_check, k.full_refresh, k.payload, 0
              FROM mailbox._outbox_parked AS k
             WHERE k.group_name = p_group AND k.outbox_id = ANY (v_unparked)
             ORDER BY k.outbox_id;
            RETURN;
        END IF;
    END IF;

    -- The group's lowest lease row that is a slot, expired (its rows are delivered again:
    -- at-least-once) or already this consumer's own comes first. Own: the poller may be a new
    -- incarnation under the same id that never saw those rows
    -- (docs/consumer-groups.md#restarts), and taking the lowest such lease means every other
    -- lease of this id lies above what it is given, so its commit covers only rows it
    -- received. Rows locked by an open poll or commit are skipped, not waited for.
    SELECT l.first_offset, l.last_offset, l.consumer_id, l.lease_until
      INTO v_first, v_last, v_holder, v_held_until
      FROM mailbox._lease AS l
     WHERE l.group_name = p_group
       AND (l.lease_until IS NULL OR l.lease_until <= v_now OR l.consumer_id = p_consumer)
     ORDER BY l.first_offset
     LIMIT 1
       FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        IF v_last - v_first + 1 > p_batch_size THEN
            -- take the front; the rest stays with its holder (or a slot), as it was -- though
            -- hidden from other polls until this transaction ends (docs/design.md §5)
            INSERT INTO mailbox._lease (group_name, first_offset, last_offset, consumer_id, lease_until)
            VALUES (p_group, v_first + p_batch_size, v_last, v_holder, v_held_until);
            v_last := v_first + p_batch_size - 1;
        ELSIF v_holder IS NULL THEN
            -- a slot: the free slots right after it join the batch while they fit
            LOOP
                SELECT l.last_offset INTO v_next_last
                  FROM mailbox._lease AS l
                 WHERE l.group_name = p_group AND l.first_offset = v_last + 1 AND l.consumer_id IS NULL
                   AND l.last_offset - v_first + 1 <= p_batch_size -- (a slot that does not fit stays unlocked)
                   FOR UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                DELETE FROM mailbox._lease AS l WHERE l.group_name = p_group AND l.first_offset = v_last + 1;
                v_last := v_next_last;
            END LOOP;
        END IF;
        UPDATE mailbox._lease
           SET last_offset = v_last, consumer_id = p_consumer, lease_until = v_until
         WHERE group_name = p_group AND first_offset = v_first;
        IF v_holder <> p_consumer THEN
            -- fencing: the lease now names the new holder, so the old holder's late commit
            -- cannot acknowledge these rows; this row makes that commit warn
            INSERT INTO mailbox._lost_lease AS x (group_name, consumer_id, first_offset, last_offset)
            SELECT p_group, v_holder, v_first, v_last
             WHERE EXISTS (SELECT 1 FROM mailbox._consumer AS c
                            WHERE c.group_name = p_group AND c.consumer_id = v_holder)
            ON CONFLICT (group_name, consumer_id, first_offset)
            DO UPDATE SET last_offset = greatest(x.last_offset, excluded.last_offset);
            -- rows this consumer had lost and now holds again are no longer lost
            PERFORM mailbox._forget_lost_range(p_group, p_consumer, v_first, v_last);
        END IF;
    ELSE
        v_first := v_group.delivered_offset + 1;
        -- (capped at the boundary of a partition change the group drains: _group_head of part
        -- 28, inlined)
        v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                              WHERE x.group_name = p_group))
                     FROM mailbox._outbox AS o WHERE o.outbox_key = v_group.outbox_key);
        IF v_head < v_first + p_batch_size - 1 AND NOT v_numberer THEN
            PERFORM mailbox._sequence_outbox(v_group.outbox_key, greatest(p_batch_size, 1000));
            v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                                  WHERE x.group_name = p_group))
                         FROM mailbox._outbox AS o WHERE o.outbox_key = v_group.outbox_key);
        END IF;
        -- with a numberer, unclaimed rows are in slots: what is left is claimed by open polls
        -- or not numbered yet, and the numberer's next pass wakes this consumer
        IF v_head < v_first OR v_numberer THEN
            -- nothing to deliver: this consumer now waits for a wake-up (part 17)
            INSERT INTO mailbox._outbox_waiter AS w (outbox_key, group_name, consumer_id, waiting_until)
            VALUES (v_group.outbox_key, p_group, p_consumer,
                    v_now + least(mailbox._heartbeat_timeout(), interval '60 seconds'))
            ON CONFLICT (outbox_key, group_name, consumer_id) DO UPDATE SET waiting_until = excluded.waiting_until;
            RETURN;
        END IF;
        v_last := least(v_head, v_first + p_batch_size - 1);
        INSERT INTO mailbox._lease (group_name, first_offset, last_offset, consumer_id, lease_until)
        VALUES (p_group, v_first, v_last, p_consumer, v_until);
        UPDATE mailbox._consumer_group SET delivered_offset = v_last WHERE group_name = p_group;
    END IF;
    -- Rows v_first .. v_last, from the chunks that hold them (contiguous, so: from the one
    -- holding v_first to the one before v_last). A dense chunk (keys first_id, first_id + 1,
    -- ...) is read with one index range scan; others by joining their key slice to the log.
    v_from_chunk := coalesce((SELECT pg_catalog.max(c.base_offset) FROM mailbox._outbox_chunk AS c
                               WHERE c.outbox_key = v_group.outbox_key AND c.base_offset < v_first), 0);
    -- parked rows (part 28) were acknowledged for this group by outbox_park: never again
    -- from the log (an unparked one comes back through _take_unparked above)
    RETURN QUERY
    SELECT q.* FROM (
        SELECT c.base_offset + 1 + (l._id - c.first_id) AS o,
               l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
               l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload, 0
          FROM mailbox._outbox_chunk AS c
          JOIN mailbox._outbox_log AS l
            ON l.outbox_key = c.outbox_key
           AND l._id BETWEEN c.first_id + greatest(v_first - c.base_offset - 1, 0)
                         AND c.first_id + least(v_last - c.base_offset, c.row_count) - 1
         WHERE c.outbox_key = v_group.outbox_key AND c.dense
           AND c.base_offset >= v_from_chunk AND c.base_offset < v_last
        UNION ALL
        SELECT s.first_in_chunk + u.n - 1,
               l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
               l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload, 0
          FROM mailbox._outbox_chunk AS c
         CROSS JOIN LATERAL (
               SELECT greatest(v_first, c.base_offset + 1) AS first_in_chunk,
                      least(v_last, c.base_offset + c.row_count) AS last_in_chunk
         ) AS s
         CROSS JOIN LATERAL pg_catalog.unnest(
               c.ids[(s.first_in_chunk - c.base_offset)::int:(s.last_in_chunk - c.base_offset)::int]
         ) WITH ORDINALITY AS u (id, n)
          JOIN mailbox._outbox_log AS l ON l.outbox_key = c.outbox_key AND l._id = u.id
         WHERE c.outbox_key = v_group.outbox_key AND NOT c.dense
           AND c.base_offset >= v_from_chunk AND c.base_offset < v_last
    ) AS q
     WHERE NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                        WHERE k.group_name = p_group AND k.outbox_id = q.o)
     ORDER BY 1;
    -- a busy consumer needs no wake-up: producers stop notifying (no write when not waiting)
    DELETE FROM mailbox._outbox_waiter AS w
     WHERE w.outbox_key = v_group.outbox_key AND w.group_name = p_group AND w.consumer_id = p_consumer;
END
$$;
COMMENT ON FUNCTION mailbox.poll_outbox(text, text, int, int) IS
'lease the next rows of a consumer group (expired leases first) to a consumer, in offset order';
