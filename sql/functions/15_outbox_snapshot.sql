-- Part 15: snapshots of a captured table (mailbox.outbox_snapshot, enable_outbox's initial one).
--
-- A snapshot turns the table's rows into JSON, and to_jsonb calls the casts to json of the
-- columns' types: code the table's owner controls. Run with the extension owner's rights it
-- would make the table owner superuser; run with the CALLER's rights it would lend the
-- caller's (a mailbox_admin's: reading every outbox, granting) to the table owner. So, as
-- for capture (part 14), the rows are read and serialised by a function owned by the table's
-- owner, mailbox._outbox_<key>_rows(), made with the capture function; only its JSON values
-- cross into the definer code below, which writes the extension's tables.
--
-- Reading as the owner shows every row the owner sees. A caller whom row-level security
-- restricts on that table is therefore refused (42501): a snapshot is the whole table, and
-- that caller may not read the whole table. The SHARE lock makes the rows one state and orders
-- the snapshot against concurrent writers: a write committed before it is in the snapshot, a
-- later one lands after it.

-- The body of outbox p_key's row reader (owned by the table owner; see above). It refuses a
-- table its function owner does not own, so an ALTER TABLE ... OWNER TO never lends the old
-- owner's rights to the new owner's casts (repair_outbox_capture re-owns it).
CREATE FUNCTION mailbox._rows_function_sql()
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $gen$
    SELECT $body$
BEGIN
    -- operators spelled out: the owner may ALTER this function's search_path (it runs as
    -- the owner then, but this check must mean what it says whoever it runs as)
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_class AS c, pg_catalog.pg_roles AS r
                    WHERE c.oid OPERATOR(pg_catalog.=) $1 AND r.oid OPERATOR(pg_catalog.=) c.relowner
                      AND r.rolname OPERATOR(pg_catalog.=) current_user) THEN
        RAISE EXCEPTION 'snapshot of % runs as %, which does not own it', $1, current_user
            USING ERRCODE = '55000',
                  HINT = 'A member of mailbox_admin runs mailbox.repair_outbox_capture() for its outbox.';
    END IF;
    RETURN QUERY EXECUTE pg_catalog.format('SELECT pg_catalog.to_jsonb(t) FROM %s AS t', $1);
END
$body$;
$gen$;

