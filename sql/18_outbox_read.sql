-- Part 18: offsets (the sequencer), claim-check pages, status.

-- Gives committed rows that have no offset yet the next offsets, in row-key order, and returns
-- how many it numbered. Only rows visible to this statement's snapshot -- i.e. committed --
-- are numbered, so a row whose transaction commits late simply gets a later offset: offsets
-- follow visibility, never skip a row, and are gapless (head_offset - group_offset = lag).
-- One sequencer per outbox runs at a time (the catalog row lock); a caller that finds it busy
-- returns 0 at once rather than waiting, and reads what the other one numbered.
CREATE FUNCTION mailbox._sequence_outbox(p_key int, p_limit int DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_head bigint;
    v_count bigint;
BEGIN
    SELECT o.head_offset INTO v_head FROM mailbox._outbox AS o
     WHERE o.outbox_key = p_key
       FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    WITH todo AS (
        SELECT l._id, v_head + pg_catalog.row_number() OVER (ORDER BY l._id) AS new_offset
          FROM mailbox._outbox_log AS l
         WHERE l.outbox_key = p_key AND l.outbox_id IS NULL
         ORDER BY l._id
         LIMIT p_limit
    )
    UPDATE mailbox._outbox_log AS l SET outbox_id = todo.new_offset
      FROM todo
     WHERE l.outbox_key = p_key AND l._id = todo._id;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count > 0 THEN
        UPDATE mailbox._outbox SET head_offset = v_head + v_count WHERE outbox_key = p_key;
    END IF;
    RETURN v_count;
END
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
     WHERE l.outbox_key = p_key AND l.outbox_id = p_outbox_id;
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
    v_row bigint := mailbox._claim_check_row(v_key, p_outbox, p_outbox_id);
BEGIN
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
    v_row bigint := mailbox._claim_check_row(v_key, p_outbox, p_outbox_id);
    v_group_outbox int;
BEGIN
    IF p_group IS NOT NULL THEN
        SELECT g.outbox_key INTO v_group_outbox FROM mailbox._consumer_group AS g WHERE g.group_name = p_group;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'consumer group not found: %', p_group
                USING ERRCODE = '42704', HINT = 'Create it with mailbox.create_consumer_group().';
        END IF;
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
