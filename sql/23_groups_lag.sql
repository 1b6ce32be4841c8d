-- Part 23: consumer-group monitoring (SPEC §2.1): consumer_lag and the views over offsets,
-- leases and heartbeats.

CREATE FUNCTION mailbox._heartbeat_timeout()
RETURNS interval
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT pg_catalog.make_interval(secs => mailbox._setting_int('consumer_heartbeat_timeout_seconds'));
$$;

-- The outboxes with groups whose state the caller may read: those it may consume
-- (mailbox._authorize decides; outboxes without grants are open to every consumer).
CREATE FUNCTION mailbox._consumable_outboxes()
RETURNS SETOF int
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
BEGIN
    FOR v_key IN SELECT DISTINCT g.outbox_key FROM mailbox._consumer_group AS g ORDER BY 1 LOOP
        BEGIN
            PERFORM mailbox._authorize('outbox', v_key, 'consume');
            RETURN NEXT v_key;
        EXCEPTION WHEN insufficient_privilege THEN
            NULL; -- not listed
        END;
    END LOOP;
END
$$;

CREATE FUNCTION mailbox.consumer_lag(p_group text DEFAULT NULL)
RETURNS TABLE (
    group_name text, consumer_id text, committed_offset bigint, group_offset bigint, head_offset bigint,
    lag bigint, in_flight bigint, last_heartbeat_at timestamptz, heartbeat_age_seconds double precision,
    healthy boolean
)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- reads consumer state for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_timeout interval := mailbox._heartbeat_timeout();
    v_keys int[];
BEGIN
    -- a named group needs consume on its outbox; without a name, only the groups of
    -- outboxes the caller may consume are listed
    IF p_group IS NOT NULL THEN
        v_keys := ARRAY[mailbox._group_outbox(p_group)];
        PERFORM mailbox._authorize('outbox', v_keys[1], 'consume');
    ELSE
        v_keys := ARRAY(SELECT mailbox._consumable_outboxes());
    END IF;
    -- the head must count every committed row, numbered or not yet; a running numberer
    -- (part 24) numbers them within milliseconds, and numbering here would hold the
    -- outbox's sequencer until the caller's transaction ends
    IF NOT mailbox._numberer_alive() THEN
        PERFORM mailbox._sequence_all(k.outbox_key)
           FROM pg_catalog.unnest(v_keys) AS k (outbox_key) ORDER BY k.outbox_key;
    END IF;
    RETURN QUERY
    SELECT g.group_name, c.consumer_id, c.committed_offset, x.group_offset, o.head_offset,
           o.head_offset - x.group_offset,
           coalesce((SELECT pg_catalog.sum(l.last_offset - l.first_offset + 1)::bigint FROM mailbox._lease AS l
                      WHERE l.group_name = g.group_name AND l.consumer_id = c.consumer_id
                        AND l.lease_until > pg_catalog.now()), 0)
           + coalesce((SELECT pg_catalog.sum(p.in_flight)::bigint FROM mailbox.consumer_partition_lag AS p
                        WHERE p.group_name = g.group_name AND p.consumer_id = c.consumer_id AND p.leased), 0),
           c.last_heartbeat_at,
           EXTRACT(EPOCH FROM pg_catalog.now() - c.last_heartbeat_at)::double precision,
           pg_catalog.now() - c.last_heartbeat_at < v_timeout
      FROM mailbox._consumer_group AS g
     CROSS JOIN LATERAL (
           SELECT CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl WHERE pl.group_name = g.group_name)
                       THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
                       ELSE mailbox._group_offset(g.group_name, g.delivered_offset) END AS group_offset
     ) AS x
      JOIN mailbox._outbox AS o ON o.outbox_key = g.outbox_key
      LEFT JOIN mailbox._consumer AS c ON c.group_name = g.group_name
     WHERE g.outbox_key = ANY (v_keys) AND (p_group IS NULL OR g.group_name = p_group)
     ORDER BY g.group_name, c.consumer_id;
END
$$;
COMMENT ON FUNCTION mailbox.consumer_lag(text) IS
'per consumer (one row with NULL consumer for a group without any): offsets, lag in rows, in-flight rows, health';

-- mailbox.consumer_status and mailbox.consumer_group_lag: part 29 (they need part 26's
-- functions for partitioned groups).

CREATE VIEW mailbox.consumer_active_leases AS
SELECT l.group_name, l.consumer_id, l.first_offset, l.last_offset, l.last_offset - l.first_offset + 1 AS row_count,
       l.lease_until
  FROM mailbox._lease AS l
 WHERE l.lease_until > pg_catalog.now();
COMMENT ON VIEW mailbox.consumer_active_leases IS 'unexpired leases: which consumer holds which offsets until when';
