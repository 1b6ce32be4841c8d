-- Part 05: validation and alert helpers shared by every other part (settings: part 04).

-- Names become parts of identifiers (outbox_<N>, pending_<I>_<tier>), so they are checked
-- before any DDL runs; 40 bytes keeps every derived name under NAMEDATALEN.
CREATE FUNCTION mailbox._check_name(p_kind text, p_name text, p_max_bytes int DEFAULT 40)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_name IS NULL THEN
        RAISE EXCEPTION '% name must not be null', p_kind
            USING ERRCODE = '22004',
                  HINT = 'Pass a lowercase identifier such as orders or order_events.';
    END IF;
    IF p_name !~ '^[a-z_][a-z0-9_]*$' OR pg_catalog.octet_length(p_name) > p_max_bytes THEN
        RAISE EXCEPTION 'invalid % name: %', p_kind, pg_catalog.quote_literal(p_name)
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format(
                      'Names of %s objects are lowercase identifiers [a-z_][a-z0-9_]* of at most %s bytes.',
                      p_kind, p_max_bytes),
                  HINT = 'Use lowercase letters, digits and underscores, starting with a letter or underscore.';
    END IF;
    RETURN p_name;
END
$$;

-- Consumer group and consumer ids are free text (host names, pod names) but bounded.
CREATE FUNCTION mailbox._check_id(p_kind text, p_value text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION '% must not be null', p_kind
            USING ERRCODE = '22004', HINT = pg_catalog.format('Pass a non-empty %s.', p_kind);
    END IF;
    IF p_value = '' OR pg_catalog.char_length(p_value) > 200 THEN
        RAISE EXCEPTION 'invalid %: %', p_kind, pg_catalog.quote_literal(p_value)
            USING ERRCODE = '22023',
                  HINT = pg_catalog.format('A %s is non-empty text of at most 200 characters.', p_kind);
    END IF;
    RETURN p_value;
END
$$;

-- A required argument that is NULL is always 22004 with the parameter named.
CREATE FUNCTION mailbox._require(p_value anyelement, p_param text)
RETURNS anyelement
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION '% must not be null', p_param
            USING ERRCODE = '22004', HINT = pg_catalog.format('Pass a value for %s.', p_param);
    END IF;
    RETURN p_value;
END
$$;

CREATE FUNCTION mailbox._alert(p_event text, p_detail jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_payload jsonb := pg_catalog.jsonb_build_object('event', p_event)
                       || coalesce(p_detail, '{}'::jsonb)
                       || pg_catalog.jsonb_build_object('at', pg_catalog.now());
BEGIN
    INSERT INTO mailbox.alert_log (event, payload) VALUES (p_event, v_payload);
    PERFORM pg_catalog.pg_notify('mailbox_alert', v_payload::text);
END
$$;

-- pg_mailbox's advisory locks, all of them: no other code (SQL or Python) writes a key; the
-- first three are taken only through their functions, the numberer's only in part 24.
--   (7168632, 1)     _ddl_lock()              pg_mailbox DDL in this database (maintenance
--                    _try_ddl_lock()                     only tries it, part 43)
--   (7168632, 2)     _try_maintenance_lock()  one maintenance pass at a time
--   (7168633, key)   _retention_lock(key)     retention vs seeks of one outbox
--   (7168634, 0)     part 24 (run_numberer)   one numberer per database (a session lock)
--   (7168635, key)   part 34 (_inbox_gap_fold) one gap fold of an inbox at a time (try only)
--   (7168636, hashtext(inbox key '/' aggregate))
--                    part 33 (inbox_claim)    an ordered inbox's aggregate in flight in an open
--                                             claiming transaction (try only; a hash collision
--                                             only holds back another aggregate a while)

-- Serialises pg_mailbox DDL (create/enable/drop) in this database, so two concurrent calls
-- for the same name or table give one success and one clean 42710 instead of a unique
-- violation. Hot paths never take it. The key pair is pg_mailbox's own (classid 'mbx').
CREATE FUNCTION mailbox._ddl_lock()
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(7168632, 1);
$$;

-- The extension's owner: the superuser that created it (or restored it, pg_dump's CREATE
-- EXTENSION names no owner), whose SECURITY DEFINER functions the API runs as.
CREATE FUNCTION mailbox._extension_owner()
RETURNS oid
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox';
$$;

-- The DDL lock without waiting: false while some pg_mailbox DDL runs (maintenance then leaves
-- what needs it for its next pass).
CREATE FUNCTION mailbox._try_ddl_lock()
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_try_advisory_xact_lock(7168632, 1);
$$;

-- One maintenance pass at a time: false (and no wait) while another pass runs.
CREATE FUNCTION mailbox._try_maintenance_lock()
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_try_advisory_xact_lock(7168632, 2);
$$;

CREATE FUNCTION mailbox._owner_code_begin()
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    INSERT INTO mailbox._owner_code_running (backend_pid, xact_start)
    VALUES (pg_catalog.pg_backend_pid(), pg_catalog.now())
    ON CONFLICT DO NOTHING;
$$;

CREATE FUNCTION mailbox._owner_code_end()
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    DELETE FROM mailbox._owner_code_running AS r
     WHERE r.backend_pid = pg_catalog.pg_backend_pid() AND r.xact_start = pg_catalog.now();
$$;

-- The role that called into pg_mailbox. Inside a SECURITY DEFINER function current_user is the
-- extension owner, but SET ROLE (the 'role' setting) and session_user are untouched, so they
-- still name the caller. Used to make definer functions honour the caller's table privileges
-- and per-object grants. PostgreSQL does not tell a definer function who called it; so code
-- of another role that runs in this session (a trigger of its own, say) is taken for the
-- session's role, as it is by PostgreSQL's own SECURITY INVOKER triggers. The one case
-- pg_mailbox adds, a table owner's code it runs itself on someone's behalf, is refused here.
CREATE FUNCTION mailbox._caller()
RETURNS name
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT FROM mailbox._owner_code_running AS r
                WHERE r.backend_pid = pg_catalog.pg_backend_pid() AND r.xact_start = pg_catalog.now()) THEN
        RAISE EXCEPTION 'permission denied: pg_mailbox is running a table owner''s code for role %', session_user
            USING ERRCODE = '42501',
                  DETAIL = 'A snapshot or maintenance runs the table''s casts, triggers and defaults as its owner; '
                           'that code may not act with the rights of the session that called pg_mailbox.',
                  HINT = 'Do not call pg_mailbox functions from triggers, casts or defaults of captured or inbox tables.';
    END IF;
    RETURN CASE WHEN pg_catalog.current_setting('role') = 'none' THEN session_user
                ELSE pg_catalog.current_setting('role')::name END;
