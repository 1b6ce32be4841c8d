-- Part 14: statement-level capture of a table into its outbox.
--
-- One trigger function serves every captured table. PL/pgSQL compiles a trigger function once
-- per table it is attached to, so the static statements below (including those reading the
-- transition tables) get cached plans per table, and only the branch for TG_OP ever runs.

CREATE FUNCTION mailbox._notify_outbox(p_name text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    -- PostgreSQL folds identical notifications of one transaction into one and drops those of
    -- a rolled-back transaction or subtransaction: one wake-up per committed transaction.
    IF mailbox._setting_bool('outbox_notify', true) THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', p_name);
    END IF;
END
$$;

CREATE FUNCTION mailbox._capture()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- any role allowed to write the captured table writes its outbox rows
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    -- arguments fixed by enable_outbox: outbox key, outbox name, per-outbox threshold or ''
    v_key int := TG_ARGV[0]::int;
    v_name text := TG_ARGV[1];
    v_threshold int := nullif(TG_ARGV[2], '')::int;
    v_source text := pg_catalog.format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    v_ins bigint := 0;
    v_del bigint := 0;
    v_inserted jsonb := '[]';
    v_deleted jsonb := '[]';
    v_row bigint;
    v_notify text;
BEGIN
    -- The capture hot path calls no helpers with SET clauses unless a setting is present:
    -- an unset GUC reads as NULL and means its default.

    IF TG_OP = 'TRUNCATE' THEN
        INSERT INTO mailbox._outbox_log (outbox_key, source, event_type, payload, full_refresh)
        VALUES (v_key, v_source, 'TRUNCATE',
                pg_catalog.jsonb_build_object('v', 1, 'source', v_source, 'op', 'TRUNCATE', 'full_refresh', true,
                                              'inserted', v_inserted, 'deleted', v_deleted),
                true);
        PERFORM mailbox._alert('outbox_full_refresh',
                               pg_catalog.jsonb_build_object('outbox', v_name, 'source', v_source, 'op', 'TRUNCATE'));
        PERFORM mailbox._notify_outbox(v_name);
        RETURN NULL;
    END IF;

    IF TG_OP = 'INSERT' THEN
        SELECT pg_catalog.count(*) INTO v_ins FROM mailbox_new_rows;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT pg_catalog.count(*) INTO v_del FROM mailbox_old_rows;
    ELSE
        SELECT pg_catalog.count(*) INTO v_ins FROM mailbox_new_rows;
        v_del := v_ins;
    END IF;
    IF v_ins + v_del = 0
       AND (pg_catalog.current_setting('mailbox.outbox_skip_empty_delta', true) IS NULL
            OR mailbox._setting_bool('outbox_skip_empty_delta', true)) THEN
        RETURN NULL;
    END IF;
    IF v_threshold IS NULL THEN
        v_threshold := CASE WHEN pg_catalog.current_setting('mailbox.outbox_inline_threshold_rows', true) IS NULL
                            THEN 10000
                            ELSE mailbox._setting_int('outbox_inline_threshold_rows', 10000, 0, 2147483647) END;
    END IF;

    IF v_ins + v_del <= v_threshold THEN
        IF v_ins > 0 THEN
            SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r)) INTO v_inserted FROM mailbox_new_rows AS r;
        END IF;
        IF v_del > 0 THEN
            SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r)) INTO v_deleted FROM mailbox_old_rows AS r;
        END IF;
        INSERT INTO mailbox._outbox_log (outbox_key, source, event_type, payload, inserted_count, deleted_count)
        VALUES (v_key, v_source, TG_OP,
                pg_catalog.jsonb_build_object('v', 1, 'source', v_source, 'op', TG_OP,
                                              'inserted', v_inserted, 'deleted', v_deleted),
                v_ins, v_del);
    ELSE
        INSERT INTO mailbox._outbox_log
            (outbox_key, source, event_type, payload, inserted_count, deleted_count, is_claim_check)
        VALUES (v_key, v_source, TG_OP,
                pg_catalog.jsonb_build_object('v', 1, 'claim_check', true, 'source', v_source, 'op', TG_OP,
                                              'inserted_count', v_ins, 'deleted_count', v_del),
                v_ins, v_del, true)
        RETURNING _id INTO v_row;
        -- old rows first, then new ones: applying them in row_num order replays the statement
        IF v_del > 0 THEN
            INSERT INTO mailbox._outbox_delta_rows (outbox_key, row_key, row_num, op, payload)
            SELECT v_key, v_row, pg_catalog.row_number() OVER (), 'D', pg_catalog.to_jsonb(r)
              FROM mailbox_old_rows AS r;
        END IF;
        IF v_ins > 0 THEN
            INSERT INTO mailbox._outbox_delta_rows (outbox_key, row_key, row_num, op, payload)
            SELECT v_key, v_row, v_del + pg_catalog.row_number() OVER (), 'I', pg_catalog.to_jsonb(r)
              FROM mailbox_new_rows AS r;
        END IF;
    END IF;
    v_notify := pg_catalog.lower(pg_catalog.current_setting('mailbox.outbox_notify', true));
    IF v_notify IS NULL OR v_notify IN ('on', 'true')
       OR (v_notify NOT IN ('off', 'false') AND mailbox._setting_bool('outbox_notify', true)) THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', v_name);
    END IF;
    RETURN NULL;
