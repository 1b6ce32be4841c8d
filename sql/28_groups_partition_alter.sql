-- Part 28 (continued): changing the partition count of an outbox while its consumers run
-- (issue 13; docs/ordering.md#changing-the-partition-count).
--
-- A row's partition is computed from its key with the count in force (part 26), so changing
-- the count moves keys between partitions. Per-key order must hold inside every group across
-- the change, so each group changes layout at an epoch boundary:
--
--   * alter_outbox_partitions() holds the sequencer's lock (the _outbox row, part 18) while it
--     records the new count, so no row is numbered during the change: the head at that moment
--     is the boundary B. Rows committed but not numbered yet get offsets above B afterwards.
--   * Each group of the outbox gets a row here: it keeps its old layout for the rows up to B
--     and hands out nothing above B (polls read the head capped at B, _group_head; the
--     numberer slots only up to B) until every row up to B is acknowledged or parked.
--   * Then the group switches (_finish_partition_change): its partitions are rebuilt for the
--     new count, all at B, and rows above B are delivered in the new layout. A group with
--     nothing in flight up to B switches at once, in the ALTER's own transaction; later, the
--     numberer's pass switches it while a numberer runs (in its own short transaction: a
--     poll transaction left open must not hold the group's new partitions), else a poll.
--
-- So a key that moves to another partition never has a row above B delivered while one of
-- its rows up to B is leased, unacknowledged or delivered again: the price is a pause in new
-- rows for a group until its consumers have committed what they hold (at most one
-- visibility timeout when one of them died). A group changes layout only while it can lock,
-- without waiting, every row its polls and commits lock (group row, leases, partition
-- leases); a consumer whose poll transaction is open defers the switch to a later poll, a
-- later commit's poll or the next numberer pass, never blocks on it.
--
-- A group still draining an earlier change when the count changes again keeps its old
-- layout and boundary: it has delivered nothing above its boundary, so it switches straight
-- to the newest count (and needs no switch at all when that is its own count again).

CREATE TABLE mailbox._partition_change (
    group_name text PRIMARY KEY REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    -- the count this group still uses, for the rows up to boundary
    partitions int NOT NULL CHECK (partitions BETWEEN 1 AND 256),
    boundary bigint NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE mailbox._partition_change IS
'pg_mailbox: groups still draining their old partition layout after alter_outbox_partitions';
SELECT pg_catalog.pg_extension_config_dump('mailbox._partition_change', '');

-- The partition count a group uses now: its old one while it drains a change, else its
-- outbox's.
CREATE FUNCTION mailbox._group_partitions(p_group text, p_key int)
RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                    mailbox._outbox_partitions(p_key));
$$;

-- The head as a group may read it: the outbox's head, capped at the boundary of a change the
-- group still drains. One statement, so the cap and the head come from one snapshot: a head
-- above a boundary was numbered after the change committed, and then the cap is seen too.
CREATE FUNCTION mailbox._group_head(p_group text, p_key int)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                  WHERE x.group_name = p_group))
      FROM mailbox._outbox AS o WHERE o.outbox_key = p_key;
$$;

-- Whether every row of a draining group up to its boundary is acknowledged (or parked).
-- Not p_exact: only what the partition rows say (every partition acknowledged up to the
-- boundary, which polls finding nothing more up to it record), without reading the log.
CREATE FUNCTION mailbox._partition_change_drained(
    p_group text, p_key int, p_parts int, p_boundary bigint, p_exact boolean
)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF p_parts = 1 THEN
        -- offset ranges (part 20): every row up to the boundary handed out and acknowledged
        RETURN (SELECT mailbox._group_offset(g.group_name, g.delivered_offset) >= p_boundary
                  FROM mailbox._consumer_group AS g WHERE g.group_name = p_group);
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                WHERE pl.group_name = p_group AND pl.delivered_offset > pl.acked_offset) THEN
        RETURN false; -- rows in flight (a cheap answer before reading the log)
    END IF;
    IF NOT p_exact THEN
        RETURN NOT EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                            WHERE pl.group_name = p_group AND pl.acked_offset < p_boundary);
    END IF;
    -- (capped at the boundary while the group drains)
    RETURN mailbox._partitioned_group_offset(p_group, p_key) >= p_boundary;
END
$$;

