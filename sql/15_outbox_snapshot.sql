-- Part 15: snapshots of a captured table (mailbox.outbox_snapshot, enable_outbox's initial one).
--
-- Snapshots read the captured table with the CALLER's rights (SECURITY INVOKER): to_jsonb
-- runs the casts of the table owner's types, and reading the table as the caller is also
-- what proves the caller may read it. Only the built values cross into the definer helpers
-- below, which write the extension's tables and run no code of the table's.
--
-- _snapshot_begin takes the SHARE lock (the caller may hold only SELECT, which allows no more
-- than ACCESS SHARE): the count and the rows are one state, and the snapshot is ordered
-- against concurrent writers: a write committed before it is in the snapshot, a later one
-- lands after it.
CREATE FUNCTION mailbox._snapshot_begin(p_name text)
RETURNS TABLE (outbox_key int, source_rel regclass, threshold int)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- locks the captured table in SHARE mode for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_outbox mailbox._outbox;
BEGIN
    SELECT * INTO v_outbox FROM mailbox._outbox AS o WHERE o.outbox_key = mailbox._outbox_key(p_name);
    IF v_outbox.source_rel IS NULL THEN
        RAISE EXCEPTION 'outbox has no source table: %', v_outbox.outbox_name
            USING ERRCODE = '55000', HINT = 'Snapshots are for outboxes made by mailbox.enable_outbox().';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = v_outbox.source_rel) THEN
        RAISE EXCEPTION 'source table of outbox % no longer exists', v_outbox.outbox_name
            USING ERRCODE = '55000', HINT = 'Drop the outbox with mailbox.drop_outbox().';
    END IF;
    PERFORM mailbox._check_table_privilege(v_outbox.source_rel, 'SELECT', 'snapshot');
    EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE', v_outbox.source_rel::regclass);
    RETURN QUERY SELECT v_outbox.outbox_key, v_outbox.source_rel::regclass,
                        coalesce(v_outbox.inline_threshold_rows,
                                 mailbox._setting_int('outbox_inline_threshold_rows', 10000, 0, 2147483647));
END
$$;

-- Writes a snapshot's outbox row: inline (p_rows holds every row) or claim-check (p_rows NULL;
-- the rows follow through _snapshot_append). Returns the row's key.
CREATE FUNCTION mailbox._snapshot_write(p_key int, p_count bigint, p_rows jsonb)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the outbox log for mailbox_admin; p_rows is already-built data
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_source text;
    v_row bigint;
BEGIN
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO v_source
      FROM mailbox._outbox AS o
      JOIN pg_catalog.pg_class AS c ON c.oid = o.source_rel
      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE o.outbox_key = p_key;
    IF p_rows IS NOT NULL THEN
        INSERT INTO mailbox._outbox_log (outbox_key, source, event_type, payload, inserted_count, full_refresh)
        VALUES (p_key, v_source, 'SNAPSHOT',
                pg_catalog.jsonb_build_object('v', 1, 'source', v_source, 'op', 'SNAPSHOT', 'full_refresh', true,
                                              'inserted', p_rows, 'deleted', pg_catalog.jsonb_build_array()),
                p_count, true)
        RETURNING _id INTO v_row;
    ELSE
        INSERT INTO mailbox._outbox_log
            (outbox_key, source, event_type, payload, inserted_count, is_claim_check, full_refresh)
        VALUES (p_key, v_source, 'SNAPSHOT',
                pg_catalog.jsonb_build_object('v', 1, 'claim_check', true, 'source', v_source, 'op', 'SNAPSHOT',
                                              'full_refresh', true, 'inserted_count', p_count, 'deleted_count', 0),
                p_count, true, true)
        RETURNING _id INTO v_row;
    END IF;
    PERFORM mailbox._notify_outbox((SELECT o.outbox_name FROM mailbox._outbox AS o WHERE o.outbox_key = p_key));
    RETURN v_row;
END
$$;

-- Appends one page of a claim-check snapshot: p_rows is a JSON array, numbered from p_after + 1.
-- Only a claim-check SNAPSHOT row of this outbox written by the calling transaction takes pages.
CREATE FUNCTION mailbox._snapshot_append(p_key int, p_row bigint, p_after bigint, p_rows jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes claim-check rows for mailbox_admin; p_rows is already-built data
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailbox._outbox_log AS l
                    WHERE l.outbox_key = p_key AND l._id = p_row AND l.is_claim_check
                      AND l.event_type = 'SNAPSHOT' AND l._xid = pg_catalog.pg_current_xact_id()) THEN
        RAISE EXCEPTION 'not a snapshot of this transaction: outbox row %', p_row
            USING ERRCODE = '55000', HINT = 'Pages are added by mailbox.outbox_snapshot() only.';
    END IF;
    INSERT INTO mailbox._outbox_delta_rows (outbox_key, row_key, row_num, op, payload)
    SELECT p_key, p_row, p_after + e.n, 'I', e.value
      FROM pg_catalog.jsonb_array_elements(p_rows) WITH ORDINALITY AS e (value, n);
END
$$;

CREATE FUNCTION mailbox.outbox_snapshot(p_name text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_target record;
    v_count bigint;
    v_rows jsonb;
    v_row bigint;
    v_page jsonb[] := '{}';
    v_done bigint := 0;
    v_item jsonb;
BEGIN
    SELECT * INTO v_target FROM mailbox._snapshot_begin(p_name);
    -- everything below reads the table as the caller
    EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM %s', v_target.source_rel) INTO v_count;
    IF v_count <= v_target.threshold THEN
        EXECUTE pg_catalog.format(
            'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(t)), pg_catalog.jsonb_build_array()) FROM %s AS t',
            v_target.source_rel) INTO v_rows;
        PERFORM mailbox._snapshot_write(v_target.outbox_key, v_count, v_rows);
        RETURN v_count;
    END IF;
    v_row := mailbox._snapshot_write(v_target.outbox_key, v_count, NULL);
    -- pages of 1000 rows keep memory bounded whatever the table's size
    FOR v_item IN EXECUTE pg_catalog.format('SELECT pg_catalog.to_jsonb(t) FROM %s AS t', v_target.source_rel) LOOP
        v_page := v_page || v_item;
        IF pg_catalog.cardinality(v_page) = 1000 THEN
            PERFORM mailbox._snapshot_append(v_target.outbox_key, v_row, v_done, pg_catalog.to_jsonb(v_page));
            v_done := v_done + 1000;
            v_page := '{}';
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(v_page) > 0 THEN
        PERFORM mailbox._snapshot_append(v_target.outbox_key, v_row, v_done, pg_catalog.to_jsonb(v_page));
    END IF;
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_snapshot(text) IS
'write the captured table''s whole content as one full_refresh SNAPSHOT row; returns its row count';
