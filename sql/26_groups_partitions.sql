-- Part 26: ordered, parallel consumption (SPEC §2.3, issue 9; docs/ordering.md).
--
-- An outbox created with p_partitions > 1 gives each row a partition when it is numbered:
-- abs(hashtext(coalesce(key, ''))) % p_partitions (computed as bigint, so the one hash value
-- whose abs() overflows an int still maps), so the producers' path is unchanged. A group
-- then keeps one row per partition (mailbox._partition_lease): the consumer holding it, until
-- when, and the partition's acknowledged and delivered offsets. A partition's rows go only to
-- its holder, in offset order; a poll re-delivers what its holder has in flight before
-- anything new; a partition changes hands only when its lease expired (the new holder starts
-- at the first unacknowledged row) or when its holder gives it up with nothing in flight
-- (rebalancing). Hence per-key order across expiry, crashes and redelivery.
--
-- Polls lock only the partition rows they use, with FOR UPDATE SKIP LOCKED, and never the
-- group row: consumers of different partitions never wait for each other, and a consumer
-- idle in its poll transaction holds back only its own partitions.

CREATE TABLE mailbox._outbox_partitioning (
    outbox_key int PRIMARY KEY REFERENCES mailbox._outbox (outbox_key) ON DELETE CASCADE,
    partitions int NOT NULL CHECK (partitions BETWEEN 2 AND 256)
);
COMMENT ON TABLE mailbox._outbox_partitioning IS
'pg_mailbox: partition count of the outboxes created with p_partitions > 1';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_partitioning', '');

-- The partition of every numbered row of a partitioned outbox, in offset order (written by
-- the sequencer with the offsets; rows at or below the retention low mark are removed).
CREATE TABLE mailbox._outbox_part (
    outbox_key int NOT NULL REFERENCES mailbox._outbox (outbox_key) ON DELETE CASCADE,
    outbox_id bigint NOT NULL,
    part smallint NOT NULL,
    row_id bigint NOT NULL,
    PRIMARY KEY (outbox_key, outbox_id)
);
COMMENT ON TABLE mailbox._outbox_part IS 'pg_mailbox: partition and row of each offset of a partitioned outbox';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_part', '');

-- mailbox._partition_lease (part 20): which consumer holds each partition of a group.

CREATE TABLE mailbox._outbox_parked (
    group_name text NOT NULL REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    outbox_id bigint NOT NULL,
    event_id uuid NOT NULL,
    part int NOT NULL,
    reason text,
    parked_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    parked_by text NOT NULL,
    -- a copy of the row: retention may drain the log once the group moved past it
    created_at timestamptz NOT NULL,
    source text,
    event_type text,
    key text,
    headers jsonb NOT NULL,
    inserted_count int NOT NULL,
    deleted_count int NOT NULL,
    is_claim_check boolean NOT NULL,
    full_refresh boolean NOT NULL,
    payload jsonb NOT NULL,
    -- set by outbox_unpark: the row is delivered again (to the holder of its partition)
    unparked_at timestamptz,
    consumer_id text,
    lease_until timestamptz,
    PRIMARY KEY (group_name, outbox_id)
);
COMMENT ON TABLE mailbox._outbox_parked IS
'pg_mailbox: rows a consumer parked (poison), kept until unparked and acknowledged';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_parked', '');

-- The outboxes whose groups the caller may read (consume), for the views below; as
-- consumer_lag() lists only those groups.
CREATE FUNCTION mailbox._readable_group_outboxes()
RETURNS SETOF int
LANGUAGE sql STABLE
SECURITY DEFINER -- reads the group and grant catalogs for a mailbox_consumer caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT k FROM mailbox._consumable_outboxes() AS k;
$$;

-- security_barrier: a caller's own functions in a WHERE clause run only on rows it may see
CREATE VIEW mailbox.outbox_parked WITH (security_barrier) AS
SELECT p.group_name AS "group", p.outbox_id, p.event_id, p.part AS partition, p.reason, p.parked_at
  FROM mailbox._outbox_parked AS p
  JOIN mailbox._consumer_group AS g ON g.group_name = p.group_name
 WHERE p.unparked_at IS NULL
   AND g.outbox_key IN (SELECT k FROM mailbox._readable_group_outboxes() AS k);
COMMENT ON VIEW mailbox.outbox_parked IS
'rows parked by a consumer group (mailbox.outbox_park), until unparked; of the outboxes the caller may consume';

-- The partition count of an outbox (1: not partitioned).
CREATE FUNCTION mailbox._outbox_partitions(p_key int)
RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce((SELECT p.partitions FROM mailbox._outbox_partitioning AS p WHERE p.outbox_key = p_key), 1);
$$;