-- Switches a draining group to its outbox's partition count once its old layout drained,
-- without waiting for any lock (see above). True when it switched now. p_exact: see
-- _partition_change_drained (the numberer, which tries every pass, does not read the log).
CREATE FUNCTION mailbox._finish_partition_change(p_group text, p_key int, p_exact boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_change mailbox._partition_change;
    v_parts int;
BEGIN
    SELECT * INTO v_change FROM mailbox._partition_change AS x WHERE x.group_name = p_group;
    IF NOT FOUND
       OR NOT mailbox._partition_change_drained(p_group, p_key, v_change.partitions, v_change.boundary, p_exact) THEN
        RETURN false;
    END IF;
    -- A subtransaction: when a lock is taken or the group is not drained after all, it rolls
    -- back and releases what it locked (a poll transaction left open must not keep every
    -- partition of its group locked).
    BEGIN
        PERFORM FROM mailbox._consumer_group AS g WHERE g.group_name = p_group FOR NO KEY UPDATE NOWAIT;
        PERFORM FROM mailbox._partition_lease AS pl WHERE pl.group_name = p_group
          ORDER BY pl.part FOR UPDATE NOWAIT;
        PERFORM FROM mailbox._lease AS l WHERE l.group_name = p_group ORDER BY l.first_offset FOR UPDATE NOWAIT;
        SELECT * INTO v_change FROM mailbox._partition_change AS x WHERE x.group_name = p_group FOR UPDATE NOWAIT;
        IF NOT FOUND
           OR NOT mailbox._partition_change_drained(p_group, p_key, v_change.partitions, v_change.boundary, p_exact) THEN
            RAISE EXCEPTION 'partition change of group % not drained', p_group USING ERRCODE = 'MBX01';
        END IF;
        v_parts := mailbox._outbox_partitions(p_key);
        DELETE FROM mailbox._partition_change AS x WHERE x.group_name = p_group;
        -- nothing is leased up to the boundary (drained) nor above it (capped)
        DELETE FROM mailbox._lease AS l WHERE l.group_name = p_group;
        PERFORM mailbox._reset_partitions(p_group, p_key, v_change.boundary); -- the new count's partitions
        UPDATE mailbox._consumer_group AS g SET group_offset = v_change.boundary, delivered_offset = v_change.boundary
         WHERE g.group_name = p_group;
        -- parked rows belong to their key's partition in the new layout
        UPDATE mailbox._outbox_parked AS k
           SET part = (pg_catalog.abs(pg_catalog.hashtext(coalesce(k.key, ''))::bigint) % v_parts)::int
         WHERE k.group_name = p_group;
    EXCEPTION WHEN lock_not_available OR SQLSTATE 'MBX01' THEN
        RETURN false;
    END;
    RETURN true;
END
$$;

CREATE FUNCTION mailbox.alter_outbox_partitions(p_outbox text, p_partitions int)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- changes the extension catalog for mailbox_admin; runs no caller code
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_old int;
    v_boundary bigint;
BEGIN
    PERFORM mailbox._check_partitions(p_partitions);
    v_key := mailbox._outbox_key(p_outbox); -- 22004, 42704
    -- against drop_outbox, create_consumer_group and another change
    PERFORM mailbox._ddl_lock();
    -- The sequencer's lock (part 18), waited for: no row gets an offset until this commits,
    -- so the head now is the boundary and every row numbered later lies above it.
    SELECT o.head_offset INTO v_boundary FROM mailbox._outbox AS o WHERE o.outbox_key = v_key FOR NO KEY UPDATE;
    v_old := mailbox._outbox_partitions(v_key);
    IF v_old = p_partitions THEN
        RETURN;
    END IF;
    -- a new row version: a REPEATABLE READ poll whose snapshot predates this change, and
    -- would number rows above the boundary without seeing it, fails with 40001 instead
    UPDATE mailbox._outbox AS o SET head_offset = v_boundary WHERE o.outbox_key = v_key;
    DELETE FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key;
    IF p_partitions > 1 THEN
        INSERT INTO mailbox._outbox_partitioning (outbox_key, partitions) VALUES (v_key, p_partitions);
    END IF;
    -- every group drains its old layout up to the boundary; one already draining an earlier
    -- change keeps that (see above), and needs none when the count returns to its own
    INSERT INTO mailbox._partition_change (group_name, partitions, boundary)
    SELECT g.group_name, v_old, v_boundary FROM mailbox._consumer_group AS g WHERE g.outbox_key = v_key
    ON CONFLICT (group_name) DO NOTHING;
    DELETE FROM mailbox._partition_change AS x
     USING mailbox._consumer_group AS g
     WHERE g.group_name = x.group_name AND g.outbox_key = v_key AND x.partitions = p_partitions;
    -- groups with nothing in flight up to the boundary switch now
    PERFORM mailbox._finish_partition_change(g.group_name, v_key, TRUE)
       FROM mailbox._consumer_group AS g WHERE g.outbox_key = v_key ORDER BY g.group_name;
END
$$;
COMMENT ON FUNCTION mailbox.alter_outbox_partitions(text, int) IS
'change the partition count of an outbox: offsets stay, per-key order holds in every group across the change';