CREATE FUNCTION mailbox.outbox_snapshot(p_name text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the outbox for mailbox_admin; the table is read by its owner's function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_outbox mailbox._outbox;
    v_rel regclass;
    v_source text;
    v_threshold int;
    v_caller name := mailbox._caller();
    v_item jsonb;
    v_page jsonb[] := '{}';
    v_count bigint := 0;
    v_row bigint;
    v_reader regprocedure;
BEGIN
    SELECT * INTO v_outbox FROM mailbox._outbox AS o WHERE o.outbox_key = mailbox._outbox_key(p_name);
    IF v_outbox.source_rel IS NULL THEN
        RAISE EXCEPTION 'outbox has no source table: %', v_outbox.outbox_name
            USING ERRCODE = '55000', HINT = 'Snapshots are for outboxes made by mailbox.enable_outbox().';
    END IF;
    v_rel := (SELECT c.oid FROM pg_catalog.pg_class AS c WHERE c.oid = v_outbox.source_rel);
    IF v_rel IS NULL THEN
        RAISE EXCEPTION 'source table of outbox % no longer exists', v_outbox.outbox_name
            USING ERRCODE = '55000', HINT = 'Drop the outbox with mailbox.drop_outbox().';
    END IF;
    PERFORM mailbox._check_table_privilege(v_rel, 'SELECT', 'snapshot');
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = v_rel AND c.relrowsecurity)
       AND NOT pg_catalog.pg_has_role(v_caller, (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = v_rel),
                                      'USAGE')
       AND NOT (SELECT r.rolbypassrls OR r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = v_caller) THEN
        RAISE EXCEPTION 'permission denied to snapshot table: % (row-level security restricts role %)', v_rel, v_caller
            USING ERRCODE = '42501',
                  DETAIL = 'A snapshot holds every row of the table, and row-level security hides some from this role.',
                  HINT = 'Take the snapshot as the table''s owner or as a role with BYPASSRLS.';
    END IF;
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO v_source
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = v_rel;
    v_threshold := coalesce(v_outbox.inline_threshold_rows,
                            mailbox._setting_int('outbox_inline_threshold_rows'));
    EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE', v_rel);
    -- The table owner owns its row reader and may ALTER it (SECURITY INVOKER would make this
    -- call run the owner's casts as the extension owner). Lock its catalog row, which holds off
    -- any ALTER FUNCTION until this transaction ends, then check it is still a definer function
    -- of the table's owner.
    v_reader := pg_catalog.to_regprocedure(mailbox._owner_function(v_outbox.outbox_key, 'rows') || '(regclass)');
    PERFORM 1 FROM pg_catalog.pg_proc AS p WHERE p.oid = v_reader FOR SHARE;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_class AS c ON c.oid = v_rel
                    WHERE p.oid = v_reader AND p.prosecdef AND p.proowner = c.relowner) THEN
        RAISE EXCEPTION 'snapshot reader of outbox % is missing or was altered', v_outbox.outbox_name
            USING ERRCODE = '55000',
                  DETAIL = 'It must be a SECURITY DEFINER function owned by the table''s owner.',
                  HINT = pg_catalog.format('SELECT mailbox.repair_outbox_capture(%s);',
                                           pg_catalog.quote_literal(v_outbox.outbox_name));
    END IF;

    -- rows up to the threshold are kept for an inline row; past it, the claim-check row is
    -- written and the rows follow in pages of 1,000, so memory stays bounded
    PERFORM mailbox._owner_code_begin(); -- the reader runs the owner's casts in this session
    FOR v_item IN EXECUTE pg_catalog.format('SELECT * FROM %s($1)', mailbox._owner_function(v_outbox.outbox_key, 'rows'))
                  USING v_rel LOOP
        v_count := v_count + 1;
        v_page := v_page || v_item;
        IF v_row IS NULL AND v_count > v_threshold THEN
            INSERT INTO mailbox._outbox_log
                (outbox_key, source, event_type, payload, inserted_count, is_claim_check, full_refresh)
            VALUES (v_outbox.outbox_key, v_source, 'SNAPSHOT', '{}', 0, true, true)
            RETURNING _id INTO v_row;
        END IF;
        IF v_row IS NOT NULL AND pg_catalog.cardinality(v_page) >= 1000 THEN
            PERFORM mailbox._snapshot_page(v_outbox.outbox_key, v_row, v_count - pg_catalog.cardinality(v_page), v_page);
            v_page := '{}';
        END IF;
    END LOOP;
    PERFORM mailbox._owner_code_end();

    IF v_row IS NULL THEN
        INSERT INTO mailbox._outbox_log (outbox_key, source, event_type, payload, inserted_count, full_refresh)
        VALUES (v_outbox.outbox_key, v_source, 'SNAPSHOT',
                pg_catalog.jsonb_build_object('v', 1, 'source', v_source, 'op', 'SNAPSHOT', 'full_refresh', true,
                                              'inserted', pg_catalog.to_jsonb(v_page),
                                              'deleted', pg_catalog.jsonb_build_array()),
                v_count, true);
    ELSE
        IF pg_catalog.cardinality(v_page) > 0 THEN
            PERFORM mailbox._snapshot_page(v_outbox.outbox_key, v_row, v_count - pg_catalog.cardinality(v_page), v_page);
        END IF;
        -- the row's count and payload are known only now
        UPDATE mailbox._outbox_log AS l
           SET inserted_count = v_count,
               payload = pg_catalog.jsonb_build_object('v', 1, 'claim_check', true, 'source', v_source,
                                                       'op', 'SNAPSHOT', 'full_refresh', true,
                                                       'inserted_count', v_count, 'deleted_count', 0)
         WHERE l.outbox_key = v_outbox.outbox_key AND l._id = v_row;
    END IF;
    PERFORM mailbox._alert('outbox_full_refresh',
                           pg_catalog.jsonb_build_object('outbox', v_outbox.outbox_name, 'source', v_source,
                                                         'op', 'SNAPSHOT', 'rows', v_count));
    PERFORM mailbox._notify_outbox(v_outbox.outbox_name);
    RETURN v_count;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_snapshot(text) IS
'write the captured table''s whole content as one full_refresh SNAPSHOT row; returns its row count';

-- One page of a claim-check snapshot, numbered from p_after + 1.
CREATE FUNCTION mailbox._snapshot_page(p_key int, p_row bigint, p_after bigint, p_rows jsonb[])
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    INSERT INTO mailbox._outbox_delta_rows (outbox_key, row_key, row_num, op, payload)
    SELECT p_key, p_row, p_after + u.n, 'I', u.value
      FROM pg_catalog.unnest(p_rows) WITH ORDINALITY AS u (value, n);
$$;