END
$$;
-- A table a caller hands to pg_mailbox (p_use: 'capture' by enable_outbox, 'adopt' by
-- enable_inbox_tracking) must be an ordinary or partitioned table of the caller's own, not
-- one of the extension's and not a temporary one. One rule for both halves.
CREATE FUNCTION mailbox._check_user_table(p_rel oid, p_use text)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_kind char;
    v_schema text;
BEGIN
    SELECT c.relkind, n.nspname INTO v_kind, v_schema
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_rel;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table not found: %', p_rel
            USING ERRCODE = '42704', HINT = 'Pass schema.table, or a name the current search_path resolves.';
    END IF;
    IF v_kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'not a table: %', p_rel::regclass
            USING ERRCODE = '42809',
                  DETAIL = pg_catalog.format('%s is a %s.', p_rel::regclass,
                      CASE v_kind WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                                  WHEN 'S' THEN 'sequence' WHEN 'f' THEN 'foreign table'
                                  WHEN 'i' THEN 'index' WHEN 'c' THEN 'composite type'
                                  ELSE 'relation of kind ' || v_kind END),
                  HINT = CASE p_use
                      WHEN 'capture' THEN 'Only ordinary and partitioned tables can be captured; publish events with mailbox.outbox_publish() instead.'
                      ELSE 'Only ordinary and partitioned tables can be inbox tables.' END;
    END IF;
    IF v_schema = 'mailbox' THEN
        RAISE EXCEPTION 'cannot % a pg_mailbox table: %', p_use, p_rel::regclass
            USING ERRCODE = '22023',
                  HINT = CASE p_use WHEN 'capture' THEN 'Capture your own tables, not the extension''s.'
                                    ELSE 'Adopt your own tables, or use mailbox.create_inbox().' END;
    END IF;
    IF v_schema LIKE 'pg_temp%' THEN
        RAISE EXCEPTION 'cannot % a temporary table: %', p_use, p_rel::regclass
            USING ERRCODE = '22023',
                  HINT = CASE p_use WHEN 'capture' THEN 'Outbox rows outlive the session; capture a permanent table.'
                                    ELSE 'Inbox rows outlive the session; adopt a permanent table.' END;
    END IF;
END
$$;


-- 42501 unless the caller holds EVERY listed privilege on the table (has_table_privilege with a
-- list is true when any one is held, so each is checked alone): capturing a table must not
-- become a way to read one you may not read. The error names the first missing privilege.
CREATE FUNCTION mailbox._check_table_privilege(p_rel oid, p_privileges text, p_action text)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_caller name := mailbox._caller();
    v_privilege text;
BEGIN
    FOREACH v_privilege IN ARRAY pg_catalog.regexp_split_to_array(pg_catalog.btrim(p_privileges), '\s*,\s*') LOOP
        IF NOT pg_catalog.has_table_privilege(v_caller, p_rel, v_privilege) THEN
            RAISE EXCEPTION 'permission denied to % table: % (role % lacks %)', p_action, p_rel::regclass,
                            v_caller, v_privilege
                USING ERRCODE = '42501',
                      DETAIL = pg_catalog.format('To %s a table, a role needs %s on it.', p_action, p_privileges),
                      HINT = pg_catalog.format('GRANT %s ON %s TO %s;', v_privilege, p_rel::regclass,
                                               pg_catalog.quote_ident(v_caller));
        END IF;
    END LOOP;
END
$$;

-- Serialises what moves a group's position backwards (seek_offset, create_consumer_group with
-- 'earliest') with the retention drain of the same outbox, so a drain never deletes rows a
-- group was just pointed back at. Taken per outbox; polls and commits never take it.
CREATE FUNCTION mailbox._retention_lock(p_outbox_key int)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(7168633, p_outbox_key);
$$;
