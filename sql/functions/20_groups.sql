-- Part 20: consumer groups over an outbox (SPEC §2): catalog and leases.
--
-- A group reads offsets in order. delivered_offset is how far it has handed rows out (to a
-- consumer, or to a slot while a numberer runs, part 24); every offset in
-- (group_offset, delivered_offset] is in exactly one lease, a contiguous range held by one
-- consumer until it is acknowledged (the lease row is deleted) or expires (the next poll of
-- any consumer takes it over), or a slot no poll has claimed yet. So group_offset, the highest offset H with every row
-- <= H acknowledged, is simply the lowest leased offset - 1, or delivered_offset without
-- leases. Polls and commits write one lease row per batch, never one row per message.

-- The group offset as it is now: every offset of a group above it is in a lease row (claimed
-- or a slot), so it is the lowest leased offset - 1, or delivered_offset without any. The
-- stored group_offset is this value as of the last commit (no numberer running) or the last
-- numberer pass: a commit never writes the group row while a numberer runs, since an open
-- transaction holding it would stop the numberer from handing the group new rows.
CREATE FUNCTION mailbox._group_offset(p_group text, p_delivered bigint)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce((SELECT pg_catalog.min(l.first_offset) - 1 FROM mailbox._lease AS l
                      WHERE l.group_name = p_group), p_delivered);
$$;

-- A group by name, locked for the caller's change, or 42704.
CREATE FUNCTION mailbox._lock_group(p_group text)
RETURNS mailbox._consumer_group
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_group mailbox._consumer_group;
BEGIN
    SELECT * INTO v_group FROM mailbox._consumer_group AS g WHERE g.group_name = p_group FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM mailbox._group_outbox(p_group); -- raises 22004, 22023 or 42704
    END IF;
    RETURN v_group;
END
$$;

-- The outbox key of a group (no lock), or 42704.
CREATE FUNCTION mailbox._group_outbox(p_group text)
RETURNS int
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
BEGIN
    PERFORM mailbox._check_id('consumer group', p_group);
    SELECT g.outbox_key INTO v_key FROM mailbox._consumer_group AS g WHERE g.group_name = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer group not found: %', p_group
            USING ERRCODE = '42704', HINT = 'Create it with mailbox.create_consumer_group().';
    END IF;
    RETURN v_key;
END
$$;

-- A registered consumer (heartbeat refreshed), or 42704.
CREATE FUNCTION mailbox._touch_consumer(p_group text, p_consumer text)
RETURNS mailbox._consumer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_consumer mailbox._consumer;
BEGIN
    PERFORM mailbox._check_id('consumer id', p_consumer);
    UPDATE mailbox._consumer AS c
       SET last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
     WHERE c.group_name = p_group AND c.consumer_id = p_consumer
    RETURNING * INTO v_consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer not found: % in group %', p_consumer, p_group
            USING ERRCODE = '42704', HINT = 'A consumer registers itself with its first mailbox.poll_outbox().';
    END IF;
    RETURN v_consumer;
END
$$;

-- Offsets p_first .. p_last are a consumer's again (it took them over): they leave its lost
-- ranges, so its commit does not warn 'lease lost' for rows it holds. What it lost around
-- them stays lost.
CREATE FUNCTION mailbox._forget_lost_range(p_group text, p_consumer text, p_first bigint, p_last bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._lost_lease AS x
         WHERE x.group_name = p_group AND x.consumer_id = p_consumer
           AND x.first_offset <= p_last AND x.last_offset >= p_first
        RETURNING x.first_offset, x.last_offset
    ), kept AS (
        SELECT r.first_offset, pg_catalog.max(r.last_offset) AS last_offset
          FROM gone
         CROSS JOIN LATERAL (
               VALUES (gone.first_offset, p_first - 1), (p_last + 1, gone.last_offset)
         ) AS r (first_offset, last_offset)
         WHERE r.first_offset <= r.last_offset
         GROUP BY r.first_offset
    )
    INSERT INTO mailbox._lost_lease AS x (group_name, consumer_id, first_offset, last_offset)
    SELECT p_group, p_consumer, k.first_offset, k.last_offset FROM kept AS k
    ON CONFLICT (group_name, consumer_id, first_offset)
    DO UPDATE SET last_offset = greatest(x.last_offset, excluded.last_offset);
