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
    -- only while a consumer of the outbox waits for a wake-up (part 17)
    IF mailbox._setting_bool('outbox_notify', true)
       AND EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w JOIN mailbox._outbox AS o USING (outbox_key)
                    WHERE o.outbox_name = p_name AND w.waiting_until > pg_catalog.now()) THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', p_name);
    END IF;
END
$$;

-- Capture runs code its table's owner controls: to_jsonb calls the casts to json of the
-- columns' types, and the transition tables hold whatever the owner's defaults, triggers and
-- domains made. So the trigger function of a captured table is generated per outbox, OWNED BY
-- THE TABLE'S OWNER and SECURITY DEFINER: any role allowed to write the table produces outbox
-- rows, and everything that runs inside runs with the table owner's rights, never the
-- extension owner's (docs/security.md, "Whose rights run what"). The table owner gets exactly
-- what this function needs: INSERT on its own outbox's two partitions (the columns a capture
-- writes; _id, _xid, event_id and created_at always come from their defaults), SELECT on _id
-- (RETURNING), USAGE on the row sequence, EXECUTE on the setting parsers and SELECT of who is
-- waiting for a wake-up (part 17: outbox keys and times only). Writing its own
-- outbox directly is no more than the owner can do by writing its own table.
--
-- The function body is static SQL with the outbox's partitions written in, so PL/pgSQL caches
-- its plans, and it reads no catalog beyond one check that the table still has the owner the
-- function runs as (an ALTER TABLE ... OWNER TO would otherwise leave the new owner's casts
-- running with the old owner's rights; mailbox.repair_outbox_capture() re-owns it).
CREATE FUNCTION mailbox._capture_function_sql(p_key int, p_name text, p_threshold int)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $gen$
BEGIN
    -- only integers and checked names are written in: p_key and p_threshold are integers, the
    -- outbox name passed _check_name ([a-z_][a-z0-9_]*) and goes through %I or quote_literal
    RETURN pg_catalog.format($body$
DECLARE
    v_source text := pg_catalog.format('%%I.%%I', TG_TABLE_SCHEMA, TG_TABLE_NAME);
    v_ins bigint := 0;
    v_del bigint := 0;
    v_inserted jsonb := '[]';
    v_deleted jsonb := '[]';
    v_threshold int := %4$s;
    v_row bigint;
    v_notify text;
BEGIN
    -- operators spelled out: the owner may ALTER this function's search_path (it runs as
    -- the owner then, but this check must mean what it says whoever it runs as)
    -- (and it holds the grants capture gave it: REASSIGN OWNED moves the function too)
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_class AS c, pg_catalog.pg_roles AS r
                    WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID AND r.oid OPERATOR(pg_catalog.=) c.relowner
                      AND r.rolname OPERATOR(pg_catalog.=) current_user)
       OR NOT pg_catalog.has_schema_privilege('mailbox', 'USAGE')
       OR NOT pg_catalog.has_any_column_privilege(%6$s, 'INSERT') THEN
        RAISE EXCEPTION 'capture of %% runs as %%, which does not own it or lacks its grants', v_source, current_user
            USING ERRCODE = '55000',
                  DETAIL = 'A captured table''s trigger function runs with its owner''s rights.',
                  HINT = 'A member of mailbox_admin runs SELECT mailbox.repair_outbox_capture('
                         || pg_catalog.quote_literal(%3$s) || ').';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        INSERT INTO mailbox.%2$I (outbox_key, source, event_type, payload, full_refresh)
        VALUES (%1$s, v_source, 'TRUNCATE',
                pg_catalog.jsonb_build_object('v', 1, 'source', v_source, 'op', 'TRUNCATE', 'full_refresh', true,
                                              'inserted', v_inserted, 'deleted', v_deleted),
                true);
    ELSE
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
            INSERT INTO mailbox.%2$I (outbox_key, source, event_type, payload, inserted_count, deleted_count)
            VALUES (%1$s, v_source, TG_OP,
                    pg_catalog.jsonb_build_object('v', 1, 'source', v_source, 'op', TG_OP,
                                                  'inserted', v_inserted, 'deleted', v_deleted),
                    v_ins, v_del);
        ELSE
            INSERT INTO mailbox.%2$I
                (outbox_key, source, event_type, payload, inserted_count, deleted_count, is_claim_check)
            VALUES (%1$s, v_source, TG_OP,
                    pg_catalog.jsonb_build_object('v', 1, 'claim_check', true, 'source', v_source, 'op', TG_OP,
                                                  'inserted_count', v_ins, 'deleted_count', v_del),
                    v_ins, v_del, true)
            RETURNING _id INTO v_row;
            -- old rows first, then new ones: applying them in row_num order replays the statement
            IF v_del > 0 THEN
                INSERT INTO mailbox.%5$I (outbox_key, row_key, row_num, op, payload)
                SELECT %1$s, v_row, pg_catalog.row_number() OVER (), 'D', pg_catalog.to_jsonb(r)
                  FROM mailbox_old_rows AS r;
            END IF;
            IF v_ins > 0 THEN
                INSERT INTO mailbox.%5$I (outbox_key, row_key, row_num, op, payload)
                SELECT %1$s, v_row, v_del + pg_catalog.row_number() OVER (), 'I', pg_catalog.to_jsonb(r)
                  FROM mailbox_new_rows AS r;
            END IF;
        END IF;
    END IF;
    -- unset (NULL) means on; the common spellings are read here, anything else goes through
    -- the strict parser, which raises for a bad value
    -- and only while a consumer waits for it (part 17)
    v_notify := pg_catalog.lower(pg_catalog.current_setting('mailbox.outbox_notify', true));
    IF (v_notify IS NULL OR v_notify IN ('on', 'true')
        OR (v_notify NOT IN ('off', 'false') AND mailbox._setting_bool('outbox_notify', true)))
       AND EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w
                    WHERE w.outbox_key = %1$s AND w.waiting_until > pg_catalog.now()) THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', %3$s);
    END IF;
    RETURN NULL;
