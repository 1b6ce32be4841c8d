-- Part 12: creating and removing outboxes.

-- Creates the catalog row, the two partitions and the latest-row view of one outbox.
-- Partitions are created standalone and then ATTACHed: ATTACH takes SHARE UPDATE EXCLUSIVE
-- on the shared parent, so creating an outbox neither blocks producers of other outboxes nor
-- queues behind their open transactions (CREATE TABLE ... PARTITION OF would take ACCESS
-- EXCLUSIVE on the parent).
CREATE FUNCTION mailbox._create_outbox_objects(
    p_name text, p_source_rel oid, p_retention_hours int, p_inline_threshold_rows int
)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_log text := mailbox._outbox_relname(p_name, 'log');
    v_delta text := mailbox._outbox_relname(p_name, 'delta');
    v_view text := mailbox._outbox_relname(p_name, 'view');
    v_latest text := mailbox._outbox_relname(p_name, 'latest');
BEGIN
    PERFORM mailbox._check_name('outbox', p_name);
    PERFORM mailbox._ddl_lock();
    PERFORM mailbox._require(p_retention_hours, 'p_retention_hours');
    IF p_retention_hours < 0 THEN
        RAISE EXCEPTION 'invalid retention for outbox %: % hours', p_name, p_retention_hours
            USING ERRCODE = '22023', HINT = 'p_retention_hours is 0 (drain as soon as allowed) or more.';
    END IF;
    IF p_inline_threshold_rows < 0 THEN
        RAISE EXCEPTION 'invalid inline threshold for outbox %: % rows', p_name, p_inline_threshold_rows
            USING ERRCODE = '22023',
                  HINT = 'p_inline_threshold_rows is NULL (use mailbox.outbox_inline_threshold_rows) or 0 or more.';
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._outbox WHERE outbox_name = p_name) THEN
        RAISE EXCEPTION 'outbox already exists: %', p_name
            USING ERRCODE = '42710', HINT = 'Choose another name, or drop it with mailbox.drop_outbox().';
    END IF;

    INSERT INTO mailbox._outbox (outbox_name, source_rel, source_name, retention_hours, inline_threshold_rows)
    VALUES (
        p_name, p_source_rel,
        CASE WHEN p_source_rel IS NOT NULL THEN
            (SELECT pg_catalog.format('%s.%s', n.nspname, c.relname)
               FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
              WHERE c.oid = p_source_rel)
        END,
        p_retention_hours, p_inline_threshold_rows
    )
    RETURNING outbox_key INTO v_key;
    -- the insert trigger marks rows as restored from a dump (part 10); this one is new
    UPDATE mailbox._outbox SET seq_snapshot = '1:1:' WHERE outbox_key = v_key;
    INSERT INTO mailbox._outbox_retention (outbox_key) VALUES (v_key);

    -- v_key is an integer this function generated, never caller text
    -- the parents have no index (see part 10): each partition gets its own
    EXECUTE pg_catalog.format('CREATE TABLE mailbox.%I (LIKE mailbox._outbox_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS,'
                              ' PRIMARY KEY (outbox_key, _id))', v_log);
    EXECUTE pg_catalog.format('CREATE INDEX ON mailbox.%I (outbox_key, _xid, _id)', v_log);
    EXECUTE pg_catalog.format('ALTER TABLE mailbox._outbox_log ATTACH PARTITION mailbox.%I FOR VALUES IN (%s)',
                              v_log, v_key);
    EXECUTE pg_catalog.format('CREATE TABLE mailbox.%I (LIKE mailbox._outbox_delta_rows INCLUDING DEFAULTS INCLUDING CONSTRAINTS,'
                              ' PRIMARY KEY (outbox_key, row_key, row_num))', v_delta);
    -- The foreign key lives on the pair of partitions, not on the parents: attaching a
    -- partition under a parent-level key would lock the whole log against every producer.
    EXECUTE pg_catalog.format(
        'ALTER TABLE mailbox.%I ADD FOREIGN KEY (outbox_key, row_key) REFERENCES mailbox.%I (outbox_key, _id)'
        ' ON DELETE CASCADE', v_delta, v_log);
    EXECUTE pg_catalog.format('ALTER TABLE mailbox._outbox_delta_rows ATTACH PARTITION mailbox.%I FOR VALUES IN (%s)',
                              v_delta, v_key);
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I AS SELECT event_id, created_at, source, event_type, key, headers, payload,'
        ' inserted_count, deleted_count, is_claim_check, full_refresh FROM mailbox.%I ORDER BY _id DESC LIMIT 1',
        v_latest, v_log);
    -- Offsets live in the numbering chunks (part 10), not in the rows: the view joins them,
    -- so an operator sees which row has which offset (NULL: committed, not numbered yet).
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I AS SELECT o.outbox_id, l.event_id, l.created_at, l.source, l.event_type, l.key,'
        ' l.headers, l.payload, l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh'
        ' FROM mailbox.%I AS l LEFT JOIN (SELECT c.base_offset + u.n AS outbox_id, u.id'
        ' FROM mailbox._outbox_chunk AS c CROSS JOIN LATERAL pg_catalog.unnest(c.ids) WITH ORDINALITY AS u (id, n)'
        ' WHERE c.outbox_key = %s) AS o ON o.id = l._id',
        v_view, v_log, v_key);
    EXECUTE pg_catalog.format('COMMENT ON VIEW mailbox.%I IS %s', v_view,
                              pg_catalog.quote_literal('pg_mailbox outbox ' || p_name || ': its rows with their offsets'));
    EXECUTE pg_catalog.format('COMMENT ON TABLE mailbox.%I IS %s', v_log,
                              pg_catalog.quote_literal('pg_mailbox outbox ' || p_name || ': rows (offsets: mailbox.'
                                                       || pg_catalog.quote_ident(v_view) || ')'));
    EXECUTE pg_catalog.format('GRANT SELECT ON mailbox.%I, mailbox.%I, mailbox.%I, mailbox.%I TO mailbox_admin',
                              v_log, v_delta, v_view, v_latest);
    RETURN v_key;
