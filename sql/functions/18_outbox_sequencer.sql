-- Part 18: offsets (the sequencer).

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
    v_chunk int := mailbox._setting_int('outbox_chunk_rows');
    v_want int;
    v_ids bigint[];
    v_last_xid xid8;
    v_n int;
    v_total bigint := 0;
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