END
$body$,
        p_key, mailbox._outbox_relname(p_name, 'log'), pg_catalog.quote_literal(p_name),
        coalesce(p_threshold::text, 'NULL'), mailbox._outbox_relname(p_name, 'delta'),
        pg_catalog.quote_literal('mailbox.' || pg_catalog.quote_ident(mailbox._outbox_relname(p_name, 'log'))));
END
$gen$;

-- The name of one of outbox p_key's generated functions owned by its table's owner:
-- 'capture' (the trigger function) or 'rows' (the snapshot reader, part 15).
CREATE FUNCTION mailbox._owner_function(p_key int, p_kind text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('mailbox.%I', '_outbox_' || p_key || '_' || p_kind);
$$;

-- (Re)creates outbox p_key's capture function for the current owner of its table, grants that
-- owner what the function needs, and (re)installs the four statement triggers.
CREATE FUNCTION mailbox._install_capture(p_key int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_outbox mailbox._outbox;
    v_table regclass;
    v_owner regrole;
    v_fn text := mailbox._owner_function(p_key, 'capture');
    v_rows text := mailbox._owner_function(p_key, 'rows');
BEGIN
    SELECT * INTO v_outbox FROM mailbox._outbox AS o WHERE o.outbox_key = p_key;
    SELECT c.oid, c.relowner INTO v_table, v_owner FROM pg_catalog.pg_class AS c WHERE c.oid = v_outbox.source_rel;
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql VOLATILE'
        ' SECURITY DEFINER SET search_path = pg_catalog, mailbox, pg_temp AS %s',
        v_fn, pg_catalog.quote_literal(mailbox._capture_function_sql(p_key, v_outbox.outbox_name,
                                                                     v_outbox.inline_threshold_rows)));
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s() FROM PUBLIC', v_fn);
    EXECUTE pg_catalog.format('ALTER FUNCTION %s() OWNER TO %s', v_fn, v_owner);
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %s(regclass) RETURNS SETOF jsonb LANGUAGE plpgsql STABLE'
        ' SECURITY DEFINER SET search_path = pg_catalog, mailbox, pg_temp AS %s',
        v_rows, pg_catalog.quote_literal(mailbox._rows_function_sql()));
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s(regclass) FROM PUBLIC', v_rows);
    EXECUTE pg_catalog.format('ALTER FUNCTION %s(regclass) OWNER TO %s', v_rows, v_owner);
    EXECUTE pg_catalog.format('ALTER FUNCTION %s(regclass) DEPENDS ON EXTENSION pg_mailbox', v_rows);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s(regclass) IS %s', v_rows,
                              pg_catalog.quote_literal('pg_mailbox snapshot rows of ' || v_table::text
                                                       || '; runs as the table''s owner'));
    -- not an extension member (pg_dump must dump it with the table's triggers), but dropped
    -- with the extension, triggers and all, like the partitions
    EXECUTE pg_catalog.format('ALTER FUNCTION %s() DEPENDS ON EXTENSION pg_mailbox', v_fn);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s() IS %s', v_fn,
                              pg_catalog.quote_literal('pg_mailbox capture of ' || v_table::text
                                                       || ' into outbox ' || v_outbox.outbox_name
                                                       || '; runs as the table''s owner'));
    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA mailbox TO %s', v_owner);
    EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE mailbox._outbox_row_seq TO %s', v_owner);
    EXECUTE pg_catalog.format(
        'GRANT EXECUTE ON FUNCTION mailbox._setting_bool(text, boolean), mailbox._setting_int(text, int, int, int)'
        ' TO %s', v_owner);
    EXECUTE pg_catalog.format(
        'GRANT INSERT (outbox_key, source, event_type, payload, inserted_count, deleted_count, is_claim_check,'
        ' full_refresh), SELECT (_id) ON mailbox.%I TO %s', mailbox._outbox_relname(v_outbox.outbox_name, 'log'), v_owner);
    EXECUTE pg_catalog.format(
        'GRANT INSERT (outbox_key, row_key, row_num, op, payload) ON mailbox.%I TO %s',
        mailbox._outbox_relname(v_outbox.outbox_name, 'delta'), v_owner);
    EXECUTE pg_catalog.format('GRANT SELECT (outbox_key, waiting_until) ON mailbox._outbox_waiter TO %s', v_owner);

    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS mailbox_capture_insert ON %s', v_table);
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS mailbox_capture_update ON %s', v_table);
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS mailbox_capture_delete ON %s', v_table);
    EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS mailbox_capture_truncate ON %s', v_table);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_capture_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS mailbox_new_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_capture_update AFTER UPDATE ON %s'
        ' REFERENCING OLD TABLE AS mailbox_old_rows NEW TABLE AS mailbox_new_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_capture_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS mailbox_old_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_capture_truncate AFTER TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()',
        v_table, v_fn);