END
$$;

CREATE FUNCTION mailbox.create_outbox(
    p_name text, p_retention_hours int DEFAULT 24, p_inline_threshold_rows int DEFAULT NULL,
    p_partitions int DEFAULT 1
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- creates tables in the extension's schema for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_partitions(p_partitions);
    PERFORM mailbox._create_outbox_objects(p_name, NULL, p_retention_hours, p_inline_threshold_rows);
    PERFORM mailbox._set_outbox_partitions(p_name, p_partitions); -- part 26
END
$$;
COMMENT ON FUNCTION mailbox.create_outbox(text, int, int, int) IS
'create an outbox fed by mailbox.outbox_publish()';

-- The outbox name enable_outbox gives a table when the caller names none: the table's name
-- (ASCII letters lowercased, every other character but [a-z0-9_] as '_', a leading digit
-- prefixed with '_') when that is a valid name that is free; otherwise its first 32 bytes,
-- '_' and 7 hex digits of md5('schema.table'), which is unique per schema-qualified table.
-- 42710 when even that is taken.
CREATE FUNCTION mailbox._derive_outbox_name(p_schema text, p_table text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_base text := pg_catalog.regexp_replace(
        pg_catalog.translate(p_table, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
        '[^a-z0-9_]', '_', 'g');
    v_name text;
BEGIN
    IF v_base = '' OR v_base ~ '^[0-9]' THEN
        v_base := '_' || v_base;
    END IF;
    v_name := v_base;
    IF pg_catalog.octet_length(v_name) > 40
       OR EXISTS (SELECT 1 FROM mailbox._outbox AS o WHERE o.outbox_name = v_name) THEN
        v_name := pg_catalog.left(v_base, 32) || '_' || pg_catalog.left(pg_catalog.md5(p_schema || '.' || p_table), 7);
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._outbox AS o WHERE o.outbox_name = v_name) THEN
        RAISE EXCEPTION 'outbox already exists: %', v_name
            USING ERRCODE = '42710',
                  DETAIL = pg_catalog.format('The name derived for table %s.%s is in use.', p_schema, p_table),
                  HINT = 'Pass p_outbox_name to choose another name.';
    END IF;
    RETURN v_name;
END
$$;

CREATE FUNCTION mailbox._enable_outbox(
    p_rel oid,
    p_retention_hours int,
    p_inline_threshold_rows int,
    p_outbox_name text
)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- installs triggers on the caller's table that write into extension tables
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_name text;
    v_key int;
    v_schema text;
    v_table text;
BEGIN
    PERFORM mailbox._check_user_table(p_rel, 'capture');
    IF p_outbox_name IS NOT NULL THEN
        PERFORM mailbox._check_name('outbox', p_outbox_name);
    END IF;
    PERFORM mailbox._check_table_privilege(p_rel, 'SELECT, TRIGGER', 'capture');
    PERFORM mailbox._ddl_lock();
    SELECT n.nspname, c.relname INTO v_schema, v_table
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_rel;
    IF EXISTS (SELECT 1 FROM mailbox._outbox WHERE source_rel = p_rel) THEN
        RAISE EXCEPTION 'outbox already enabled for table: %', pg_catalog.format('%I.%I', v_schema, v_table)
            USING ERRCODE = '42710',
                  HINT = 'mailbox.outboxes shows its outbox; disable it first to recreate it.';
    END IF;
    v_name := coalesce(p_outbox_name, mailbox._derive_outbox_name(v_schema, v_table));

    v_key := mailbox._create_outbox_objects(v_name, p_rel, p_retention_hours, p_inline_threshold_rows);
    PERFORM mailbox._install_capture(v_key);
    RETURN v_name;
END
$$;

-- Deliberately SECURITY INVOKER without SET search_path: p_source is resolved with the
-- caller's search_path (as a table name in the caller's own SQL would be). Everything
-- privileged happens in _enable_outbox, which re-checks the table and the caller's rights;
-- the initial snapshot reads the table with the caller's rights (outbox_snapshot).
CREATE FUNCTION mailbox.enable_outbox(
    p_source text,
    p_retention_hours int DEFAULT 24,
    p_inline_threshold_rows int DEFAULT NULL,
    p_outbox_name text DEFAULT NULL,
    p_initial_snapshot boolean DEFAULT FALSE,
    p_partitions int DEFAULT 1
)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
    v_rel oid;
    v_name text;
BEGIN
    IF p_source IS NULL THEN
        RAISE EXCEPTION 'p_source must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the table to capture, as schema.table.';
    END IF;
    BEGIN
        v_rel := pg_catalog.to_regclass(p_source);
    EXCEPTION WHEN invalid_name OR syntax_error OR invalid_parameter_value THEN
        RAISE EXCEPTION 'invalid table name: %', pg_catalog.quote_literal(p_source)
            USING ERRCODE = '22023', HINT = 'Pass schema.table, quoting identifiers as in SQL.';
    END;
    IF v_rel IS NULL THEN
        RAISE EXCEPTION 'table not found: %', p_source
            USING ERRCODE = '42704', HINT = 'Pass schema.table, or a name the current search_path resolves.';
    END IF;
    IF p_initial_snapshot IS NULL THEN
        RAISE EXCEPTION 'p_initial_snapshot must not be null'
            USING ERRCODE = '22004', HINT = 'Pass true or false.';
    END IF;
    PERFORM mailbox._check_partitions(p_partitions);
    v_name := mailbox._enable_outbox(v_rel, p_retention_hours, p_inline_threshold_rows, p_outbox_name);
    PERFORM mailbox._set_outbox_partitions(v_name, p_partitions); -- part 26
    IF p_initial_snapshot THEN
        PERFORM mailbox.outbox_snapshot(v_name);
    END IF;
    RETURN v_name;
END
$$;
COMMENT ON FUNCTION mailbox.enable_outbox(text, int, int, text, boolean, int) IS
'capture every INSERT, UPDATE, DELETE and TRUNCATE of a table into an outbox; returns its name';

-- Detaching an outbox's partitions needs ACCESS EXCLUSIVE on the shared parents. Waiting for it
-- in the lock queue would block every producer of every outbox behind this request for as long
-- as the oldest open producer transaction runs; instead, try without waiting, a few times over
-- about two seconds, and fail with 55P03 if producers never pause.
CREATE FUNCTION mailbox._lock_shared_log()
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    FOR v_try IN 1 .. 40 LOOP
        BEGIN
            LOCK TABLE mailbox._outbox_log, mailbox._outbox_delta_rows IN ACCESS EXCLUSIVE MODE NOWAIT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_catalog.pg_sleep(0.05);
        END;
    END LOOP;
    RAISE EXCEPTION 'outbox log is busy: producers or consumers held it for two seconds'
        USING ERRCODE = '55P03',
              DETAIL = 'Dropping an outbox detaches its partitions from the log all outboxes share.',
              HINT = 'Retry; it succeeds as soon as no transaction is writing to or reading from any outbox.';
END
$$;

CREATE FUNCTION mailbox.disable_outbox(p_name text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- drops extension tables and the capture triggers on the caller's table
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_outbox mailbox._outbox;
BEGIN
    PERFORM mailbox._require(p_name, 'p_name');
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    PERFORM mailbox._ddl_lock();
    SELECT * INTO v_outbox FROM mailbox._outbox WHERE outbox_name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        IF p_if_exists THEN
            RAISE NOTICE 'outbox not found, skipping: %', p_name;
            RETURN;
        END IF;
        PERFORM mailbox._outbox_key(p_name); -- raises 42704 with its hint
    END IF;

    -- the source may have been dropped already; its triggers went with it
    PERFORM mailbox._remove_capture(v_outbox.outbox_key);
    PERFORM mailbox._forget_grants('outbox', v_outbox.outbox_key);
    DELETE FROM mailbox._outbox_waiter AS w WHERE w.outbox_key = v_outbox.outbox_key;
    DELETE FROM mailbox._claim_check_consumed WHERE outbox_key = v_outbox.outbox_key;
    PERFORM mailbox._lock_shared_log();
    EXECUTE pg_catalog.format('DROP VIEW IF EXISTS mailbox.%I', mailbox._outbox_relname(p_name, 'latest'));
    EXECUTE pg_catalog.format('DROP VIEW IF EXISTS mailbox.%I', mailbox._outbox_relname(p_name, 'view'));
    -- detach before dropping: dropping a partition that foreign keys reference would need
    -- CASCADE, which would drop those constraints on the shared parents
    EXECUTE pg_catalog.format('ALTER TABLE mailbox._outbox_delta_rows DETACH PARTITION mailbox.%I',
                              mailbox._outbox_relname(p_name, 'delta'));
    EXECUTE pg_catalog.format('DROP TABLE mailbox.%I', mailbox._outbox_relname(p_name, 'delta'));
    EXECUTE pg_catalog.format('ALTER TABLE mailbox._outbox_log DETACH PARTITION mailbox.%I',
                              mailbox._outbox_relname(p_name, 'log'));
    EXECUTE pg_catalog.format('DROP TABLE mailbox.%I', mailbox._outbox_relname(p_name, 'log'));
    -- consumer groups and their state go with the catalog row (ON DELETE CASCADE)
    DELETE FROM mailbox._outbox WHERE outbox_key = v_outbox.outbox_key;
END
$$;
COMMENT ON FUNCTION mailbox.disable_outbox(text, boolean) IS
'remove an outbox: capture triggers, tables, view, consumer groups and catalog rows';

CREATE FUNCTION mailbox.drop_outbox(p_name text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox.disable_outbox(p_name, p_if_exists);
$$;
COMMENT ON FUNCTION mailbox.drop_outbox(text, boolean) IS 'alias of mailbox.disable_outbox()';