-- p_partitions of create_outbox / enable_outbox: 22023 outside 1 .. 256, 22004 for NULL,
-- with the HINT every argument check gives (1: no partitions, §2.2 semantics).
-- (Not through _check_positive: enable_outbox runs it as the table owner, who may not call
-- that one.)
CREATE FUNCTION mailbox._check_partitions(p_partitions int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_partitions IS NULL THEN
        RAISE EXCEPTION 'p_partitions must not be null'
            USING ERRCODE = '22004', HINT = 'Pass p_partitions from 1 to 256 (1: no per-key order, §2.2 semantics).';
    END IF;
    IF p_partitions < 1 OR p_partitions > 256 THEN
        RAISE EXCEPTION 'invalid p_partitions: %', p_partitions
            USING ERRCODE = '22023', HINT = 'Pass p_partitions from 1 to 256 (1: no per-key order, §2.2 semantics).';
    END IF;
    RETURN p_partitions;
END
$$;

CREATE FUNCTION mailbox._set_outbox_partitions(p_name text, p_partitions int)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- records the partition count in the extension catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_partitions(p_partitions);
    IF p_partitions > 1 THEN
        INSERT INTO mailbox._outbox_partitioning (outbox_key, partitions)
        VALUES (mailbox._outbox_key(p_name), p_partitions);
    END IF;
END
$$;

-- Called by the sequencer with each chunk it numbered: the partition of every row.
CREATE FUNCTION mailbox._partition_chunk(p_key int, p_parts int, p_base bigint, p_ids bigint[])
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    INSERT INTO mailbox._outbox_part (outbox_key, outbox_id, part, row_id)
    SELECT p_key, p_base + u.n, (pg_catalog.abs(pg_catalog.hashtext(coalesce(l.key, ''))::bigint) % p_parts)::smallint, u.id
      FROM pg_catalog.unnest(p_ids) WITH ORDINALITY AS u (id, n)
      JOIN mailbox._outbox_log AS l ON l.outbox_key = p_key AND l._id = u.id;
    -- what retention drained is no longer needed (each time a thousand offsets passed)
    DELETE FROM mailbox._outbox_part AS x
     WHERE (p_base + pg_catalog.cardinality(p_ids)) / 1000 <> p_base / 1000
       AND x.outbox_key = p_key
       AND x.outbox_id <= (SELECT r.low_offset FROM mailbox._outbox_retention AS r WHERE r.outbox_key = p_key);
$$;

-- A partitioned group's offset: the highest H with every row <= H acknowledged.
CREATE FUNCTION mailbox._partitioned_group_offset(p_group text, p_key int)
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
-- offsets are read in index order and rows by index probes: a backlog numbered moments ago
-- has no statistics yet, and the planner's bitmap scans, sorts and hash joins over the whole
-- outbox cost far more than the batch
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    SELECT coalesce(pg_catalog.min(n.next_offset) - 1,
                    (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = p_key))
      FROM mailbox._partition_lease AS pl
     CROSS JOIN LATERAL (
           SELECT x.outbox_id AS next_offset FROM mailbox._outbox_part AS x
            WHERE x.outbox_key = p_key AND x.outbox_id > pl.acked_offset AND x.part = pl.part
              AND NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                               WHERE k.group_name = p_group AND k.outbox_id = x.outbox_id)
            ORDER BY x.outbox_id LIMIT 1
     ) AS n
     WHERE pl.group_name = p_group;
$$;

-- Stores the group offset of a partitioned group unless someone holds its row (the next
-- commit or numberer pass does it then). Locks the row only when the value changed.
CREATE FUNCTION mailbox._store_partitioned_group_offset(p_group text, p_key int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_offset bigint := mailbox._partitioned_group_offset(p_group, p_key);
BEGIN
    IF EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                WHERE g.group_name = p_group AND g.group_offset IS DISTINCT FROM v_offset) THEN
        UPDATE mailbox._consumer_group AS g
           SET group_offset = v_offset, delivered_offset = greatest(g.delivered_offset, v_offset)
         WHERE g.group_name = (SELECT x.group_name FROM mailbox._consumer_group AS x
                                WHERE x.group_name = p_group FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
END
$$;

-- A new group of a partitioned outbox, or one seeked: every partition starts at p_offset.
CREATE FUNCTION mailbox._reset_partitions(p_group text, p_key int, p_offset bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    DELETE FROM mailbox._partition_lease AS pl WHERE pl.group_name = p_group;
    INSERT INTO mailbox._partition_lease (group_name, part, acked_offset, delivered_offset)
    SELECT p_group, s, p_offset, p_offset
      FROM pg_catalog.generate_series(0, mailbox._outbox_partitions(p_key) - 1) AS s
     WHERE mailbox._outbox_partitions(p_key) > 1;
$$;