END
$$;

-- Removes outbox p_key's capture triggers (when its table still exists) and function, and the
-- grants _install_capture gave the table owner on the outbox's partitions (those go with the
-- partitions; schema, sequence and parser grants stay, as other captured tables may need them).
CREATE FUNCTION mailbox._remove_capture(p_key int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_fn regprocedure := pg_catalog.to_regprocedure(mailbox._owner_function(p_key, 'capture') || '()');
    v_trigger record;
    v_old_owner regrole;
    v_name text := (SELECT o.outbox_name FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
BEGIN
    IF v_fn IS NULL THEN
        RETURN;
    END IF;
    -- the old owner's rights on this outbox's partitions go with its function (unless it owns
    -- the partitions: the extension owner capturing its own table)
    v_old_owner := (SELECT p.proowner FROM pg_catalog.pg_proc AS p WHERE p.oid = v_fn);
    IF v_old_owner <> (SELECT c.relowner FROM pg_catalog.pg_class AS c
                        WHERE c.oid = pg_catalog.to_regclass(pg_catalog.format('mailbox.%I', mailbox._outbox_relname(v_name, 'log')))) THEN
        EXECUTE pg_catalog.format('REVOKE ALL ON mailbox.%I, mailbox.%I FROM %s',
                                  mailbox._outbox_relname(v_name, 'log'), mailbox._outbox_relname(v_name, 'delta'),
                                  v_old_owner);
    END IF;
    FOR v_trigger IN
        SELECT t.tgname, t.tgrelid::regclass AS rel FROM pg_catalog.pg_trigger AS t
         WHERE t.tgfoid = v_fn AND NOT t.tgisinternal
    LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', v_trigger.tgname, v_trigger.rel);
    END LOOP;
    EXECUTE pg_catalog.format('DROP FUNCTION %s', v_fn);
    EXECUTE pg_catalog.format('DROP FUNCTION IF EXISTS %s(regclass)', mailbox._owner_function(p_key, 'rows'));
END
$$;

-- After ALTER TABLE ... OWNER TO on a captured table, its capture function still belongs to the
-- old owner and refuses to run (55000) rather than run the new owner's code with the old
-- owner's rights; this hands it to the new owner.
CREATE FUNCTION mailbox.repair_outbox_capture(p_name text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- re-creates the capture function and triggers on the captured table for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := mailbox._outbox_key(p_name);
    v_rel oid;
BEGIN
    PERFORM mailbox._ddl_lock();
    SELECT o.source_rel INTO v_rel FROM mailbox._outbox AS o WHERE o.outbox_key = v_key;
    IF v_rel IS NULL OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = v_rel) THEN
        RAISE EXCEPTION 'outbox has no source table: %', p_name
            USING ERRCODE = '55000', HINT = 'Only outboxes made by mailbox.enable_outbox() capture a table.';
    END IF;
    PERFORM mailbox._check_table_privilege(v_rel, 'SELECT, TRIGGER', 'capture');
    PERFORM mailbox._remove_capture(v_key);
    PERFORM mailbox._install_capture(v_key);
END
$$;
COMMENT ON FUNCTION mailbox.repair_outbox_capture(text) IS
're-create an outbox''s capture for its table''s current owner (after ALTER TABLE ... OWNER TO)';

-- A captured TRUNCATE raises outbox_full_refresh (snapshots raise their own, with their row
-- count). A trigger on the shared log (cloned to every outbox partition), so a capture function
-- running as the table's owner needs no right on the alert log; it fires only for those rows.
CREATE FUNCTION mailbox._alert_full_refresh()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the alert log for whoever wrote a full-refresh row; reads only that row
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._alert('outbox_full_refresh',
                           pg_catalog.jsonb_build_object(
                               'outbox', (SELECT o.outbox_name FROM mailbox._outbox AS o
                                           WHERE o.outbox_key = new.outbox_key),
                               'source', new.source, 'op', new.event_type));
    RETURN NULL;
END
$$;
CREATE TRIGGER mailbox_full_refresh_alert AFTER INSERT ON mailbox._outbox_log
FOR EACH ROW WHEN (new.full_refresh AND new.event_type = 'TRUNCATE') EXECUTE FUNCTION mailbox._alert_full_refresh();
