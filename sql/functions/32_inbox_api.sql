-- Part 32: creating, adopting and dropping inboxes (SPEC §3.1, control plane).

-- Registers an inbox whose table exists (made by create_inbox or checked by
-- enable_inbox_tracking) and creates its views and its generated functions (part 35).
CREATE FUNCTION mailbox._inbox_register(
    p_name text, p_rel oid, p_is_managed boolean, p_columns jsonb, p_casts jsonb,
    p_max_retries int, p_retention_hours int, p_schedule text,
    p_with_dead_letter boolean, p_with_stats boolean
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
BEGIN
    INSERT INTO mailbox._inbox (inbox_name, table_rel, schema_name, table_name, is_managed, columns, casts,
                                max_retries, retention_hours, schedule, with_dead_letter, with_stats)
    SELECT p_name, p_rel, n.nspname, c.relname, p_is_managed, p_columns, p_casts,
           p_max_retries, p_retention_hours, p_schedule, p_with_dead_letter, p_with_stats
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_rel
    RETURNING * INTO v_inbox;
    PERFORM mailbox._inbox_create_state_views(v_inbox);
    PERFORM mailbox._inbox_create_views(v_inbox);
    PERFORM mailbox._inbox_generate(v_inbox);
END
$$;

-- Shared argument checks of create_inbox and enable_inbox_tracking; 42710 for a taken name.
CREATE FUNCTION mailbox._inbox_check_new(p_name text, p_max_retries int, p_retention_hours int)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_name('inbox', p_name);
    PERFORM mailbox._require(p_max_retries, 'p_max_retries');
    IF p_max_retries < 1 THEN
        RAISE EXCEPTION 'invalid max_retries for inbox %: %', p_name, p_max_retries
            USING ERRCODE = '22023',
                  HINT = 'p_max_retries is 1 or more: the failure that reaches it moves the message to the DLQ.';
    END IF;
    IF p_retention_hours < 0 THEN
        RAISE EXCEPTION 'invalid retention for inbox %: % hours', p_name, p_retention_hours
            USING ERRCODE = '22023', HINT = 'p_retention_hours is 0 (drain as soon as possible) or more.';
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._inbox WHERE inbox_name = p_name) THEN
        RAISE EXCEPTION 'inbox already exists: %', p_name
            USING ERRCODE = '42710', HINT = 'Choose another name, or drop it with mailbox.drop_inbox().';
    END IF;
END
$$;

-- create_inbox's schema checks: the schema exists, is not a system schema, the caller may
-- create in it, and no role but a superuser owns it. A schema's owner may drop or rename any
-- table in it, so a tenant owning the schema could swap the table under a receive waiting for
-- its lock; the re-planned statement would then run the tenant's trigger as the extension
-- owner (docs/security.md). public belongs to pg_database_owner, that is the database's owner.
CREATE FUNCTION mailbox._inbox_check_schema(p_schema text)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_owner oid;
BEGIN
    SELECT CASE WHEN n.nspowner = 'pg_database_owner'::regrole
                THEN (SELECT d.datdba FROM pg_catalog.pg_database AS d
                       WHERE d.datname = pg_catalog.current_database())
                ELSE n.nspowner END
      INTO v_owner
      FROM pg_catalog.pg_namespace AS n WHERE n.nspname = p_schema;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schema not found: %', p_schema
            USING ERRCODE = '3F000', HINT = 'Create the schema first, or pass an existing one.';
    END IF;
    IF p_schema LIKE 'pg\_%' OR p_schema = 'information_schema' THEN
        RAISE EXCEPTION 'cannot create an inbox in system schema: %', p_schema
            USING ERRCODE = '22023', HINT = 'Pass your own schema, or omit p_schema for mailbox.';
    END IF;
    IF p_schema <> 'mailbox' AND NOT pg_catalog.has_schema_privilege(mailbox._caller(), p_schema, 'CREATE') THEN
        RAISE EXCEPTION 'permission denied for schema %', p_schema
            USING ERRCODE = '42501',
                  HINT = pg_catalog.format('Role %s needs CREATE on schema %s.', mailbox._caller(), p_schema);
    END IF;
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.oid = v_owner) IS NOT TRUE THEN
        RAISE EXCEPTION 'cannot create a managed inbox in schema %: its owner % is not a superuser',
                        p_schema, v_owner::regrole
            USING ERRCODE = '42501',
                  DETAIL = 'A schema''s owner can drop or replace any table in it, and the inbox '
                           'functions write the managed table as the extension owner.',
                  HINT = 'Create the table yourself and adopt it with mailbox.enable_inbox_tracking(), '
                         'or use a schema a superuser owns (omit p_schema for mailbox).';
    END IF;
END
$$;

