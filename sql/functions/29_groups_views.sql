-- Part 29: the consumer-group monitoring views (SPEC §2.1; consumer_lag() is part 23). After
-- part 27: a partitioned group's offset and rows in flight come from its partitions' state
-- (mailbox._partitioned_group_offset, mailbox.consumer_partition_lag), so the views and
-- consumer_lag() agree.

CREATE VIEW mailbox.consumer_status AS
SELECT c.group_name, c.consumer_id, o.outbox_name, c.committed_offset,
       CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl WHERE pl.group_name = g.group_name)
            THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
            ELSE coalesce((SELECT pg_catalog.min(l.first_offset) - 1 FROM mailbox._lease AS l
                            WHERE l.group_name = g.group_name), g.delivered_offset)
       END AS group_offset,
       coalesce((SELECT pg_catalog.sum(l.last_offset - l.first_offset + 1) FROM mailbox._lease AS l
                  WHERE l.group_name = c.group_name AND l.consumer_id = c.consumer_id
                    AND l.lease_until > pg_catalog.now()), 0)
       + coalesce((SELECT pg_catalog.sum(p.in_flight) FROM mailbox.consumer_partition_lag AS p
                    WHERE p.group_name = c.group_name AND p.consumer_id = c.consumer_id AND p.leased), 0)
       AS in_flight,
       c.registered_at, c.last_heartbeat_at, c.last_commit_at,
       pg_catalog.now() - c.last_heartbeat_at < mailbox._heartbeat_timeout() AS healthy,
       -- the partitions it holds (partitioned outboxes, part 26)
       coalesce((SELECT pg_catalog.array_agg(pl.part ORDER BY pl.part) FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = c.group_name AND pl.consumer_id = c.consumer_id
                    AND pl.lease_until > pg_catalog.now()), '{}') AS partitions
  FROM mailbox._consumer AS c
  JOIN mailbox._consumer_group AS g ON g.group_name = c.group_name
  JOIN mailbox._outbox AS o ON o.outbox_key = g.outbox_key;
COMMENT ON VIEW mailbox.consumer_status IS 'every consumer with its offsets, in-flight rows and health';

CREATE VIEW mailbox.consumer_group_lag AS
WITH live AS (
    -- the group offset as mailbox._group_offset() computes it (which a view's caller may not
    -- execute); a partitioned group's as consumer_lag() computes it
    SELECT g.group_name,
           CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl WHERE pl.group_name = g.group_name)
                THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
                ELSE coalesce((SELECT pg_catalog.min(l.first_offset) - 1 FROM mailbox._lease AS l
                                WHERE l.group_name = g.group_name), g.delivered_offset)
           END AS group_offset
      FROM mailbox._consumer_group AS g
)

SELECT g.group_name, o.outbox_name, g.auto_offset_reset, x.group_offset, g.delivered_offset, o.head_offset,
       o.head_offset - x.group_offset AS lag,
       (SELECT pg_catalog.count(*) FROM mailbox._consumer AS c WHERE c.group_name = g.group_name) AS consumers,
       coalesce((SELECT pg_catalog.sum(l.last_offset - l.first_offset + 1) FROM mailbox._lease AS l
                  WHERE l.group_name = g.group_name AND l.lease_until > pg_catalog.now()), 0)
       + coalesce((SELECT pg_catalog.sum(p.in_flight) FROM mailbox.consumer_partition_lag AS p
                    WHERE p.group_name = g.group_name AND p.leased), 0) AS in_flight
  FROM mailbox._consumer_group AS g
  JOIN live AS x ON x.group_name = g.group_name
  JOIN mailbox._outbox AS o ON o.outbox_key = g.outbox_key;
COMMENT ON VIEW mailbox.consumer_group_lag IS
'every consumer group: offsets and lag in rows (as of the last numbering; consumer_lag() numbers first)';
