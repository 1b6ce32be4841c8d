-- Part 14: statement-level capture of a table into its outbox: installing, repairing and
-- removing each captured table's trigger function (its code: part 13). Each function is
-- static SQL for its own outbox, so PL/pgSQL caches its plans, and only the branch for TG_OP
-- ever runs.

CREATE FUNCTION mailbox._notify_outbox(p_name text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    -- PostgreSQL folds identical notifications of one transaction into one and drops those of
    -- a rolled-back transaction or subtransaction: one wake-up per committed transaction.
    -- only while a consumer of the outbox waits for a wake-up (part 17)
    IF mailbox._setting_bool('outbox_notify')
       AND EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w JOIN mailbox._outbox AS o USING (outbox_key)
                    WHERE o.outbox_name = p_name AND w.waiting_until > pg_catalog.now()) THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', p_name);
    END IF;
END
$$;

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
        'GRANT EXECUTE ON FUNCTION mailbox._setting_bool(text), mailbox._setting_int(text),'
        ' mailbox._settings(), mailbox._setting_missing(text, text) TO %s', v_owner);
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