CREATE FUNCTION mailbox.create_inbox(
    p_name text,
    p_schema text DEFAULT 'mailbox',
    p_max_retries int DEFAULT 3,
    p_schedule text DEFAULT '1s',
    with_dead_letter boolean DEFAULT TRUE,
    with_stats boolean DEFAULT TRUE,
    p_retention_hours int DEFAULT 72
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- creates the inbox table and views, and writes the catalog, for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_rel oid;
    v_columns jsonb;
BEGIN
    PERFORM mailbox._require(p_schema, 'p_schema');
    PERFORM mailbox._require(with_dead_letter, 'with_dead_letter');
    PERFORM mailbox._require(with_stats, 'with_stats');
    PERFORM mailbox._require(p_retention_hours, 'p_retention_hours');
    PERFORM mailbox._ddl_lock();
    PERFORM mailbox._inbox_check_new(p_name, p_max_retries, p_retention_hours);
    PERFORM mailbox._inbox_check_schema(p_schema);
    IF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_schema, p_name)) IS NOT NULL THEN
        RAISE EXCEPTION 'relation already exists: %', pg_catalog.format('%I.%I', p_schema, p_name)
            USING ERRCODE = '42710',
                  HINT = 'Adopt it with mailbox.enable_inbox_tracking(), or choose another inbox name.';
    END IF;

    -- the managed table: a column per role, named after it (SPEC §3.1, part 30's registry);
    -- every other function goes through the column mapping built below
    EXECUTE pg_catalog.format('CREATE TABLE %I.%I (%s)', p_schema, p_name, mailbox._inbox_managed_columns());
    v_rel := pg_catalog.format('%I.%I', p_schema, p_name)::regclass;
    v_columns := (SELECT pg_catalog.jsonb_object_agg(r.role, r.role) FROM mailbox._inbox_roles() AS r);
    PERFORM mailbox._inbox_base_indexes(p_schema, p_name, p_max_retries);
    EXECUTE pg_catalog.format('COMMENT ON TABLE %I.%I IS %s', p_schema, p_name,
                              pg_catalog.quote_literal('pg_mailbox inbox ' || p_name));
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.%I TO mailbox_admin', p_schema, p_name);
    EXECUTE pg_catalog.format('GRANT INSERT ON %I.%I TO mailbox_producer', p_schema, p_name);
    EXECUTE pg_catalog.format('GRANT SELECT, UPDATE ON %I.%I TO mailbox_consumer', p_schema, p_name);
    PERFORM mailbox._inbox_register(p_name, v_rel, TRUE, v_columns, '{}', p_max_retries, p_retention_hours,
                                    p_schedule, with_dead_letter, with_stats);
END
$$;
COMMENT ON FUNCTION mailbox.create_inbox(text, text, int, text, boolean, boolean, int) IS
'create an inbox table with its pending, dead-letter and stats views';

-- Adopts a table. SECURITY DEFINER with the pinned search_path like every definer function,
-- so p_table_ref is resolved with that path: name a table outside mailbox as schema.table.
-- The inbox's generated functions and views are owned by the table's owner and run with its
-- rights, never the extension owner's (part 35, docs/security.md "Inbox tables").
CREATE FUNCTION mailbox.enable_inbox_tracking(
    p_name text,
    p_table_ref text,
    p_id_column text DEFAULT 'event_id',
    p_processed_at_column text DEFAULT 'processed_at',
    p_retry_count_column text DEFAULT 'retry_count',
    p_error_column text DEFAULT 'error',
    p_received_at_column text DEFAULT 'received_at',
    p_event_type_column text DEFAULT 'event_type',
    p_max_retries int DEFAULT 3,
    p_schedule text DEFAULT '1s',
    p_payload_column text DEFAULT 'payload'
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- creates views beside the caller's table and writes the catalog
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_rel oid;
    v_checked jsonb;
BEGIN
    PERFORM mailbox._require(p_table_ref, 'p_table_ref');
    PERFORM mailbox._ddl_lock();
    PERFORM mailbox._inbox_check_new(p_name, p_max_retries, NULL);
    BEGIN
        v_rel := pg_catalog.to_regclass(p_table_ref);
    EXCEPTION WHEN invalid_name OR syntax_error OR invalid_parameter_value THEN
        RAISE EXCEPTION 'invalid table name: %', pg_catalog.quote_literal(p_table_ref)
            USING ERRCODE = '22023', HINT = 'Pass schema.table, quoting identifiers as in SQL.';
    END;
    IF v_rel IS NULL THEN
        RAISE EXCEPTION 'table not found: %', p_table_ref
            USING ERRCODE = '42704', HINT = 'Pass the table as schema.table (e.g. public.my_inbox).';
    END IF;
    -- every inbox role reads and writes an adopted table through the inbox: the adopter must
    -- hold each of these itself (the helper checks them one by one, 42501 naming the first missing)
    PERFORM mailbox._check_table_privilege(v_rel, 'SELECT, INSERT, UPDATE, DELETE', 'adopt');
    IF EXISTS (SELECT 1 FROM mailbox._inbox WHERE table_rel = v_rel) THEN
        RAISE EXCEPTION 'inbox already enabled for table: %', v_rel::regclass
            USING ERRCODE = '42710',
                  HINT = 'mailbox.inbox_status() shows its inbox; drop it first to adopt the table again.';
    END IF;
    v_checked := mailbox._inbox_resolve_columns(v_rel, pg_catalog.jsonb_build_object(
        'event_id', p_id_column, 'processed_at', p_processed_at_column, 'retry_count', p_retry_count_column,
        'received_at', p_received_at_column, 'error', p_error_column, 'event_type', p_event_type_column,
        'payload', p_payload_column));
    IF NOT pg_catalog.has_schema_privilege(mailbox._caller(), v_checked ->> 'schema', 'CREATE') THEN
        RAISE EXCEPTION 'permission denied for schema %', v_checked ->> 'schema'
            USING ERRCODE = '42501',
                  HINT = pg_catalog.format('The inbox views are created beside the table; role %s needs CREATE there.',
                                           mailbox._caller());
    END IF;
    PERFORM mailbox._inbox_register(p_name, v_rel, FALSE, v_checked -> 'columns', v_checked -> 'casts',
                                    p_max_retries, NULL, p_schedule, TRUE, TRUE);
END
$$;
COMMENT ON FUNCTION mailbox.enable_inbox_tracking(text, text, text, text, text, text, text, text, int, text, text) IS
'adopt an existing table (any name, mapped columns) as an inbox without altering it';

CREATE FUNCTION mailbox.drop_inbox(p_name text, p_if_exists boolean DEFAULT FALSE, p_cascade boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- drops the inbox views (and a managed table) and catalog rows for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_table text;
BEGIN
    PERFORM mailbox._require(p_name, 'p_name');
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    PERFORM mailbox._require(p_cascade, 'p_cascade');
    PERFORM mailbox._ddl_lock();
    SELECT * INTO v_inbox FROM mailbox._inbox WHERE inbox_name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        IF p_if_exists THEN
            RAISE NOTICE 'inbox not found, skipping: %', p_name;
            RETURN;
        END IF;
        PERFORM mailbox._inbox_get(p_name); -- raises 42704 with its hint
    END IF;
    -- the inbox's table is table_rel, wherever it is now: after a rename another table may
    -- carry the stored name, and that one is never ours to drop; the table may also have been
    -- dropped by hand already
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO v_table
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = v_inbox.table_rel;
    -- dropping the table: first wait for the transactions that use it (a worker's open
    -- claim), which read the inbox's per-inbox views, rather than hold those views' locks
    -- while waiting for the table (a worker's next read of them would deadlock). Keeping a
    -- managed table: wait the same way for those that wrote it, which keep its named receive
    -- (part 35, named receive); an adopted table is not locked (docs/inbox.md, drop_inbox).
    IF v_table IS NOT NULL AND v_inbox.is_managed AND p_cascade THEN
        EXECUTE pg_catalog.format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', v_table);
    ELSE
        PERFORM mailbox._inbox_quiesce(v_inbox);
    END IF;
    PERFORM mailbox._inbox_drop_views(v_inbox);
    PERFORM mailbox._inbox_gap_untrack(v_inbox);
    PERFORM mailbox._inbox_drop_functions(v_inbox);
    PERFORM mailbox._inbox_drop_state_views(v_inbox);
    DELETE FROM mailbox._inbox_lease WHERE inbox_key = v_inbox.inbox_key;
    DELETE FROM mailbox._inbox_open_claim WHERE inbox_key = v_inbox.inbox_key; -- this transaction's
    DELETE FROM mailbox._inbox_waiter WHERE inbox_key = v_inbox.inbox_key;
    DELETE FROM mailbox._inbox_aggregate WHERE inbox_key = v_inbox.inbox_key;
    DELETE FROM mailbox._inbox_dlq_event WHERE inbox_key = v_inbox.inbox_key;
    DELETE FROM mailbox._inbox_gap_alert WHERE inbox_key = v_inbox.inbox_key;
    DELETE FROM mailbox._inbox WHERE inbox_key = v_inbox.inbox_key;
    PERFORM mailbox._forget_grants('inbox', v_inbox.inbox_key);
    IF v_table IS NOT NULL THEN
        IF v_inbox.is_managed AND p_cascade THEN
            EXECUTE pg_catalog.format('DROP TABLE %s', v_table);
        ELSE
            RAISE NOTICE 'inbox table kept: %', v_table
                USING HINT = CASE WHEN v_inbox.is_managed THEN 'Pass p_cascade => true to drop it with the inbox.'
                                  ELSE 'Adopted tables are never dropped by pg_mailbox.' END;
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION mailbox.drop_inbox(text, boolean, boolean) IS
'remove an inbox: views and catalog rows, and with p_cascade the table create_inbox made';
