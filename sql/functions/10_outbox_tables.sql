-- Part 10: the outbox catalog and the log every outbox lives in.
--
-- All outboxes share one LIST-partitioned parent, mailbox._outbox_log; outbox N is its
-- partition mailbox.outbox_<N>. Producers and capture triggers therefore insert with static
-- SQL (cached plans, no per-call dynamic SQL on the hot path) and tuple routing puts the row
-- in outbox_<N>. See docs/design.md for the offset (sequencer) design.
--
-- Backups (docs/backup.md): every table and sequence here that holds state is registered
-- with pg_extension_config_dump, so pg_dump saves its rows, which a restore loads after
-- CREATE EXTENSION ran. The partitions, made at run time, are not extension members:
-- pg_dump saves them as ordinary tables and attaches them to the parents the extension
-- script made. So the parents carry no index: pg_dump restores a partition's index after
-- attaching it, and attaching under an indexed parent would already have made one (restore
-- error "multiple primary keys"). Each partition has its own primary key and index instead
-- (made by _create_outbox_objects); every query names the outbox, so it reads one partition.

-- An outbox's catalog row by name: the one place that raises 22004 / 42704 for an outbox
-- name, as mailbox._inbox_get (part 30) is for an inbox.
CREATE FUNCTION mailbox._outbox_get(p_outbox text)
RETURNS mailbox._outbox
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_outbox mailbox._outbox;
BEGIN
    IF p_outbox IS NULL THEN
        RAISE EXCEPTION 'outbox name must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the name of an outbox (see mailbox.outboxes).';
    END IF;
    SELECT o.* INTO v_outbox FROM mailbox._outbox AS o WHERE o.outbox_name = p_outbox;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox not found: %', p_outbox
            USING ERRCODE = '42704',
                  HINT = 'Create it with mailbox.create_outbox() or mailbox.enable_outbox(); mailbox.outboxes lists them.';
    END IF;
    RETURN v_outbox;
END
$$;

-- Its key, for the many callers that need only that.
CREATE FUNCTION mailbox._outbox_key(p_outbox text)
RETURNS int
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (mailbox._outbox_get(p_outbox)).outbox_key;
$$;

-- The names of an outbox's relations in schema mailbox, one home for them: 'log' its partition
-- of the shared log (where rows live), 'delta' its claim-check rows, 'view' mailbox.outbox_<N>
-- (the rows with their offsets, SPEC §1.3), 'latest' its latest-row view.
CREATE FUNCTION mailbox._outbox_relname(p_name text, p_kind text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE p_kind
               WHEN 'log' THEN '_outbox_log_' || p_name
               WHEN 'delta' THEN 'outbox_delta_rows_' || p_name
               WHEN 'view' THEN 'outbox_' || p_name
               WHEN 'latest' THEN 'outbox_latest_' || p_name
           END;
$$;

-- Bytes an outbox takes on disk: its rows and claim-check rows, with their indexes and TOAST.
CREATE FUNCTION mailbox._outbox_bytes(p_name text)
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce(pg_catalog.pg_total_relation_size(
               pg_catalog.to_regclass(pg_catalog.format('mailbox.%I', mailbox._outbox_relname(p_name, 'log')))), 0)
         + coalesce(pg_catalog.pg_total_relation_size(
               pg_catalog.to_regclass(pg_catalog.format('mailbox.%I', mailbox._outbox_relname(p_name, 'delta')))), 0);
$$;

-- Restoring a dump (docs/backup.md). Transaction ids are the cluster's: an outbox restored
-- from pg_dump carries ids of the cluster it was dumped from, in its log rows (_xid) and in
-- its sequencer snapshots, and the new cluster's ids may be behind, ahead of or among them.
-- Read as ids of the new cluster they would leave new rows without an offset (below the old
-- snapshot) or number old rows twice. So a restored catalog row is marked (seq_snapshot
-- 2:2:, which no real snapshot is: the first normal xid is 3) by the trigger below, and the
-- first sequencer run on it calls _rebase_restored_outbox. The trigger marks every row
-- inserted; _create_outbox_objects, the only other writer of new rows, then sets the initial
-- state of a new outbox.
CREATE FUNCTION mailbox._outbox_mark_restored()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    NEW.seq_snapshot := '2:2:';
    NEW.win_snapshot := NULL;
    NEW.win_xid := NULL;
    NEW.win_id := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER mailbox_outbox_restored BEFORE INSERT ON mailbox._outbox
FOR EACH ROW EXECUTE FUNCTION mailbox._outbox_mark_restored();

-- Called by _sequence_outbox, under the catalog row's lock, for a restored outbox. Every row
-- visible now without an offset (the restored rows, and rows committed since the restore)
-- gets the next offsets in row-key (insertion) order; every numbered row whose _xid could
-- fall into a later window gets _xid 2 (frozen: below every snapshot's xmin, never in its
-- xip), so no window takes it again; and the sequencer goes on from a snapshot taken before
-- all that, so the rows it did not see (of transactions still running, this one's own
-- included) are numbered as usual once they commit. Returns how many rows it numbered.
CREATE FUNCTION mailbox._rebase_restored_outbox(p_key int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_me xid8 := pg_catalog.pg_current_xact_id();
    v_snap pg_snapshot := pg_catalog.pg_current_snapshot();
    v_chunk int := mailbox._setting_int('outbox_chunk_rows');
    v_head bigint;
    v_ids bigint[];
    v_part bigint[];
    v_n int;
BEGIN
    -- as in _sequence_outbox: this transaction counts as running (its rows come later)
    IF pg_catalog.pg_visible_in_snapshot(v_me, v_snap) THEN
        v_snap := mailbox._snapshot_with(v_snap, v_me);
    END IF;
    SELECT o.head_offset INTO v_head FROM mailbox._outbox AS o WHERE o.outbox_key = p_key;
    v_ids := ARRAY(
        SELECT l._id
          FROM mailbox._outbox_log AS l
          LEFT JOIN (SELECT u.id FROM mailbox._outbox_chunk AS c
                      CROSS JOIN LATERAL pg_catalog.unnest(c.ids) AS u (id)
                      WHERE c.outbox_key = p_key) AS n ON n.id = l._id
         WHERE l.outbox_key = p_key AND n.id IS NULL AND l._xid <> v_me
         ORDER BY l._id
    );
    FOR v_i IN 1 .. coalesce(pg_catalog.cardinality(v_ids), 0) BY v_chunk LOOP
        v_part := v_ids[v_i:v_i + v_chunk - 1];
        v_n := pg_catalog.cardinality(v_part);
        INSERT INTO mailbox._outbox_chunk (outbox_key, base_offset, row_count, ids, dense, first_id)
        VALUES (p_key, v_head, v_n, v_part, v_part[v_n] - v_part[1] = v_n - 1, v_part[1]);
        v_head := v_head + v_n;
    END LOOP;
    UPDATE mailbox._outbox_log AS l
       SET _xid = '2'
     WHERE l.outbox_key = p_key AND l._xid >= pg_catalog.pg_snapshot_xmin(v_snap)
       AND l._id IN (SELECT u.id FROM mailbox._outbox_chunk AS c
                      CROSS JOIN LATERAL pg_catalog.unnest(c.ids) AS u (id)
                      WHERE c.outbox_key = p_key);
    UPDATE mailbox._outbox
       SET head_offset = v_head, seq_snapshot = v_snap, win_snapshot = NULL, win_xid = NULL, win_id = NULL
     WHERE outbox_key = p_key;
    RETURN coalesce(pg_catalog.cardinality(v_ids), 0);
END
$$;
