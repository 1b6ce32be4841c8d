-- Part 26: ordered, parallel consumption (SPEC §2.3, issue 9; docs/ordering.md).
--
-- An outbox created with p_partitions > 1 gives each row a partition:
-- abs(hashtext(coalesce(key, ''))) % p_partitions (computed as bigint, so the one hash value
-- whose abs() overflows an int still maps). Nothing stores it: readers compute it from the
-- key as they read the log through the offset chunks (_partition_rows), so producers and
-- the sequencer do the same work as for an unpartitioned outbox. A group
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

-- The rows with offsets p_first < o <= p_last of an outbox of p_parts partitions, each with
-- its partition and row key, read through the chunks that hold them (a dense chunk by one
-- index range scan of the log, as poll_outbox reads; others by their key slice). Unordered.
CREATE FUNCTION mailbox._partition_rows(p_key int, p_parts int, p_first bigint, p_last bigint)
RETURNS TABLE (
    outbox_id bigint, event_id uuid, created_at timestamptz, source text, event_type text, key text,
    headers jsonb, inserted_count int, deleted_count int, is_claim_check boolean, full_refresh boolean,
    payload jsonb, partition int, row_id bigint
)
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_from_chunk bigint;
BEGIN
    IF p_last <= p_first THEN
        RETURN;
    END IF;
    v_from_chunk := coalesce((SELECT pg_catalog.max(c.base_offset) FROM mailbox._outbox_chunk AS c
                               WHERE c.outbox_key = p_key AND c.base_offset <= p_first), 0);
    RETURN QUERY
    SELECT c.base_offset + 1 + (l._id - c.first_id),
           l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
           l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload,
           (pg_catalog.abs(pg_catalog.hashtext(coalesce(l.key, ''))::bigint) % p_parts)::int, l._id
      FROM mailbox._outbox_chunk AS c
      JOIN mailbox._outbox_log AS l
        ON l.outbox_key = c.outbox_key
       AND l._id BETWEEN c.first_id + greatest(p_first - c.base_offset, 0)
                     AND c.first_id + least(p_last - c.base_offset, c.row_count) - 1
     WHERE c.outbox_key = p_key AND c.dense
       AND c.base_offset >= v_from_chunk AND c.base_offset < p_last
    UNION ALL
    SELECT s.first_in_chunk + u.n - 1,
           l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
           l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload,
           (pg_catalog.abs(pg_catalog.hashtext(coalesce(l.key, ''))::bigint) % p_parts)::int, l._id
      FROM mailbox._outbox_chunk AS c
     CROSS JOIN LATERAL (
           SELECT greatest(p_first + 1, c.base_offset + 1) AS first_in_chunk,
                  least(p_last, c.base_offset + c.row_count) AS last_in_chunk
     ) AS s
     CROSS JOIN LATERAL pg_catalog.unnest(
           c.ids[(s.first_in_chunk - c.base_offset)::int:(s.last_in_chunk - c.base_offset)::int]
     ) WITH ORDINALITY AS u (id, n)
      JOIN mailbox._outbox_log AS l ON l.outbox_key = c.outbox_key AND l._id = u.id
     WHERE c.outbox_key = p_key AND NOT c.dense
       AND c.base_offset >= v_from_chunk AND c.base_offset < p_last;
END
$$;

-- A partitioned group's offset: the highest H with every row <= H acknowledged (parked rows
-- count as acknowledged). Its first unacknowledged row is the first row, from the lowest
-- acknowledged offset of its partitions on, above its own partition's acknowledged offset:
-- found by reading the log forward from there, a thousand offsets at a time. Callable by
-- consumers for the monitoring views (it reveals no more than they show).
CREATE FUNCTION mailbox._partitioned_group_offset(p_group text, p_key int)
RETURNS bigint
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads the log for the views of mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    -- the group's count and head (a group draining a partition change: its old count, up
    -- to the boundary, part 28)
    v_parts int := mailbox._group_partitions(p_group, p_key);
    v_ack bigint[] := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_rec record;
    v_from bigint;
    v_head bigint := mailbox._group_head(p_group, p_key);
    v_next bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                    WHERE g.group_name = p_group AND g.outbox_key = p_key) THEN
        RETURN NULL; -- not that group's outbox: nothing to say
    END IF;
    FOR v_rec IN SELECT pl.part, pl.acked_offset FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = p_group LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_from := least(v_from, v_rec.acked_offset);
    END LOOP;
    IF v_from IS NULL THEN
        RETURN v_head;
    END IF;
    WHILE v_from < v_head LOOP
        v_next := (SELECT pg_catalog.min(r.outbox_id)
                     FROM mailbox._partition_rows(p_key, v_parts, v_from, least(v_head, v_from + 1000)) AS r
                    WHERE r.outbox_id > v_ack[r.partition + 1]
                      AND NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                       WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id));
        IF v_next IS NOT NULL THEN
            RETURN v_next - 1;
        END IF;
        v_from := least(v_head, v_from + 1000);
    END LOOP;
    RETURN v_head;
END
$$;

-- Per partition of a partitioned group: rows in flight (delivered, not acknowledged) and lag
-- (rows not acknowledged, parked ones excepted), by one read of the log from the lowest
-- acknowledged offset (mailbox.consumer_partition_lag).
CREATE FUNCTION mailbox._partition_counts(p_group text)
RETURNS TABLE (part int, in_flight bigint, lag bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads the log for the view of mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_key int := (SELECT g.outbox_key FROM mailbox._consumer_group AS g WHERE g.group_name = p_group);
    v_parts int := mailbox._group_partitions(p_group, v_key); -- (part 28)
    v_ack bigint[] := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_del bigint[] := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_rec record;
    v_from bigint;
BEGIN
    FOR v_rec IN SELECT pl.part, pl.acked_offset, pl.delivered_offset FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = p_group LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_del[v_rec.part + 1] := v_rec.delivered_offset;
        v_from := least(v_from, v_rec.acked_offset);
    END LOOP;
    IF v_from IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.p, coalesce(c.in_flight, 0), coalesce(c.lag, 0)
      FROM pg_catalog.generate_series(0, v_parts - 1) AS s (p)
      LEFT JOIN (
           SELECT r.partition AS p,
                  pg_catalog.count(*) FILTER (WHERE r.outbox_id <= v_del[r.partition + 1]) AS in_flight,
                  pg_catalog.count(*) FILTER (WHERE NOT EXISTS (
                      SELECT 1 FROM mailbox._outbox_parked AS k
                       WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id)) AS lag
             FROM mailbox._partition_rows(v_key, v_parts, v_from, mailbox._group_head(p_group, v_key)) AS r
            WHERE r.outbox_id > v_ack[r.partition + 1]
            GROUP BY r.partition
      ) AS c ON c.p = s.p;
END
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
