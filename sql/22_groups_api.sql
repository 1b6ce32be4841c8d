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
    -- A partitioned outbox (part 27): partitions are leased, not offset ranges.
    v_parts := (SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key);
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
        SELECT * INTO v_group FROM mailbox._consumer_group AS g WHERE g.group_name = p_group FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        v_group := mailbox._lock_group(p_group);
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
        v_head := (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = v_group.outbox_key);
        IF v_head < v_first + p_batch_size - 1 AND NOT v_numberer THEN
            PERFORM mailbox._sequence_outbox(v_group.outbox_key, greatest(p_batch_size, 1000));
            v_head := (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = v_group.outbox_key);
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
    RETURN QUERY
    SELECT c.base_offset + 1 + (l._id - c.first_id),
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
     ORDER BY 1;
    -- a busy consumer needs no wake-up: producers stop notifying (no write when not waiting)
    DELETE FROM mailbox._outbox_waiter AS w
     WHERE w.outbox_key = v_group.outbox_key AND w.group_name = p_group AND w.consumer_id = p_consumer;
END
$$;
COMMENT ON FUNCTION mailbox.poll_outbox(text, text, int, int) IS
'lease the next rows of a consumer group (expired leases first) to a consumer, in offset order';

CREATE FUNCTION mailbox.commit_offset(p_group text, p_consumer text, p_last_offset bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers acknowledge only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_consumer mailbox._consumer;
    v_delivered bigint;
    v_full bigint;
    v_partial bigint;
    v_batch bigint;
    v_numberer boolean;
    v_key int := mailbox._group_outbox(p_group);
    v_unparked bigint;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'consume');
    -- lock order as in poll_outbox: own consumer row, then the group row
    SELECT * INTO v_consumer FROM mailbox._consumer AS c
     WHERE c.group_name = p_group AND c.consumer_id = p_consumer
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM mailbox._lock_group(p_group);                 -- raises for a bad or unknown group
        PERFORM mailbox._touch_consumer(p_group, p_consumer); -- raises 22004, 22023 or 42704
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key) THEN
        RETURN mailbox._commit_partitioned(p_group, p_consumer, p_last_offset, v_key, v_consumer.committed_offset);
    END IF;
    -- Without a numberer, commits and polls of a group take turns on its row, as the group
    -- offset is stored here. With one, the commit locks only this consumer's rows (the
    -- numberer stores the group offset), so an open transaction holds back nothing else.
    v_numberer := mailbox._numberer_alive();
    IF v_numberer THEN
        SELECT g.delivered_offset INTO v_delivered FROM mailbox._consumer_group AS g
         WHERE g.group_name = p_group;
    ELSE
        SELECT g.delivered_offset INTO v_delivered FROM mailbox._consumer_group AS g
         WHERE g.group_name = p_group FOR UPDATE;
    END IF;
    PERFORM mailbox._require(p_last_offset, 'p_last_offset');
    IF p_last_offset < 0 THEN
        RAISE EXCEPTION 'invalid p_last_offset: %', p_last_offset
            USING ERRCODE = '22023',
                  HINT = 'Pass the offset (outbox_id) of the last row processed; offsets start at 1.';
    END IF;

    -- A commit acknowledges one batch: this consumer's highest lease starting at or below the
    -- offset. Two live processes under one id (a restart whose predecessor still runs, a
    -- retried commit) may each hold a batch of that id; one's commit must not acknowledge the
    -- other's lower batch, which it never received (docs/consumer-groups.md#restarts).
    v_batch := (SELECT pg_catalog.max(l.first_offset) FROM mailbox._lease AS l
                 WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.first_offset <= p_last_offset);
    WITH acked AS (
        DELETE FROM mailbox._lease AS l
         WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.first_offset = v_batch
           AND l.last_offset <= p_last_offset
        RETURNING l.last_offset - l.first_offset + 1 AS n
    )
    SELECT coalesce(pg_catalog.sum(n), 0) INTO v_full FROM acked;
    WITH cut AS (
        SELECT l.first_offset FROM mailbox._lease AS l
         WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.first_offset = v_batch
           AND l.last_offset > p_last_offset
    ), moved AS (
        UPDATE mailbox._lease AS l SET first_offset = p_last_offset + 1
          FROM cut
         WHERE l.group_name = p_group AND l.first_offset = cut.first_offset
        RETURNING p_last_offset - cut.first_offset + 1 AS n
    )
    SELECT coalesce(pg_catalog.sum(n), 0) INTO v_partial FROM moved;
    -- unparked rows this consumer received again (part 27)
    WITH gone AS (
        DELETE FROM mailbox._outbox_parked AS k
         WHERE k.group_name = p_group AND k.consumer_id = p_consumer AND k.unparked_at IS NOT NULL
           AND k.outbox_id <= p_last_offset
        RETURNING 1
    )
    SELECT pg_catalog.count(*) INTO v_unparked FROM gone;
    v_partial := v_partial + v_unparked;
    -- After the leases: a takeover of this consumer's lease that was running when this commit
    -- started (possible with a numberer, where nothing serialises them) made the DELETE above
    -- wait and skip the row; its lost range is visible from this statement on.
    DELETE FROM mailbox._lost_lease AS x
     WHERE x.group_name = p_group AND x.consumer_id = p_consumer AND x.first_offset <= p_last_offset;
    IF FOUND THEN
        RAISE WARNING 'lease lost: consumer % of group % no longer holds some offsets up to %',
            p_consumer, p_group, p_last_offset
            USING DETAIL = 'Its lease expired and the rows were delivered to another consumer.',
                  HINT = 'Extend leases with mailbox.extend_lease() while a batch takes longer than its visibility timeout.';
    END IF;
    -- Below the committed offset with nothing held there: a regression, ignored. (Rows this
    -- consumer holds below it -- redelivered to it after a takeover -- are acknowledged above.)
    IF v_full + v_partial = 0 AND p_last_offset < v_consumer.committed_offset THEN
        PERFORM mailbox._touch_consumer(p_group, p_consumer);
        RAISE WARNING 'commit below committed offset: consumer % of group % is at %, got %',
            p_consumer, p_group, v_consumer.committed_offset, p_last_offset
            USING HINT = 'Nothing was acknowledged; offsets only move forward (use mailbox.seek_offset() to move back).';
        RETURN 0;
    END IF;

    IF NOT v_numberer THEN
        UPDATE mailbox._consumer_group AS g
           SET group_offset = mailbox._group_offset(p_group, g.delivered_offset)
         WHERE g.group_name = p_group;
    END IF;
    -- nothing past what the group handed out can have been processed: a commit beyond it
    -- records the delivered offset, so the committed offset never passes the head
    UPDATE mailbox._consumer
       SET committed_offset = greatest(committed_offset, least(p_last_offset, v_delivered)),
           last_commit_at = pg_catalog.now(),
           last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
     WHERE group_name = p_group AND consumer_id = p_consumer;
    RETURN v_full + v_partial;
