-- Part 42: the statements of the outbox's maintenance steps, one private function each.
-- mailbox_server/outbox_maintenance.py orchestrates them (order, budgets, alerts); every
-- statement lives here, where sqlfluff lints it and the API snapshot shows it.

-- Consumer rows are locked in (group, consumer) order, the order seek_offset and
-- drop_consumer_group use, so maintenance cannot deadlock with them.

-- Consumers whose heartbeat just passed the timeout: marked, returned once (one
-- consumer_unhealthy alert per healthy -> unhealthy transition).
CREATE FUNCTION mailbox._mark_unhealthy_consumers(p_timeout_seconds int)
RETURNS TABLE (group_name text, consumer_id text, last_heartbeat_at text)
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._consumer AS c
       SET unhealthy_since = pg_catalog.now()
      FROM (SELECT x.group_name, x.consumer_id FROM mailbox._consumer AS x
             WHERE x.unhealthy_since IS NULL AND x.reaped_at IS NULL
               AND x.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(secs => p_timeout_seconds)
             ORDER BY x.group_name, x.consumer_id
               FOR NO KEY UPDATE) AS t
     WHERE c.group_name = t.group_name AND c.consumer_id = t.consumer_id
    RETURNING c.group_name, c.consumer_id, c.last_heartbeat_at::text;
$$;

-- Consumers silent past the dead threshold: marked reaped and returned (their leases are
-- released by _release_consumer_leases, one call each, so each alert carries its count).
CREATE FUNCTION mailbox._reap_dead_consumers(p_dead_hours int)
RETURNS TABLE (group_name text, consumer_id text, last_heartbeat_at text)
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._consumer AS c
       SET reaped_at = pg_catalog.now()
      FROM (SELECT x.group_name, x.consumer_id FROM mailbox._consumer AS x
             WHERE x.reaped_at IS NULL
               AND x.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(hours => p_dead_hours)
             ORDER BY x.group_name, x.consumer_id
               FOR NO KEY UPDATE) AS t
     WHERE c.group_name = t.group_name AND c.consumer_id = t.consumer_id
    RETURNING c.group_name, c.consumer_id, c.last_heartbeat_at::text;
$$;

-- Expires a reaped consumer's live leases now; returns how many rows they covered.
CREATE FUNCTION mailbox._release_consumer_leases(p_group text, p_consumer text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH released AS (
        UPDATE mailbox._lease AS l SET lease_until = pg_catalog.now()
         WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.lease_until > pg_catalog.now()
        RETURNING l.last_offset - l.first_offset + 1 AS n
    )
    SELECT coalesce(pg_catalog.sum(released.n), 0)::bigint FROM released;
$$;

-- Forgets consumers without commits (and silent) for p_days that hold no lease.
CREATE FUNCTION mailbox._forget_stale_consumers(p_days int)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._consumer AS c
         WHERE coalesce(c.last_commit_at, c.registered_at)
               <= pg_catalog.now() - pg_catalog.make_interval(days => p_days)
           AND c.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(days => p_days)
           AND NOT EXISTS (SELECT 1 FROM mailbox._lease AS l
                            WHERE l.group_name = c.group_name AND l.consumer_id = c.consumer_id)
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

CREATE FUNCTION mailbox._count_expired_leases()
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.count(*) FROM mailbox._lease AS l WHERE l.lease_until <= pg_catalog.now();
$$;

-- The lowest offset any group of the outbox still needs (NULL: no group). A partitioned
-- group stores its offset only now and then (part 27): it is computed.
CREATE FUNCTION mailbox._outbox_min_group_offset(p_key int)
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.min(CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                                             WHERE pl.group_name = g.group_name)
                               THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
                               ELSE g.group_offset END)
      FROM mailbox._consumer_group AS g WHERE g.outbox_key = p_key;
$$;

-- After forced retention moved the low mark past a group, the group continues after the
-- drained rows: its leases below the mark go and its offsets move up to it.
CREATE FUNCTION mailbox._catch_up_groups(p_key int)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH low AS (SELECT r.low_offset FROM mailbox._outbox_retention AS r WHERE r.outbox_key = p_key),
    trimmed AS (
        DELETE FROM mailbox._lease AS l USING mailbox._consumer_group AS g, low
         WHERE g.outbox_key = p_key AND l.group_name = g.group_name AND l.last_offset <= low.low_offset
    )
    UPDATE mailbox._consumer_group AS g
       SET delivered_offset = greatest(g.delivered_offset, low.low_offset),
           group_offset = greatest(g.group_offset, low.low_offset)
      FROM low
     WHERE g.outbox_key = p_key AND g.group_offset < low.low_offset;
$$;

CREATE FUNCTION mailbox._record_drain(p_key int, p_count bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._outbox_retention
       SET last_drained_at = pg_catalog.now(), last_drained_count = p_count
     WHERE outbox_key = p_key;
$$;

-- An outbox's size and whether a storage alert is standing for it.
CREATE FUNCTION mailbox._outbox_storage_state(p_key int, OUT total_bytes bigint, OUT alerted boolean)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailbox._outbox_bytes(o.outbox_name), coalesce(r.storage_alerted, false)
      FROM mailbox._outbox AS o
      LEFT JOIN mailbox._outbox_retention AS r ON r.outbox_key = o.outbox_key
     WHERE o.outbox_key = p_key;
$$;

CREATE FUNCTION mailbox._set_storage_alerted(p_key int, p_alerted boolean)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._outbox_retention SET storage_alerted = p_alerted WHERE outbox_key = p_key;
$$;

-- Outboxes that hold no rows but whose log still takes more than p_min_bytes on disk.
CREATE FUNCTION mailbox._outboxes_to_truncate(p_min_bytes bigint)
RETURNS TABLE (outbox_key int, outbox_name text)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.outbox_key, o.outbox_name FROM mailbox._outbox AS o
     WHERE NOT EXISTS (SELECT 1 FROM mailbox._outbox_log AS l WHERE l.outbox_key = o.outbox_key)
       AND pg_catalog.pg_relation_size(pg_catalog.format(
               'mailbox.%I', mailbox._outbox_relname(o.outbox_name, 'log'))::regclass) > p_min_bytes
     ORDER BY o.outbox_key;
$$;

-- Every outbox with what retention needs of it, in key order.
CREATE FUNCTION mailbox._outboxes_to_maintain()
RETURNS TABLE (outbox_key int, outbox_name text, retention_hours int)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.outbox_key, o.outbox_name, o.retention_hours FROM mailbox._outbox AS o ORDER BY o.outbox_key;
$$;
