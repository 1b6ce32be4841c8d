-- Part 18: offsets (the sequencer), claim-check pages, status.

-- The sequencer: gives committed rows that have no offset yet the next offsets and returns
-- how many it numbered (at most about p_limit).
--
-- Rows carry their producer's top-level xid (_xid). seq_snapshot S_prev is a snapshot every
-- visible row of which already has an offset. A window snapshot S_cur (taken now) adds the
-- rows visible in S_cur but not in S_prev: those of transactions in progress at S_prev
-- (xip(S_prev)) plus those with xmax(S_prev) <= _xid < xmax(S_cur), each only if visible in
-- S_cur -- two index range scans, however long an unrelated transaction stays open.
-- A window is numbered in chunks of at most mailbox.outbox_chunk_rows, in (_xid, _id) order.
--
-- Hence offsets follow visibility: a transaction that commits late simply lands in a later
-- window, nothing is skipped, and offsets are gapless (head_offset - group_offset = lag).
-- One sequencer per outbox runs at a time (the catalog row lock); a caller that finds it busy
-- returns 0 at once and reads what the other one numbered. pg_current_snapshot() is the active
-- snapshot: in READ COMMITTED the window query's later snapshot sees all S_cur saw; in
-- REPEATABLE READ it is the same snapshot, and a sequencer that committed since then makes the
-- row lock below fail with 40001 instead of numbering from an older S_cur than S_prev.
-- A snapshot that also counts p_xid as in progress. pg_current_snapshot() leaves the calling
-- transaction out of xip: once a later transaction has completed, the caller's own running xid
-- is below xmax and so looks visible. A window taken by a transaction that writes outbox rows
-- (publish, then poll, then publish again) must count it as running, or its rows written after
-- the window would fall below the next one and never get an offset.
CREATE FUNCTION mailbox._snapshot_with(p_snapshot pg_snapshot, p_xid xid8)
RETURNS pg_snapshot
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('%s:%s:%s',
               least(pg_catalog.pg_snapshot_xmin(p_snapshot), p_xid),
               pg_catalog.pg_snapshot_xmax(p_snapshot),
               (SELECT pg_catalog.string_agg(x::text, ',' ORDER BY x)
                  FROM (SELECT pg_catalog.pg_snapshot_xip(p_snapshot) AS x UNION SELECT p_xid) AS u)
           )::pg_catalog.pg_snapshot;
$$;

