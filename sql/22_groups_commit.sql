-- Part 22 (continued): commit, extend, seek and heartbeat of the consumer-group data plane
-- (SPEC §2.1, §2.2); polls are in 22_groups_api.sql.

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
    -- the group's count (_group_partitions of part 28, inlined)
    IF coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                (SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key)) > 1 THEN
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
         WHERE g.group_name = p_group FOR NO KEY UPDATE;
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
        RETURNING l.first_offset AS f, l.last_offset AS t
    )
    -- parked rows were acknowledged by outbox_park (unparked ones are counted below)
    SELECT coalesce(pg_catalog.sum(a.t - a.f + 1 - (SELECT pg_catalog.count(*) FROM mailbox._outbox_parked AS k
                                                     WHERE k.group_name = p_group
                                                       AND k.outbox_id BETWEEN a.f AND a.t)), 0)
      INTO v_full FROM acked AS a;
    WITH cut AS (
        SELECT l.first_offset FROM mailbox._lease AS l
         WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.first_offset = v_batch
           AND l.last_offset > p_last_offset
    ), moved AS (
        UPDATE mailbox._lease AS l SET first_offset = p_last_offset + 1
          FROM cut
         WHERE l.group_name = p_group AND l.first_offset = cut.first_offset
        RETURNING cut.first_offset AS f
    )
    SELECT coalesce(pg_catalog.sum(p_last_offset - m.f + 1 - (SELECT pg_catalog.count(*) FROM mailbox._outbox_parked AS k
                                                               WHERE k.group_name = p_group
                                                                 AND k.outbox_id BETWEEN m.f AND p_last_offset)), 0)
      INTO v_partial FROM moved AS m;
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
    -- a group draining a change of the partition count (part 28) replays in the new one
    DELETE FROM mailbox._partition_change AS x WHERE x.group_name = p_group;
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