END
$$;
COMMENT ON FUNCTION mailbox.commit_offset(text, text, bigint) IS
'acknowledge the rows this consumer holds leases on up to an offset; returns how many';

CREATE FUNCTION mailbox.extend_lease(p_group text, p_consumer text, p_extension_seconds int DEFAULT 30)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers change their own leases only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_until timestamptz;
    v_now timestamptz;
BEGIN
    PERFORM mailbox._authorize('outbox', mailbox._group_outbox(p_group), 'consume');
    PERFORM mailbox._touch_consumer(p_group, p_consumer);
    PERFORM mailbox._require(p_extension_seconds, 'p_extension_seconds');
    IF p_extension_seconds < 0 THEN
        RAISE EXCEPTION 'invalid p_extension_seconds: %', p_extension_seconds
            USING ERRCODE = '22023', HINT = 'Pass 0 or more seconds from now.';
    END IF;
    -- only live leases: an expired one may already belong to someone else. The clock, not
    -- now(): the transaction may have started long before (or waited for a lock).
    v_now := pg_catalog.clock_timestamp();
    UPDATE mailbox._lease
       SET lease_until = v_now + pg_catalog.make_interval(secs => p_extension_seconds)
     WHERE group_name = p_group AND consumer_id = p_consumer AND lease_until > v_now;
    IF FOUND THEN
        v_until := v_now + pg_catalog.make_interval(secs => p_extension_seconds);
    END IF;
    -- partition leases and unparked rows delivered again (parts 26, 27)
    UPDATE mailbox._partition_lease
       SET lease_until = v_now + pg_catalog.make_interval(secs => p_extension_seconds)
     WHERE group_name = p_group AND consumer_id = p_consumer AND lease_until > v_now;
    IF FOUND THEN
        v_until := v_now + pg_catalog.make_interval(secs => p_extension_seconds);
    END IF;
    UPDATE mailbox._outbox_parked
       SET lease_until = v_now + pg_catalog.make_interval(secs => p_extension_seconds)
     WHERE group_name = p_group AND consumer_id = p_consumer AND lease_until > v_now;
    IF FOUND THEN
        v_until := v_now + pg_catalog.make_interval(secs => p_extension_seconds);
    END IF;
    RETURN v_until;