CREATE FUNCTION mailbox._sequence_outbox(p_key int, p_limit int DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_head bigint;
    v_seq pg_snapshot;
    v_win pg_snapshot;
    v_xid xid8;
    v_id bigint;
    v_fresh boolean;
    v_was_open pg_snapshot;
    v_me xid8;
    v_seq_xmax xid8;
    v_win_xmax xid8;
    v_xip xid8[];
    v_chunk int := mailbox._setting_int('outbox_chunk_rows', 1000, 1, 1000000);
    v_want int;
    v_ids bigint[];
    v_last_xid xid8;
    v_n int;
    v_total bigint := 0;
    v_parts int;
BEGIN
    SELECT o.head_offset, o.seq_snapshot, o.win_snapshot, o.win_xid, o.win_id
      INTO v_head, v_seq, v_win, v_xid, v_id
      FROM mailbox._outbox AS o
     WHERE o.outbox_key = p_key
       FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_was_open := v_win;
    v_parts := coalesce((SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = p_key), 1);
    IF pg_catalog.pg_snapshot_xmax(v_seq) = '2'::xid8 THEN
        -- restored from a dump: its transaction ids are another cluster's (part 10)
        v_total := mailbox._rebase_restored_outbox(p_key);
        SELECT o.head_offset, o.seq_snapshot INTO v_head, v_seq FROM mailbox._outbox AS o WHERE o.outbox_key = p_key;
    END IF;
    LOOP
        v_fresh := v_win IS NULL;
        IF v_fresh THEN
            v_win := pg_catalog.pg_current_snapshot();
            v_me := pg_catalog.pg_current_xact_id_if_assigned();
            IF v_me IS NOT NULL AND pg_catalog.pg_visible_in_snapshot(v_me, v_win) THEN
                v_win := mailbox._snapshot_with(v_win, v_me);
            END IF;
            v_xid := '0'::xid8;
            v_id := 0;
        END IF;
        v_want := least(v_chunk, greatest(p_limit - v_total, 1));
        -- Three parts in (_xid, _id) order, each an index range scan with plain conditions
        -- (a row comparison would displace the other conditions from the index bounds):
        -- the rest of the cursor's transaction, the other transactions in progress at
        -- S_prev, then the xid range new since S_prev. The second part probes the index once
        -- per xid: written as _xid = ANY (v_xip), a cached generic plan kept the order by
        -- turning the array into a filter over every row of the outbox, for every chunk --
        -- numbering cost grew with the square of the backlog (docs/design.md §3).
        v_seq_xmax := pg_catalog.pg_snapshot_xmax(v_seq);
        v_win_xmax := pg_catalog.pg_snapshot_xmax(v_win);
        v_xip := ARRAY(SELECT x FROM pg_catalog.pg_snapshot_xip(v_seq) AS x
                        WHERE x > v_xid AND pg_catalog.pg_visible_in_snapshot(x, v_win) ORDER BY x);
        SELECT pg_catalog.array_agg(w._id ORDER BY w._xid, w._id), pg_catalog.max(w._xid)
          INTO v_ids, v_last_xid
          FROM (
              (SELECT l._xid, l._id FROM mailbox._outbox_log AS l
                WHERE l.outbox_key = p_key AND l._xid = v_xid AND l._id > v_id
                ORDER BY l._xid, l._id LIMIT v_want)
              UNION ALL
              (SELECT x._xid, x._id
                 FROM pg_catalog.unnest(v_xip) AS t (xid)
                CROSS JOIN LATERAL (
                    SELECT l._xid, l._id FROM mailbox._outbox_log AS l
                     WHERE l.outbox_key = p_key AND l._xid = t.xid
                     ORDER BY l._id LIMIT v_want
                ) AS x
                ORDER BY 1, 2 LIMIT v_want)
              UNION ALL
              (SELECT l._xid, l._id FROM mailbox._outbox_log AS l
                WHERE l.outbox_key = p_key
                  AND l._xid >= v_seq_xmax AND l._xid > v_xid AND l._xid < v_win_xmax
                  AND pg_catalog.pg_visible_in_snapshot(l._xid, v_win)
                ORDER BY l._xid, l._id LIMIT v_want)
              ORDER BY 1, 2
              LIMIT v_want
          ) AS w;
        v_n := coalesce(pg_catalog.cardinality(v_ids), 0);
        IF v_n > 0 THEN
            INSERT INTO mailbox._outbox_chunk (outbox_key, base_offset, row_count, ids, dense, first_id)
            VALUES (p_key, v_head, v_n, v_ids,
                    v_ids[v_n] - v_ids[1] = v_n - 1
                    AND v_ids = ARRAY(SELECT x FROM pg_catalog.unnest(v_ids) AS x ORDER BY x),
                    v_ids[1]);
            IF v_parts > 1 THEN
                -- a partitioned outbox: each row's partition, from its key (part 26)
                PERFORM mailbox._partition_chunk(p_key, v_parts, v_head, v_ids);
            END IF;
            v_head := v_head + v_n;
            v_total := v_total + v_n;
            v_xid := v_last_xid;
            v_id := v_ids[v_n];
        END IF;
        IF v_n < v_want THEN
            -- window exhausted: everything visible in it now has an offset
            v_seq := v_win;
            v_win := NULL;
            EXIT WHEN v_fresh;
        END IF;
        EXIT WHEN v_total >= p_limit;
    END LOOP;
    IF v_total = 0 AND v_win IS NULL AND v_was_open IS NULL THEN
        RETURN 0; -- a fresh window found nothing new: no state to save
    END IF;
    UPDATE mailbox._outbox
       SET head_offset = v_head, seq_snapshot = v_seq, win_snapshot = v_win,
           win_xid = CASE WHEN v_win IS NULL THEN NULL ELSE v_xid END,
           win_id = CASE WHEN v_win IS NULL THEN NULL ELSE v_id END
     WHERE outbox_key = p_key;
    RETURN v_total;
END
$$;

-- The row key at an offset, or NULL (not numbered yet, or drained).
CREATE FUNCTION mailbox._row_at_offset(p_key int, p_offset bigint)
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT c.ids[p_offset - c.base_offset]
      FROM mailbox._outbox_chunk AS c
     WHERE c.outbox_key = p_key AND c.base_offset < p_offset
     ORDER BY c.base_offset DESC
     LIMIT 1;
$$;

-- A claim-check row by (outbox, offset): its row key, or 42704 / 22023.
CREATE FUNCTION mailbox._claim_check_row(p_key int, p_outbox text, p_outbox_id bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_row bigint;
    v_is_claim_check boolean;
BEGIN
    PERFORM mailbox._require(p_outbox_id, 'p_outbox_id');
    SELECT l._id, l.is_claim_check INTO v_row, v_is_claim_check
      FROM mailbox._outbox_log AS l
     WHERE l.outbox_key = p_key AND l._id = mailbox._row_at_offset(p_key, p_outbox_id);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox row not found: %/%', p_outbox, p_outbox_id
            USING ERRCODE = '42704',
                  HINT = 'Pass an outbox_id returned by mailbox.poll_outbox(); drained rows are gone.';
    END IF;
    IF NOT v_is_claim_check THEN
        RAISE EXCEPTION 'outbox row is not a claim-check row: %/%', p_outbox, p_outbox_id
            USING ERRCODE = '22023',
                  HINT = 'An inline row carries its rows in payload->''inserted'' and payload->''deleted''.';
    END IF;
    RETURN v_row;
END
$$;

CREATE FUNCTION mailbox.outbox_delta_rows(
    p_outbox text, p_outbox_id bigint, p_after_row int DEFAULT 0, p_limit int DEFAULT 1000
)
RETURNS TABLE (row_num int, op char(1), payload jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- consumers read claim-check rows only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_key int := mailbox._outbox_key(p_outbox);
    v_row bigint;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'consume');
    v_row := mailbox._claim_check_row(v_key, p_outbox, p_outbox_id);
    PERFORM mailbox._require(p_after_row, 'p_after_row');
    PERFORM mailbox._require(p_limit, 'p_limit');
    IF p_limit <= 0 THEN
        RAISE EXCEPTION 'invalid page size: %', p_limit
            USING ERRCODE = '22023', HINT = 'p_limit is 1 or more (default 1000).';
    END IF;
    RETURN QUERY
    SELECT d.row_num, d.op, d.payload
      FROM mailbox._outbox_delta_rows AS d
     WHERE d.outbox_key = v_key AND d.row_key = v_row AND d.row_num > p_after_row
     ORDER BY d.row_num
     LIMIT p_limit;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_delta_rows(text, bigint, int, int) IS
'one keyset page of the rows of a claim-check outbox row, after row_num p_after_row';

CREATE FUNCTION mailbox.outbox_rows_consumed(p_outbox text, p_outbox_id bigint, p_group text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers record reads only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := mailbox._outbox_key(p_outbox);
    v_row bigint;
    v_group_outbox int;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'consume'); -- covers every group of the outbox
    v_row := mailbox._claim_check_row(v_key, p_outbox, p_outbox_id);
    IF p_group IS NOT NULL THEN
        v_group_outbox := mailbox._group_outbox(p_group);
        IF v_group_outbox <> v_key THEN
            RAISE EXCEPTION 'consumer group % does not read outbox %', p_group, p_outbox
                USING ERRCODE = '22023', HINT = 'Pass the group that polled this row, or NULL for every group.';
        END IF;
    END IF;
    INSERT INTO mailbox._claim_check_consumed (outbox_key, row_key, group_name)
    VALUES (v_key, v_row, coalesce(p_group, ''))
    ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_rows_consumed(text, bigint, text) IS
'record that a consumer group (NULL: every group) finished reading a claim-check row; idempotent';
