-- Part 19: reading claim-check rows by page (outbox_delta_rows) and marking them read
-- (outbox_rows_consumed).

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