END
$$;
COMMENT ON FUNCTION mailbox.extend_lease(text, text, int) IS
'move every live lease of a consumer to now() + p_extension_seconds; NULL when it holds none';

CREATE FUNCTION mailbox.seek_offset(p_group text, p_consumer text, p_new_offset bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- moves a group's offsets in the extension catalog
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_group mailbox._consumer_group;
    v_head bigint;
    v_low bigint;
    v_new bigint;
    v_key int;
BEGIN
    PERFORM mailbox._check_id('consumer id', p_consumer);
    v_key := mailbox._group_outbox(p_group);
    PERFORM mailbox._authorize('outbox', v_key, 'consume'); -- consume covers seek (SPEC §0)
    -- the retention drain of this outbox must not run between the seek and its commit, and
    -- locks go consumer rows first, then the group row, as everywhere
    PERFORM mailbox._retention_lock(v_key);
    PERFORM FROM mailbox._consumer AS c WHERE c.group_name = p_group
     ORDER BY c.consumer_id FOR NO KEY UPDATE;
    v_group := mailbox._lock_group(p_group);
    PERFORM mailbox._register_consumer(p_group, p_consumer);
    IF p_new_offset < 0 THEN
        RAISE EXCEPTION 'invalid offset: %', p_new_offset
            USING ERRCODE = '22023', HINT = 'Offsets start at 0 (before the first row); NULL means the head.';
    END IF;
    v_head := mailbox._sequence_all(v_group.outbox_key);
    v_low := (SELECT r.low_offset FROM mailbox._outbox_retention AS r WHERE r.outbox_key = v_group.outbox_key);
    v_new := coalesce(p_new_offset, v_head);
    IF v_new > v_head OR v_new < v_low THEN
        RAISE NOTICE 'offset % is outside the retained range % .. %; using %', v_new, v_low, v_head,
            least(greatest(v_new, v_low), v_head);
        v_new := least(greatest(v_new, v_low), v_head);
    END IF;
    DELETE FROM mailbox._lease WHERE group_name = p_group;
    PERFORM mailbox._reset_partitions(p_group, v_group.outbox_key, v_new);
    UPDATE mailbox._consumer_group SET group_offset = v_new, delivered_offset = v_new WHERE group_name = p_group;
    UPDATE mailbox._consumer SET committed_offset = v_new WHERE group_name = p_group;
    DELETE FROM mailbox._lost_lease WHERE group_name = p_group;
    PERFORM mailbox._alert('consumer_seeked', pg_catalog.jsonb_build_object(
        'group', p_group, 'consumer', p_consumer, 'from_offset', v_group.group_offset, 'to_offset', v_new));
END
$$;
COMMENT ON FUNCTION mailbox.seek_offset(text, text, bigint) IS
'move a consumer group so that rows after p_new_offset (NULL: the head) are delivered next';

CREATE FUNCTION mailbox.consumer_heartbeat(p_group text, p_consumer text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers report liveness only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._authorize('outbox', mailbox._group_outbox(p_group), 'consume');
    PERFORM mailbox._touch_consumer(p_group, p_consumer);
END
$$;
COMMENT ON FUNCTION mailbox.consumer_heartbeat(text, text) IS 'record that a consumer is alive';