$$;

-- Registers a consumer on first contact; refreshes its heartbeat otherwise.
CREATE FUNCTION mailbox._register_consumer(p_group text, p_consumer text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_id('consumer id', p_consumer);
    INSERT INTO mailbox._consumer AS c (group_name, consumer_id)
    VALUES (p_group, p_consumer)
    ON CONFLICT (group_name, consumer_id)
    DO UPDATE SET last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL;
END
$$;

-- Every offset up to the head, numbered (used where "the head" must include every row
-- committed so far: 'latest' groups, seek to the head, lag).
CREATE FUNCTION mailbox._sequence_all(p_key int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_n bigint;
BEGIN
    LOOP
        v_n := mailbox._sequence_outbox(p_key, 100000);
        EXIT WHEN v_n < 100000;
    END LOOP;
    RETURN (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
END
$$;

CREATE FUNCTION mailbox.create_consumer_group(
    p_name text, p_outbox text, p_auto_offset_reset text DEFAULT 'latest'
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the extension catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_start bigint;
BEGIN
    PERFORM mailbox._check_id('consumer group', p_name);
    v_key := mailbox._outbox_key(p_outbox);
    PERFORM mailbox._require(p_auto_offset_reset, 'p_auto_offset_reset');
    IF p_auto_offset_reset NOT IN ('earliest', 'latest') THEN
        RAISE EXCEPTION 'invalid auto_offset_reset: %', pg_catalog.quote_literal(p_auto_offset_reset)
            USING ERRCODE = '22023', HINT = 'Use ''earliest'' (every retained row) or ''latest'' (rows committed from now on).';
    END IF;
    PERFORM mailbox._ddl_lock();
    IF EXISTS (SELECT 1 FROM mailbox._consumer_group WHERE group_name = p_name) THEN
        RAISE EXCEPTION 'consumer group already exists: %', p_name
            USING ERRCODE = '42710', HINT = 'Choose another name, or drop it with mailbox.drop_consumer_group().';
    END IF;
    IF p_auto_offset_reset = 'latest' THEN
        v_start := mailbox._sequence_all(v_key);
    ELSE
        PERFORM mailbox._retention_lock(v_key); -- a running drain finishes first
        v_start := (SELECT r.low_offset FROM mailbox._outbox_retention AS r WHERE r.outbox_key = v_key);
    END IF;
    INSERT INTO mailbox._consumer_group (group_name, outbox_key, auto_offset_reset, group_offset, delivered_offset)
    VALUES (p_name, v_key, p_auto_offset_reset, v_start, v_start);
    PERFORM mailbox._reset_partitions(p_name, v_key, v_start); -- a partitioned outbox (part 26)
END
$$;
COMMENT ON FUNCTION mailbox.create_consumer_group(text, text, text) IS
'create a consumer group reading an outbox from its oldest retained row (earliest) or its head (latest)';

CREATE FUNCTION mailbox.drop_consumer_group(p_name text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the extension catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._require(p_name, 'p_name');
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    -- lock order as in poll_outbox: consumer rows, then the group row (the cascade below
    -- would take them the other way round)
    PERFORM FROM mailbox._consumer AS c WHERE c.group_name = p_name ORDER BY c.consumer_id FOR UPDATE;
    DELETE FROM mailbox._claim_check_consumed WHERE group_name = p_name;
    DELETE FROM mailbox._outbox_waiter AS w WHERE w.group_name = p_name;
    DELETE FROM mailbox._consumer_group WHERE group_name = p_name;
    IF NOT FOUND THEN
        IF p_if_exists THEN
            RAISE NOTICE 'consumer group not found, skipping: %', p_name;
            RETURN;
        END IF;
        RAISE EXCEPTION 'consumer group not found: %', p_name
            USING ERRCODE = '42704', HINT = 'mailbox.consumer_group_lag lists the groups.';
    END IF;
END
$$;
COMMENT ON FUNCTION mailbox.drop_consumer_group(text, boolean) IS
'drop a consumer group with its consumers and leases';