END
$$;

-- The whole current content of a captured table as one full_refresh row. The SHARE lock makes
-- the count and the rows one consistent state and orders the snapshot against concurrent
-- writers: a write committed before it is in the snapshot, a later one lands after it.
CREATE FUNCTION mailbox._write_snapshot(p_key int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_outbox mailbox._outbox;
    v_table regclass;
    v_source text;
    v_threshold int;
    v_count bigint;
    v_rows jsonb;
    v_row bigint;
BEGIN
    SELECT * INTO v_outbox FROM mailbox._outbox WHERE outbox_key = p_key;
    IF v_outbox.source_rel IS NULL THEN
        RAISE EXCEPTION 'outbox has no source table: %', v_outbox.outbox_name
            USING ERRCODE = '55000', HINT = 'Snapshots are for outboxes made by mailbox.enable_outbox().';
    END IF;
    v_table := (SELECT c.oid FROM pg_catalog.pg_class AS c WHERE c.oid = v_outbox.source_rel);
    IF v_table IS NULL THEN
        RAISE EXCEPTION 'source table of outbox % no longer exists', v_outbox.outbox_name
            USING ERRCODE = '55000', HINT = 'Drop the outbox with mailbox.drop_outbox().';
    END IF;
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO v_source
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = v_table;
    v_threshold := coalesce(v_outbox.inline_threshold_rows,
                            mailbox._setting_int('outbox_inline_threshold_rows', 10000, 0, 2147483647));

    PERFORM mailbox._check_table_privilege(v_table, 'SELECT', 'snapshot');
    EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE', v_table);
    EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM %s', v_table) INTO v_count;
    IF v_count <= v_threshold THEN
        EXECUTE pg_catalog.format(
            'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.to_jsonb(t)), pg_catalog.jsonb_build_array()) FROM %s AS t',
            v_table) INTO v_rows;
        INSERT INTO mailbox._outbox_log (outbox_key, source, event_type, payload, inserted_count, full_refresh)
        VALUES (p_key, v_source, 'SNAPSHOT',
                pg_catalog.jsonb_build_object('v', 1, 'source', v_source, 'op', 'SNAPSHOT', 'full_refresh', true,
                                              'inserted', v_rows, 'deleted', pg_catalog.jsonb_build_array()),
                v_count, true);
    ELSE
        INSERT INTO mailbox._outbox_log
            (outbox_key, source, event_type, payload, inserted_count, is_claim_check, full_refresh)
        VALUES (p_key, v_source, 'SNAPSHOT',
                pg_catalog.jsonb_build_object('v', 1, 'claim_check', true, 'source', v_source, 'op', 'SNAPSHOT',
                                              'full_refresh', true, 'inserted_count', v_count, 'deleted_count', 0),
                v_count, true, true)
        RETURNING _id INTO v_row;
        EXECUTE pg_catalog.format(
            'INSERT INTO mailbox._outbox_delta_rows (outbox_key, row_key, row_num, op, payload)'
            ' SELECT $1, $2, pg_catalog.row_number() OVER (), ''I'', pg_catalog.to_jsonb(t) FROM %s AS t',
            v_table) USING p_key, v_row;
    END IF;
    PERFORM mailbox._alert('outbox_full_refresh',
                           pg_catalog.jsonb_build_object('outbox', v_outbox.outbox_name, 'source', v_source,
                                                         'op', 'SNAPSHOT', 'rows', v_count));
    PERFORM mailbox._notify_outbox(v_outbox.outbox_name);
    RETURN v_count;
END
$$;

CREATE FUNCTION mailbox.outbox_snapshot(p_name text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- reads the captured table and writes extension tables for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    RETURN mailbox._write_snapshot(mailbox._outbox_key(p_name));
END
$$;
COMMENT ON FUNCTION mailbox.outbox_snapshot(text) IS
'write the captured table''s whole content as one full_refresh SNAPSHOT row; returns its row count';
