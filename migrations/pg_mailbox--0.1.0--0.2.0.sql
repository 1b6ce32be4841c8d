-- Built by `make migration` from sql/upgrade/0.1.0--0.2.0.sql, sql/functions/*.sql,
-- sql/*.sql and sql/upgrade/regenerate.sql (scripts/build-upgrade.py); edit those.
\echo Use "ALTER EXTENSION pg_mailbox UPDATE TO '0.2.0'" to load this file. \quit

-- sql/upgrade/0.1.0--0.2.0.sql
-- Schema delta 0.1.0 -> 0.2.0, run first by pg_mailbox--0.1.0--0.2.0.sql (`make migration`;
-- docs/development.md, "Schema and functions"). Everything sql/functions/ re-creates is
-- re-created after this; what goes here is what CREATE OR REPLACE cannot do:
--   * new tables, columns (at the end, as in sql/schema/), types, indexes, sequences, their
--     pg_extension_config_dump() calls and comments, new roles;
--   * DROP FUNCTION / DROP VIEW of objects 0.2.0 removes, renames, or whose result type,
--     parameter names or defaults change (re-created afterwards from sql/functions/);
--   * moving data between changed tables.
-- Released upgrade scripts never change; this one may until 0.2.0 is released.

-- New tables (sql/schema/, with their comments and config_dump calls).

-- Issue 11: whether an inbox has per-object grants, kept by _set_grant (part 39), read by the
-- data plane's lookup instead of a probe of _object_grant.
ALTER TABLE mailbox._inbox ADD COLUMN has_grants boolean NOT NULL DEFAULT FALSE;
ALTER TABLE mailbox._inbox ADD COLUMN held_until timestamptz;
UPDATE mailbox._inbox AS i
   SET has_grants = TRUE
 WHERE EXISTS (SELECT 1 FROM mailbox._object_grant AS g WHERE g.object_kind = 'inbox' AND g.object_key = i.inbox_key);
-- Issue 11: a transaction's open claims looked up by inbox and transaction through an index
-- (part 30), not a heap of dead rows. The table is empty outside open transactions.
ALTER TABLE mailbox._inbox_open_claim ADD COLUMN xact_id xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id();
CREATE INDEX _inbox_open_claim_xact_idx ON mailbox._inbox_open_claim (inbox_key, xact_id);
-- Issue 11: open claims write no WAL (part 30: a row never outlives its transaction; the table
-- is empty outside open transactions, so the rewrite is instant).
ALTER TABLE mailbox._inbox_open_claim SET UNLOGGED;
-- Issue 11: the aggregate of an ordered inbox's lease, one row per aggregate at most (part 37,
-- _inbox_claim_leases). A lease taken before the update has none: it still counts in every
-- claim's scan, only not in the re-read after the aggregate's lock, until it ends.
ALTER TABLE mailbox._inbox_lease ADD COLUMN aggregate_id text;
CREATE UNIQUE INDEX _inbox_lease_aggregate_idx ON mailbox._inbox_lease (inbox_key, aggregate_id)
    WHERE aggregate_id IS NOT NULL;

-- Issue 11: gap state of managed ordered inboxes (part 34, gap state): every gap as of the inbox's last
-- fold, and the aggregates touched since (insert-only, one row per statement with the array
-- of its aggregates and its count changes, written by the inbox table's triggers in the
-- writer's transaction; NULL aggregates mean all of them), the highest sequence per aggregate
-- and the message counts as of that fold. No index on _inbox_gap_touched: it stays small between folds,
-- and the receive path pays one heap insert per statement, nothing more.
CREATE TABLE mailbox._inbox_gap (
    inbox_key int NOT NULL,
    aggregate_id text NOT NULL,
    expected_seq bigint NOT NULL,
    found_seq bigint NOT NULL,
    found_received_at timestamptz,
    PRIMARY KEY (inbox_key, aggregate_id, expected_seq)
);
COMMENT ON TABLE mailbox._inbox_gap IS 'pg_mailbox: ordering gaps of a managed ordered inbox as of its last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_gap', '');

CREATE TABLE mailbox._inbox_gap_touched (
    inbox_key int NOT NULL,
    aggregate_ids text[],
    -- per aggregate of aggregate_ids, the lowest sequence an INSERT added (an appended run can
    -- be folded without re-reading the aggregate); NULL for UPDATE and DELETE
    min_seqs bigint[],
    -- the statement's change of the unprocessed and processed counts (NULL: count again)
    d_unprocessed bigint,
    d_processed bigint
);
COMMENT ON TABLE mailbox._inbox_gap_touched IS
'pg_mailbox: aggregates of managed ordered inboxes whose gaps changed since the last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_gap_touched', '');

-- Per aggregate with unprocessed messages above its position at the last fold, the highest
-- such sequence (an aggregate without a row had none): a later INSERT only above it appends.
CREATE TABLE mailbox._inbox_gap_head (
    inbox_key int NOT NULL,
    aggregate_id text NOT NULL,
    high_seq bigint NOT NULL,
    PRIMARY KEY (inbox_key, aggregate_id)
);
COMMENT ON TABLE mailbox._inbox_gap_head IS
'pg_mailbox: highest unprocessed sequence per aggregate of a managed ordered inbox as of its last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_gap_head', '');

-- The unprocessed and processed message counts of a managed ordered inbox as of its last fold
-- (inbox_health adds the deltas of the touched rows it sees).
CREATE TABLE mailbox._inbox_count (
    inbox_key int PRIMARY KEY,
    unprocessed bigint NOT NULL,
    processed bigint NOT NULL
);
COMMENT ON TABLE mailbox._inbox_count IS
'pg_mailbox: message counts of a managed ordered inbox as of its last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_count', '');

-- Issue 11: inbox workers waiting for a wake-up (part 33): receivers notify only while one is.
CREATE UNLOGGED TABLE mailbox._inbox_waiter (
    inbox_key int NOT NULL,
    -- one row per connection, not per worker name: several connections may claim under one
    -- name, and each writes only its own row, so no claimer ever waits for another's
    backend_pid int NOT NULL,
    worker text NOT NULL,
    waiting_until timestamptz NOT NULL,
    PRIMARY KEY (inbox_key, backend_pid)
);
COMMENT ON TABLE mailbox._inbox_waiter IS
'pg_mailbox: inbox workers waiting for a wake-up (their last claim was empty); receivers notify only while one is';
-- Issue 11: a bound on every wait, which a named receive reads before it looks for waiters.
CREATE SEQUENCE mailbox._inbox_waiting_until;
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int >= 150000 THEN
        ALTER SEQUENCE mailbox._inbox_waiting_until SET UNLOGGED;
    END IF;
END
$$;
COMMENT ON SEQUENCE mailbox._inbox_waiting_until IS
'pg_mailbox: seconds since the epoch until which some inbox worker may be waiting for a wake-up';

-- Issue 13: groups still draining their old layout after alter_outbox_partitions (part 28).
CREATE TABLE mailbox._partition_change (
    group_name text PRIMARY KEY REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    -- the count this group still uses, for the rows up to boundary
    partitions int NOT NULL CHECK (partitions BETWEEN 1 AND 256),
    boundary bigint NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE mailbox._partition_change IS
'pg_mailbox: groups still draining their old partition layout after alter_outbox_partitions';
SELECT pg_catalog.pg_extension_config_dump('mailbox._partition_change', '');

-- Functions 0.2.0 no longer has (issue 12: the inbox role registry, _check_user_table): the
-- re-created parts would leave them behind.
DROP FUNCTION mailbox._check_capturable(oid);
DROP FUNCTION mailbox._inbox_map_column(mailbox._inbox, text, text, text[]);
DROP FUNCTION mailbox._inbox_tracking_py(oid, jsonb, jsonb);

-- sql/functions/04_settings.sql
-- Part 04: the settings registry. Every mailbox.* GUC is one row of mailbox._settings():
-- its name, kind, default, bounds, area and meaning. The SQL readers below, the server-side
-- Python (mailbox_server/settings.py) and docs/configuration.md (which
-- tests/maintenance/test_settings.py checks lists exactly these rows) all take them from
-- here; no call site repeats a default or a bound.
--
-- Settings are custom GUCs: an unset GUC means the default; a value that does not parse or
-- is out of range is an error naming the GUC (22023), never a silent default.

CREATE OR REPLACE FUNCTION mailbox._settings()
RETURNS SETOF mailbox._setting
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
AS $$
    VALUES
    ('outbox_inline_threshold_rows', 'int', '10000', 0::bigint, 2147483647::bigint, 'outbox',
     'a captured statement changing at most this many rows is written inline; above it, claim-check'),
    ('outbox_skip_empty_delta', 'bool', 'on', NULL, NULL, 'outbox',
     'a captured statement that changes no rows writes nothing'),
    ('outbox_notify', 'bool', 'on', NULL, NULL, 'outbox',
     'NOTIFY mailbox_outbox_new when a consumer of the outbox waits'),
    ('outbox_chunk_rows', 'int', '1000', 1, 1000000, 'outbox',
     'how many rows one offset chunk numbers at most'),
    ('outbox_storage_critical_mb', 'int', '1024', 1, 2147483647, 'outbox',
     'storage_status is critical at this size, warning from 80%'),
    ('outbox_force_retention', 'bool', 'off', NULL, NULL, 'outbox',
     'drain by age alone, ignoring group offsets and claim-check reads'),
    ('outbox_drain_batch_size', 'int', '10000', 1, 10000000, 'outbox',
     'rows per retention batch'),
    ('maintenance_max_batches', 'int', '100', 1, 100000, 'outbox',
     'retention batches per outbox per run'),
    ('consumer_heartbeat_timeout_seconds', 'int', '60', 1, 86400000, 'groups',
     'a consumer is healthy while its last heartbeat is younger'),
    ('consumer_dead_threshold_hours', 'int', '24', 1, 87600, 'groups',
     'maintenance reaps a consumer silent this long and releases its leases'),
    ('consumer_stale_offset_threshold_days', 'int', '7', 1, 36500, 'groups',
     'maintenance forgets a consumer without commits (and silent) this long'),
    ('consumer_slot_rows', 'int', '1', 1, 100000, 'groups',
     'rows per slot the numberer hands to each group'),
    ('alert_retention_hours', 'int', '168', 1, 876000, 'alerts',
     'maintenance deletes older mailbox.alert_log rows'),
    ('inbox_retry_delay_seconds', 'int', '0', 0, 31536000, 'inbox',
     'delay before a failed message is claimable again when p_retry_after_seconds is NULL'),
    ('inbox_degraded_age_seconds', 'int', '60', 1, 31536000, 'inbox',
     'pending age from which health is degraded'),
    ('inbox_critical_age_seconds', 'int', '300', 1, 31536000, 'inbox',
     'pending age from which health is critical'),
    ('inbox_critical_dlq_count', 'int', '100', 1, 2147483647, 'inbox',
     'dead letters from which health is critical'),
    ('inbox_processed_retention_hours', 'int', '72', 0, 876000, 'inbox',
     'processed-row retention of adopted inboxes'),
    ('inbox_dlq_retention_hours', 'int', '0', 0, 876000, 'inbox',
     'dead-letter retention; 0 keeps them forever'),
    ('inbox_drain_batch_size', 'int', '10000', 1, 1000000, 'inbox',
     'rows per inbox and kind deleted per maintenance pass'),
    ('inbox_dlq_alert_max_per_run', 'int', '10', 0, 10000, 'inbox',
     'inbox_dlq_message alerts per pass before the inbox_dlq_batch summary'),
    ('inbox_gap_alert_seconds', 'int', '60', 0, 31536000, 'inbox',
     'age a gap must reach before inbox_ordering_gap')
$$;

-- A name missing from the registry (or read as the wrong kind) is a bug in pg_mailbox, not
-- user input: an internal error, raised off the parsers' fast path.
CREATE OR REPLACE FUNCTION mailbox._setting_missing(p_name text, p_kind text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'pg_mailbox has no %setting mailbox.%', coalesce(p_kind || ' ', ''), p_name
        USING ERRCODE = 'XX000',
              HINT = 'This is a bug in pg_mailbox: every setting it reads is a row of mailbox._settings().';
END
$$;

-- The parsers look their setting up in the registry with one inlined scan of its VALUES
-- (about 1 us).
CREATE OR REPLACE FUNCTION mailbox._setting_int(p_name text)
RETURNS int
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_raw text := pg_catalog.current_setting('mailbox.' || p_name, true);
    v_def mailbox._setting;
    v_value bigint;
BEGIN
    SELECT * INTO v_def FROM mailbox._settings() AS s WHERE s.name = p_name AND s.kind = 'int';
    IF NOT FOUND THEN
        PERFORM mailbox._setting_missing(p_name, 'int');
    END IF;
    IF v_raw IS NULL OR v_raw = '' THEN
        RETURN v_def.default_value::int;
    END IF;
    IF v_raw ~ '^\s*-?[0-9]{1,18}\s*$' THEN
        v_value := v_raw::bigint;
        IF v_value BETWEEN v_def.min_value AND v_def.max_value THEN
            RETURN v_value::int;
        END IF;
    END IF;
    RAISE EXCEPTION 'invalid value for setting mailbox.%: %', p_name, pg_catalog.quote_literal(v_raw)
        USING ERRCODE = '22023',
              HINT = pg_catalog.format('mailbox.%s takes an integer from %s to %s (default %s).',
                                       p_name, v_def.min_value, v_def.max_value, v_def.default_value);
END
$$;

CREATE OR REPLACE FUNCTION mailbox._setting_bool(p_name text)
RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_raw text := pg_catalog.lower(pg_catalog.btrim(pg_catalog.current_setting('mailbox.' || p_name, true)));
    v_default text;
BEGIN
    SELECT s.default_value INTO v_default FROM mailbox._settings() AS s WHERE s.name = p_name AND s.kind = 'bool';
    IF NOT FOUND THEN
        PERFORM mailbox._setting_missing(p_name, 'bool');
    END IF;
    IF v_raw IS NULL OR v_raw = '' THEN
        RETURN v_default::boolean;
    ELSIF v_raw IN ('on', 'true', 'yes', '1', 't', 'y') THEN
        RETURN true;
    ELSIF v_raw IN ('off', 'false', 'no', '0', 'f', 'n') THEN
        RETURN false;
    END IF;
    RAISE EXCEPTION 'invalid value for setting mailbox.%: %', p_name, pg_catalog.quote_literal(v_raw)
        USING ERRCODE = '22023',
              HINT = pg_catalog.format('mailbox.%s takes on or off (default %s).', p_name, v_default);
END
$$;

-- The default of a setting as SQL text, for code generated with the default written in (a
-- captured table's trigger reads the GUC only when it is set).
CREATE OR REPLACE FUNCTION mailbox._setting_default(p_name text)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_default text;
BEGIN
    SELECT s.default_value INTO v_default FROM mailbox._settings() AS s WHERE s.name = p_name;
    IF NOT FOUND THEN
        PERFORM mailbox._setting_missing(p_name, NULL);
    END IF;
    RETURN v_default;
END
$$;

-- sql/functions/05_util.sql
-- Part 05: validation and alert helpers shared by every other part (settings: part 04).

-- Names become parts of identifiers (outbox_<N>, pending_<I>_<tier>), so they are checked
-- before any DDL runs; 40 bytes keeps every derived name under NAMEDATALEN.
CREATE OR REPLACE FUNCTION mailbox._check_name(p_kind text, p_name text, p_max_bytes int DEFAULT 40)
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
CREATE OR REPLACE FUNCTION mailbox._check_id(p_kind text, p_value text)
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
CREATE OR REPLACE FUNCTION mailbox._require(p_value anyelement, p_param text)
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

CREATE OR REPLACE FUNCTION mailbox._alert(p_event text, p_detail jsonb DEFAULT '{}')
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
CREATE OR REPLACE FUNCTION mailbox._ddl_lock()
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(7168632, 1);
$$;

-- The extension's owner: the superuser that created it (or restored it, pg_dump's CREATE
-- EXTENSION names no owner), whose SECURITY DEFINER functions the API runs as.
CREATE OR REPLACE FUNCTION mailbox._extension_owner()
RETURNS oid
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox';
$$;

-- The DDL lock without waiting: false while some pg_mailbox DDL runs (maintenance then leaves
-- what needs it for its next pass).
CREATE OR REPLACE FUNCTION mailbox._try_ddl_lock()
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_try_advisory_xact_lock(7168632, 1);
$$;

-- One maintenance pass at a time: false (and no wait) while another pass runs.
CREATE OR REPLACE FUNCTION mailbox._try_maintenance_lock()
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_try_advisory_xact_lock(7168632, 2);
$$;

CREATE OR REPLACE FUNCTION mailbox._owner_code_begin()
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    INSERT INTO mailbox._owner_code_running (backend_pid, xact_start)
    VALUES (pg_catalog.pg_backend_pid(), pg_catalog.now())
    ON CONFLICT DO NOTHING;
$$;

CREATE OR REPLACE FUNCTION mailbox._owner_code_end()
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
CREATE OR REPLACE FUNCTION mailbox._caller()
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
CREATE OR REPLACE FUNCTION mailbox._check_user_table(p_rel oid, p_use text)
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
CREATE OR REPLACE FUNCTION mailbox._check_table_privilege(p_rel oid, p_privileges text, p_action text)
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
CREATE OR REPLACE FUNCTION mailbox._retention_lock(p_outbox_key int)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(7168633, p_outbox_key);
$$;

-- sql/functions/08_python.sql
-- Part 08: how PL/Python finds the mailbox_server package.
--
-- `make install` copies plpython/mailbox_server to
-- $SHAREDIR/extension/pg_mailbox/python/<version>/. Every PL/Python function starts with
--     if GD.get("mailbox.version") != "<version>": plpy.execute("SELECT mailbox._python_load()")
-- with <version> baked into its body by this script. After ALTER EXTENSION UPDATE the new
-- bodies carry the new version, so a pooled session that imported the old package reloads
-- the new one on its next call instead of running stale code (see docs/design.md).

CREATE OR REPLACE FUNCTION mailbox._python_load()
RETURNS text
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
-- definer: reading pg_config (SHAREDIR) is reserved to superusers
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
import sys

version = "0.2.0"
marker = "/extension/pg_mailbox/python/"
rows = plpy.execute("SELECT setting FROM pg_catalog.pg_config WHERE name = 'SHAREDIR'")
path = rows[0]["setting"] + marker + version

stale = [m for m in sys.modules if m == "mailbox_server" or m.startswith("mailbox_server.")]
for name in stale:
    del sys.modules[name]
sys.path[:] = [p for p in sys.path if marker not in p]
sys.path.insert(0, path)
try:
    import mailbox_server
except ImportError as exc:
    plpy.error(
        "pg_mailbox python package not found: " + path,
        detail=str(exc),
        hint="Run make install (or pgxn install pg_mailbox) for version " + version + ".",
        sqlstate="58P01",
    )
if mailbox_server.__version__ != version:
    plpy.error(
        "pg_mailbox python package version mismatch: " + mailbox_server.__version__,
        detail="The SQL objects are version " + version + ".",
        hint="Reinstall the extension files for version " + version + ".",
        sqlstate="55000",
    )
GD["mailbox.version"] = version
return path
$$;

-- Raises the error of a control-plane envelope (see mailbox_server/errors.py) with its own
-- SQLSTATE, DETAIL and HINT, or returns its result.
CREATE OR REPLACE FUNCTION mailbox._unwrap(p_envelope jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_error jsonb := p_envelope -> 'error';
    v_state text := v_error ->> 'sqlstate';
    v_message text := v_error ->> 'message';
    v_detail text := v_error ->> 'detail';
    v_hint text := v_error ->> 'hint';
BEGIN
    IF v_state IS NULL THEN
        RETURN p_envelope -> 'result';
    END IF;
    -- RAISE rejects NULL options, so only the fields that are set are passed
    IF v_detail IS NULL AND v_hint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message;
    ELSIF v_detail IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, HINT = v_hint;
    ELSIF v_hint IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, DETAIL = v_detail;
    END IF;
    RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_message, DETAIL = v_detail, HINT = v_hint;
END
$$;

-- sql/functions/10_outbox_tables.sql
-- Part 10: the outbox catalog and the log every outbox lives in.
--
-- All outboxes share one LIST-partitioned parent, mailbox._outbox_log; outbox N is its
-- partition mailbox.outbox_<N>. Producers and capture triggers therefore insert with static
-- SQL (cached plans, no per-call dynamic SQL on the hot path) and tuple routing puts the row
-- in outbox_<N>. See docs/design.md for the offset (sequencer) design.
--
-- Backups (docs/backup.md): every table and sequence here that holds state is registered
-- with pg_extension_config_dump, so pg_dump saves its rows, which a restore loads after
-- CREATE EXTENSION ran. The partitions, made at run time, are not extension members:
-- pg_dump saves them as ordinary tables and attaches them to the parents the extension
-- script made. So the parents carry no index: pg_dump restores a partition's index after
-- attaching it, and attaching under an indexed parent would already have made one (restore
-- error "multiple primary keys"). Each partition has its own primary key and index instead
-- (made by _create_outbox_objects); every query names the outbox, so it reads one partition.

-- An outbox's catalog row by name: the one place that raises 22004 / 42704 for an outbox
-- name, as mailbox._inbox_get (part 30) is for an inbox.
CREATE OR REPLACE FUNCTION mailbox._outbox_get(p_outbox text)
RETURNS mailbox._outbox
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_outbox mailbox._outbox;
BEGIN
    IF p_outbox IS NULL THEN
        RAISE EXCEPTION 'outbox name must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the name of an outbox (see mailbox.outboxes).';
    END IF;
    SELECT o.* INTO v_outbox FROM mailbox._outbox AS o WHERE o.outbox_name = p_outbox;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox not found: %', p_outbox
            USING ERRCODE = '42704',
                  HINT = 'Create it with mailbox.create_outbox() or mailbox.enable_outbox(); mailbox.outboxes lists them.';
    END IF;
    RETURN v_outbox;
END
$$;

-- Its key, for the many callers that need only that.
CREATE OR REPLACE FUNCTION mailbox._outbox_key(p_outbox text)
RETURNS int
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT (mailbox._outbox_get(p_outbox)).outbox_key;
$$;

-- The names of an outbox's relations in schema mailbox, one home for them: 'log' its partition
-- of the shared log (where rows live), 'delta' its claim-check rows, 'view' mailbox.outbox_<N>
-- (the rows with their offsets, SPEC §1.3), 'latest' its latest-row view.
CREATE OR REPLACE FUNCTION mailbox._outbox_relname(p_name text, p_kind text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE p_kind
               WHEN 'log' THEN '_outbox_log_' || p_name
               WHEN 'delta' THEN 'outbox_delta_rows_' || p_name
               WHEN 'view' THEN 'outbox_' || p_name
               WHEN 'latest' THEN 'outbox_latest_' || p_name
           END;
$$;

-- Bytes an outbox takes on disk: its rows and claim-check rows, with their indexes and TOAST.
CREATE OR REPLACE FUNCTION mailbox._outbox_bytes(p_name text)
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce(pg_catalog.pg_total_relation_size(
               pg_catalog.to_regclass(pg_catalog.format('mailbox.%I', mailbox._outbox_relname(p_name, 'log')))), 0)
         + coalesce(pg_catalog.pg_total_relation_size(
               pg_catalog.to_regclass(pg_catalog.format('mailbox.%I', mailbox._outbox_relname(p_name, 'delta')))), 0);
$$;

-- Restoring a dump (docs/backup.md). Transaction ids are the cluster's: an outbox restored
-- from pg_dump carries ids of the cluster it was dumped from, in its log rows (_xid) and in
-- its sequencer snapshots, and the new cluster's ids may be behind, ahead of or among them.
-- Read as ids of the new cluster they would leave new rows without an offset (below the old
-- snapshot) or number old rows twice. So a restored catalog row is marked (seq_snapshot
-- 2:2:, which no real snapshot is: the first normal xid is 3) by the trigger below, and the
-- first sequencer run on it calls _rebase_restored_outbox. The trigger marks every row
-- inserted; _create_outbox_objects, the only other writer of new rows, then sets the initial
-- state of a new outbox.
CREATE OR REPLACE FUNCTION mailbox._outbox_mark_restored()
RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    NEW.seq_snapshot := '2:2:';
    NEW.win_snapshot := NULL;
    NEW.win_xid := NULL;
    NEW.win_id := NULL;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER mailbox_outbox_restored BEFORE INSERT ON mailbox._outbox
FOR EACH ROW EXECUTE FUNCTION mailbox._outbox_mark_restored();

-- Called by _sequence_outbox, under the catalog row's lock, for a restored outbox. Every row
-- visible now without an offset (the restored rows, and rows committed since the restore)
-- gets the next offsets in row-key (insertion) order; every numbered row whose _xid could
-- fall into a later window gets _xid 2 (frozen: below every snapshot's xmin, never in its
-- xip), so no window takes it again; and the sequencer goes on from a snapshot taken before
-- all that, so the rows it did not see (of transactions still running, this one's own
-- included) are numbered as usual once they commit. Returns how many rows it numbered.
CREATE OR REPLACE FUNCTION mailbox._rebase_restored_outbox(p_key int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_me xid8 := pg_catalog.pg_current_xact_id();
    v_snap pg_snapshot := pg_catalog.pg_current_snapshot();
    v_chunk int := mailbox._setting_int('outbox_chunk_rows');
    v_head bigint;
    v_ids bigint[];
    v_part bigint[];
    v_n int;
BEGIN
    -- as in _sequence_outbox: this transaction counts as running (its rows come later)
    IF pg_catalog.pg_visible_in_snapshot(v_me, v_snap) THEN
        v_snap := mailbox._snapshot_with(v_snap, v_me);
    END IF;
    SELECT o.head_offset INTO v_head FROM mailbox._outbox AS o WHERE o.outbox_key = p_key;
    v_ids := ARRAY(
        SELECT l._id
          FROM mailbox._outbox_log AS l
          LEFT JOIN (SELECT u.id FROM mailbox._outbox_chunk AS c
                      CROSS JOIN LATERAL pg_catalog.unnest(c.ids) AS u (id)
                      WHERE c.outbox_key = p_key) AS n ON n.id = l._id
         WHERE l.outbox_key = p_key AND n.id IS NULL AND l._xid <> v_me
         ORDER BY l._id
    );
    FOR v_i IN 1 .. coalesce(pg_catalog.cardinality(v_ids), 0) BY v_chunk LOOP
        v_part := v_ids[v_i:v_i + v_chunk - 1];
        v_n := pg_catalog.cardinality(v_part);
        INSERT INTO mailbox._outbox_chunk (outbox_key, base_offset, row_count, ids, dense, first_id)
        VALUES (p_key, v_head, v_n, v_part, v_part[v_n] - v_part[1] = v_n - 1, v_part[1]);
        v_head := v_head + v_n;
    END LOOP;
    UPDATE mailbox._outbox_log AS l
       SET _xid = '2'
     WHERE l.outbox_key = p_key AND l._xid >= pg_catalog.pg_snapshot_xmin(v_snap)
       AND l._id IN (SELECT u.id FROM mailbox._outbox_chunk AS c
                      CROSS JOIN LATERAL pg_catalog.unnest(c.ids) AS u (id)
                      WHERE c.outbox_key = p_key);
    UPDATE mailbox._outbox
       SET head_offset = v_head, seq_snapshot = v_snap, win_snapshot = NULL, win_xid = NULL, win_id = NULL
     WHERE outbox_key = p_key;
    RETURN coalesce(pg_catalog.cardinality(v_ids), 0);
END
$$;

-- sql/functions/12_outbox_ddl.sql
-- Part 12: creating and removing outboxes.

-- Creates the catalog row, the two partitions and the latest-row view of one outbox.
-- Partitions are created standalone and then ATTACHed: ATTACH takes SHARE UPDATE EXCLUSIVE
-- on the shared parent, so creating an outbox neither blocks producers of other outboxes nor
-- queues behind their open transactions (CREATE TABLE ... PARTITION OF would take ACCESS
-- EXCLUSIVE on the parent).
CREATE OR REPLACE FUNCTION mailbox._create_outbox_objects(
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

CREATE OR REPLACE FUNCTION mailbox.create_outbox(
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
CREATE OR REPLACE FUNCTION mailbox._derive_outbox_name(p_schema text, p_table text)
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

CREATE OR REPLACE FUNCTION mailbox._enable_outbox(
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
CREATE OR REPLACE FUNCTION mailbox.enable_outbox(
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
CREATE OR REPLACE FUNCTION mailbox._lock_shared_log()
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

CREATE OR REPLACE FUNCTION mailbox.disable_outbox(p_name text, p_if_exists boolean DEFAULT FALSE)
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

CREATE OR REPLACE FUNCTION mailbox.drop_outbox(p_name text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox.disable_outbox(p_name, p_if_exists);
$$;
COMMENT ON FUNCTION mailbox.drop_outbox(text, boolean) IS 'alias of mailbox.disable_outbox()';

-- sql/functions/13_outbox_capture_code.sql
-- Part 13: the code of a captured table's trigger function (installed by part 14).

-- Capture runs code its table's owner controls: to_jsonb calls the casts to json of the
-- columns' types, and the transition tables hold whatever the owner's defaults, triggers and
-- domains made. So the trigger function of a captured table is generated per outbox, OWNED BY
-- THE TABLE'S OWNER and SECURITY DEFINER: any role allowed to write the table produces outbox
-- rows, and everything that runs inside runs with the table owner's rights, never the
-- extension owner's (docs/security.md, "Whose rights run what"). The table owner gets exactly
-- what this function needs: INSERT on its own outbox's two partitions (the columns a capture
-- writes; _id, _xid, event_id and created_at always come from their defaults), SELECT on _id
-- (RETURNING), USAGE on the row sequence, EXECUTE on the setting parsers and the registry they
-- read (part 04) and SELECT of who is waiting for a wake-up (part 17: outbox keys and times
-- only). Writing its own outbox directly is no more than the owner can do by writing its own
-- table.
--
-- The function body is static SQL with the outbox's partitions written in, so PL/pgSQL caches
-- its plans, and it reads no catalog beyond one check that the table still has the owner the
-- function runs as (an ALTER TABLE ... OWNER TO would otherwise leave the new owner's casts
-- running with the old owner's rights; mailbox.repair_outbox_capture() re-owns it).
CREATE OR REPLACE FUNCTION mailbox._capture_function_sql(p_key int, p_name text, p_threshold int)
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
    v_ok boolean;
    v_ins bigint := 0;
    v_del bigint := 0;
    v_threshold int := %4$s;
    v_row bigint;
    v_waiting boolean;
BEGIN
    -- The producer's hot path: one statement checks and counts, one writes the row (with its
    -- JSON built in the INSERT and the wake-up check in its RETURNING): every statement a
    -- trigger runs costs an executor start-up, which is most of what capture costs.
    -- The check comes first, in a statement of its own: the row serialisation below runs the
    -- owner's casts, which must not run for a table this function no longer belongs to.
    -- Operators spelled out: the owner may ALTER this function's search_path (it runs as the
    -- owner then, but this check must mean what it says whoever it runs as); and it holds the
    -- grants capture gave it (REASSIGN OWNED moves the function too).
    IF TG_OP = 'INSERT' THEN
        SELECT %6$s, (SELECT pg_catalog.count(*) FROM mailbox_new_rows) INTO v_ok, v_ins
          FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID;
    ELSIF TG_OP = 'UPDATE' THEN
        SELECT %6$s, (SELECT pg_catalog.count(*) FROM mailbox_new_rows) INTO v_ok, v_ins
          FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID;
        v_del := v_ins;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT %6$s, (SELECT pg_catalog.count(*) FROM mailbox_old_rows) INTO v_ok, v_del
          FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID;
    ELSE
        SELECT %6$s INTO v_ok FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID;
    END IF;
    IF v_ok IS NOT TRUE THEN
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
                                              'inserted', '[]'::jsonb, 'deleted', '[]'::jsonb),
                true)
        RETURNING %7$s
        INTO v_waiting;
    ELSE
        IF v_ins + v_del = 0
           AND mailbox._setting_bool('outbox_skip_empty_delta') THEN
            RETURN NULL;
        END IF;
        IF v_threshold IS NULL THEN
            v_threshold := CASE WHEN pg_catalog.current_setting('mailbox.outbox_inline_threshold_rows', true) IS NULL
                                THEN %8$s
                                ELSE mailbox._setting_int('outbox_inline_threshold_rows') END;
        END IF;
        IF v_ins + v_del > v_threshold THEN
            INSERT INTO mailbox.%2$I
                (outbox_key, source, event_type, payload, inserted_count, deleted_count, is_claim_check)
            VALUES (%1$s, v_source, TG_OP,
                    pg_catalog.jsonb_build_object('v', 1, 'claim_check', true, 'source', v_source, 'op', TG_OP,
                                                  'inserted_count', v_ins, 'deleted_count', v_del),
                    v_ins, v_del, true)
            RETURNING _id, %7$s
            INTO v_row, v_waiting;
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
        ELSIF TG_OP = 'INSERT' THEN
            INSERT INTO mailbox.%2$I (outbox_key, source, event_type, payload, inserted_count, deleted_count)
            VALUES (%1$s, v_source, TG_OP,
                    pg_catalog.jsonb_build_object(
                        'v', 1, 'source', v_source, 'op', TG_OP,
                        'inserted', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r))
                                                FROM mailbox_new_rows AS r), '[]'::jsonb),
                        'deleted', '[]'::jsonb),
                    v_ins, v_del)
            RETURNING %7$s
            INTO v_waiting;
        ELSIF TG_OP = 'DELETE' THEN
            INSERT INTO mailbox.%2$I (outbox_key, source, event_type, payload, inserted_count, deleted_count)
            VALUES (%1$s, v_source, TG_OP,
                    pg_catalog.jsonb_build_object(
                        'v', 1, 'source', v_source, 'op', TG_OP, 'inserted', '[]'::jsonb,
                        'deleted', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r))
                                               FROM mailbox_old_rows AS r), '[]'::jsonb)),
                    v_ins, v_del)
            RETURNING %7$s
            INTO v_waiting;
        ELSE
            INSERT INTO mailbox.%2$I (outbox_key, source, event_type, payload, inserted_count, deleted_count)
            VALUES (%1$s, v_source, TG_OP,
                    pg_catalog.jsonb_build_object(
                        'v', 1, 'source', v_source, 'op', TG_OP,
                        'inserted', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r))
                                                FROM mailbox_new_rows AS r), '[]'::jsonb),
                        'deleted', coalesce((SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(r))
                                               FROM mailbox_old_rows AS r), '[]'::jsonb)),
                    v_ins, v_del)
            RETURNING %7$s
            INTO v_waiting;
        END IF;
    END IF;
    -- wake a waiting consumer (part 17); the setting is read only then (a bad value raises)
    IF v_waiting AND mailbox._setting_bool('outbox_notify') THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', %3$s);
    END IF;
    RETURN NULL;
END
$body$,
        p_key, mailbox._outbox_relname(p_name, 'log'), pg_catalog.quote_literal(p_name),
        coalesce(p_threshold::text, 'NULL'), mailbox._outbox_relname(p_name, 'delta'),
        -- the owner and grant check, the same in each of the four statements above
        'pg_catalog.pg_get_userbyid(c.relowner) OPERATOR(pg_catalog.=) current_user'
        || ' AND pg_catalog.has_schema_privilege(''mailbox'', ''USAGE'')'
        || ' AND pg_catalog.has_any_column_privilege('
        || pg_catalog.quote_literal('mailbox.' || pg_catalog.quote_ident(mailbox._outbox_relname(p_name, 'log')))
        || ', ''INSERT'')',
        -- whether a consumer waits for a wake-up (part 17), read in each INSERT's RETURNING
        pg_catalog.format('EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w WHERE w.outbox_key = %s'
                          ' AND w.waiting_until > pg_catalog.now())', p_key),
        -- the default inline threshold, from the settings registry (part 04)
        mailbox._setting_default('outbox_inline_threshold_rows'));
END
$gen$;

-- sql/functions/14_outbox_capture.sql
-- Part 14: statement-level capture of a table into its outbox: installing, repairing and
-- removing each captured table's trigger function (its code: part 13). Each function is
-- static SQL for its own outbox, so PL/pgSQL caches its plans, and only the branch for TG_OP
-- ever runs.

CREATE OR REPLACE FUNCTION mailbox._notify_outbox(p_name text)
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
CREATE OR REPLACE FUNCTION mailbox._owner_function(p_key int, p_kind text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('mailbox.%I', '_outbox_' || p_key || '_' || p_kind);
$$;

-- (Re)creates outbox p_key's capture function for the current owner of its table, grants that
-- owner what the function needs, and (re)installs the four statement triggers.
CREATE OR REPLACE FUNCTION mailbox._install_capture(p_key int)
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
CREATE OR REPLACE FUNCTION mailbox._remove_capture(p_key int)
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
CREATE OR REPLACE FUNCTION mailbox.repair_outbox_capture(p_name text)
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
CREATE OR REPLACE FUNCTION mailbox._alert_full_refresh()
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
CREATE OR REPLACE TRIGGER mailbox_full_refresh_alert AFTER INSERT ON mailbox._outbox_log
FOR EACH ROW WHEN (new.full_refresh AND new.event_type = 'TRUNCATE') EXECUTE FUNCTION mailbox._alert_full_refresh();

-- sql/functions/15_outbox_snapshot.sql
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
CREATE OR REPLACE FUNCTION mailbox._rows_function_sql()
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

CREATE OR REPLACE FUNCTION mailbox.outbox_snapshot(p_name text)
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
CREATE OR REPLACE FUNCTION mailbox._snapshot_page(p_key int, p_row bigint, p_after bigint, p_rows jsonb[])
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    INSERT INTO mailbox._outbox_delta_rows (outbox_key, row_key, row_num, op, payload)
    SELECT p_key, p_row, p_after + u.n, 'I', u.value
      FROM pg_catalog.unnest(p_rows) WITH ORDINALITY AS u (value, n);
$$;

-- sql/functions/16_outbox_publish.sql
-- Part 16: publishing events. Runs in the caller's transaction, so the event exists if and
-- only if the caller's business writes commit.

CREATE OR REPLACE FUNCTION mailbox._check_headers(p_headers jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_headers IS NULL THEN
        RETURN '{}';
    END IF;
    IF pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION 'invalid headers: expected a JSON object, got %', pg_catalog.jsonb_typeof(p_headers)
            USING ERRCODE = '22023', HINT = 'Pass headers as a JSON object, for example ''{"trace_id": "abc"}''.';
    END IF;
    RETURN p_headers;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.outbox_publish(
    p_outbox text,
    p_payload jsonb,
    p_headers jsonb DEFAULT '{}',
    p_key text DEFAULT NULL,
    p_event_type text DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- producers write the outbox only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_granted boolean;
    v_event uuid;
    v_waiting boolean;
BEGIN
    -- The producer's hot path: two statements (every statement costs an executor start-up,
    -- most of what a publish costs) and no nested helper calls (each one with its own SET
    -- clause costs more than the insert); the helpers run only to raise their errors.
    -- An outbox without grants is open to mailbox_producer.
    SELECT o.outbox_key,
           EXISTS (SELECT 1 FROM mailbox._object_grant AS x
                    WHERE x.object_kind = 'outbox' AND x.object_key = o.outbox_key)
      INTO v_key, v_granted
      FROM mailbox._outbox AS o WHERE o.outbox_name = p_outbox;
    IF NOT FOUND THEN
        v_key := mailbox._outbox_key(p_outbox);
    END IF;
    IF v_granted THEN
        PERFORM mailbox._authorize('outbox', v_key, 'publish');
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'payload must not be null (outbox %)', p_outbox
            USING ERRCODE = '22004', HINT = 'Pass a JSON value; use ''{}'' for an event without data.';
    END IF;
    IF p_headers IS NULL OR pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
        p_headers := mailbox._check_headers(p_headers);
    END IF;
    INSERT INTO mailbox._outbox_log (outbox_key, event_type, key, headers, payload)
    VALUES (v_key, p_event_type, p_key, p_headers, p_payload)
    RETURNING event_id,
              EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w
                       WHERE w.outbox_key = v_key AND w.waiting_until > pg_catalog.now())
      INTO v_event, v_waiting;
    -- wake a waiting consumer (part 17); the setting is read only then (a bad value raises)
    IF v_waiting AND mailbox._setting_bool('outbox_notify') THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', p_outbox);
    END IF;
    RETURN v_event;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_publish(text, jsonb, jsonb, text, text) IS
'publish one event to an outbox in the caller''s transaction; returns its event_id';

CREATE OR REPLACE FUNCTION mailbox.outbox_publish_batch(
    p_outbox text,
    p_payloads jsonb[],
    p_headers jsonb DEFAULT '{}',
    p_key text DEFAULT NULL,
    p_event_type text DEFAULT NULL
)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- producers write the outbox only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := mailbox._outbox_key(p_outbox);
    v_headers jsonb := mailbox._check_headers(p_headers);
    v_null_at int;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'publish');
    PERFORM mailbox._require(p_payloads, 'p_payloads');
    SELECT pg_catalog.min(u.i) INTO v_null_at
      FROM pg_catalog.unnest(p_payloads) WITH ORDINALITY AS u (payload, i) WHERE u.payload IS NULL;
    IF v_null_at IS NOT NULL THEN
        RAISE EXCEPTION 'payload must not be null (outbox %, element %)', p_outbox, v_null_at
            USING ERRCODE = '22004', HINT = 'Every element of p_payloads must be a JSON value.';
    END IF;
    IF pg_catalog.cardinality(p_payloads) = 0 THEN
        RETURN;
    END IF;
    -- event ids come back in array order: _id follows the ORDER BY of the inserting SELECT
    RETURN QUERY
    WITH ins AS (
        INSERT INTO mailbox._outbox_log (outbox_key, event_type, key, headers, payload)
        SELECT v_key, p_event_type, p_key, v_headers, u.payload
          FROM pg_catalog.unnest(p_payloads) WITH ORDINALITY AS u (payload, i)
         ORDER BY u.i
        RETURNING _id, event_id
    )
    SELECT ins.event_id FROM ins ORDER BY ins._id;
    PERFORM mailbox._notify_outbox(p_outbox);
END
$$;
COMMENT ON FUNCTION mailbox.outbox_publish_batch(text, jsonb[], jsonb, text, text) IS
'publish several events to an outbox in one statement; returns their event_ids in array order';

-- sql/functions/17_outbox_wakeup.sql
-- Part 17: wake-ups that cost producers almost nothing (issue 8).
--
-- NOTIFY is cheap to send but expensive to commit: PostgreSQL serialises the commits of all
-- notifying transactions of a database on one lock held through the commit's WAL flush, so
-- producers that notify lose group commit and run at about 0.4x of a bare INSERT. A wake-up
-- is only useful to a consumer that is actually waiting, so producers notify only then:
--
--   * a poll that returns no rows records its consumer as waiting on the outbox (a row here,
--     expiring after mailbox.consumer_heartbeat_timeout_seconds, at most 60 s, unless the
--     consumer polls again); a poll that returns rows removes it, and so do dropping its
--     group or outbox: a busy or gone consumer needs no wake-up;
--   * a producer (outbox_publish, outbox_publish_batch, capture, snapshots) sends
--     NOTIFY mailbox_outbox_new only while some consumer of the outbox is waiting.
--
-- Under load consumers are busy and no producer notifies; an idle consumer is woken by the
-- first commit after it went idle, in about a millisecond. One race remains: producers look
-- for waiters when they write, not when they commit, so a producer that wrote before a
-- consumer's empty poll committed and commits after that poll read does not notify. The
-- relay (and docs/consumer-groups.md's loop) polls once more a few milliseconds after an
-- empty poll, which catches the usual short producer transaction; a producer transaction
-- that runs on longer is caught by the consumer's poll interval. Rows are never lost, only
-- delivered up to one poll interval later.
-- The table is UNLOGGED: it is soft state, rebuilt by the next empty poll after a crash.

-- Whether a producer of outbox p_key should notify. Inlined by the hot paths; this helper is
-- for the rest (snapshots, publish_batch).
CREATE OR REPLACE FUNCTION mailbox._outbox_has_waiter(p_key int)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w
                    WHERE w.outbox_key = p_key AND w.waiting_until > pg_catalog.now());
$$;

-- Maintenance forgets waits that expired (a consumer that stopped polling, or one whose id
-- changes with every restart), so the producers' check stays one short index range.
CREATE OR REPLACE FUNCTION mailbox._forget_expired_waiters()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    -- (a row a consumer's open transaction is rewriting is its own again: skipped, never
    -- waited for)
    WITH gone AS (
        DELETE FROM mailbox._outbox_waiter AS w
         WHERE w.ctid = ANY (ARRAY(SELECT x.ctid FROM mailbox._outbox_waiter AS x
                                    WHERE x.waiting_until <= pg_catalog.now() FOR UPDATE SKIP LOCKED))
           AND w.waiting_until <= pg_catalog.now()
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- sql/functions/18_outbox_sequencer.sql
-- Part 18: offsets (the sequencer).

-- The sequencer: gives committed rows that have no offset yet the next offsets and returns
-- how many it numbered (at most about p_limit).
--
-- Rows carry their producer's top-level xid (_xid). seq_snapshot S_prev is a snapshot every
-- visible row of which already has an offset. A window snapshot S_cur (taken now) adds the
-- rows visible in S_cur but not in S_prev: those of transactions in progress at S_prev
-- (xip(S_prev)) plus those with xmax(S_prev) <= _xid < xmax(S_cur), each only if visible in
-- S_cur -- two index range scans, however long an unrelated transaction stays open.
-- A window is numbered in chunks of at most mailbox.outbox_chunk_rows, in (_xid, _id) order.
--
-- Hence offsets follow visibility: a transaction that commits late simply lands in a later
-- window, nothing is skipped, and offsets are gapless (head_offset - group_offset = lag).
-- One sequencer per outbox runs at a time (the catalog row lock); a caller that finds it busy
-- returns 0 at once and reads what the other one numbered. pg_current_snapshot() is the active
-- snapshot: in READ COMMITTED the window query's later snapshot sees all S_cur saw; in
-- REPEATABLE READ it is the same snapshot, and a sequencer that committed since then makes the
-- row lock below fail with 40001 instead of numbering from an older S_cur than S_prev.
-- A snapshot that also counts p_xid as in progress. pg_current_snapshot() leaves the calling
-- transaction out of xip: once a later transaction has completed, the caller's own running xid
-- is below xmax and so looks visible. A window taken by a transaction that writes outbox rows
-- (publish, then poll, then publish again) must count it as running, or its rows written after
-- the window would fall below the next one and never get an offset.
CREATE OR REPLACE FUNCTION mailbox._snapshot_with(p_snapshot pg_snapshot, p_xid xid8)
RETURNS pg_snapshot
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('%s:%s:%s',
               least(pg_catalog.pg_snapshot_xmin(p_snapshot), p_xid),
               pg_catalog.pg_snapshot_xmax(p_snapshot),
               (SELECT pg_catalog.string_agg(x::text, ',' ORDER BY x)
                  FROM (SELECT pg_catalog.pg_snapshot_xip(p_snapshot) AS x UNION SELECT p_xid) AS u)
           )::pg_catalog.pg_snapshot;
$$;

CREATE OR REPLACE FUNCTION mailbox._sequence_outbox(p_key int, p_limit int DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_head bigint;
    v_seq pg_snapshot;
    v_win pg_snapshot;
    v_xid xid8;
    v_id bigint;
    v_fresh boolean;
    v_was_open pg_snapshot;
    v_me xid8;
    v_seq_xmax xid8;
    v_win_xmax xid8;
    v_xip xid8[];
    v_chunk int := mailbox._setting_int('outbox_chunk_rows');
    v_want int;
    v_ids bigint[];
    v_last_xid xid8;
    v_n int;
    v_total bigint := 0;
BEGIN
    SELECT o.head_offset, o.seq_snapshot, o.win_snapshot, o.win_xid, o.win_id
      INTO v_head, v_seq, v_win, v_xid, v_id
      FROM mailbox._outbox AS o
     WHERE o.outbox_key = p_key
       FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_was_open := v_win;
    IF pg_catalog.pg_snapshot_xmax(v_seq) = '2'::xid8 THEN
        -- restored from a dump: its transaction ids are another cluster's (part 10)
        v_total := mailbox._rebase_restored_outbox(p_key);
        SELECT o.head_offset, o.seq_snapshot INTO v_head, v_seq FROM mailbox._outbox AS o WHERE o.outbox_key = p_key;
    END IF;
    LOOP
        v_fresh := v_win IS NULL;
        IF v_fresh THEN
            v_win := pg_catalog.pg_current_snapshot();
            v_me := pg_catalog.pg_current_xact_id_if_assigned();
            IF v_me IS NOT NULL AND pg_catalog.pg_visible_in_snapshot(v_me, v_win) THEN
                v_win := mailbox._snapshot_with(v_win, v_me);
            END IF;
            v_xid := '0'::xid8;
            v_id := 0;
        END IF;
        v_want := least(v_chunk, greatest(p_limit - v_total, 1));
        -- Three parts in (_xid, _id) order, each an index range scan with plain conditions
        -- (a row comparison would displace the other conditions from the index bounds):
        -- the rest of the cursor's transaction, the other transactions in progress at
        -- S_prev, then the xid range new since S_prev. The second part probes the index once
        -- per xid: written as _xid = ANY (v_xip), a cached generic plan kept the order by
        -- turning the array into a filter over every row of the outbox, for every chunk --
        -- numbering cost grew with the square of the backlog (docs/design.md §3).
        v_seq_xmax := pg_catalog.pg_snapshot_xmax(v_seq);
        v_win_xmax := pg_catalog.pg_snapshot_xmax(v_win);
        v_xip := ARRAY(SELECT x FROM pg_catalog.pg_snapshot_xip(v_seq) AS x
                        WHERE x > v_xid AND pg_catalog.pg_visible_in_snapshot(x, v_win) ORDER BY x);
        SELECT pg_catalog.array_agg(w._id ORDER BY w._xid, w._id), pg_catalog.max(w._xid)
          INTO v_ids, v_last_xid
          FROM (
              (SELECT l._xid, l._id FROM mailbox._outbox_log AS l
                WHERE l.outbox_key = p_key AND l._xid = v_xid AND l._id > v_id
                ORDER BY l._xid, l._id LIMIT v_want)
              UNION ALL
              (SELECT x._xid, x._id
                 FROM pg_catalog.unnest(v_xip) AS t (xid)
                CROSS JOIN LATERAL (
                    SELECT l._xid, l._id FROM mailbox._outbox_log AS l
                     WHERE l.outbox_key = p_key AND l._xid = t.xid
                     ORDER BY l._id LIMIT v_want
                ) AS x
                ORDER BY 1, 2 LIMIT v_want)
              UNION ALL
              (SELECT l._xid, l._id FROM mailbox._outbox_log AS l
                WHERE l.outbox_key = p_key
                  AND l._xid >= v_seq_xmax AND l._xid > v_xid AND l._xid < v_win_xmax
                  AND pg_catalog.pg_visible_in_snapshot(l._xid, v_win)
                ORDER BY l._xid, l._id LIMIT v_want)
              ORDER BY 1, 2
              LIMIT v_want
          ) AS w;
        v_n := coalesce(pg_catalog.cardinality(v_ids), 0);
        IF v_n > 0 THEN
            INSERT INTO mailbox._outbox_chunk (outbox_key, base_offset, row_count, ids, dense, first_id)
            VALUES (p_key, v_head, v_n, v_ids,
                    v_ids[v_n] - v_ids[1] = v_n - 1
                    AND v_ids = ARRAY(SELECT x FROM pg_catalog.unnest(v_ids) AS x ORDER BY x),
                    v_ids[1]);
            v_head := v_head + v_n;
            v_total := v_total + v_n;
            v_xid := v_last_xid;
            v_id := v_ids[v_n];
        END IF;
        IF v_n < v_want THEN
            -- window exhausted: everything visible in it now has an offset
            v_seq := v_win;
            v_win := NULL;
            EXIT WHEN v_fresh;
        END IF;
        EXIT WHEN v_total >= p_limit;
    END LOOP;
    IF v_total = 0 AND v_win IS NULL AND v_was_open IS NULL THEN
        RETURN 0; -- a fresh window found nothing new: no state to save
    END IF;
    UPDATE mailbox._outbox
       SET head_offset = v_head, seq_snapshot = v_seq, win_snapshot = v_win,
           win_xid = CASE WHEN v_win IS NULL THEN NULL ELSE v_xid END,
           win_id = CASE WHEN v_win IS NULL THEN NULL ELSE v_id END
     WHERE outbox_key = p_key;
    RETURN v_total;
END
$$;

-- sql/functions/19_outbox_claim_check.sql
-- Part 19: reading claim-check rows by page (outbox_delta_rows) and marking them read
-- (outbox_rows_consumed).

-- The row key at an offset, or NULL (not numbered yet, or drained).
CREATE OR REPLACE FUNCTION mailbox._row_at_offset(p_key int, p_offset bigint)
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
CREATE OR REPLACE FUNCTION mailbox._claim_check_row(p_key int, p_outbox text, p_outbox_id bigint)
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

CREATE OR REPLACE FUNCTION mailbox.outbox_delta_rows(
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

CREATE OR REPLACE FUNCTION mailbox.outbox_rows_consumed(p_outbox text, p_outbox_id bigint, p_group text DEFAULT NULL)
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

-- sql/functions/20_groups.sql
-- Part 20: consumer groups over an outbox (SPEC §2): catalog and leases.
--
-- A group reads offsets in order. delivered_offset is how far it has handed rows out (to a
-- consumer, or to a slot while a numberer runs, part 24); every offset in
-- (group_offset, delivered_offset] is in exactly one lease, a contiguous range held by one
-- consumer until it is acknowledged (the lease row is deleted) or expires (the next poll of
-- any consumer takes it over), or a slot no poll has claimed yet. So group_offset, the highest offset H with every row
-- <= H acknowledged, is simply the lowest leased offset - 1, or delivered_offset without
-- leases. Polls and commits write one lease row per batch, never one row per message.

-- The group offset as it is now: every offset of a group above it is in a lease row (claimed
-- or a slot), so it is the lowest leased offset - 1, or delivered_offset without any. The
-- stored group_offset is this value as of the last commit (no numberer running) or the last
-- numberer pass: a commit never writes the group row while a numberer runs, since an open
-- transaction holding it would stop the numberer from handing the group new rows.
CREATE OR REPLACE FUNCTION mailbox._group_offset(p_group text, p_delivered bigint)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce((SELECT pg_catalog.min(l.first_offset) - 1 FROM mailbox._lease AS l
                      WHERE l.group_name = p_group), p_delivered);
$$;

-- A group by name, locked for the caller's change, or 42704.
CREATE OR REPLACE FUNCTION mailbox._lock_group(p_group text)
RETURNS mailbox._consumer_group
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_group mailbox._consumer_group;
BEGIN
    SELECT * INTO v_group FROM mailbox._consumer_group AS g WHERE g.group_name = p_group FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM mailbox._group_outbox(p_group); -- raises 22004, 22023 or 42704
    END IF;
    RETURN v_group;
END
$$;

-- The outbox key of a group (no lock), or 42704.
CREATE OR REPLACE FUNCTION mailbox._group_outbox(p_group text)
RETURNS int
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
BEGIN
    PERFORM mailbox._check_id('consumer group', p_group);
    SELECT g.outbox_key INTO v_key FROM mailbox._consumer_group AS g WHERE g.group_name = p_group;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer group not found: %', p_group
            USING ERRCODE = '42704', HINT = 'Create it with mailbox.create_consumer_group().';
    END IF;
    RETURN v_key;
END
$$;

-- A registered consumer (heartbeat refreshed), or 42704.
CREATE OR REPLACE FUNCTION mailbox._touch_consumer(p_group text, p_consumer text)
RETURNS mailbox._consumer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_consumer mailbox._consumer;
BEGIN
    PERFORM mailbox._check_id('consumer id', p_consumer);
    UPDATE mailbox._consumer AS c
       SET last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
     WHERE c.group_name = p_group AND c.consumer_id = p_consumer
    RETURNING * INTO v_consumer;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'consumer not found: % in group %', p_consumer, p_group
            USING ERRCODE = '42704', HINT = 'A consumer registers itself with its first mailbox.poll_outbox().';
    END IF;
    RETURN v_consumer;
END
$$;

-- Offsets p_first .. p_last are a consumer's again (it took them over): they leave its lost
-- ranges, so its commit does not warn 'lease lost' for rows it holds. What it lost around
-- them stays lost.
CREATE OR REPLACE FUNCTION mailbox._forget_lost_range(p_group text, p_consumer text, p_first bigint, p_last bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._lost_lease AS x
         WHERE x.group_name = p_group AND x.consumer_id = p_consumer
           AND x.first_offset <= p_last AND x.last_offset >= p_first
        RETURNING x.first_offset, x.last_offset
    ), kept AS (
        SELECT r.first_offset, pg_catalog.max(r.last_offset) AS last_offset
          FROM gone
         CROSS JOIN LATERAL (
               VALUES (gone.first_offset, p_first - 1), (p_last + 1, gone.last_offset)
         ) AS r (first_offset, last_offset)
         WHERE r.first_offset <= r.last_offset
         GROUP BY r.first_offset
    )
    INSERT INTO mailbox._lost_lease AS x (group_name, consumer_id, first_offset, last_offset)
    SELECT p_group, p_consumer, k.first_offset, k.last_offset FROM kept AS k
    ON CONFLICT (group_name, consumer_id, first_offset)
    DO UPDATE SET last_offset = greatest(x.last_offset, excluded.last_offset);
$$;

-- Registers a consumer on first contact; refreshes its heartbeat otherwise.
CREATE OR REPLACE FUNCTION mailbox._register_consumer(p_group text, p_consumer text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_id('consumer id', p_consumer);
    INSERT INTO mailbox._consumer AS c (group_name, consumer_id)
    VALUES (p_group, p_consumer)
    ON CONFLICT (group_name, consumer_id)
    DO UPDATE SET last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL;
END
$$;

-- Every offset up to the head, numbered (used where "the head" must include every row
-- committed so far: 'latest' groups, seek to the head, lag).
CREATE OR REPLACE FUNCTION mailbox._sequence_all(p_key int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_n bigint;
BEGIN
    LOOP
        v_n := mailbox._sequence_outbox(p_key, 100000);
        EXIT WHEN v_n < 100000;
    END LOOP;
    RETURN (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
END
$$;

CREATE OR REPLACE FUNCTION mailbox.create_consumer_group(
    p_name text, p_outbox text, p_auto_offset_reset text DEFAULT 'latest'
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the extension catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_start bigint;
BEGIN
    PERFORM mailbox._check_id('consumer group', p_name);
    v_key := mailbox._outbox_key(p_outbox);
    PERFORM mailbox._require(p_auto_offset_reset, 'p_auto_offset_reset');
    IF p_auto_offset_reset NOT IN ('earliest', 'latest') THEN
        RAISE EXCEPTION 'invalid auto_offset_reset: %', pg_catalog.quote_literal(p_auto_offset_reset)
            USING ERRCODE = '22023', HINT = 'Use ''earliest'' (every retained row) or ''latest'' (rows committed from now on).';
    END IF;
    PERFORM mailbox._ddl_lock();
    IF EXISTS (SELECT 1 FROM mailbox._consumer_group WHERE group_name = p_name) THEN
        RAISE EXCEPTION 'consumer group already exists: %', p_name
            USING ERRCODE = '42710', HINT = 'Choose another name, or drop it with mailbox.drop_consumer_group().';
    END IF;
    IF p_auto_offset_reset = 'latest' THEN
        v_start := mailbox._sequence_all(v_key);
    ELSE
        PERFORM mailbox._retention_lock(v_key); -- a running drain finishes first
        v_start := (SELECT r.low_offset FROM mailbox._outbox_retention AS r WHERE r.outbox_key = v_key);
    END IF;
    INSERT INTO mailbox._consumer_group (group_name, outbox_key, auto_offset_reset, group_offset, delivered_offset)
    VALUES (p_name, v_key, p_auto_offset_reset, v_start, v_start);
    PERFORM mailbox._reset_partitions(p_name, v_key, v_start); -- a partitioned outbox (part 26)
END
$$;
COMMENT ON FUNCTION mailbox.create_consumer_group(text, text, text) IS
'create a consumer group reading an outbox from its oldest retained row (earliest) or its head (latest)';

CREATE OR REPLACE FUNCTION mailbox.drop_consumer_group(p_name text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the extension catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._require(p_name, 'p_name');
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    -- lock order as in poll_outbox: consumer rows, then the group row (the cascade below
    -- would take them the other way round)
    PERFORM FROM mailbox._consumer AS c WHERE c.group_name = p_name ORDER BY c.consumer_id FOR UPDATE;
    DELETE FROM mailbox._claim_check_consumed WHERE group_name = p_name;
    DELETE FROM mailbox._outbox_waiter AS w WHERE w.group_name = p_name;
    DELETE FROM mailbox._consumer_group WHERE group_name = p_name;
    IF NOT FOUND THEN
        IF p_if_exists THEN
            RAISE NOTICE 'consumer group not found, skipping: %', p_name;
            RETURN;
        END IF;
        RAISE EXCEPTION 'consumer group not found: %', p_name
            USING ERRCODE = '42704', HINT = 'mailbox.consumer_group_lag lists the groups.';
    END IF;
END
$$;
COMMENT ON FUNCTION mailbox.drop_consumer_group(text, boolean) IS
'drop a consumer group with its consumers and leases';

-- sql/functions/22_groups_api.sql
-- Part 22: the consumer-group data plane (SPEC §2.1, §2.2): poll, commit, extend, seek,
-- heartbeat. Lag and the monitoring views are part 23.

CREATE OR REPLACE FUNCTION mailbox._check_positive(p_value int, p_param text, p_max int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION '% must not be null', p_param
            USING ERRCODE = '22004', HINT = pg_catalog.format('Pass %s from 1 to %s.', p_param, p_max);
    END IF;
    IF p_value < 1 OR p_value > p_max THEN
        RAISE EXCEPTION 'invalid %: %', p_param, p_value
            USING ERRCODE = '22023', HINT = pg_catalog.format('Pass %s from 1 to %s.', p_param, p_max);
    END IF;
    RETURN p_value;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.poll_outbox(
    p_group text, p_consumer text, p_batch_size int DEFAULT 100, p_visibility_seconds int DEFAULT 30
)
RETURNS TABLE (
    outbox_id bigint, event_id uuid, created_at timestamptz, source text, event_type text, key text,
    headers jsonb, inserted_count int, deleted_count int, is_claim_check boolean, full_refresh boolean,
    payload jsonb, partition int
)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers read the outbox and write leases only through this function
SET search_path = pg_catalog, mailbox, pg_temp
-- a batch is at most a few thousand index-scanned rows: starting parallel workers for it
-- (the planner's estimates can suggest it) costs more than the whole poll
SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
DECLARE
    v_group mailbox._consumer_group;
    v_until timestamptz;
    v_first bigint;
    v_last bigint;
    v_holder text;
    v_held_until timestamptz;
    v_head bigint;
    v_from_chunk bigint;
    v_beat timestamptz;
    v_now timestamptz;
    v_key int;
    v_numberer boolean;
    v_next_last bigint;
    v_parts int;
    v_unparked bigint[];
BEGIN
    PERFORM mailbox._check_positive(p_batch_size, 'p_batch_size', 100000);
    PERFORM mailbox._check_positive(p_visibility_seconds, 'p_visibility_seconds', 604800);
    -- The hot path inlines what helpers do elsewhere (PL/pgSQL caches these plans); the
    -- helpers run only to raise the right error.
    IF p_consumer IS NULL OR p_consumer = '' OR pg_catalog.char_length(p_consumer) > 200 THEN
        PERFORM mailbox._check_id('consumer id', p_consumer);
    END IF;
    -- Authority before anything is written (the heartbeat below writes). The common case --
    -- an outbox without grants, open to mailbox_consumer -- costs one index probe here.
    SELECT g.outbox_key INTO v_key FROM mailbox._consumer_group AS g WHERE g.group_name = p_group;
    IF NOT FOUND THEN
        v_key := mailbox._group_outbox(p_group); -- raises 22004, 22023 or 42704
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._object_grant AS x WHERE x.object_kind = 'outbox' AND x.object_key = v_key) THEN
        PERFORM mailbox._authorize('outbox', v_key, 'consume');
    END IF;
    -- The poll is a heartbeat: a known consumer's row is refreshed here, before the group
    -- lock, at most every 100 ms (unhealthy or reaped consumers are always older than that).
    -- Lock order is own consumer row, then group row, everywhere.
    SELECT c.last_heartbeat_at INTO v_beat FROM mailbox._consumer AS c
     WHERE c.group_name = p_group AND c.consumer_id = p_consumer;
    IF FOUND AND v_beat < pg_catalog.now() - interval '100 milliseconds' THEN
        UPDATE mailbox._consumer AS c
           SET last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
         WHERE c.group_name = p_group AND c.consumer_id = p_consumer;
    END IF;
    -- A group draining a change of the partition count (part 28) uses its old count until it
    -- drained, then switches (the numberer does that while one runs). (_group_partitions,
    -- inlined.)
    v_parts := (SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group);
    IF v_parts IS NOT NULL AND NOT mailbox._numberer_alive()
       AND mailbox._finish_partition_change(p_group, v_key, TRUE) THEN
        v_parts := NULL;
    END IF;
    -- A partitioned outbox (part 27): partitions are leased, not offset ranges.
    v_parts := coalesce(v_parts, (SELECT x.partitions FROM mailbox._outbox_partitioning AS x
                                   WHERE x.outbox_key = v_key));
    IF v_parts > 1 THEN
        RETURN QUERY SELECT * FROM mailbox._poll_partitioned(
            p_group, p_consumer, p_batch_size, p_visibility_seconds, v_key, v_parts);
        RETURN;
    END IF;
    -- With a numberer running (part 24) the group's new rows wait in slots it committed, and
    -- polls only claim lease rows with FOR UPDATE SKIP LOCKED: a poll never waits for another
    -- consumer, and one whose transaction stays open holds back only the rows it claimed
    -- (SPEC §2.2.4). Without one, this poll numbers and allocates itself, and from here to the
    -- caller's commit the consumers of this group take turns, as the group row is locked.
    v_numberer := mailbox._numberer_alive();
    IF v_numberer THEN
        SELECT * INTO v_group FROM mailbox._consumer_group AS g WHERE g.group_name = p_group;
    ELSE
        SELECT * INTO v_group FROM mailbox._consumer_group AS g WHERE g.group_name = p_group FOR NO KEY UPDATE;
    END IF;
    IF NOT FOUND THEN
        v_group := mailbox._lock_group(p_group);
    END IF;
    IF NOT v_numberer AND EXISTS (SELECT 1 FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key)
       AND mailbox._group_partitions(p_group, v_key) > 1 THEN
        -- the group switched to partitions while this poll waited for its row (part 28)
        RETURN QUERY SELECT * FROM mailbox._poll_partitioned(
            p_group, p_consumer, p_batch_size, p_visibility_seconds, v_key, mailbox._group_partitions(p_group, v_key));
        RETURN;
    END IF;
    -- A new consumer registers under the group lock: its foreign key takes a share lock on the
    -- group row, which taken before the lock would deadlock with another newcomer. Always, not
    -- only when unseen above: maintenance may have forgotten it meanwhile. (An existing row
    -- costs one index probe and no write.)
    INSERT INTO mailbox._consumer AS c (group_name, consumer_id)
    VALUES (p_group, p_consumer)
    ON CONFLICT (group_name, consumer_id) DO NOTHING;
    -- Lease times count from now, not from the start of the transaction: this poll may have
    -- waited for the group longer than the visibility timeout.
    v_now := pg_catalog.clock_timestamp();
    v_until := v_now + pg_catalog.make_interval(secs => p_visibility_seconds);
    -- rows an operator unparked (part 27) come first, alone
    IF EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k WHERE k.group_name = p_group AND k.unparked_at IS NOT NULL) THEN
        v_unparked := mailbox._take_unparked(p_group, p_consumer, NULL, v_until);
        IF v_unparked IS NOT NULL THEN
            RETURN QUERY
            SELECT k.outbox_id, k.event_id, k.created_at, k.source, k.event_type, k.key, k.headers,
                   k.inserted_count, k.deleted_count, k.is_claim_check, k.full_refresh, k.payload, 0
              FROM mailbox._outbox_parked AS k
             WHERE k.group_name = p_group AND k.outbox_id = ANY (v_unparked)
             ORDER BY k.outbox_id;
            RETURN;
        END IF;
    END IF;

    -- The group's lowest lease row that is a slot, expired (its rows are delivered again:
    -- at-least-once) or already this consumer's own comes first. Own: the poller may be a new
    -- incarnation under the same id that never saw those rows
    -- (docs/consumer-groups.md#restarts), and taking the lowest such lease means every other
    -- lease of this id lies above what it is given, so its commit covers only rows it
    -- received. Rows locked by an open poll or commit are skipped, not waited for.
    SELECT l.first_offset, l.last_offset, l.consumer_id, l.lease_until
      INTO v_first, v_last, v_holder, v_held_until
      FROM mailbox._lease AS l
     WHERE l.group_name = p_group
       AND (l.lease_until IS NULL OR l.lease_until <= v_now OR l.consumer_id = p_consumer)
     ORDER BY l.first_offset
     LIMIT 1
       FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        IF v_last - v_first + 1 > p_batch_size THEN
            -- take the front; the rest stays with its holder (or a slot), as it was -- though
            -- hidden from other polls until this transaction ends (docs/design.md §5)
            INSERT INTO mailbox._lease (group_name, first_offset, last_offset, consumer_id, lease_until)
            VALUES (p_group, v_first + p_batch_size, v_last, v_holder, v_held_until);
            v_last := v_first + p_batch_size - 1;
        ELSIF v_holder IS NULL THEN
            -- a slot: the free slots right after it join the batch while they fit
            LOOP
                SELECT l.last_offset INTO v_next_last
                  FROM mailbox._lease AS l
                 WHERE l.group_name = p_group AND l.first_offset = v_last + 1 AND l.consumer_id IS NULL
                   AND l.last_offset - v_first + 1 <= p_batch_size -- (a slot that does not fit stays unlocked)
                   FOR UPDATE SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                DELETE FROM mailbox._lease AS l WHERE l.group_name = p_group AND l.first_offset = v_last + 1;
                v_last := v_next_last;
            END LOOP;
        END IF;
        UPDATE mailbox._lease
           SET last_offset = v_last, consumer_id = p_consumer, lease_until = v_until
         WHERE group_name = p_group AND first_offset = v_first;
        IF v_holder <> p_consumer THEN
            -- fencing: the lease now names the new holder, so the old holder's late commit
            -- cannot acknowledge these rows; this row makes that commit warn
            INSERT INTO mailbox._lost_lease AS x (group_name, consumer_id, first_offset, last_offset)
            SELECT p_group, v_holder, v_first, v_last
             WHERE EXISTS (SELECT 1 FROM mailbox._consumer AS c
                            WHERE c.group_name = p_group AND c.consumer_id = v_holder)
            ON CONFLICT (group_name, consumer_id, first_offset)
            DO UPDATE SET last_offset = greatest(x.last_offset, excluded.last_offset);
            -- rows this consumer had lost and now holds again are no longer lost
            PERFORM mailbox._forget_lost_range(p_group, p_consumer, v_first, v_last);
        END IF;
    ELSE
        v_first := v_group.delivered_offset + 1;
        -- (capped at the boundary of a partition change the group drains: _group_head of part
        -- 28, inlined)
        v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                              WHERE x.group_name = p_group))
                     FROM mailbox._outbox AS o WHERE o.outbox_key = v_group.outbox_key);
        IF v_head < v_first + p_batch_size - 1 AND NOT v_numberer THEN
            PERFORM mailbox._sequence_outbox(v_group.outbox_key, greatest(p_batch_size, 1000));
            v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                                  WHERE x.group_name = p_group))
                         FROM mailbox._outbox AS o WHERE o.outbox_key = v_group.outbox_key);
        END IF;
        -- with a numberer, unclaimed rows are in slots: what is left is claimed by open polls
        -- or not numbered yet, and the numberer's next pass wakes this consumer
        IF v_head < v_first OR v_numberer THEN
            -- nothing to deliver: this consumer now waits for a wake-up (part 17)
            INSERT INTO mailbox._outbox_waiter AS w (outbox_key, group_name, consumer_id, waiting_until)
            VALUES (v_group.outbox_key, p_group, p_consumer,
                    v_now + least(mailbox._heartbeat_timeout(), interval '60 seconds'))
            ON CONFLICT (outbox_key, group_name, consumer_id) DO UPDATE SET waiting_until = excluded.waiting_until;
            RETURN;
        END IF;
        v_last := least(v_head, v_first + p_batch_size - 1);
        INSERT INTO mailbox._lease (group_name, first_offset, last_offset, consumer_id, lease_until)
        VALUES (p_group, v_first, v_last, p_consumer, v_until);
        UPDATE mailbox._consumer_group SET delivered_offset = v_last WHERE group_name = p_group;
    END IF;
    -- Rows v_first .. v_last, from the chunks that hold them (contiguous, so: from the one
    -- holding v_first to the one before v_last). A dense chunk (keys first_id, first_id + 1,
    -- ...) is read with one index range scan; others by joining their key slice to the log.
    v_from_chunk := coalesce((SELECT pg_catalog.max(c.base_offset) FROM mailbox._outbox_chunk AS c
                               WHERE c.outbox_key = v_group.outbox_key AND c.base_offset < v_first), 0);
    -- parked rows (part 28) were acknowledged for this group by outbox_park: never again
    -- from the log (an unparked one comes back through _take_unparked above)
    RETURN QUERY
    SELECT q.* FROM (
        SELECT c.base_offset + 1 + (l._id - c.first_id) AS o,
               l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
               l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload, 0
          FROM mailbox._outbox_chunk AS c
          JOIN mailbox._outbox_log AS l
            ON l.outbox_key = c.outbox_key
           AND l._id BETWEEN c.first_id + greatest(v_first - c.base_offset - 1, 0)
                         AND c.first_id + least(v_last - c.base_offset, c.row_count) - 1
         WHERE c.outbox_key = v_group.outbox_key AND c.dense
           AND c.base_offset >= v_from_chunk AND c.base_offset < v_last
        UNION ALL
        SELECT s.first_in_chunk + u.n - 1,
               l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
               l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload, 0
          FROM mailbox._outbox_chunk AS c
         CROSS JOIN LATERAL (
               SELECT greatest(v_first, c.base_offset + 1) AS first_in_chunk,
                      least(v_last, c.base_offset + c.row_count) AS last_in_chunk
         ) AS s
         CROSS JOIN LATERAL pg_catalog.unnest(
               c.ids[(s.first_in_chunk - c.base_offset)::int:(s.last_in_chunk - c.base_offset)::int]
         ) WITH ORDINALITY AS u (id, n)
          JOIN mailbox._outbox_log AS l ON l.outbox_key = c.outbox_key AND l._id = u.id
         WHERE c.outbox_key = v_group.outbox_key AND NOT c.dense
           AND c.base_offset >= v_from_chunk AND c.base_offset < v_last
    ) AS q
     WHERE NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                        WHERE k.group_name = p_group AND k.outbox_id = q.o)
     ORDER BY 1;
    -- a busy consumer needs no wake-up: producers stop notifying (no write when not waiting)
    DELETE FROM mailbox._outbox_waiter AS w
     WHERE w.outbox_key = v_group.outbox_key AND w.group_name = p_group AND w.consumer_id = p_consumer;
END
$$;
COMMENT ON FUNCTION mailbox.poll_outbox(text, text, int, int) IS
'lease the next rows of a consumer group (expired leases first) to a consumer, in offset order';

-- sql/functions/22_groups_commit.sql
-- Part 22 (continued): commit, extend, seek and heartbeat of the consumer-group data plane
-- (SPEC §2.1, §2.2); polls are in 22_groups_api.sql.

CREATE OR REPLACE FUNCTION mailbox.commit_offset(p_group text, p_consumer text, p_last_offset bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers acknowledge only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_consumer mailbox._consumer;
    v_delivered bigint;
    v_full bigint;
    v_partial bigint;
    v_batch bigint;
    v_numberer boolean;
    v_key int := mailbox._group_outbox(p_group);
    v_unparked bigint;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'consume');
    -- lock order as in poll_outbox: own consumer row, then the group row
    SELECT * INTO v_consumer FROM mailbox._consumer AS c
     WHERE c.group_name = p_group AND c.consumer_id = p_consumer
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM mailbox._lock_group(p_group);                 -- raises for a bad or unknown group
        PERFORM mailbox._touch_consumer(p_group, p_consumer); -- raises 22004, 22023 or 42704
    END IF;
    -- the group's count (_group_partitions of part 28, inlined)
    IF coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                (SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key)) > 1 THEN
        RETURN mailbox._commit_partitioned(p_group, p_consumer, p_last_offset, v_key, v_consumer.committed_offset);
    END IF;
    -- Without a numberer, commits and polls of a group take turns on its row, as the group
    -- offset is stored here. With one, the commit locks only this consumer's rows (the
    -- numberer stores the group offset), so an open transaction holds back nothing else.
    v_numberer := mailbox._numberer_alive();
    IF v_numberer THEN
        SELECT g.delivered_offset INTO v_delivered FROM mailbox._consumer_group AS g
         WHERE g.group_name = p_group;
    ELSE
        SELECT g.delivered_offset INTO v_delivered FROM mailbox._consumer_group AS g
         WHERE g.group_name = p_group FOR NO KEY UPDATE;
    END IF;
    PERFORM mailbox._require(p_last_offset, 'p_last_offset');
    IF p_last_offset < 0 THEN
        RAISE EXCEPTION 'invalid p_last_offset: %', p_last_offset
            USING ERRCODE = '22023',
                  HINT = 'Pass the offset (outbox_id) of the last row processed; offsets start at 1.';
    END IF;

    -- A commit acknowledges one batch: this consumer's highest lease starting at or below the
    -- offset. Two live processes under one id (a restart whose predecessor still runs, a
    -- retried commit) may each hold a batch of that id; one's commit must not acknowledge the
    -- other's lower batch, which it never received (docs/consumer-groups.md#restarts).
    v_batch := (SELECT pg_catalog.max(l.first_offset) FROM mailbox._lease AS l
                 WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.first_offset <= p_last_offset);
    WITH acked AS (
        DELETE FROM mailbox._lease AS l
         WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.first_offset = v_batch
           AND l.last_offset <= p_last_offset
        RETURNING l.first_offset AS f, l.last_offset AS t
    )
    -- parked rows were acknowledged by outbox_park (unparked ones are counted below)
    SELECT coalesce(pg_catalog.sum(a.t - a.f + 1 - (SELECT pg_catalog.count(*) FROM mailbox._outbox_parked AS k
                                                     WHERE k.group_name = p_group
                                                       AND k.outbox_id BETWEEN a.f AND a.t)), 0)
      INTO v_full FROM acked AS a;
    WITH cut AS (
        SELECT l.first_offset FROM mailbox._lease AS l
         WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.first_offset = v_batch
           AND l.last_offset > p_last_offset
    ), moved AS (
        UPDATE mailbox._lease AS l SET first_offset = p_last_offset + 1
          FROM cut
         WHERE l.group_name = p_group AND l.first_offset = cut.first_offset
        RETURNING cut.first_offset AS f
    )
    SELECT coalesce(pg_catalog.sum(p_last_offset - m.f + 1 - (SELECT pg_catalog.count(*) FROM mailbox._outbox_parked AS k
                                                               WHERE k.group_name = p_group
                                                                 AND k.outbox_id BETWEEN m.f AND p_last_offset)), 0)
      INTO v_partial FROM moved AS m;
    -- unparked rows this consumer received again (part 27)
    WITH gone AS (
        DELETE FROM mailbox._outbox_parked AS k
         WHERE k.group_name = p_group AND k.consumer_id = p_consumer AND k.unparked_at IS NOT NULL
           AND k.outbox_id <= p_last_offset
        RETURNING 1
    )
    SELECT pg_catalog.count(*) INTO v_unparked FROM gone;
    v_partial := v_partial + v_unparked;
    -- After the leases: a takeover of this consumer's lease that was running when this commit
    -- started (possible with a numberer, where nothing serialises them) made the DELETE above
    -- wait and skip the row; its lost range is visible from this statement on.
    DELETE FROM mailbox._lost_lease AS x
     WHERE x.group_name = p_group AND x.consumer_id = p_consumer AND x.first_offset <= p_last_offset;
    IF FOUND THEN
        RAISE WARNING 'lease lost: consumer % of group % no longer holds some offsets up to %',
            p_consumer, p_group, p_last_offset
            USING DETAIL = 'Its lease expired and the rows were delivered to another consumer.',
                  HINT = 'Extend leases with mailbox.extend_lease() while a batch takes longer than its visibility timeout.';
    END IF;
    -- Below the committed offset with nothing held there: a regression, ignored. (Rows this
    -- consumer holds below it -- redelivered to it after a takeover -- are acknowledged above.)
    IF v_full + v_partial = 0 AND p_last_offset < v_consumer.committed_offset THEN
        PERFORM mailbox._touch_consumer(p_group, p_consumer);
        RAISE WARNING 'commit below committed offset: consumer % of group % is at %, got %',
            p_consumer, p_group, v_consumer.committed_offset, p_last_offset
            USING HINT = 'Nothing was acknowledged; offsets only move forward (use mailbox.seek_offset() to move back).';
        RETURN 0;
    END IF;

    IF NOT v_numberer THEN
        UPDATE mailbox._consumer_group AS g
           SET group_offset = mailbox._group_offset(p_group, g.delivered_offset)
         WHERE g.group_name = p_group;
    END IF;
    -- nothing past what the group handed out can have been processed: a commit beyond it
    -- records the delivered offset, so the committed offset never passes the head
    UPDATE mailbox._consumer
       SET committed_offset = greatest(committed_offset, least(p_last_offset, v_delivered)),
           last_commit_at = pg_catalog.now(),
           last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
     WHERE group_name = p_group AND consumer_id = p_consumer;
    RETURN v_full + v_partial;
END
$$;
COMMENT ON FUNCTION mailbox.commit_offset(text, text, bigint) IS
'acknowledge the rows this consumer holds leases on up to an offset; returns how many';

CREATE OR REPLACE FUNCTION mailbox.extend_lease(p_group text, p_consumer text, p_extension_seconds int DEFAULT 30)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers change their own leases only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_until timestamptz;
    v_now timestamptz;
BEGIN
    PERFORM mailbox._authorize('outbox', mailbox._group_outbox(p_group), 'consume');
    PERFORM mailbox._touch_consumer(p_group, p_consumer);
    PERFORM mailbox._require(p_extension_seconds, 'p_extension_seconds');
    IF p_extension_seconds < 0 THEN
        RAISE EXCEPTION 'invalid p_extension_seconds: %', p_extension_seconds
            USING ERRCODE = '22023', HINT = 'Pass 0 or more seconds from now.';
    END IF;
    -- only live leases: an expired one may already belong to someone else. The clock, not
    -- now(): the transaction may have started long before (or waited for a lock).
    v_now := pg_catalog.clock_timestamp();
    UPDATE mailbox._lease
       SET lease_until = v_now + pg_catalog.make_interval(secs => p_extension_seconds)
     WHERE group_name = p_group AND consumer_id = p_consumer AND lease_until > v_now;
    IF FOUND THEN
        v_until := v_now + pg_catalog.make_interval(secs => p_extension_seconds);
    END IF;
    -- partition leases and unparked rows delivered again (parts 26, 27)
    UPDATE mailbox._partition_lease
       SET lease_until = v_now + pg_catalog.make_interval(secs => p_extension_seconds)
     WHERE group_name = p_group AND consumer_id = p_consumer AND lease_until > v_now;
    IF FOUND THEN
        v_until := v_now + pg_catalog.make_interval(secs => p_extension_seconds);
    END IF;
    UPDATE mailbox._outbox_parked
       SET lease_until = v_now + pg_catalog.make_interval(secs => p_extension_seconds)
     WHERE group_name = p_group AND consumer_id = p_consumer AND lease_until > v_now;
    IF FOUND THEN
        v_until := v_now + pg_catalog.make_interval(secs => p_extension_seconds);
    END IF;
    RETURN v_until;
END
$$;
COMMENT ON FUNCTION mailbox.extend_lease(text, text, int) IS
'move every live lease of a consumer to now() + p_extension_seconds; NULL when it holds none';

CREATE OR REPLACE FUNCTION mailbox.seek_offset(p_group text, p_consumer text, p_new_offset bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- moves a group's offsets in the extension catalog
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_group mailbox._consumer_group;
    v_head bigint;
    v_low bigint;
    v_new bigint;
    v_key int;
BEGIN
    PERFORM mailbox._check_id('consumer id', p_consumer);
    v_key := mailbox._group_outbox(p_group);
    PERFORM mailbox._authorize('outbox', v_key, 'consume'); -- consume covers seek (SPEC §0)
    -- the retention drain of this outbox must not run between the seek and its commit, and
    -- locks go consumer rows first, then the group row, as everywhere
    PERFORM mailbox._retention_lock(v_key);
    PERFORM FROM mailbox._consumer AS c WHERE c.group_name = p_group
     ORDER BY c.consumer_id FOR NO KEY UPDATE;
    v_group := mailbox._lock_group(p_group);
    PERFORM mailbox._register_consumer(p_group, p_consumer);
    IF p_new_offset < 0 THEN
        RAISE EXCEPTION 'invalid offset: %', p_new_offset
            USING ERRCODE = '22023', HINT = 'Offsets start at 0 (before the first row); NULL means the head.';
    END IF;
    v_head := mailbox._sequence_all(v_group.outbox_key);
    v_low := (SELECT r.low_offset FROM mailbox._outbox_retention AS r WHERE r.outbox_key = v_group.outbox_key);
    v_new := coalesce(p_new_offset, v_head);
    IF v_new > v_head OR v_new < v_low THEN
        RAISE NOTICE 'offset % is outside the retained range % .. %; using %', v_new, v_low, v_head,
            least(greatest(v_new, v_low), v_head);
        v_new := least(greatest(v_new, v_low), v_head);
    END IF;
    DELETE FROM mailbox._lease WHERE group_name = p_group;
    -- a group draining a change of the partition count (part 28) replays in the new one
    DELETE FROM mailbox._partition_change AS x WHERE x.group_name = p_group;
    PERFORM mailbox._reset_partitions(p_group, v_group.outbox_key, v_new);
    UPDATE mailbox._consumer_group SET group_offset = v_new, delivered_offset = v_new WHERE group_name = p_group;
    UPDATE mailbox._consumer SET committed_offset = v_new WHERE group_name = p_group;
    DELETE FROM mailbox._lost_lease WHERE group_name = p_group;
    PERFORM mailbox._alert('consumer_seeked', pg_catalog.jsonb_build_object(
        'group', p_group, 'consumer', p_consumer, 'from_offset', v_group.group_offset, 'to_offset', v_new));
END
$$;
COMMENT ON FUNCTION mailbox.seek_offset(text, text, bigint) IS
'move a consumer group so that rows after p_new_offset (NULL: the head) are delivered next';

CREATE OR REPLACE FUNCTION mailbox.consumer_heartbeat(p_group text, p_consumer text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers report liveness only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._authorize('outbox', mailbox._group_outbox(p_group), 'consume');
    PERFORM mailbox._touch_consumer(p_group, p_consumer);
END
$$;
COMMENT ON FUNCTION mailbox.consumer_heartbeat(text, text) IS 'record that a consumer is alive';

-- sql/functions/23_groups_lag.sql
-- Part 23: consumer-group monitoring (SPEC §2.1): consumer_lag and the views over offsets,
-- leases and heartbeats.

CREATE OR REPLACE FUNCTION mailbox._heartbeat_timeout()
RETURNS interval
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT pg_catalog.make_interval(secs => mailbox._setting_int('consumer_heartbeat_timeout_seconds'));
$$;

-- The outboxes with groups whose state the caller may read: those it may consume
-- (mailbox._authorize decides; outboxes without grants are open to every consumer).
CREATE OR REPLACE FUNCTION mailbox._consumable_outboxes()
RETURNS SETOF int
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
BEGIN
    FOR v_key IN SELECT DISTINCT g.outbox_key FROM mailbox._consumer_group AS g ORDER BY 1 LOOP
        BEGIN
            PERFORM mailbox._authorize('outbox', v_key, 'consume');
            RETURN NEXT v_key;
        EXCEPTION WHEN insufficient_privilege THEN
            NULL; -- not listed
        END;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.consumer_lag(p_group text DEFAULT NULL)
RETURNS TABLE (
    group_name text, consumer_id text, committed_offset bigint, group_offset bigint, head_offset bigint,
    lag bigint, in_flight bigint, last_heartbeat_at timestamptz, heartbeat_age_seconds double precision,
    healthy boolean
)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- reads consumer state for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_timeout interval := mailbox._heartbeat_timeout();
    v_keys int[];
BEGIN
    -- a named group needs consume on its outbox; without a name, only the groups of
    -- outboxes the caller may consume are listed
    IF p_group IS NOT NULL THEN
        v_keys := ARRAY[mailbox._group_outbox(p_group)];
        PERFORM mailbox._authorize('outbox', v_keys[1], 'consume');
    ELSE
        v_keys := ARRAY(SELECT mailbox._consumable_outboxes());
    END IF;
    -- the head must count every committed row, numbered or not yet; a running numberer
    -- (part 24) numbers them within milliseconds, and numbering here would hold the
    -- outbox's sequencer until the caller's transaction ends
    IF NOT mailbox._numberer_alive() THEN
        PERFORM mailbox._sequence_all(k.outbox_key)
           FROM pg_catalog.unnest(v_keys) AS k (outbox_key) ORDER BY k.outbox_key;
    END IF;
    RETURN QUERY
    SELECT g.group_name, c.consumer_id, c.committed_offset, x.group_offset, o.head_offset,
           o.head_offset - x.group_offset,
           coalesce((SELECT pg_catalog.sum(l.last_offset - l.first_offset + 1)::bigint FROM mailbox._lease AS l
                      WHERE l.group_name = g.group_name AND l.consumer_id = c.consumer_id
                        AND l.lease_until > pg_catalog.now()), 0)
           + coalesce((SELECT pg_catalog.sum(p.in_flight)::bigint FROM mailbox.consumer_partition_lag AS p
                        WHERE p.group_name = g.group_name AND p.consumer_id = c.consumer_id AND p.leased), 0),
           c.last_heartbeat_at,
           EXTRACT(EPOCH FROM pg_catalog.now() - c.last_heartbeat_at)::double precision,
           pg_catalog.now() - c.last_heartbeat_at < v_timeout
      FROM mailbox._consumer_group AS g
     CROSS JOIN LATERAL (
           SELECT CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl WHERE pl.group_name = g.group_name)
                       THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
                       ELSE mailbox._group_offset(g.group_name, g.delivered_offset) END AS group_offset
     ) AS x
      JOIN mailbox._outbox AS o ON o.outbox_key = g.outbox_key
      LEFT JOIN mailbox._consumer AS c ON c.group_name = g.group_name
     WHERE g.outbox_key = ANY (v_keys) AND (p_group IS NULL OR g.group_name = p_group)
     ORDER BY g.group_name, c.consumer_id;
END
$$;
COMMENT ON FUNCTION mailbox.consumer_lag(text) IS
'per consumer (one row with NULL consumer for a group without any): offsets, lag in rows, in-flight rows, health';

-- mailbox.consumer_status and mailbox.consumer_group_lag: part 29 (they need part 26's
-- functions for partitioned groups).

CREATE OR REPLACE VIEW mailbox.consumer_active_leases AS
SELECT l.group_name, l.consumer_id, l.first_offset, l.last_offset, l.last_offset - l.first_offset + 1 AS row_count,
       l.lease_until
  FROM mailbox._lease AS l
 WHERE l.lease_until > pg_catalog.now();
COMMENT ON VIEW mailbox.consumer_active_leases IS 'unexpired leases: which consumer holds which offsets until when';

-- sql/functions/24_groups_numberer.sql
-- Part 24: the background numberer (SPEC §2.2.4, issue 8).
--
-- PostgreSQL has no autonomous transactions: whatever a transaction writes -- offsets, the
-- sequencer state, a group's delivered offset -- stays invisible, and its rows locked, until
-- that transaction ends. A consumer that polls in a transaction it then keeps open (psycopg's
-- default: poll, process, commit_offset, commit) would hold the outbox's sequencer and its
-- group's row for as long as it works or idles, and every group would stall behind it.
-- So while a numberer runs, numbering happens only in its own short transactions (PgQ's
-- ticker is the precedent):
--
--   * mailbox.run_numberer() loops: number every outbox with new rows, hand each group the
--     new offsets as slots (lease rows without a holder, mailbox.consumer_slot_rows each),
--     store each group's offset, COMMIT, NOTIFY the outboxes with waiting consumers;
--   * polls claim slots and expired leases with FOR UPDATE SKIP LOCKED and write nothing
--     else a peer needs; commits lock only their own rows. An open poll transaction then
--     holds back exactly the rows it claimed (until it ends: a lease row it locked cannot be
--     taken over even after its lease expires, docs/design.md §5).
--
-- It holds a session advisory lock while it runs (one numberer per database) and writes a
-- heartbeat after its passes. Polls believe a numberer is alive only when all of these hold:
-- the heartbeat is at most 2 s old, its backend is still running the statement that wrote
-- it (so a numberer that was cancelled or errored out, and whose session keeps the lock,
-- counts as stopped at once), and that backend holds the lock. A role that merely takes the
-- advisory lock (any role that can connect can) writes no heartbeat and fakes nothing: polls
-- then number inline. Without a numberer, polls number inline and allocate under the group
-- row's lock, as before; an installation without a numberer behaves as it always did.

-- The numberer's heartbeat: p_alive false clears it as its run ends.
CREATE OR REPLACE FUNCTION mailbox._numberer_beat(p_alive boolean)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- the heartbeat table is written only here, for run_numberer's caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    INSERT INTO mailbox._numberer_heartbeat AS h (singleton, pid, beat_at)
    VALUES (true, pg_catalog.pg_backend_pid(), CASE WHEN p_alive THEN pg_catalog.clock_timestamp() END)
    ON CONFLICT (singleton) DO UPDATE SET pid = excluded.pid, beat_at = excluded.beat_at
     WHERE p_alive OR h.pid = excluded.pid;
$$;

-- Whether a numberer runs (see above). It takes no lock, so it cannot leave one behind. It
-- reads one row and, while a numberer runs, that backend's status; the lock table (pg_locks,
-- ~0.1 ms) is read once per numberer run and session: the run (pid, statement start) found
-- holding the lock is remembered in mailbox.numberer_verified, and a run keeps its lock until
-- its statement ends (costs measured in docs/design.md §4.1).
CREATE OR REPLACE FUNCTION mailbox._numberer_alive()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- reads the heartbeat table and other backends' status for any poller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_pid int;
    v_at timestamptz;
    v_start timestamptz;
    v_run text;
BEGIN
    SELECT h.pid, h.beat_at INTO v_pid, v_at FROM mailbox._numberer_heartbeat AS h;
    IF v_at IS NULL OR v_at < pg_catalog.clock_timestamp() - interval '2 s' THEN
        RETURN false;
    END IF;
    -- the backend still runs the statement that wrote the heartbeat (read afresh: backend
    -- status is otherwise a snapshot taken once per transaction)
    PERFORM pg_catalog.pg_stat_clear_snapshot();
    v_start := (SELECT a.query_start FROM pg_catalog.pg_stat_get_activity(v_pid) AS a
                 WHERE a.state = 'active' AND a.query_start <= v_at);
    IF v_start IS NULL THEN
        RETURN false;
    END IF;
    v_run := v_pid::text || '@' || v_start::text;
    IF pg_catalog.current_setting('mailbox.numberer_verified', true) IS NOT DISTINCT FROM v_run THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l
                    WHERE l.locktype = 'advisory' AND l.pid = v_pid -- a backend has one database
                      AND l.classid = 7168634 AND l.objid = 0 AND l.objsubid = 2 AND l.granted) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config('mailbox.numberer_verified', v_run, false);
    RETURN true;
END
$$;

-- Hands a group the offsets after its delivered offset up to p_head as slots, and stores
-- its group offset. Skips a group whose row someone holds (a seek, a commit without a
-- numberer): the next pass does it. Only groups of one partition (part 28: a group draining
-- a change of the partition count uses its old count, and gets slots up to the boundary).
-- Returns the number of offsets handed out.
CREATE OR REPLACE FUNCTION mailbox._slot_groups(p_key int, p_head bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_slot int := mailbox._setting_int('consumer_slot_rows');
    v_group text;
    v_stored bigint;
    v_delivered bigint;
    v_offset bigint;
    v_total bigint := 0;
    v_head bigint;
BEGIN
    FOR v_group, v_stored IN
        SELECT g.group_name, g.group_offset FROM mailbox._consumer_group AS g
         WHERE g.outbox_key = p_key
           AND (g.delivered_offset < p_head
                OR g.group_offset <> mailbox._group_offset(g.group_name, g.delivered_offset))
           AND mailbox._group_partitions(g.group_name, p_key) = 1
         ORDER BY g.group_name
    LOOP
        SELECT g.delivered_offset INTO v_delivered FROM mailbox._consumer_group AS g
         WHERE g.group_name = v_group
           FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- read again under the group's lock, which a partition change's switch takes too
        CONTINUE WHEN mailbox._group_partitions(v_group, p_key) > 1;
        v_head := least(p_head, mailbox._group_head(v_group, p_key));
        IF v_delivered < v_head THEN
            INSERT INTO mailbox._lease (group_name, first_offset, last_offset, consumer_id, lease_until)
            SELECT v_group, s, least(s + v_slot - 1, v_head), NULL, NULL
              FROM pg_catalog.generate_series(v_delivered + 1, v_head, v_slot) AS s;
            v_total := v_total + (v_head - v_delivered);
            v_delivered := v_head;
        END IF;
        v_offset := mailbox._group_offset(v_group, v_delivered);
        UPDATE mailbox._consumer_group AS g
           SET delivered_offset = v_delivered, group_offset = v_offset
         WHERE g.group_name = v_group
           AND (g.delivered_offset, g.group_offset) IS DISTINCT FROM (v_delivered, v_offset);
    END LOOP;
    RETURN v_total;
END
$$;

-- One pass over every outbox; returns the rows numbered plus the offsets handed to groups.
CREATE OR REPLACE FUNCTION mailbox._numberer_pass()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the sequencer and lease catalog for run_numberer's caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_name text;
    v_head bigint;
    v_slotted bigint;
    v_n bigint;
    v_total bigint := 0;
BEGIN
    FOR v_key, v_name IN SELECT o.outbox_key, o.outbox_name FROM mailbox._outbox AS o ORDER BY o.outbox_key LOOP
        v_n := mailbox._sequence_outbox(v_key, 10000);
        v_total := v_total + v_n;
        v_head := (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = v_key);
        -- groups that drained a change of the partition count switch to the new one (part 28)
        v_slotted := (SELECT pg_catalog.count(*) FROM mailbox._partition_change AS x
                        JOIN mailbox._consumer_group AS g ON g.group_name = x.group_name
                       WHERE g.outbox_key = v_key
                         AND mailbox._finish_partition_change(x.group_name, v_key, FALSE));
        -- partitioned groups read the numbered rows by partition: no slots (part 26); a group
        -- draining a change of the partition count uses its old count (part 28)
        IF EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                    WHERE g.outbox_key = v_key AND mailbox._group_partitions(g.group_name, v_key) > 1) THEN
            v_slotted := v_slotted + v_n;
            PERFORM mailbox._store_partitioned_group_offset(g.group_name, v_key)
               FROM mailbox._consumer_group AS g
              WHERE g.outbox_key = v_key AND mailbox._group_partitions(g.group_name, v_key) > 1
              ORDER BY g.group_name;
        END IF;
        v_slotted := v_slotted + mailbox._slot_groups(v_key, v_head);
        v_total := v_total + v_slotted;
        IF v_slotted > 0 AND mailbox._outbox_has_waiter(v_key) THEN
            PERFORM pg_catalog.pg_notify('mailbox_outbox_new', v_name);
        END IF;
    END LOOP;
    RETURN v_total;
END
$$;

-- Takes the numberer's lock, retrying for up to p_wait_ms (a numberer ending its run gives
-- it up). False when another session has it.
CREATE OR REPLACE FUNCTION mailbox._numberer_start(p_wait_ms int)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_until timestamptz := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_wait_ms / 1000.0);
BEGIN
    LOOP
        IF pg_catalog.pg_try_advisory_lock(7168634, 0) THEN
            RETURN true;
        END IF;
        EXIT WHEN pg_catalog.clock_timestamp() >= v_until;
        PERFORM pg_catalog.pg_sleep(0.002);
    END LOOP;
    RETURN false;
END
$$;

-- Whether a consumer waits for a wake-up on some outbox (the numberer then sleeps briefly).
CREATE OR REPLACE FUNCTION mailbox._numberer_has_waiters()
RETURNS boolean
LANGUAGE sql STABLE
SECURITY DEFINER -- reads the waiter table for run_numberer's caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w WHERE w.waiting_until > pg_catalog.now());
$$;

-- The numberer. A procedure, as it commits after every pass; so it takes no SET clause
-- (PostgreSQL refuses transaction control in a procedure with one) and names every object
-- with its schema instead. Run it outside a transaction block: CALL mailbox.run_numberer();
-- pg_cron (schedule_numberer), "pg-mailbox numberer" and the relay run it.
CREATE OR REPLACE PROCEDURE mailbox.run_numberer(p_seconds int DEFAULT 60)
LANGUAGE plpgsql
AS $$
DECLARE
    v_path text := pg_catalog.current_setting('search_path');
    v_end timestamptz;
    v_done bigint;
    v_idle_ms int := 1;
    v_beat timestamptz;
BEGIN
    -- A procedure that commits may not have a SET clause, so the search path is pinned here,
    -- first: pg_cron runs this as the scheduling role, and an operator resolved through the
    -- caller's path (a "/" in public, say) would run as it. Restored when it returns (an
    -- error leaves the pinned path in the session).
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, mailbox, pg_temp', false);
    IF p_seconds IS NULL OR p_seconds < 1 OR p_seconds > 86400 THEN
        PERFORM pg_catalog.set_config('search_path', v_path, false);
        RAISE EXCEPTION 'invalid p_seconds: %', p_seconds
            USING ERRCODE = '22023', HINT = 'Pass 1 to 86400 seconds.';
    END IF;
    -- fails here (2D000) when called inside a transaction block, before taking the lock
    COMMIT;
    IF NOT mailbox._numberer_start(2000) THEN
        RAISE NOTICE 'a numberer is already running in database %', pg_catalog.current_database()
            USING HINT = 'One numberer per database is enough; this call returns at once.';
        PERFORM pg_catalog.set_config('search_path', v_path, false);
        RETURN;
    END IF;
    v_end := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_seconds);
    COMMIT;
    LOOP
        v_done := mailbox._numberer_pass();
        -- the heartbeat at most every 100 ms (polls trust one up to 2 s old)
        IF v_beat IS NULL OR pg_catalog.clock_timestamp() - v_beat >= interval '100 ms' THEN
            PERFORM mailbox._numberer_beat(true);
            v_beat := pg_catalog.clock_timestamp();
        END IF;
        COMMIT;
        EXIT WHEN pg_catalog.clock_timestamp() >= v_end;
        IF v_done > 0 THEN
            v_idle_ms := 1;
        ELSE
            -- idle: 1 ms while a consumer waits (its wake-up latency), backing off to 10 ms
            -- while none does (a busy consumer has rows to work on)
            IF mailbox._numberer_has_waiters() THEN
                v_idle_ms := 1;
            ELSE
                v_idle_ms := least(v_idle_ms * 2, 10);
            END IF;
            PERFORM pg_catalog.pg_sleep(v_idle_ms / 1000.0);
            COMMIT;
        END IF;
    END LOOP;
    PERFORM mailbox._numberer_beat(false);
    COMMIT;
    PERFORM pg_catalog.pg_advisory_unlock(7168634, 0);
    PERFORM pg_catalog.set_config('search_path', v_path, false);
END
$$;
COMMENT ON PROCEDURE mailbox.run_numberer(int) IS -- noqa: LT01
'number new outbox rows and hand them to consumer groups in short transactions of its own, for p_seconds';

-- sql/functions/25_outbox_status.sql
-- Part 25: outbox status (after part 20, whose groups it reports).

CREATE OR REPLACE FUNCTION mailbox._outbox_status_py(p_name text)
RETURNS jsonb
LANGUAGE plpython3u STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "0.2.0":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, outbox_status
return errors.envelope(plpy, outbox_status.outbox_status, p_name)
$$;

CREATE OR REPLACE FUNCTION mailbox.outbox_status(p_name text)
RETURNS jsonb
LANGUAGE sql STABLE
SECURITY DEFINER -- reads extension catalogs and sizes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._unwrap(mailbox._outbox_status_py(p_name));
$$;
COMMENT ON FUNCTION mailbox.outbox_status(text) IS
'health and size of one outbox as jsonb (see docs/outbox.md)';

CREATE OR REPLACE VIEW mailbox.outboxes AS
SELECT o.outbox_name,
       coalesce((SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
                   FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                  WHERE c.oid = o.source_rel), o.source_name) AS source,
       'mailbox.' || pg_catalog.quote_ident(mailbox._outbox_relname(o.outbox_name, 'view')) AS outbox_table,
       o.source_rel IS NULL
           OR (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger AS t
                WHERE t.tgrelid = o.source_rel
                  AND t.tgfoid = pg_catalog.to_regprocedure(mailbox._owner_function(o.outbox_key, 'capture') || '()')
                  AND t.tgenabled <> 'D') = 4
           AS enabled,
       o.retention_hours,
       o.inline_threshold_rows,
       o.head_offset,
       o.created_at,
       (SELECT pg_catalog.count(*) FROM mailbox._consumer_group AS g WHERE g.outbox_key = o.outbox_key)
           AS consumer_group_count
  FROM mailbox._outbox AS o;
COMMENT ON VIEW mailbox.outboxes IS 'every outbox with its source table and settings';

-- sql/functions/26_groups_partitions.sql
-- Part 26: ordered, parallel consumption (SPEC §2.3, issue 9; docs/ordering.md).
--
-- An outbox created with p_partitions > 1 gives each row a partition:
-- abs(hashtext(coalesce(key, ''))) % p_partitions (computed as bigint, so the one hash value
-- whose abs() overflows an int still maps). Nothing stores it: readers compute it from the
-- key as they read the log through the offset chunks (_partition_rows), so producers and
-- the sequencer do the same work as for an unpartitioned outbox. A group
-- then keeps one row per partition (mailbox._partition_lease): the consumer holding it, until
-- when, and the partition's acknowledged and delivered offsets. A partition's rows go only to
-- its holder, in offset order; a poll re-delivers what its holder has in flight before
-- anything new; a partition changes hands only when its lease expired (the new holder starts
-- at the first unacknowledged row) or when its holder gives it up with nothing in flight
-- (rebalancing). Hence per-key order across expiry, crashes and redelivery.
--
-- Polls lock only the partition rows they use, with FOR UPDATE SKIP LOCKED, and never the
-- group row: consumers of different partitions never wait for each other, and a consumer
-- idle in its poll transaction holds back only its own partitions.

-- The outboxes whose groups the caller may read (consume), for the views below; as
-- consumer_lag() lists only those groups.
CREATE OR REPLACE FUNCTION mailbox._readable_group_outboxes()
RETURNS SETOF int
LANGUAGE sql STABLE
SECURITY DEFINER -- reads the group and grant catalogs for a mailbox_consumer caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT k FROM mailbox._consumable_outboxes() AS k;
$$;

-- security_barrier: a caller's own functions in a WHERE clause run only on rows it may see
CREATE OR REPLACE VIEW mailbox.outbox_parked WITH (security_barrier) AS
SELECT p.group_name AS "group", p.outbox_id, p.event_id, p.part AS partition, p.reason, p.parked_at
  FROM mailbox._outbox_parked AS p
  JOIN mailbox._consumer_group AS g ON g.group_name = p.group_name
 WHERE p.unparked_at IS NULL
   AND g.outbox_key IN (SELECT k FROM mailbox._readable_group_outboxes() AS k);
COMMENT ON VIEW mailbox.outbox_parked IS
'rows parked by a consumer group (mailbox.outbox_park), until unparked; of the outboxes the caller may consume';

-- The partition count of an outbox (1: not partitioned).
CREATE OR REPLACE FUNCTION mailbox._outbox_partitions(p_key int)
RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce((SELECT p.partitions FROM mailbox._outbox_partitioning AS p WHERE p.outbox_key = p_key), 1);
$$;

-- p_partitions of create_outbox / enable_outbox: 22023 outside 1 .. 256, 22004 for NULL,
-- with the HINT every argument check gives (1: no partitions, §2.2 semantics).
-- (Not through _check_positive: enable_outbox runs it as the table owner, who may not call
-- that one.)
CREATE OR REPLACE FUNCTION mailbox._check_partitions(p_partitions int)
RETURNS int
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_partitions IS NULL THEN
        RAISE EXCEPTION 'p_partitions must not be null'
            USING ERRCODE = '22004', HINT = 'Pass p_partitions from 1 to 256 (1: no per-key order, §2.2 semantics).';
    END IF;
    IF p_partitions < 1 OR p_partitions > 256 THEN
        RAISE EXCEPTION 'invalid p_partitions: %', p_partitions
            USING ERRCODE = '22023', HINT = 'Pass p_partitions from 1 to 256 (1: no per-key order, §2.2 semantics).';
    END IF;
    RETURN p_partitions;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._set_outbox_partitions(p_name text, p_partitions int)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- records the partition count in the extension catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_partitions(p_partitions);
    IF p_partitions > 1 THEN
        INSERT INTO mailbox._outbox_partitioning (outbox_key, partitions)
        VALUES (mailbox._outbox_key(p_name), p_partitions);
    END IF;
END
$$;

-- The rows with offsets p_first < o <= p_last of an outbox of p_parts partitions, each with
-- its partition and row key, read through the chunks that hold them (a dense chunk by one
-- index range scan of the log, as poll_outbox reads; others by their key slice). Unordered.
CREATE OR REPLACE FUNCTION mailbox._partition_rows(p_key int, p_parts int, p_first bigint, p_last bigint)
RETURNS TABLE (
    outbox_id bigint, event_id uuid, created_at timestamptz, source text, event_type text, key text,
    headers jsonb, inserted_count int, deleted_count int, is_claim_check boolean, full_refresh boolean,
    payload jsonb, partition int, row_id bigint
)
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_from_chunk bigint;
BEGIN
    IF p_last <= p_first THEN
        RETURN;
    END IF;
    v_from_chunk := coalesce((SELECT pg_catalog.max(c.base_offset) FROM mailbox._outbox_chunk AS c
                               WHERE c.outbox_key = p_key AND c.base_offset <= p_first), 0);
    RETURN QUERY
    SELECT c.base_offset + 1 + (l._id - c.first_id),
           l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
           l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload,
           (pg_catalog.abs(pg_catalog.hashtext(coalesce(l.key, ''))::bigint) % p_parts)::int, l._id
      FROM mailbox._outbox_chunk AS c
      JOIN mailbox._outbox_log AS l
        ON l.outbox_key = c.outbox_key
       AND l._id BETWEEN c.first_id + greatest(p_first - c.base_offset, 0)
                     AND c.first_id + least(p_last - c.base_offset, c.row_count) - 1
     WHERE c.outbox_key = p_key AND c.dense
       AND c.base_offset >= v_from_chunk AND c.base_offset < p_last
    UNION ALL
    SELECT s.first_in_chunk + u.n - 1,
           l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
           l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload,
           (pg_catalog.abs(pg_catalog.hashtext(coalesce(l.key, ''))::bigint) % p_parts)::int, l._id
      FROM mailbox._outbox_chunk AS c
     CROSS JOIN LATERAL (
           SELECT greatest(p_first + 1, c.base_offset + 1) AS first_in_chunk,
                  least(p_last, c.base_offset + c.row_count) AS last_in_chunk
     ) AS s
     CROSS JOIN LATERAL pg_catalog.unnest(
           c.ids[(s.first_in_chunk - c.base_offset)::int:(s.last_in_chunk - c.base_offset)::int]
     ) WITH ORDINALITY AS u (id, n)
      JOIN mailbox._outbox_log AS l ON l.outbox_key = c.outbox_key AND l._id = u.id
     WHERE c.outbox_key = p_key AND NOT c.dense
       AND c.base_offset >= v_from_chunk AND c.base_offset < p_last;
END
$$;

-- A partitioned group's offset: the highest H with every row <= H acknowledged (parked rows
-- count as acknowledged). Its first unacknowledged row is the first row, from the lowest
-- acknowledged offset of its partitions on, above its own partition's acknowledged offset:
-- found by reading the log forward from there, a thousand offsets at a time. Callable by
-- consumers for the monitoring views (it reveals no more than they show).
CREATE OR REPLACE FUNCTION mailbox._partitioned_group_offset(p_group text, p_key int)
RETURNS bigint
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads the log for the views of mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    -- the group's count and head (a group draining a partition change: its old count, up
    -- to the boundary, part 28)
    v_parts int := mailbox._group_partitions(p_group, p_key);
    v_ack bigint[] := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_rec record;
    v_from bigint;
    v_head bigint := mailbox._group_head(p_group, p_key);
    v_next bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                    WHERE g.group_name = p_group AND g.outbox_key = p_key) THEN
        RETURN NULL; -- not that group's outbox: nothing to say
    END IF;
    FOR v_rec IN SELECT pl.part, pl.acked_offset FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = p_group LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_from := least(v_from, v_rec.acked_offset);
    END LOOP;
    IF v_from IS NULL THEN
        RETURN v_head;
    END IF;
    WHILE v_from < v_head LOOP
        v_next := (SELECT pg_catalog.min(r.outbox_id)
                     FROM mailbox._partition_rows(p_key, v_parts, v_from, least(v_head, v_from + 1000)) AS r
                    WHERE r.outbox_id > v_ack[r.partition + 1]
                      AND NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                       WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id));
        IF v_next IS NOT NULL THEN
            RETURN v_next - 1;
        END IF;
        v_from := least(v_head, v_from + 1000);
    END LOOP;
    RETURN v_head;
END
$$;

-- Per partition of a partitioned group: rows in flight (delivered, not acknowledged) and lag
-- (rows not acknowledged, parked ones excepted), by one read of the log from the lowest
-- acknowledged offset (mailbox.consumer_partition_lag).
CREATE OR REPLACE FUNCTION mailbox._partition_counts(p_group text)
RETURNS TABLE (part int, in_flight bigint, lag bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads the log for the view of mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_key int := (SELECT g.outbox_key FROM mailbox._consumer_group AS g WHERE g.group_name = p_group);
    v_parts int := mailbox._group_partitions(p_group, v_key); -- (part 28)
    v_ack bigint[] := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_del bigint[] := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_rec record;
    v_from bigint;
BEGIN
    FOR v_rec IN SELECT pl.part, pl.acked_offset, pl.delivered_offset FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = p_group LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_del[v_rec.part + 1] := v_rec.delivered_offset;
        v_from := least(v_from, v_rec.acked_offset);
    END LOOP;
    IF v_from IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.p, coalesce(c.in_flight, 0), coalesce(c.lag, 0)
      FROM pg_catalog.generate_series(0, v_parts - 1) AS s (p)
      LEFT JOIN (
           SELECT r.partition AS p,
                  pg_catalog.count(*) FILTER (WHERE r.outbox_id <= v_del[r.partition + 1]) AS in_flight,
                  pg_catalog.count(*) FILTER (WHERE NOT EXISTS (
                      SELECT 1 FROM mailbox._outbox_parked AS k
                       WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id)) AS lag
             FROM mailbox._partition_rows(v_key, v_parts, v_from, mailbox._group_head(p_group, v_key)) AS r
            WHERE r.outbox_id > v_ack[r.partition + 1]
            GROUP BY r.partition
      ) AS c ON c.p = s.p;
END
$$;

-- Stores the group offset of a partitioned group unless someone holds its row (the next
-- commit or numberer pass does it then). Locks the row only when the value changed.
CREATE OR REPLACE FUNCTION mailbox._store_partitioned_group_offset(p_group text, p_key int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_offset bigint := mailbox._partitioned_group_offset(p_group, p_key);
BEGIN
    IF EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                WHERE g.group_name = p_group AND g.group_offset IS DISTINCT FROM v_offset) THEN
        UPDATE mailbox._consumer_group AS g
           SET group_offset = v_offset, delivered_offset = greatest(g.delivered_offset, v_offset)
         WHERE g.group_name = (SELECT x.group_name FROM mailbox._consumer_group AS x
                                WHERE x.group_name = p_group FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
END
$$;

-- A new group of a partitioned outbox, or one seeked: every partition starts at p_offset.
CREATE OR REPLACE FUNCTION mailbox._reset_partitions(p_group text, p_key int, p_offset bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    DELETE FROM mailbox._partition_lease AS pl WHERE pl.group_name = p_group;
    INSERT INTO mailbox._partition_lease (group_name, part, acked_offset, delivered_offset)
    SELECT p_group, s, p_offset, p_offset
      FROM pg_catalog.generate_series(0, mailbox._outbox_partitions(p_key) - 1) AS s
     WHERE mailbox._outbox_partitions(p_key) > 1;
$$;

-- sql/functions/27_groups_partition_api.sql
-- Part 27: polling in partitioned groups (SPEC §2.3; part 26 has the tables, the commit is
-- in 27_groups_partition_commit.sql and docs/ordering.md has the guarantees).

-- Unparked rows (outbox_unpark) that p_consumer may take now: of its partitions (NULL: any),
-- not leased to a live other consumer. Leases them to it and returns their offsets.
CREATE OR REPLACE FUNCTION mailbox._take_unparked(p_group text, p_consumer text, p_parts int[], p_until timestamptz)
RETURNS bigint[]
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    WITH taken AS (
        UPDATE mailbox._outbox_parked AS k
           SET consumer_id = p_consumer, lease_until = p_until
          FROM (SELECT x.outbox_id FROM mailbox._outbox_parked AS x
                 WHERE x.group_name = p_group AND x.unparked_at IS NOT NULL
                   AND (p_parts IS NULL OR x.part = ANY (p_parts))
                   AND (x.consumer_id IS NULL OR x.consumer_id = p_consumer
                        OR x.lease_until <= pg_catalog.clock_timestamp())
                 ORDER BY x.outbox_id
                   FOR UPDATE SKIP LOCKED) AS t
         WHERE k.group_name = p_group AND k.outbox_id = t.outbox_id
        RETURNING k.outbox_id
    )
    SELECT pg_catalog.array_agg(taken.outbox_id ORDER BY taken.outbox_id) FROM taken;
$$;

CREATE OR REPLACE FUNCTION mailbox._poll_partitioned(
    p_group text, p_consumer text, p_batch_size int, p_visibility_seconds int, p_key int, p_parts int
)
RETURNS TABLE (
    outbox_id bigint, event_id uuid, created_at timestamptz, source text, event_type text, key text,
    headers jsonb, inserted_count int, deleted_count int, is_claim_check boolean, full_refresh boolean,
    payload jsonb, partition int
)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
-- offsets are read in index order and rows by index probes: a backlog numbered moments ago
-- has no statistics yet, and the planner's bitmap scans, sorts and hash joins over the whole
-- outbox cost far more than the batch
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_until timestamptz;
    v_live int;
    v_share int;
    v_mine int[];
    v_released int[];
    v_rec record;
    v_ack bigint[];
    v_del bigint[];
    v_min bigint;
    v_max bigint;
    v_offs bigint[];
    v_rows bigint[];
    v_sel int[];
    v_unparked bigint[];
    v_parked boolean;
    v_head bigint;
    v_end bigint;
    v_from bigint;
    v_span bigint;
    v_numbered boolean;
    v_fast boolean := FALSE;
    v_take int[];
BEGIN
    INSERT INTO mailbox._consumer AS c (group_name, consumer_id)
    VALUES (p_group, p_consumer)
    ON CONFLICT (group_name, consumer_id) DO NOTHING;
    v_now := pg_catalog.clock_timestamp();
    v_until := v_now + pg_catalog.make_interval(secs => p_visibility_seconds);

    -- Fair share: the partitions over the consumers heard from within this visibility
    -- timeout (a silent consumer's leases expire in that time too).
    v_live := (SELECT pg_catalog.count(*) FROM mailbox._consumer AS c
                WHERE c.group_name = p_group AND c.reaped_at IS NULL
                  AND (c.consumer_id = p_consumer
                       OR c.last_heartbeat_at > v_now - pg_catalog.make_interval(secs => p_visibility_seconds)));
    v_share := (p_parts + greatest(v_live, 1) - 1) / greatest(v_live, 1);
    -- Own partitions (sticky). One locked by another process under this id is left to it.
    v_mine := ARRAY(SELECT pl.part FROM mailbox._partition_lease AS pl
                     WHERE pl.group_name = p_group AND pl.consumer_id = p_consumer
                     ORDER BY pl.part FOR UPDATE SKIP LOCKED);
    IF pg_catalog.cardinality(v_mine) > v_share THEN
        -- a consumer joined: give up the highest partitions with nothing in flight
        WITH extra AS (
            SELECT pl.part FROM mailbox._partition_lease AS pl
             WHERE pl.group_name = p_group AND pl.part = ANY (v_mine)
               AND pl.delivered_offset = pl.acked_offset
             ORDER BY pl.part DESC
             LIMIT pg_catalog.cardinality(v_mine) - v_share
        ), freed AS (
            UPDATE mailbox._partition_lease AS pl SET consumer_id = NULL, lease_until = NULL
              FROM extra WHERE pl.group_name = p_group AND pl.part = extra.part
            RETURNING pl.part
        )
        SELECT pg_catalog.array_agg(freed.part) INTO v_released FROM freed;
        v_mine := ARRAY(SELECT m FROM pg_catalog.unnest(v_mine) AS m
                         WHERE NOT m = ANY (coalesce(v_released, '{}')) ORDER BY m);
    END IF;
    -- Free partitions up to the fair share, and every partition whose lease expired (its
    -- holder stopped polling, even if it still heartbeats: its rows are delivered again,
    -- SPEC §2.2.2; once nothing is in flight, the share rule hands extra ones back).
    v_take := ARRAY(SELECT pl.part FROM mailbox._partition_lease AS pl
                     WHERE pl.group_name = p_group AND pl.consumer_id <> p_consumer AND pl.lease_until <= v_now
                     ORDER BY pl.part
                       FOR UPDATE SKIP LOCKED);
    IF pg_catalog.cardinality(v_mine) < v_share THEN
        v_take := v_take || ARRAY(SELECT pl.part FROM mailbox._partition_lease AS pl
                                   WHERE pl.group_name = p_group AND pl.consumer_id IS NULL
                                   ORDER BY pl.part
                                   LIMIT v_share - pg_catalog.cardinality(v_mine)
                                     FOR UPDATE SKIP LOCKED);
    END IF;
    FOR v_rec IN
        SELECT pl.part, pl.consumer_id, pl.acked_offset, pl.delivered_offset
          FROM mailbox._partition_lease AS pl
         WHERE pl.group_name = p_group AND pl.part = ANY (v_take)
         ORDER BY pl.part
    LOOP
        IF v_rec.consumer_id IS NOT NULL AND v_rec.delivered_offset > v_rec.acked_offset THEN
            -- fencing: what the old holder had in flight is delivered again from here
            INSERT INTO mailbox._lost_lease AS x (group_name, consumer_id, first_offset, last_offset)
            SELECT p_group, v_rec.consumer_id, v_rec.acked_offset + 1, v_rec.delivered_offset
             WHERE EXISTS (SELECT 1 FROM mailbox._consumer AS c
                            WHERE c.group_name = p_group AND c.consumer_id = v_rec.consumer_id)
            ON CONFLICT (group_name, consumer_id, first_offset)
            DO UPDATE SET last_offset = greatest(x.last_offset, excluded.last_offset);
        END IF;
        UPDATE mailbox._partition_lease AS pl
           SET consumer_id = p_consumer, delivered_offset = pl.acked_offset
         WHERE pl.group_name = p_group AND pl.part = v_rec.part;
        v_mine := v_mine || v_rec.part;
    END LOOP;
    -- The partition count may have changed since the caller read it (part 28): a switch
    -- locks every partition row, so once this poll holds one, the count read now stays.
    IF pg_catalog.cardinality(v_mine) > 0
       AND coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                    (SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = p_key), 1) <> p_parts THEN
        RETURN QUERY SELECT * FROM mailbox._poll_partitioned(
            p_group, p_consumer, p_batch_size, p_visibility_seconds, p_key, mailbox._group_partitions(p_group, p_key));
        RETURN;
    END IF;
    IF pg_catalog.cardinality(v_mine) = 0 THEN
        INSERT INTO mailbox._outbox_waiter AS w (outbox_key, group_name, consumer_id, waiting_until)
        VALUES (p_key, p_group, p_consumer, v_now + least(mailbox._heartbeat_timeout(), interval '60 seconds'))
        ON CONFLICT (outbox_key, group_name, consumer_id) DO UPDATE SET waiting_until = excluded.waiting_until;
        RETURN;
    END IF;
    -- (every path below renews the leases of v_mine, in one UPDATE with what else it writes)

    -- rows an operator unparked come first, alone
    v_parked := EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k WHERE k.group_name = p_group);
    IF v_parked AND EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                             WHERE k.group_name = p_group AND k.unparked_at IS NOT NULL) THEN
        v_unparked := mailbox._take_unparked(p_group, p_consumer, v_mine, v_until);
    END IF;
    IF v_unparked IS NOT NULL THEN
        UPDATE mailbox._partition_lease AS pl SET lease_until = v_until
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
        RETURN QUERY
        SELECT k.outbox_id, k.event_id, k.created_at, k.source, k.event_type, k.key, k.headers,
               k.inserted_count, k.deleted_count, k.is_claim_check, k.full_refresh, k.payload, k.part
          FROM mailbox._outbox_parked AS k
         WHERE k.group_name = p_group AND k.outbox_id = ANY (v_unparked)
         ORDER BY k.outbox_id;
        RETURN;
    END IF;

    -- per partition (index part + 1): acknowledged and delivered offsets; NULL: not ours
    v_ack := pg_catalog.array_fill(NULL::bigint, ARRAY[p_parts]);
    v_del := pg_catalog.array_fill(NULL::bigint, ARRAY[p_parts]);
    FOR v_rec IN SELECT pl.part, pl.acked_offset, pl.delivered_offset FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_del[v_rec.part + 1] := v_rec.delivered_offset;
    END LOOP;
    -- In flight (delivered, not acknowledged, not parked): delivered again, before anything
    -- new. A partition whose in-flight range holds no such row is acknowledged up to it.
    SELECT pg_catalog.min(u.a), pg_catalog.max(u.d) INTO v_min, v_max
      FROM ROWS FROM (pg_catalog.unnest(v_ack), pg_catalog.unnest(v_del)) AS u (a, d) WHERE u.d > u.a;
    IF v_min IS NOT NULL THEN
        SELECT pg_catalog.array_agg(w.outbox_id ORDER BY w.outbox_id), pg_catalog.array_agg(w.row_id ORDER BY w.outbox_id),
               pg_catalog.array_agg(w.partition ORDER BY w.outbox_id)
          INTO v_offs, v_rows, v_sel
          FROM (SELECT r.outbox_id, r.row_id, r.partition
                  FROM mailbox._partition_rows(p_key, p_parts, v_min, v_max) AS r
                 WHERE r.outbox_id > v_ack[r.partition + 1] AND r.outbox_id <= v_del[r.partition + 1]
                   AND (NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                                     WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id))
                 ORDER BY r.outbox_id LIMIT p_batch_size) AS w;
    END IF;
    IF v_offs IS NOT NULL THEN
        UPDATE mailbox._partition_lease AS pl SET lease_until = v_until
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
    ELSE
        UPDATE mailbox._partition_lease AS pl SET acked_offset = pl.delivered_offset
         WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) AND pl.delivered_offset > pl.acked_offset;
        FOR v_rec IN SELECT pl.part, pl.acked_offset FROM mailbox._partition_lease AS pl
                      WHERE pl.group_name = p_group AND pl.part = ANY (v_mine) LOOP
            v_ack[v_rec.part + 1] := v_rec.acked_offset;
        END LOOP;
        SELECT pg_catalog.min(a), pg_catalog.max(a) INTO v_min, v_max FROM pg_catalog.unnest(v_ack) AS a;
        -- without a numberer, this poll numbers when its own partitions are near the head
        -- (the head capped at the boundary of a partition change the group drains: _group_head
        -- of part 28, inlined as every read of the head below)
        v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                              WHERE x.group_name = p_group))
                     FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
        -- (and, below, when it read the log up to the head without filling its batch)
        v_numbered := mailbox._numberer_alive();
        IF NOT v_numbered AND v_head < v_min + p_batch_size THEN
            PERFORM mailbox._sequence_outbox(p_key, greatest(p_batch_size, 1000));
            v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                                  WHERE x.group_name = p_group))
                         FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
            v_numbered := TRUE;
        END IF;
        IF pg_catalog.cardinality(v_mine) = p_parts AND v_min = v_max THEN
            -- this consumer holds every partition, each acknowledged up to the same offset:
            -- its next rows are simply the next offsets, read as an unpartitioned poll does
            v_end := least(v_head, v_min + p_batch_size);
            v_fast := v_end > v_min;
        ELSE
            -- the next rows of this consumer's partitions, in offset order: the log is read
            -- forward from the lowest acknowledged offset, a span at a time (the span that
            -- holds a batch when the keys spread evenly), up to the head
            v_offs := '{}';
            v_span := greatest(p_batch_size, p_batch_size * p_parts / pg_catalog.cardinality(v_mine));
            v_from := v_min;
            LOOP
                v_end := least(v_head, v_from + v_span);
                IF v_end > v_from THEN
                    SELECT v_offs || pg_catalog.array_agg(w.outbox_id ORDER BY w.outbox_id),
                           v_rows || pg_catalog.array_agg(w.row_id ORDER BY w.outbox_id),
                           v_sel || pg_catalog.array_agg(w.partition ORDER BY w.outbox_id)
                      INTO v_offs, v_rows, v_sel
                      FROM (SELECT r.outbox_id, r.row_id, r.partition
                              FROM mailbox._partition_rows(p_key, p_parts, v_from, v_end) AS r
                             WHERE r.outbox_id > v_ack[r.partition + 1]
                               AND (NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                                                 WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id))
                             ORDER BY r.outbox_id LIMIT p_batch_size - pg_catalog.cardinality(v_offs)) AS w;
                END IF;
                IF pg_catalog.cardinality(v_offs) >= p_batch_size THEN
                    v_end := v_offs[pg_catalog.cardinality(v_offs)];
                    EXIT;
                END IF;
                v_from := v_end;
                IF v_from >= v_head THEN
                    -- read to the head: number what committed since (once), unless a numberer does
                    EXIT WHEN v_numbered;
                    v_numbered := TRUE;
                    EXIT WHEN mailbox._sequence_outbox(p_key, greatest(p_batch_size, 1000)) = 0;
                    v_head := (SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                                          WHERE x.group_name = p_group))
                                 FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
                END IF;
            END LOOP;
            IF pg_catalog.cardinality(v_offs) = 0 THEN
                v_offs := NULL;
            END IF;
        END IF;
        IF NOT v_fast AND v_offs IS NULL THEN
            -- nothing new: none of its partitions has a row up to v_end
            UPDATE mailbox._partition_lease AS pl
               SET acked_offset = greatest(pl.acked_offset, v_end),
                   delivered_offset = greatest(pl.acked_offset, v_end), lease_until = v_until
             WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
            INSERT INTO mailbox._outbox_waiter AS w (outbox_key, group_name, consumer_id, waiting_until)
            VALUES (p_key, p_group, p_consumer, v_now + least(mailbox._heartbeat_timeout(), interval '60 seconds'))
            ON CONFLICT (outbox_key, group_name, consumer_id) DO UPDATE SET waiting_until = excluded.waiting_until;
            RETURN;
        END IF;
        IF v_fast THEN
            -- every partition is delivered up to v_end: its rows there are those returned
            UPDATE mailbox._partition_lease AS pl
               SET delivered_offset = v_end, lease_until = v_until
             WHERE pl.group_name = p_group AND pl.part = ANY (v_mine);
        ELSE
            -- a partition with rows in the batch is delivered up to its last one; one without
            -- has no row up to v_end, so it is acknowledged that far (its commit then leaves
            -- nothing in flight, and rebalancing may hand it over)
            UPDATE mailbox._partition_lease AS pl
               SET delivered_offset = coalesce(m.last_offset, greatest(pl.acked_offset, v_end)),
                   acked_offset = CASE WHEN m.last_offset IS NULL THEN greatest(pl.acked_offset, v_end)
                                       ELSE pl.acked_offset END,
                   lease_until = v_until
              FROM pg_catalog.unnest(v_mine) AS mine (part)
              LEFT JOIN (SELECT u.part, pg_catalog.max(u.o) AS last_offset
                           FROM ROWS FROM (pg_catalog.unnest(v_sel), pg_catalog.unnest(v_offs)) AS u (part, o)
                          GROUP BY u.part) AS m ON m.part = mine.part
             WHERE pl.group_name = p_group AND pl.part = mine.part;
        END IF;
    END IF;
    DELETE FROM mailbox._outbox_waiter AS w
     WHERE w.outbox_key = p_key AND w.group_name = p_group AND w.consumer_id = p_consumer;
    IF v_fast THEN
        RETURN QUERY
        SELECT r.outbox_id, r.event_id, r.created_at, r.source, r.event_type, r.key, r.headers,
               r.inserted_count, r.deleted_count, r.is_claim_check, r.full_refresh, r.payload, r.partition
          FROM mailbox._partition_rows(p_key, p_parts, v_min, v_end) AS r
         WHERE NOT v_parked OR NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                            WHERE k.group_name = p_group AND k.outbox_id = r.outbox_id)
         ORDER BY r.outbox_id;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT u.o, l.event_id, l.created_at, l.source, l.event_type, l.key, l.headers,
           l.inserted_count, l.deleted_count, l.is_claim_check, l.full_refresh, l.payload, u.part
      FROM ROWS FROM (pg_catalog.unnest(v_offs), pg_catalog.unnest(v_rows), pg_catalog.unnest(v_sel)) AS u (o, row_id, part)
     CROSS JOIN LATERAL (
           -- one index probe per row (LIMIT keeps the planner from joining the whole log)
           SELECT x.* FROM mailbox._outbox_log AS x WHERE x.outbox_key = p_key AND x._id = u.row_id LIMIT 1
     ) AS l
     ORDER BY u.o;
END
$$;

-- sql/functions/27_groups_partition_commit.sql
-- Part 27 (continued): committing in partitioned groups, and per-partition lag (SPEC §2.3;
-- part 26 has the tables, docs/ordering.md the guarantees).

-- commit_offset for a partitioned group (its caller locked the consumer row and checked it).
CREATE OR REPLACE FUNCTION mailbox._commit_partitioned(
    p_group text, p_consumer text, p_last_offset bigint, p_key int, p_committed bigint
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
-- offsets are read in index order and rows by index probes: a backlog numbered moments ago
-- has no statistics yet, and the planner's bitmap scans, sorts and hash joins over the whole
-- outbox cost far more than the batch
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_n bigint;
    v_unparked bigint;
    v_rec record;
    v_ack bigint[];
    v_del bigint[];
    v_parts int[] := '{}';
    v_min bigint;
    v_last bigint;
    v_parts_n int;
BEGIN
    PERFORM mailbox._require(p_last_offset, 'p_last_offset');
    IF p_last_offset < 0 THEN
        RAISE EXCEPTION 'invalid p_last_offset: %', p_last_offset
            USING ERRCODE = '22023',
                  HINT = 'Pass the offset (outbox_id) of the last row processed; offsets start at 1.';
    END IF;
    -- each partition this consumer holds acknowledges its in-flight rows up to the offset,
    -- counted in one index range scan
    v_ack := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    v_del := pg_catalog.array_fill(NULL::bigint, ARRAY[256]);
    FOR v_rec IN
        SELECT pl.part, pl.acked_offset, pl.delivered_offset FROM mailbox._partition_lease AS pl
         WHERE pl.group_name = p_group AND pl.consumer_id = p_consumer
           AND pl.delivered_offset > pl.acked_offset AND pl.acked_offset < p_last_offset
         ORDER BY pl.part
           FOR UPDATE
    LOOP
        v_ack[v_rec.part + 1] := v_rec.acked_offset;
        v_del[v_rec.part + 1] := least(v_rec.delivered_offset, p_last_offset);
        v_parts := v_parts || v_rec.part;
        v_min := least(v_min, v_rec.acked_offset);
    END LOOP;
    v_n := 0;
    IF v_min IS NOT NULL THEN
        -- the group's count (_group_partitions of part 28, inlined)
        v_parts_n := coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                              (SELECT x.partitions FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = p_key));
        v_last := (SELECT pg_catalog.max(d) FROM pg_catalog.unnest(v_del) AS d);
        IF pg_catalog.cardinality(v_parts) = v_parts_n
           AND v_min = (SELECT pg_catalog.max(a) FROM pg_catalog.unnest(v_ack) AS a)
           AND v_last = (SELECT pg_catalog.min(d) FROM pg_catalog.unnest(v_del) AS d) THEN
            -- it holds every partition, all with the same range in flight: every offset of
            -- the range is a row it acknowledges now, except the parked ones
            v_n := v_last - v_min
                   - (SELECT pg_catalog.count(*) FROM mailbox._outbox_parked AS k
                       WHERE k.group_name = p_group AND k.outbox_id > v_min AND k.outbox_id <= v_last);
        ELSE
            v_n := (SELECT pg_catalog.count(*) FROM mailbox._partition_rows(p_key, v_parts_n, v_min, v_last) AS x
                     WHERE x.outbox_id > v_ack[x.partition + 1] AND x.outbox_id <= v_del[x.partition + 1]
                       -- a parked row was acknowledged by outbox_park (an unparked one below)
                       AND NOT EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                        WHERE k.group_name = p_group AND k.outbox_id = x.outbox_id));
        END IF;
        UPDATE mailbox._partition_lease AS pl SET acked_offset = least(pl.delivered_offset, p_last_offset)
         WHERE pl.group_name = p_group AND pl.part = ANY (v_parts);
    END IF;
    WITH gone AS (
        DELETE FROM mailbox._outbox_parked AS k
         WHERE k.group_name = p_group AND k.consumer_id = p_consumer AND k.unparked_at IS NOT NULL
           AND k.outbox_id <= p_last_offset
        RETURNING 1
    )
    SELECT pg_catalog.count(*) INTO v_unparked FROM gone;
    v_n := v_n + v_unparked;
    DELETE FROM mailbox._lost_lease AS x
     WHERE x.group_name = p_group AND x.consumer_id = p_consumer AND x.first_offset <= p_last_offset;
    IF FOUND THEN
        RAISE WARNING 'lease lost: consumer % of group % no longer holds some offsets up to %',
            p_consumer, p_group, p_last_offset
            USING DETAIL = 'Its partition lease expired and the partition moved to another consumer.',
                  HINT = 'Extend leases with mailbox.extend_lease() while a batch takes longer than its visibility timeout.';
    END IF;
    IF v_n = 0 AND p_last_offset < p_committed THEN
        PERFORM mailbox._touch_consumer(p_group, p_consumer);
        RAISE WARNING 'commit below committed offset: consumer % of group % is at %, got %',
            p_consumer, p_group, p_committed, p_last_offset
            USING HINT = 'Nothing was acknowledged; offsets only move forward (use mailbox.seek_offset() to move back).';
        RETURN 0;
    END IF;
    UPDATE mailbox._consumer
       SET committed_offset = greatest(committed_offset,
                                       least(p_last_offset, (SELECT o.head_offset FROM mailbox._outbox AS o
                                                               WHERE o.outbox_key = p_key))),
           last_commit_at = pg_catalog.now(),
           last_heartbeat_at = pg_catalog.now(), unhealthy_since = NULL, reaped_at = NULL
     WHERE group_name = p_group AND consumer_id = p_consumer;
    -- the stored group offset (retention, consumer_group_lag) follows every few thousand
    -- offsets and every numberer pass; consumer_lag() computes it afresh
    IF v_n > 0 AND p_last_offset / 5000 <> p_committed / 5000 THEN
        PERFORM mailbox._store_partitioned_group_offset(p_group, p_key);
    END IF;
    RETURN v_n;
END
$$;

CREATE OR REPLACE VIEW mailbox.consumer_partition_lag AS
SELECT pl.group_name, pl.part AS partition, pl.consumer_id,
       pl.lease_until > pg_catalog.now() AS leased, pl.lease_until, pl.acked_offset, pl.delivered_offset,
       n.in_flight, n.lag
  FROM mailbox._consumer_group AS g
 CROSS JOIN LATERAL mailbox._partition_counts(g.group_name) AS n
  JOIN mailbox._partition_lease AS pl ON pl.group_name = g.group_name AND pl.part = n.part;
COMMENT ON VIEW mailbox.consumer_partition_lag IS
'per partition of each partitioned group: holder, acknowledged and delivered offsets, rows in flight, lag';

-- sql/functions/28_groups_park.sql
-- Part 28: parking poison rows (SPEC §2.3; docs/ordering.md#parking). A parked row is copied
-- into mailbox._outbox_parked (part 26), so retention may drain the log past it; polls skip
-- it; outbox_unpark hands it to a consumer again (the holder of its partition), and that
-- consumer's commit acknowledges it.

CREATE OR REPLACE FUNCTION mailbox.outbox_park(p_group text, p_consumer text, p_outbox_id bigint, p_reason text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers record poison rows only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := mailbox._group_outbox(p_group);
    v_part int;
    v_row bigint;
    v_held boolean;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'consume');
    PERFORM mailbox._touch_consumer(p_group, p_consumer);
    PERFORM mailbox._require(p_outbox_id, 'p_outbox_id');
    IF mailbox._group_partitions(p_group, v_key) > 1 THEN
        SELECT r.partition, r.row_id INTO v_part, v_row
          FROM mailbox._partition_rows(v_key, mailbox._group_partitions(p_group, v_key), p_outbox_id - 1, p_outbox_id) AS r;
        v_held := EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                           WHERE pl.group_name = p_group AND pl.part = v_part AND pl.consumer_id = p_consumer
                             AND pl.acked_offset < p_outbox_id AND p_outbox_id <= pl.delivered_offset);
    ELSE
        v_part := 0;
        v_row := mailbox._row_at_offset(v_key, p_outbox_id);
        v_held := EXISTS (SELECT 1 FROM mailbox._lease AS l
                           WHERE l.group_name = p_group AND l.consumer_id = p_consumer
                             AND p_outbox_id BETWEEN l.first_offset AND l.last_offset);
    END IF;
    -- an unparked row delivered to this consumer again may be parked again
    v_held := v_held OR EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                 WHERE k.group_name = p_group AND k.outbox_id = p_outbox_id
                                   AND k.consumer_id = p_consumer AND k.unparked_at IS NOT NULL);
    IF NOT v_held THEN
        RAISE EXCEPTION 'row % of group % is not leased to consumer %', p_outbox_id, p_group, p_consumer
            USING ERRCODE = '55000',
                  HINT = 'Park a row this consumer received from mailbox.poll_outbox() and has not committed.';
    END IF;
    INSERT INTO mailbox._outbox_parked AS k (
        group_name, outbox_id, event_id, part, reason, parked_by, created_at, source, event_type, key,
        headers, inserted_count, deleted_count, is_claim_check, full_refresh, payload)
    SELECT p_group, p_outbox_id, l.event_id, v_part, p_reason, p_consumer, l.created_at, l.source,
           l.event_type, l.key, l.headers, l.inserted_count, l.deleted_count, l.is_claim_check,
           l.full_refresh, l.payload
      FROM mailbox._outbox_log AS l
     WHERE l.outbox_key = v_key AND l._id = v_row
    ON CONFLICT (group_name, outbox_id) DO UPDATE
       SET reason = excluded.reason, parked_by = excluded.parked_by, parked_at = pg_catalog.now(),
           unparked_at = NULL, consumer_id = NULL, lease_until = NULL;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_park(text, text, bigint, text) IS
'set aside a row this consumer cannot process: the rows after it in its partition flow again';

CREATE OR REPLACE FUNCTION mailbox.outbox_unpark(p_group text, p_outbox_id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers release parked rows only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._authorize('outbox', mailbox._group_outbox(p_group), 'consume');
    PERFORM mailbox._require(p_outbox_id, 'p_outbox_id');
    UPDATE mailbox._outbox_parked AS k
       SET unparked_at = pg_catalog.now(), consumer_id = NULL, lease_until = NULL
     WHERE k.group_name = p_group AND k.outbox_id = p_outbox_id AND k.unparked_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'row % of group % is not parked', p_outbox_id, p_group
            USING ERRCODE = '42704', HINT = 'mailbox.outbox_parked lists the parked rows.';
    END IF;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_unpark(text, bigint) IS
'deliver a parked row again (to the consumer holding its partition); acknowledged by that consumer''s commit';

-- sql/functions/28_groups_partition_alter.sql
-- Part 28 (continued): changing the partition count of an outbox while its consumers run
-- (issue 13; docs/ordering.md#changing-the-partition-count).
--
-- A row's partition is computed from its key with the count in force (part 26), so changing
-- the count moves keys between partitions. Per-key order must hold inside every group across
-- the change, so each group changes layout at an epoch boundary:
--
--   * alter_outbox_partitions() holds the sequencer's lock (the _outbox row, part 18) while it
--     records the new count, so no row is numbered during the change: the head at that moment
--     is the boundary B. Rows committed but not numbered yet get offsets above B afterwards.
--   * Each group of the outbox gets a row here: it keeps its old layout for the rows up to B
--     and hands out nothing above B (polls read the head capped at B, _group_head; the
--     numberer slots only up to B) until every row up to B is acknowledged or parked.
--   * Then the group switches (_finish_partition_change): its partitions are rebuilt for the
--     new count, all at B, and rows above B are delivered in the new layout. A group with
--     nothing in flight up to B switches at once, in the ALTER's own transaction; later, the
--     numberer's pass switches it while a numberer runs (in its own short transaction: a
--     poll transaction left open must not hold the group's new partitions), else a poll.
--
-- So a key that moves to another partition never has a row above B delivered while one of
-- its rows up to B is leased, unacknowledged or delivered again: the price is a pause in new
-- rows for a group until its consumers have committed what they hold (at most one
-- visibility timeout when one of them died). A group changes layout only while it can lock,
-- without waiting, every row its polls and commits lock (group row, leases, partition
-- leases); a consumer whose poll transaction is open defers the switch to a later poll, a
-- later commit's poll or the next numberer pass, never blocks on it.
--
-- A group still draining an earlier change when the count changes again keeps its old
-- layout and boundary: it has delivered nothing above its boundary, so it switches straight
-- to the newest count (and needs no switch at all when that is its own count again).

-- The partition count a group uses now: its old one while it drains a change, else its
-- outbox's.
CREATE OR REPLACE FUNCTION mailbox._group_partitions(p_group text, p_key int)
RETURNS int
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT coalesce((SELECT x.partitions FROM mailbox._partition_change AS x WHERE x.group_name = p_group),
                    mailbox._outbox_partitions(p_key));
$$;

-- The head as a group may read it: the outbox's head, capped at the boundary of a change the
-- group still drains. One statement, so the cap and the head come from one snapshot: a head
-- above a boundary was numbered after the change committed, and then the cap is seen too.
CREATE OR REPLACE FUNCTION mailbox._group_head(p_group text, p_key int)
RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT least(o.head_offset, (SELECT x.boundary FROM mailbox._partition_change AS x
                                  WHERE x.group_name = p_group))
      FROM mailbox._outbox AS o WHERE o.outbox_key = p_key;
$$;

-- Whether every row of a draining group up to its boundary is acknowledged (or parked).
-- Not p_exact: only what the partition rows say (every partition acknowledged up to the
-- boundary, which polls finding nothing more up to it record), without reading the log.
CREATE OR REPLACE FUNCTION mailbox._partition_change_drained(
    p_group text, p_key int, p_parts int, p_boundary bigint, p_exact boolean
)
RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF p_parts = 1 THEN
        -- offset ranges (part 20): every row up to the boundary handed out and acknowledged
        RETURN (SELECT mailbox._group_offset(g.group_name, g.delivered_offset) >= p_boundary
                  FROM mailbox._consumer_group AS g WHERE g.group_name = p_group);
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                WHERE pl.group_name = p_group AND pl.delivered_offset > pl.acked_offset) THEN
        RETURN false; -- rows in flight (a cheap answer before reading the log)
    END IF;
    IF NOT p_exact THEN
        RETURN NOT EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                            WHERE pl.group_name = p_group AND pl.acked_offset < p_boundary);
    END IF;
    -- (capped at the boundary while the group drains)
    RETURN mailbox._partitioned_group_offset(p_group, p_key) >= p_boundary;
END
$$;

-- Switches a draining group to its outbox's partition count once its old layout drained,
-- without waiting for any lock (see above). True when it switched now. p_exact: see
-- _partition_change_drained (the numberer, which tries every pass, does not read the log).
CREATE OR REPLACE FUNCTION mailbox._finish_partition_change(p_group text, p_key int, p_exact boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_change mailbox._partition_change;
    v_parts int;
BEGIN
    SELECT * INTO v_change FROM mailbox._partition_change AS x WHERE x.group_name = p_group;
    IF NOT FOUND
       OR NOT mailbox._partition_change_drained(p_group, p_key, v_change.partitions, v_change.boundary, p_exact) THEN
        RETURN false;
    END IF;
    -- A subtransaction: when a lock is taken or the group is not drained after all, it rolls
    -- back and releases what it locked (a poll transaction left open must not keep every
    -- partition of its group locked).
    BEGIN
        PERFORM FROM mailbox._consumer_group AS g WHERE g.group_name = p_group FOR NO KEY UPDATE NOWAIT;
        PERFORM FROM mailbox._partition_lease AS pl WHERE pl.group_name = p_group
          ORDER BY pl.part FOR UPDATE NOWAIT;
        PERFORM FROM mailbox._lease AS l WHERE l.group_name = p_group ORDER BY l.first_offset FOR UPDATE NOWAIT;
        SELECT * INTO v_change FROM mailbox._partition_change AS x WHERE x.group_name = p_group FOR UPDATE NOWAIT;
        IF NOT FOUND
           OR NOT mailbox._partition_change_drained(p_group, p_key, v_change.partitions, v_change.boundary, p_exact) THEN
            RAISE EXCEPTION 'partition change of group % not drained', p_group USING ERRCODE = 'MBX01';
        END IF;
        v_parts := mailbox._outbox_partitions(p_key);
        DELETE FROM mailbox._partition_change AS x WHERE x.group_name = p_group;
        -- nothing is leased up to the boundary (drained) nor above it (capped)
        DELETE FROM mailbox._lease AS l WHERE l.group_name = p_group;
        PERFORM mailbox._reset_partitions(p_group, p_key, v_change.boundary); -- the new count's partitions
        UPDATE mailbox._consumer_group AS g SET group_offset = v_change.boundary, delivered_offset = v_change.boundary
         WHERE g.group_name = p_group;
        -- parked rows belong to their key's partition in the new layout
        UPDATE mailbox._outbox_parked AS k
           SET part = (pg_catalog.abs(pg_catalog.hashtext(coalesce(k.key, ''))::bigint) % v_parts)::int
         WHERE k.group_name = p_group;
    EXCEPTION WHEN lock_not_available OR SQLSTATE 'MBX01' THEN
        RETURN false;
    END;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.alter_outbox_partitions(p_outbox text, p_partitions int)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- changes the extension catalog for mailbox_admin; runs no caller code
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_old int;
    v_boundary bigint;
BEGIN
    PERFORM mailbox._check_partitions(p_partitions);
    v_key := mailbox._outbox_key(p_outbox); -- 22004, 42704
    -- against drop_outbox, create_consumer_group and another change
    PERFORM mailbox._ddl_lock();
    -- The sequencer's lock (part 18), waited for: no row gets an offset until this commits,
    -- so the head now is the boundary and every row numbered later lies above it.
    SELECT o.head_offset INTO v_boundary FROM mailbox._outbox AS o WHERE o.outbox_key = v_key FOR NO KEY UPDATE;
    v_old := mailbox._outbox_partitions(v_key);
    IF v_old = p_partitions THEN
        RETURN;
    END IF;
    -- a new row version: a REPEATABLE READ poll whose snapshot predates this change, and
    -- would number rows above the boundary without seeing it, fails with 40001 instead
    UPDATE mailbox._outbox AS o SET head_offset = v_boundary WHERE o.outbox_key = v_key;
    DELETE FROM mailbox._outbox_partitioning AS x WHERE x.outbox_key = v_key;
    IF p_partitions > 1 THEN
        INSERT INTO mailbox._outbox_partitioning (outbox_key, partitions) VALUES (v_key, p_partitions);
    END IF;
    -- every group drains its old layout up to the boundary; one already draining an earlier
    -- change keeps that (see above), and needs none when the count returns to its own
    INSERT INTO mailbox._partition_change (group_name, partitions, boundary)
    SELECT g.group_name, v_old, v_boundary FROM mailbox._consumer_group AS g WHERE g.outbox_key = v_key
    ON CONFLICT (group_name) DO NOTHING;
    DELETE FROM mailbox._partition_change AS x
     USING mailbox._consumer_group AS g
     WHERE g.group_name = x.group_name AND g.outbox_key = v_key AND x.partitions = p_partitions;
    -- groups with nothing in flight up to the boundary switch now
    PERFORM mailbox._finish_partition_change(g.group_name, v_key, TRUE)
       FROM mailbox._consumer_group AS g WHERE g.outbox_key = v_key ORDER BY g.group_name;
END
$$;
COMMENT ON FUNCTION mailbox.alter_outbox_partitions(text, int) IS
'change the partition count of an outbox: offsets stay, per-key order holds in every group across the change';

-- sql/functions/29_groups_views.sql
-- Part 29: the consumer-group monitoring views (SPEC §2.1; consumer_lag() is part 23). After
-- part 27: a partitioned group's offset and rows in flight come from its partitions' state
-- (mailbox._partitioned_group_offset, mailbox.consumer_partition_lag), so the views and
-- consumer_lag() agree.

CREATE OR REPLACE VIEW mailbox.consumer_status AS
SELECT c.group_name, c.consumer_id, o.outbox_name, c.committed_offset,
       CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl WHERE pl.group_name = g.group_name)
            THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
            ELSE coalesce((SELECT pg_catalog.min(l.first_offset) - 1 FROM mailbox._lease AS l
                            WHERE l.group_name = g.group_name), g.delivered_offset)
       END AS group_offset,
       coalesce((SELECT pg_catalog.sum(l.last_offset - l.first_offset + 1) FROM mailbox._lease AS l
                  WHERE l.group_name = c.group_name AND l.consumer_id = c.consumer_id
                    AND l.lease_until > pg_catalog.now()), 0)
       + coalesce((SELECT pg_catalog.sum(p.in_flight) FROM mailbox.consumer_partition_lag AS p
                    WHERE p.group_name = c.group_name AND p.consumer_id = c.consumer_id AND p.leased), 0)
       AS in_flight,
       c.registered_at, c.last_heartbeat_at, c.last_commit_at,
       pg_catalog.now() - c.last_heartbeat_at < mailbox._heartbeat_timeout() AS healthy,
       -- the partitions it holds (partitioned outboxes, part 26)
       coalesce((SELECT pg_catalog.array_agg(pl.part ORDER BY pl.part) FROM mailbox._partition_lease AS pl
                  WHERE pl.group_name = c.group_name AND pl.consumer_id = c.consumer_id
                    AND pl.lease_until > pg_catalog.now()), '{}') AS partitions
  FROM mailbox._consumer AS c
  JOIN mailbox._consumer_group AS g ON g.group_name = c.group_name
  JOIN mailbox._outbox AS o ON o.outbox_key = g.outbox_key;
COMMENT ON VIEW mailbox.consumer_status IS 'every consumer with its offsets, in-flight rows and health';

CREATE OR REPLACE VIEW mailbox.consumer_group_lag AS
WITH live AS (
    -- the group offset as mailbox._group_offset() computes it (which a view's caller may not
    -- execute); a partitioned group's as consumer_lag() computes it
    SELECT g.group_name,
           CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl WHERE pl.group_name = g.group_name)
                THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
                ELSE coalesce((SELECT pg_catalog.min(l.first_offset) - 1 FROM mailbox._lease AS l
                                WHERE l.group_name = g.group_name), g.delivered_offset)
           END AS group_offset
      FROM mailbox._consumer_group AS g
)

SELECT g.group_name, o.outbox_name, g.auto_offset_reset, x.group_offset, g.delivered_offset, o.head_offset,
       o.head_offset - x.group_offset AS lag,
       (SELECT pg_catalog.count(*) FROM mailbox._consumer AS c WHERE c.group_name = g.group_name) AS consumers,
       coalesce((SELECT pg_catalog.sum(l.last_offset - l.first_offset + 1) FROM mailbox._lease AS l
                  WHERE l.group_name = g.group_name AND l.lease_until > pg_catalog.now()), 0)
       + coalesce((SELECT pg_catalog.sum(p.in_flight) FROM mailbox.consumer_partition_lag AS p
                    WHERE p.group_name = g.group_name AND p.leased), 0) AS in_flight
  FROM mailbox._consumer_group AS g
  JOIN live AS x ON x.group_name = g.group_name
  JOIN mailbox._outbox AS o ON o.outbox_key = g.outbox_key;
COMMENT ON VIEW mailbox.consumer_group_lag IS
'every consumer group: offsets and lag in rows (as of the last numbering; consumer_lag() numbers first)';

-- sql/functions/30_inbox_roles.sql
-- Part 30 (roles): the inbox's role -> column model, in one place.
--
-- An inbox stores each message in a table whose columns play fixed roles (event_id,
-- payload, processed_at, ...). A managed inbox (create_inbox) gets a column per role, named
-- after it; an adopted table (enable_inbox_tracking) maps roles to its own columns, and
-- optional roles may be absent. Everything that needs the model reads it from
-- mailbox._inbox_roles(): the managed table's definition, adoption's column checks, the
-- column checks of enable_inbox_ordering / enable_inbox_priority, the parameters of
-- inbox_receive and the keys of inbox_receive_batch. The composite types that carry a
-- message (_inbox_message, part 33) and inbox_claim's result columns are written out in
-- full; tests/inbox/test_inbox_roles.py checks them against this registry.

-- One row per role:
--   table_position    the column's place in a managed inbox table;
--   message_position  the field's place in a claimed message (_inbox_message, inbox_claim's
--                     result columns; NULL: not returned);
--   receive_position  the parameter's place in inbox_receive after p_inbox (NULL: not passed);
--   receive_type      that parameter's type (inbox_receive_batch reads its keys as these);
--   required          adoption needs a column for it; an optional role whose column is
--                     missing is left out (unless the caller named a column explicitly);
--   accepted          the base types (pg_type.typname) a column for it may have;
--   cast_from_text    the API passes it as text, cast to the column's type when that is
--                     not text (a uuid or integer id, say);
--   managed_column    the column's type and constraints in a managed inbox table.
CREATE OR REPLACE FUNCTION mailbox._inbox_roles()
RETURNS TABLE (
    role text, table_position int, message_position int, receive_position int, receive_type text, required boolean,
    accepted text[], cast_from_text boolean, managed_column text
)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES
        ('event_id', 1, 1, 1, 'text', TRUE, '{text,varchar,uuid,int4,int8}'::text[], TRUE, 'text PRIMARY KEY'),
        ('event_type', 2, 2, 3, 'text', FALSE, '{text,varchar}', FALSE, 'text'),
        ('source', 3, 3, 4, 'text', FALSE, '{text,varchar}', FALSE, 'text'),
        ('aggregate_id', 4, 4, 5, 'text', FALSE, '{text,varchar,uuid,int4,int8}', TRUE, 'text'),
        ('sequence_num', 5, 5, 6, 'int8', FALSE, '{int2,int4,int8}', FALSE, 'bigint'),
        ('priority', 6, 6, 9, 'int4', FALSE, '{int2,int4,int8}', FALSE, 'smallint'),
        ('payload', 7, 7, 2, 'jsonb', FALSE, '{json,jsonb}', FALSE, 'jsonb'),
        ('headers', 8, 8, 7, 'jsonb', FALSE, '{json,jsonb}', FALSE, 'jsonb'),
        ('trace_id', 9, 9, 8, 'text', FALSE, '{text,varchar}', FALSE, 'text'),
        ('received_at', 10, 11, NULL, NULL, TRUE, '{timestamptz,timestamp}', FALSE,
         'timestamptz NOT NULL DEFAULT pg_catalog.now()'),
        ('processed_at', 11, NULL, NULL, NULL, TRUE, '{timestamptz,timestamp}', FALSE, 'timestamptz'),
        ('error', 12, NULL, NULL, NULL, FALSE, '{text,varchar}', FALSE, 'text'),
        ('retry_count', 13, 10, NULL, NULL, TRUE, '{int2,int4,int8}', FALSE, 'int NOT NULL DEFAULT 0');
$$;

-- The roles inbox_receive takes, in its parameter order (the generated receive's $2 ...
-- $10); inbox_receive_batch's keys are these with p_.
CREATE OR REPLACE FUNCTION mailbox._inbox_receive_roles()
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.array_agg(r.role ORDER BY r.receive_position)
      FROM mailbox._inbox_roles() AS r
     WHERE r.receive_position IS NOT NULL;
$$;

-- The column definition list that reads a batch with jsonb_to_recordset: each
-- inbox_receive parameter with its type (a json null or an absent key is SQL NULL).
CREATE OR REPLACE FUNCTION mailbox._inbox_batch_columns()
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.string_agg(pg_catalog.format('p_%s pg_catalog.%s', r.role, r.receive_type), ', '
                                 ORDER BY r.receive_position)
      FROM mailbox._inbox_roles() AS r
     WHERE r.receive_position IS NOT NULL;
$$;

-- The definition of a managed inbox table's columns, in table order.
CREATE OR REPLACE FUNCTION mailbox._inbox_managed_columns()
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', r.role, r.managed_column), ', '
                                 ORDER BY r.table_position)
      FROM mailbox._inbox_roles() AS r;
$$;

-- Checks that column p_column of table p_rel exists and may hold p_role; returns its base
-- type (pg_type.typname) and its full type. Adoption and the ordering / priority mappings
-- share it, so one role is judged by one rule.
CREATE OR REPLACE FUNCTION mailbox._inbox_role_column(
    p_rel oid, p_role text, p_column text, OUT base_type text, OUT full_type text
)
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_accepted text[] := (SELECT r.accepted FROM mailbox._inbox_roles() AS r WHERE r.role = p_role);
BEGIN
    SELECT b.typname, pg_catalog.format_type(a.atttypid, a.atttypmod) INTO base_type, full_type
      FROM pg_catalog.pg_attribute AS a
      JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
      JOIN pg_catalog.pg_type AS b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
     WHERE a.attrelid = p_rel AND a.attname = p_column AND a.attnum > 0 AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'column not found: %', p_column
            USING ERRCODE = '42703',
                  DETAIL = pg_catalog.format('Table %s has no column %s (mapped to %s).', p_rel::regclass,
                                             p_column, p_role),
                  HINT = 'Pass the name of an existing column for this role.';
    END IF;
    IF base_type <> ALL (v_accepted) THEN
        RAISE EXCEPTION 'column % has type %, which cannot hold %', p_column, full_type, p_role
            USING ERRCODE = '42804',
                  DETAIL = pg_catalog.format('%s accepts %s.', p_role, pg_catalog.array_to_string(v_accepted, ', ')),
                  HINT = 'Map another column, or change the column''s type.';
    END IF;
END
$$;

-- 22023 when one column is mapped to two roles.
CREATE OR REPLACE FUNCTION mailbox._inbox_check_distinct_columns(p_columns jsonb)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_column text := (SELECT m.value FROM pg_catalog.jsonb_each_text(p_columns) AS m
                       GROUP BY m.value HAVING pg_catalog.count(*) > 1 ORDER BY m.value LIMIT 1);
BEGIN
    IF v_column IS NOT NULL THEN
        RAISE EXCEPTION 'column mapped to more than one role: %', v_column
            USING ERRCODE = '22023', HINT = 'Each inbox role needs its own column.';
    END IF;
END
$$;

-- Adoption (enable_inbox_tracking): checks table p_rel and maps its columns. p_requested
-- maps roles to the column names the caller passed (a json null: do not use that role; a
-- role left out: its default, the column named after it). A required role must resolve;
-- an optional one whose default column is missing is left out. Returns {schema, table,
-- columns: {role: column}, casts: {role: type}} (casts: roles whose text is cast to the
-- column's type). Nothing about the table is changed.
CREATE OR REPLACE FUNCTION mailbox._inbox_resolve_columns(p_rel oid, p_requested jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_schema text;
    v_table text;
    r record;
    v_column text;
    v_type record;
    v_columns jsonb := '{}';
    v_casts jsonb := '{}';
BEGIN
    PERFORM mailbox._check_user_table(p_rel, 'adopt');
    SELECT n.nspname, c.relname INTO v_schema, v_table
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_rel;
    FOR r IN SELECT * FROM mailbox._inbox_roles() AS x ORDER BY NOT x.required, x.table_position LOOP
        v_column := CASE WHEN p_requested ? r.role THEN p_requested ->> r.role ELSE r.role END;
        IF v_column IS NULL THEN
            IF r.required THEN
                RAISE EXCEPTION 'column for % must not be null', r.role
                    USING ERRCODE = '22004',
                          HINT = pg_catalog.format('Name the column of %s.%s that holds %s.', v_schema, v_table, r.role);
            END IF;
            CONTINUE;
        END IF;
        IF NOT r.required AND v_column = r.role AND NOT EXISTS (
            SELECT 1 FROM pg_catalog.pg_attribute AS a
             WHERE a.attrelid = p_rel AND a.attname = v_column AND a.attnum > 0 AND NOT a.attisdropped) THEN
            CONTINUE; -- an optional role's default column is absent: the inbox goes without it
        END IF;
        v_type := mailbox._inbox_role_column(p_rel, r.role, v_column);
        v_columns := v_columns || pg_catalog.jsonb_build_object(r.role, v_column);
        IF r.cast_from_text AND v_type.base_type NOT IN ('text', 'varchar') THEN
            v_casts := v_casts || pg_catalog.jsonb_build_object(r.role, v_type.full_type);
        END IF;
    END LOOP;
    PERFORM mailbox._inbox_check_distinct_columns(v_columns);
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index AS i
          JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
         WHERE i.indrelid = p_rel AND i.indisunique AND i.indimmediate AND i.indisvalid
           AND i.indnkeyatts = 1 AND i.indpred IS NULL AND i.indexprs IS NULL
           AND a.attname = v_columns ->> 'event_id') THEN
        RAISE EXCEPTION 'id column % of %.% is not a primary key or unique', v_columns ->> 'event_id', v_schema, v_table
            USING ERRCODE = '55000',
                  DETAIL = 'Deduplication (ON CONFLICT) needs a unique index on exactly this column.',
                  HINT = pg_catalog.format('ALTER TABLE %s.%s ADD PRIMARY KEY (%s), or add a UNIQUE constraint.',
                                           v_schema, v_table, v_columns ->> 'event_id');
    END IF;
    RETURN pg_catalog.jsonb_build_object('schema', v_schema, 'table', v_table, 'columns', v_columns,
                                         'casts', v_casts);
END
$$;

-- sql/functions/30_inbox_tables.sql
-- Part 30: the inbox catalog and the side tables every inbox shares (SPEC §3).
--
-- An inbox is a table (made by create_inbox, or an existing one adopted by
-- enable_inbox_tracking) plus a catalog row that maps the inbox's roles (event_id,
-- processed_at, ...) to that table's column names. Every inbox function reads the mapping;
-- no function hard-codes a column name of an inbox table. Leases, retry times, ordering state
-- and alert bookkeeping live in the side tables below for managed and adopted inboxes alike,
-- so an adopted table's columns are never altered (see docs/design.md §7.1).
--
-- The side tables reference the catalog by inbox_key without a foreign key on purpose: a
-- foreign key check would take a KEY SHARE lock on the catalog row on every claim, and
-- concurrent claimers would turn that row into a multixact hot spot. drop_inbox deletes the
-- side rows itself.

-- An inbox's catalog row by name, or 42704 (22004 for NULL). Every inbox function starts here.
CREATE OR REPLACE FUNCTION mailbox._inbox_get(p_inbox text)
RETURNS mailbox._inbox
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
BEGIN
    IF p_inbox IS NULL THEN
        RAISE EXCEPTION 'inbox name must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the name of an inbox (see mailbox.inbox_status()).';
    END IF;
    SELECT * INTO v_inbox FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'inbox not found: %', p_inbox
            USING ERRCODE = '42704',
                  HINT = 'Create it with mailbox.create_inbox() or mailbox.enable_inbox_tracking(); '
                         'mailbox.inbox_status() lists them.';
    END IF;
    RETURN v_inbox;
END
$$;

-- The role whose rights the inbox's generated functions and views run with: its table's owner
-- (docs/security.md, "Inbox tables").
CREATE OR REPLACE FUNCTION mailbox._inbox_owner(p_inbox mailbox._inbox)
RETURNS name
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class AS c WHERE c.oid = p_inbox.table_rel;
$$;

-- The inbox's own table (table_rel) under its current name, quoted; NULL when it was dropped.
-- The control plane reads a renamed inbox's table by this name, never by the stored one.
CREATE OR REPLACE FUNCTION mailbox._inbox_current_table(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_inbox.table_rel;
$$;

-- Raises 55000 for an inbox whose stored schema.table no longer names its table (table_rel):
-- the table was renamed, moved to another schema, dropped, or another table took its name.
-- The generated functions (part 35) address the table by that name for speed, so the
-- per-message functions compare to_regclass(stored name) with table_rel on every call (one
-- name lookup) and call this only on a mismatch; nothing is ever read from or written to a
-- table that merely took the old name (docs/inbox.md, "Renaming an inbox table").
CREATE OR REPLACE FUNCTION mailbox._inbox_table_moved(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_now text;
BEGIN
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO v_now
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_inbox.table_rel;
    IF v_now IS NULL THEN
        RAISE EXCEPTION 'inbox table of inbox % was dropped', p_inbox.inbox_name
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('The inbox was made for table %s, which no longer exists.',
                                             mailbox._inbox_table_sql(p_inbox)),
                  HINT = 'Drop the inbox with mailbox.drop_inbox().';
    END IF;
    RAISE EXCEPTION 'inbox table of inbox % was renamed', p_inbox.inbox_name
        USING ERRCODE = '55000',
              DETAIL = pg_catalog.format('The inbox table %s is now %s; pg_mailbox never uses a table that '
                                         'merely took the old name.',
                                         mailbox._inbox_table_sql(p_inbox), v_now),
              HINT = pg_catalog.format('Rename the table back to %s, or drop the inbox with mailbox.drop_inbox() '
                                       '(without p_cascade the table is kept) and adopt %s with '
                                       'mailbox.enable_inbox_tracking().',
                                       mailbox._inbox_table_sql(p_inbox), v_now);
END
$$;

-- The same check for the control plane: raises 55000 (above) unless the stored name still
-- names the inbox's table. Every such check (the data plane's lookups too) first opens the
-- table by oid: pg_relation_is_updatable takes (and releases) an ACCESS SHARE lock, which
-- makes a session whose transaction began before a rename, drop or swap of the table read
-- those catalog changes, so to_regclass answers for the catalog as it is now (a review found
-- a warm session's stale answer: its statement then ran on the table put in its place). A
-- dropped table has 0 updatable events.
CREATE OR REPLACE FUNCTION mailbox._inbox_check_table(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF pg_catalog.pg_relation_is_updatable(p_inbox.table_rel, FALSE) = 0
       OR pg_catalog.to_regclass(mailbox._inbox_table_sql(p_inbox)) IS DISTINCT FROM p_inbox.table_rel THEN
        PERFORM mailbox._inbox_table_moved(p_inbox);
    END IF;
END
$$;

-- The column mapped to a role, quoted for dynamic SQL as alias.column, or NULL when the role
-- has no column. Identifiers only ever reach SQL text through format('%I').
CREATE OR REPLACE FUNCTION mailbox._inbox_col(p_columns jsonb, p_role text, p_alias text DEFAULT 't')
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_columns ->> p_role IS NOT NULL
                THEN pg_catalog.format('%I.%I', p_alias, p_columns ->> p_role) END;
$$;

-- The inbox table as written into SQL (generated code, views, control-plane queries): schema.table, quoted.
CREATE OR REPLACE FUNCTION mailbox._inbox_table_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('%I.%I', p_inbox.schema_name, p_inbox.table_name);
$$;

-- A select-list item for a role: the mapped column cast to the API type, or a typed NULL.
-- p_type is one of the fixed API types written in this file's callers, never caller text.
CREATE OR REPLACE FUNCTION mailbox._inbox_item(p_columns jsonb, p_role text, p_type text, p_alias text DEFAULT 't')
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('CAST(%s AS %s)',
                             coalesce(mailbox._inbox_col(p_columns, p_role, p_alias), 'NULL'), p_type);
$$;

-- A bind parameter for a role's value: $n, or CAST($n AS <column type>) when the column does
-- not take text by assignment (see casts above).
CREATE OR REPLACE FUNCTION mailbox._inbox_param(p_inbox mailbox._inbox, p_role text, p_n int, p_array boolean DEFAULT FALSE)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.casts ? p_role
                THEN pg_catalog.format('CAST($%s AS %s%s)', p_n, p_inbox.casts ->> p_role,
                                       CASE WHEN p_array THEN '[]' ELSE '' END)
                ELSE '$' || p_n END;
$$;

-- sql/functions/31_inbox_indexes.sql
-- Part 31 (indexes): the indexes of a managed inbox table. Adopted tables are left alone:
-- indexing them is their owner's call (docs/inbox.md, enable_inbox_tracking).

-- The indexes every managed inbox table has: pending messages in claim order, dead letters,
-- and processed rows (retention, throughput).
CREATE OR REPLACE FUNCTION mailbox._inbox_base_indexes(p_schema text, p_name text, p_max_retries int)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    EXECUTE pg_catalog.format('CREATE INDEX %I ON %I.%I (received_at) WHERE processed_at IS NULL',
                              p_name || '_pending_idx', p_schema, p_name);
    EXECUTE pg_catalog.format(
        'CREATE INDEX %I ON %I.%I (received_at) WHERE processed_at IS NULL AND retry_count >= %s',
        p_name || '_dlq_idx', p_schema, p_name, p_max_retries);
    EXECUTE pg_catalog.format('CREATE INDEX %I ON %I.%I (processed_at) WHERE processed_at IS NOT NULL',
                              p_name || '_processed_idx', p_schema, p_name);
END
$$;

-- The indexes a managed inbox table gets for its current settings: ordering and priority.
CREATE OR REPLACE FUNCTION mailbox._inbox_sync_indexes(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_ordering text := p_inbox.table_name || '_ordering_idx';
    v_priority text := p_inbox.table_name || '_priority_idx';
BEGIN
    IF NOT p_inbox.is_managed THEN
        RETURN;
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'CREATE INDEX IF NOT EXISTS %I ON %I.%I (%I, %I) INCLUDE (%I) WHERE %I IS NULL',
            v_ordering, p_inbox.schema_name, p_inbox.table_name, c ->> 'aggregate_id', c ->> 'sequence_num',
            c ->> 'received_at', c ->> 'processed_at');
    ELSIF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_inbox.schema_name, v_ordering)) IS NOT NULL THEN
        EXECUTE pg_catalog.format('DROP INDEX %I.%I', p_inbox.schema_name, v_ordering);
    END IF;
    IF p_inbox.priority_tiers IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'CREATE INDEX IF NOT EXISTS %I ON %I.%I (%I, %I) WHERE %I IS NULL',
            v_priority, p_inbox.schema_name, p_inbox.table_name, c ->> 'priority', c ->> 'received_at',
            c ->> 'processed_at');
    ELSIF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_inbox.schema_name, v_priority)) IS NOT NULL THEN
        EXECUTE pg_catalog.format('DROP INDEX %I.%I', p_inbox.schema_name, v_priority);
    END IF;
END
$$;

-- sql/functions/31_inbox_views.sql
-- Part 31: the views of an inbox, always built from its catalog row and column mapping.
--
-- pending_<i>, dlq_<i>, stats_<i>, next_<i> and gaps_<i> (ordering), pending_<i>_<tier>
-- (priority) live in the inbox table's schema and are OWNED BY THE TABLE'S OWNER: a view
-- reads its tables with its owner's rights, so a view owned by the extension owner (a
-- superuser) would read past the table's row-level security. They read the inbox's settings
-- and ordering state through two of the three per-inbox views below (in schema mailbox,
-- owned by the extension owner, security barriers that show only that inbox's rows, and
-- readable by the table owner alone), which (a) keeps them current without rebuilding and
-- (b) makes them depend on the extension: DROP EXTENSION refuses while they exist and
-- DROP EXTENSION ... CASCADE drops them, so no view outlives pg_mailbox (docs/inbox.md).
-- inbox_key is an integer from the catalog, never caller text, so it is formatted with %s.

-- The per-inbox views of the inbox's own rows of the extension's tables, for the views above
-- and the generated functions (part 35), which run as the table owner. The table owner gets
-- SELECT on them (and USAGE on schema mailbox, which holds nothing else it may use).
-- The lease view alone is also re-made by an upgrade (regenerate.sql): no view of
-- pg_mailbox reads it, so it can gain columns (aggregate_id: the aggregate a lease carries,
-- which ordered claims probe, part 35, builders).
CREATE OR REPLACE FUNCTION mailbox._inbox_create_lease_view(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_view text := '_inbox_' || p_inbox.inbox_key || '_lease';
    v_owner name := mailbox._inbox_owner(p_inbox);
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I WITH (security_barrier) AS SELECT l.event_id, l.lease_until, l.next_attempt_at,'
        ' l.aggregate_id FROM mailbox._inbox_lease AS l WHERE l.inbox_key = %s', v_view, p_inbox.inbox_key);
    IF v_owner <> CURRENT_USER THEN
        EXECUTE pg_catalog.format('GRANT SELECT ON mailbox.%I TO %I', v_view, v_owner);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_create_state_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_prefix text := '_inbox_' || p_inbox.inbox_key || '_';
    v_owner name := mailbox._inbox_owner(p_inbox);
BEGIN
    PERFORM mailbox._inbox_create_lease_view(p_inbox);
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I WITH (security_barrier) AS SELECT a.aggregate_id, a.last_seq'
        ' FROM mailbox._inbox_aggregate AS a WHERE a.inbox_key = %s', v_prefix || 'aggregate', p_inbox.inbox_key);
    EXECUTE pg_catalog.format(
        'CREATE VIEW mailbox.%I WITH (security_barrier) AS SELECT i.max_retries, i.ordering_first_sequence'
        ' FROM mailbox._inbox AS i WHERE i.inbox_key = %s', v_prefix || 'config', p_inbox.inbox_key);
    IF v_owner <> CURRENT_USER THEN
        EXECUTE pg_catalog.format('GRANT SELECT ON mailbox.%I, mailbox.%I TO %I',
                                  v_prefix || 'aggregate', v_prefix || 'config', v_owner);
        IF NOT pg_catalog.has_schema_privilege(v_owner, 'mailbox', 'USAGE') THEN
            EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA mailbox TO %I', v_owner);
        END IF;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_drop_state_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_kind text;
BEGIN
    -- the lease view first: a worker's claim reads it before its marks read the config
    -- view (adopted tables), so a drop waits for the claim's transaction holding no other
    FOREACH v_kind IN ARRAY ARRAY['lease', 'aggregate', 'config'] LOOP
        EXECUTE pg_catalog.format('DROP VIEW IF EXISTS mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_' || v_kind);
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_view_names(p_inbox mailbox._inbox)
RETURNS text[]
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT ARRAY(SELECT 'pending_' || p_inbox.inbox_name || '_' || (tier ->> 'name')
                   FROM pg_catalog.jsonb_array_elements(coalesce(p_inbox.priority_tiers, '[]')) AS tier)
           || ARRAY['next_' || p_inbox.inbox_name, 'gaps_' || p_inbox.inbox_name,
                    'stats_' || p_inbox.inbox_name, 'dlq_' || p_inbox.inbox_name,
                    'pending_' || p_inbox.inbox_name];
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_drop_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_view text;
BEGIN
    FOREACH v_view IN ARRAY mailbox._inbox_view_names(p_inbox) LOOP
        -- only views that read this inbox's settings view are ours to drop
        IF EXISTS (
            SELECT 1 FROM pg_catalog.pg_class AS c
              JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
             WHERE n.nspname = p_inbox.schema_name AND c.relname = v_view AND c.relkind = 'v'
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                             JOIN pg_catalog.pg_rewrite AS r ON r.oid = d.objid
                            WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND r.ev_class = c.oid
                              AND d.refobjid = pg_catalog.to_regclass(
                                      pg_catalog.format('mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_config')))
        ) THEN
            EXECUTE pg_catalog.format('DROP VIEW %I.%I', p_inbox.schema_name, v_view);
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_create_view(p_inbox mailbox._inbox, p_view text, p_query text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_inbox.schema_name, p_view)) IS NOT NULL THEN
        RAISE EXCEPTION 'relation already exists: %', pg_catalog.format('%I.%I', p_inbox.schema_name, p_view)
            USING ERRCODE = '42710',
                  DETAIL = pg_catalog.format('Inbox %s needs this name for one of its views.', p_inbox.inbox_name),
                  HINT = 'Rename or drop that relation, or choose another inbox name.';
    END IF;
    EXECUTE pg_catalog.format('CREATE VIEW %I.%I AS %s', p_inbox.schema_name, p_view, p_query);
    EXECUTE pg_catalog.format('ALTER VIEW %I.%I OWNER TO %I', p_inbox.schema_name, p_view,
                              mailbox._inbox_owner(p_inbox));
    EXECUTE pg_catalog.format('COMMENT ON VIEW %I.%I IS %s', p_inbox.schema_name, p_view,
                              pg_catalog.quote_literal('pg_mailbox view of inbox ' || p_inbox.inbox_name));
    EXECUTE pg_catalog.format('GRANT SELECT ON %I.%I TO mailbox_admin', p_inbox.schema_name, p_view);
    EXECUTE pg_catalog.format('GRANT SELECT ON %I.%I TO mailbox_consumer', p_inbox.schema_name, p_view);
END
$$;

-- The SQL of next_<i> (ordering on): per aggregate with unprocessed messages, its lowest
-- unprocessed sequence, found by a skip scan over (aggregate, sequence) of unprocessed rows;
-- that message is the head when it is pending (not a dead letter) and its sequence is at most
-- last processed + 1. A hole or a dead-lettered predecessor therefore blocks the aggregate.
CREATE OR REPLACE FUNCTION mailbox._inbox_next_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_table_sql(p_inbox);
    v_agg text := pg_catalog.quote_ident(c ->> 'aggregate_id');
    v_seq text := pg_catalog.quote_ident(c ->> 'sequence_num');
    v_proc text := pg_catalog.quote_ident(c ->> 'processed_at');
    v_retry text := pg_catalog.quote_ident(c ->> 'retry_count');
    v_id text := pg_catalog.quote_ident(c ->> 'event_id');
BEGIN
    RETURN pg_catalog.format($q$
WITH RECURSIVE heads AS (
    (SELECT t.%1$s AS agg, t.%2$s AS seq FROM %3$s AS t
      WHERE t.%4$s IS NULL AND t.%1$s IS NOT NULL AND t.%2$s IS NOT NULL
      ORDER BY t.%1$s, t.%2$s LIMIT 1)
    UNION ALL
    SELECT n.agg, n.seq FROM heads AS h CROSS JOIN LATERAL (
        SELECT t.%1$s AS agg, t.%2$s AS seq FROM %3$s AS t
         WHERE t.%4$s IS NULL AND t.%1$s IS NOT NULL AND t.%2$s IS NOT NULL AND t.%1$s > h.agg
         ORDER BY t.%1$s, t.%2$s LIMIT 1) AS n
)
SELECT m.* FROM heads AS h
 CROSS JOIN mailbox.%6$I AS cfg
 CROSS JOIN LATERAL (SELECT t.* FROM %3$s AS t
                      WHERE t.%1$s = h.agg AND t.%2$s = h.seq AND t.%4$s IS NULL
                      ORDER BY t.%7$s LIMIT 1) AS m
 WHERE h.seq <= coalesce((SELECT s.last_seq FROM mailbox.%8$I AS s WHERE s.aggregate_id = h.agg::text),
                         cfg.ordering_first_sequence - 1) + 1
   AND m.%5$s < cfg.max_retries$q$,
        v_agg, v_seq, v_table, v_proc, v_retry, '_inbox_' || p_inbox.inbox_key || '_config', v_id,
        '_inbox_' || p_inbox.inbox_key || '_aggregate');
END
$$;

-- The per-inbox state views are security barriers, which a join cannot see into: they are
-- read by scalar subqueries (one primary-key lookup each) in next_<i> and gaps_<i>.

-- "WITH RECURSIVE aggs AS (...)" over the table p_table: every aggregate with an unprocessed
-- sequenced message, one index probe each (a skip scan of the ordering index).
CREATE OR REPLACE FUNCTION mailbox._inbox_pending_aggs_sql(p_inbox mailbox._inbox, p_table text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT pg_catalog.format($a$
WITH RECURSIVE aggs AS (
    (SELECT t.%1$I AS agg FROM %3$s AS t
      WHERE t.%4$I IS NULL AND t.%1$I IS NOT NULL AND t.%2$I IS NOT NULL
      ORDER BY t.%1$I LIMIT 1)
    UNION ALL
    SELECT n.agg FROM aggs AS a CROSS JOIN LATERAL (
        SELECT t.%1$I AS agg FROM %3$s AS t
         WHERE t.%4$I IS NULL AND t.%1$I IS NOT NULL AND t.%2$I IS NOT NULL AND t.%1$I > a.agg
         ORDER BY t.%1$I LIMIT 1) AS n
)$a$, p_inbox.columns ->> 'aggregate_id', p_inbox.columns ->> 'sequence_num',
          p_table, p_inbox.columns ->> 'processed_at');
$$;

-- The SQL of gaps_<i>: every hole in each aggregate's sequence, counting from the last
-- processed sequence, among its unprocessed messages (dead letters are not holes). p_table
-- is the table's name when it differs from the stored one (the control plane after a rename).
CREATE OR REPLACE FUNCTION mailbox._inbox_gaps_sql(p_inbox mailbox._inbox, p_table text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := coalesce(p_table, mailbox._inbox_table_sql(p_inbox));
BEGIN
    RETURN mailbox._inbox_pending_aggs_sql(p_inbox, v_table) || pg_catalog.format($q$
SELECT a.agg::text AS aggregate_id, x.prev + 1 AS expected_seq, x.seq AS found_seq,
       pg_catalog.date_part('epoch', pg_catalog.now() - x.recv) AS gap_age_sec
  FROM aggs AS a
 CROSS JOIN mailbox.%6$I AS cfg
 CROSS JOIN LATERAL (SELECT coalesce((SELECT s.last_seq FROM mailbox.%7$I AS s WHERE s.aggregate_id = a.agg::text),
                                     cfg.ordering_first_sequence - 1) AS last_seq) AS s
 CROSS JOIN LATERAL (
        SELECT t.%2$I::bigint AS seq, t.%5$I::timestamptz AS recv,
               coalesce(pg_catalog.lag(t.%2$I::bigint) OVER (ORDER BY t.%2$I), s.last_seq) AS prev
          FROM %3$s AS t
         WHERE t.%1$I = a.agg AND t.%4$I IS NULL AND t.%2$I > s.last_seq) AS x
 WHERE x.seq > x.prev + 1$q$,
        c ->> 'aggregate_id', c ->> 'sequence_num', v_table, c ->> 'processed_at', c ->> 'received_at',
        '_inbox_' || p_inbox.inbox_key || '_config', '_inbox_' || p_inbox.inbox_key || '_aggregate');
END
$$;

-- (Re)creates every view the catalog row calls for. Callers drop the old ones first.
CREATE OR REPLACE FUNCTION mailbox._inbox_create_views(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_table_sql(p_inbox);
    v_proc text := mailbox._inbox_col(c, 'processed_at');
    v_retry text := mailbox._inbox_col(c, 'retry_count');
    v_max text := pg_catalog.format('(SELECT i.max_retries FROM mailbox.%I AS i)',
                                    '_inbox_' || p_inbox.inbox_key || '_config');
    v_tier jsonb;
BEGIN
    PERFORM mailbox._inbox_create_view(p_inbox, 'pending_' || p_inbox.inbox_name,
        pg_catalog.format('SELECT t.* FROM %s AS t WHERE %s IS NULL AND %s < %s', v_table, v_proc, v_retry, v_max));
    IF p_inbox.with_dead_letter THEN
        PERFORM mailbox._inbox_create_view(p_inbox, 'dlq_' || p_inbox.inbox_name,
            pg_catalog.format('SELECT t.* FROM %s AS t WHERE %s IS NULL AND %s >= %s', v_table, v_proc, v_retry, v_max));
    END IF;
    IF p_inbox.with_stats THEN
        PERFORM mailbox._inbox_create_view(p_inbox, 'stats_' || p_inbox.inbox_name, pg_catalog.format(
            'SELECT %1$s AS event_type,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s < cfg.max_retries) AS pending_count,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NOT NULL) AS processed_count,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s >= cfg.max_retries) AS dead_letter_count,'
            ' pg_catalog.avg(pg_catalog.date_part(''epoch'', %2$s::timestamptz - %4$s::timestamptz))'
            '   FILTER (WHERE %2$s IS NOT NULL) AS avg_processing_seconds'
            ' FROM %5$s AS t CROSS JOIN mailbox.%6$I AS cfg'
            ' GROUP BY 1',
            mailbox._inbox_item(c, 'event_type', 'text'), v_proc, v_retry, mailbox._inbox_col(c, 'received_at'),
            v_table, '_inbox_' || p_inbox.inbox_key || '_config'));
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        PERFORM mailbox._inbox_create_view(p_inbox, 'next_' || p_inbox.inbox_name, mailbox._inbox_next_sql(p_inbox));
        PERFORM mailbox._inbox_create_view(p_inbox, 'gaps_' || p_inbox.inbox_name, mailbox._inbox_gaps_sql(p_inbox));
    END IF;
    IF p_inbox.priority_tiers IS NOT NULL THEN
        FOR v_tier IN SELECT tier FROM pg_catalog.jsonb_array_elements(p_inbox.priority_tiers) AS tier LOOP
            -- tier bounds are validated integers; the tier name a validated identifier
            PERFORM mailbox._inbox_create_view(p_inbox, 'pending_' || p_inbox.inbox_name || '_' || (v_tier ->> 'name'),
                pg_catalog.format('SELECT t.* FROM %s AS t WHERE %s IS NULL AND %s < %s AND %s BETWEEN %s AND %s',
                                  v_table, v_proc, v_retry, v_max, mailbox._inbox_col(c, 'priority'),
                                  (v_tier ->> 'min')::bigint, (v_tier ->> 'max')::bigint));
        END LOOP;
    END IF;
END
$$;

-- sql/functions/32_inbox_api.sql
-- Part 32: creating, adopting and dropping inboxes (SPEC §3.1, control plane).

-- Registers an inbox whose table exists (made by create_inbox or checked by
-- enable_inbox_tracking) and creates its views and its generated functions (part 35).
CREATE OR REPLACE FUNCTION mailbox._inbox_register(
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
CREATE OR REPLACE FUNCTION mailbox._inbox_check_new(p_name text, p_max_retries int, p_retention_hours int)
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
CREATE OR REPLACE FUNCTION mailbox._inbox_check_schema(p_schema text)
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

CREATE OR REPLACE FUNCTION mailbox.create_inbox(
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
CREATE OR REPLACE FUNCTION mailbox.enable_inbox_tracking(
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

CREATE OR REPLACE FUNCTION mailbox.drop_inbox(p_name text, p_if_exists boolean DEFAULT FALSE, p_cascade boolean DEFAULT FALSE)
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

-- sql/functions/33_inbox_marks.sql
-- Part 33 (marks): settling a message (SPEC §3.1): inbox_mark_processed and
-- inbox_mark_failed, the per-message calls a worker makes after its business logic (the
-- batch forms: part 37, batch API). They look the inbox up, check the caller's grants and
-- the table, and dispatch to the inbox's generated functions (part 35), then end the lease
-- (part 30's mailbox._inbox_lease) and, on an ordered inbox, record the aggregate's position.
-- The single mark of a managed, unordered inbox without grants is its named mark (part 35,
-- named receive), which looks nothing up: inbox_mark_processed(text, text) is inlined into its
-- caller, as inbox_receive is (part 33, messages).

-- The full path of inbox_mark_processed (below): every inbox, every argument; the only one for
-- an ordered inbox, an inbox with grants of its own or an adopted table, and the one that
-- raises every error.
CREATE OR REPLACE FUNCTION mailbox._inbox_mark_processed_full(p_inbox text, p_event_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease/ordering state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
    v_done mailbox._inbox_done;
BEGIN
    -- one statement, as in inbox_receive; also whether the message has a lease row (a claim
    -- of this transaction has none, part 37, claim settle)
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved,
           i.casts ? 'event_id' -- (a uuid or integer id: its lease has the canonical text)
             OR EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l
                         WHERE l.inbox_key = i.inbox_key AND l.event_id = p_event_id) AS leased
      INTO v_found
      FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        PERFORM mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    v_inbox := v_found.inbox;
    IF v_found.granted THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, 'process');
    END IF;
    IF v_found.moved THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    IF p_event_id IS NULL THEN
        PERFORM mailbox._require(p_event_id, 'p_event_id');
    END IF;
    v_done := mailbox._inbox_route_processed(v_inbox, p_event_id); -- part 35, routes
    IF v_done.event_id IS NULL THEN
        RETURN FALSE;
    END IF;
    -- its lease ends with it. A lease written after the lookup (the commit of another
    -- worker's claim this mark waited for) is seen by this later statement; only an ordered
    -- inbox needs that (its lease rows carry the aggregate, which would hold the next head
    -- back, part 37); elsewhere such a lease holds nothing until it expires, as a processed
    -- message is never claimed, counted in flight, or replayed with its lease
    IF v_found.leased OR v_inbox.ordering_first_sequence IS NOT NULL THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = v_done.event_id;
    END IF;
    -- the highest processed sequence: a replayed older message does not move it back, and a
    -- new aggregate starts at first sequence - 1 even if a stray lower sequence is processed
    -- first (an existing aggregate only ever moves up to what was processed)
    IF v_inbox.ordering_first_sequence IS NOT NULL AND v_done.aggregate_id IS NOT NULL
       AND v_done.sequence_num IS NOT NULL THEN
        INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq, updated_at)
        VALUES (v_inbox.inbox_key, v_done.aggregate_id,
                pg_catalog.int8larger(v_done.sequence_num, v_inbox.ordering_first_sequence - 1),
                pg_catalog.clock_timestamp())
            ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
           SET last_seq = pg_catalog.int8larger(a.last_seq, v_done.sequence_num), updated_at = excluded.updated_at;
    END IF;
    RETURN TRUE;
END
$$;
COMMENT ON FUNCTION mailbox._inbox_mark_processed_full(text, text) IS
'pg_mailbox: inbox_mark_processed for any inbox, checking everything (when no named mark applies)';

-- A managed, unordered inbox without grants of its own: its named mark (part 35, named
-- receive), with no lookup; NULL for any other inbox and for arguments it would refuse, and
-- then the full path. One expression, SECURITY INVOKER and without SET, so that the planner
-- inlines it (and the router inside it) into the caller's statement: the named mark, itself
-- SECURITY DEFINER with a pinned search_path, is then the call's only function frame (a
-- PL/pgSQL frame around it cost about 7 us of backend CPU, docs/benchmarks.md). Every name in
-- it is schema-qualified and every argument has its exact type, so the caller's search_path,
-- under which an inlined body is parsed, can redirect nothing. The arguments are compared in
-- the database's default collation whatever collation the caller's expressions carry (a
-- nondeterministic one would match other ids). A caller needs EXECUTE on the two functions it
-- calls as well (mailbox_consumer has it; part 90).
CREATE OR REPLACE FUNCTION mailbox.inbox_mark_processed(p_inbox text, p_event_id text)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT COALESCE(
        mailbox._inbox_route_processed_named($1 COLLATE pg_catalog."default", $2 COLLATE pg_catalog."default"),
        mailbox._inbox_mark_processed_full($1 COLLATE pg_catalog."default", $2 COLLATE pg_catalog."default"));
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_processed(text, text) IS
'mark a message processed; false when it does not exist or is already processed';

CREATE OR REPLACE FUNCTION mailbox.inbox_mark_failed(
    p_inbox text, p_event_id text, p_error text, p_retry_after_seconds int DEFAULT NULL
)
RETURNS text
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
    v_delay int := p_retry_after_seconds;
BEGIN
    -- one statement, as in inbox_receive
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved
      INTO v_found
      FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        PERFORM mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    v_inbox := v_found.inbox;
    IF v_found.granted THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, 'process');
    END IF;
    IF v_found.moved THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    IF v_delay IS NULL THEN
        v_delay := mailbox._setting_int('inbox_retry_delay_seconds');
    END IF;
    IF p_event_id IS NULL THEN
        PERFORM mailbox._require(p_event_id, 'p_event_id');
    END IF;
    IF v_delay < 0 THEN
        RAISE EXCEPTION 'invalid retry delay: % seconds', v_delay
            USING ERRCODE = '22023', HINT = 'p_retry_after_seconds is NULL (mailbox.inbox_retry_delay_seconds) or 0 or more.';
    END IF;
    RETURN mailbox._inbox_fail_one(v_inbox, p_event_id, p_error, v_delay);
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_failed(text, text, text, int) IS
'record a failed attempt: ''retry'' (after an optional delay) or ''dead_letter'' at max_retries';

-- sql/functions/33_inbox_messages.sql
-- Part 33: the inbox data plane (SPEC §3.1): receive, claim (marks: part 33, marks; replay:
-- part 33, replay).
--
-- The per-message functions check their arguments and dispatch to the inbox's generated
-- functions (part 35), whose static SQL has cached plans and which alone touch the inbox
-- table, with its owner's rights; leases and ordering state are written here, from what they
-- return (bind parameters, this inbox's key only). The hot path inlines the lookup and
-- checks (a helper with a SET clause costs a GUC save and restore). Leases and retry
-- times live in mailbox._inbox_lease (part 30; docs/design.md §7.1: why a claim is safe).
-- Every function checks that the inbox's stored table name still names its table: a renamed
-- table is refused (55000), never replaced by whatever took the old name. A claim locks
-- candidate rows FOR UPDATE SKIP LOCKED; its leases are upserted from the latest committed
-- lease rows, so two claimers never both win a message. Claim,
-- business logic and mark in one transaction: the row lock keeps other workers off a
-- message until commit, and a crash rolls the lease back with everything else. Receivers
-- notify only while a worker waits (part 33, wake-ups).

-- The full path of inbox_receive (below): every inbox, every argument; the only one for an
-- inbox with grants of its own or an adopted table, and the one that raises every error.
CREATE OR REPLACE FUNCTION mailbox._inbox_receive_full(
    p_inbox text,
    p_event_id text,
    p_payload jsonb,
    p_event_type text,
    p_source text,
    p_aggregate_id text,
    p_sequence_num bigint,
    p_headers jsonb,
    p_trace_id text,
    p_priority int
)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- calls any inbox's generated functions (which run as the table owner) for mailbox_producer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
BEGIN
    -- one statement: the catalog row; whether the inbox has grants of its own (without, the
    -- role-level grants decide); whether its stored table name still names its table;
    -- whether a worker waits for a wake-up (_inbox_has_waiter)
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved,
           EXISTS (SELECT 1 FROM mailbox._inbox_waiter AS w
                    WHERE w.inbox_key = i.inbox_key AND w.waiting_until > pg_catalog.now()) AS waited
      INTO v_found
      FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        PERFORM mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    v_inbox := v_found.inbox;
    IF v_found.granted THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, 'receive');
    END IF;
    IF v_found.moved THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    IF p_event_id IS NULL THEN
        RAISE EXCEPTION 'event id must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the message''s unique id (the broker''s message id, say).';
    END IF;
    -- an id is a key of unique indexes (entries up to about 2700 bytes): a fixed, documented
    -- limit names the argument instead
    IF pg_catalog.octet_length(p_event_id) > 1000 THEN
        RAISE EXCEPTION 'p_event_id too long: % bytes', pg_catalog.octet_length(p_event_id)
            USING ERRCODE = '22023',
                  HINT = 'p_event_id is at most 1000 bytes; pass the broker''s message id, not the message.';
    END IF;
    -- the generated function (through its router, part 35) checks ordering, unmapped roles
    -- and the priority's range, and inserts as the table's owner
    IF mailbox._inbox_route_receive(v_inbox, p_event_id, p_payload, p_event_type, p_source, p_aggregate_id,
                                    p_sequence_num, p_headers, p_trace_id, p_priority) THEN
        IF v_found.waited THEN
            PERFORM pg_catalog.pg_notify('mailbox_inbox_new', v_inbox.inbox_name);
        END IF;
        RETURN TRUE;
    END IF;
    RETURN FALSE;
END
$$;
COMMENT ON FUNCTION mailbox._inbox_receive_full(text, text, jsonb, text, text, text, bigint, jsonb, text, int) IS
'pg_mailbox: inbox_receive for any inbox, checking everything (inbox_receive calls it when no named receive applies)';

-- A managed inbox without grants of its own: its named receive (part 35, named receive), with
-- no lookup; NULL for any other inbox and for arguments it would refuse, and then the full
-- path. One expression, SECURITY INVOKER and without SET, so that the planner inlines it (and
-- the router inside it) into the caller's statement: the named receive, itself SECURITY
-- DEFINER with a pinned search_path, is then the call's only function frame (a PL/pgSQL
-- frame around it cost about 7.5 us of backend CPU, docs/benchmarks.md). Every name in it is
-- schema-qualified and every argument has its exact type, so the caller's search_path, under
-- which an inlined body is parsed, can redirect nothing. A caller needs EXECUTE on the two
-- functions it calls as well (mailbox_producer has it; part 90).
CREATE OR REPLACE FUNCTION mailbox.inbox_receive(
    p_inbox text,
    p_event_id text,
    p_payload jsonb,
    p_event_type text DEFAULT NULL,
    p_source text DEFAULT NULL,
    p_aggregate_id text DEFAULT NULL,
    p_sequence_num bigint DEFAULT NULL,
    p_headers jsonb DEFAULT NULL,
    p_trace_id text DEFAULT NULL,
    p_priority int DEFAULT NULL
)
RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
    SELECT COALESCE(mailbox._inbox_route_receive_named($1, $2, $3, $4, $5, $6, $7, $8, $9, $10),
                    mailbox._inbox_receive_full($1, $2, $3, $4, $5, $6, $7, $8, $9, $10));
$$;
COMMENT ON FUNCTION mailbox.inbox_receive(text, text, jsonb, text, text, text, bigint, jsonb, text, int) IS
'store a message once per event id; true when new, false for a duplicate';

-- Raises inbox_claim's error for its first bad argument (inbox_claim calls it only then).
CREATE OR REPLACE FUNCTION mailbox._inbox_claim_refuse(p_worker text, p_batch_size int, p_visibility_seconds int)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._check_id('worker', p_worker);
    PERFORM mailbox._require(p_batch_size, 'p_batch_size');
    PERFORM mailbox._require(p_visibility_seconds, 'p_visibility_seconds');
    IF p_batch_size < 1 OR p_batch_size > 10000 THEN
        RAISE EXCEPTION 'invalid batch size: %', p_batch_size
            USING ERRCODE = '22023', HINT = 'p_batch_size is 1 to 10000.';
    END IF;
    IF p_visibility_seconds < 1 THEN
        RAISE EXCEPTION 'invalid visibility timeout: % seconds', p_visibility_seconds
            USING ERRCODE = '22023', HINT = 'p_visibility_seconds is 1 or more: how long the lease lasts.';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.inbox_claim(
    p_inbox text, p_worker text, p_batch_size int DEFAULT 10, p_visibility_seconds int DEFAULT 30
)
RETURNS TABLE (
    event_id text, event_type text, source text, aggregate_id text, sequence_num bigint, priority int,
    payload jsonb, headers jsonb, trace_id text, retry_count int, received_at timestamptz,
    lease_until timestamptz
)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes leases of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
-- the generated claim's LIMIT and times are parameters: one generic plan, never a custom
-- plan per call (an extension owner's generated function has no SET of its own, part 35)
SET plan_cache_mode = force_generic_plan
-- and never JIT-compiled: that generic plan is costed for a share of the pending rows, so
-- above some 120,000 of them its cost passes jit_above_cost (100,000 by default) and every
-- claim compiled its query again, about 8 ms, eight times a claim of 100 (docs/inbox.md)
SET jit = off
-- and never a sequential scan. A session keeps the plans of a function's statements until
-- the tables they read change in the catalog (a VACUUM or ANALYZE, or DDL). So a worker that
-- polled an empty inbox just vacuumed (a drained queue's table is cut to no pages) planned
-- its claim, its marks and its lookups in the lease and open-claim tables as scans of empty
-- tables, and kept scanning the whole table through the burst that followed: 1,400 instead
-- of 12,000 messages a second at 200,000 pending, and a third of its rate beside 50,000
-- lease rows of another inbox (docs/inbox.md, "Plans made on an empty queue"). Every
-- statement of these paths finds its rows by an index (the inbox table's pending, ordering,
-- priority or primary-key index, the side tables' keys), so with sequential scans off the
-- plan is the same whatever the tables' size when it was made. The functions each worker
-- calls per message or batch set it (the inbox_mark_* forms, the commit's settle, replay, and
-- the named mark); the generated functions they call, and the triggers of an adopted table,
-- run under their setting. A statement with no index to read by (an adopted table without
-- the indexes docs/inbox.md recommends) still scans, now costed 1e10 higher: past every JIT
-- threshold, so each of these functions also sets jit = off.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_inbox mailbox._inbox;
    v_found record;
    v_again record;
    v_now timestamptz;
    v_until timestamptz;
    v_rows mailbox._inbox_message[];
    v_claimed bigint;
    v_won text[];
    v_index text;
BEGIN
    -- one statement, as in inbox_receive; also whether this transaction has an open claim of
    -- the inbox (part 37, claim settle), whether the inbox has a lease row at all, and whether
    -- this connection waits for a wake-up (part 33, wake-ups)
    SELECT i AS inbox,
           i.has_grants AS granted,
           pg_catalog.pg_relation_is_updatable(i.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
             OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
                IS DISTINCT FROM i.table_rel AS moved,
           EXISTS (SELECT 1 FROM mailbox._inbox_open_claim AS o
                    WHERE o.inbox_key = i.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()) AS open,
           EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l WHERE l.inbox_key = i.inbox_key) AS leased,
           EXISTS (SELECT 1 FROM mailbox._inbox_waiter AS w
                    WHERE w.inbox_key = i.inbox_key AND w.backend_pid = pg_catalog.pg_backend_pid()) AS waiting
      INTO v_found
      FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        PERFORM mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    v_inbox := v_found.inbox;
    IF v_found.granted THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, 'process');
    END IF;
    IF v_found.moved THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    -- one test of the arguments (each PL/pgSQL expression is set up once per transaction)
    IF p_worker IS NULL OR p_worker = '' OR pg_catalog.char_length(p_worker) > 200 OR p_batch_size IS NULL
       OR p_visibility_seconds IS NULL OR p_batch_size < 1 OR p_batch_size > 10000 OR p_visibility_seconds < 1 THEN
        PERFORM mailbox._inbox_claim_refuse(p_worker, p_batch_size, p_visibility_seconds);
    END IF;
    -- a second claim in one transaction: the first one's messages get their lease rows now,
    -- so this claim skips them as it skips every leased message (part 37, claim settle)
    IF v_found.open THEN
        PERFORM mailbox._inbox_settle(o.claim_no) FROM mailbox._inbox_open_claim AS o
          WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned();
    END IF;
    v_now := pg_catalog.clock_timestamp();
    v_until := v_now + pg_catalog.make_interval(secs => p_visibility_seconds);
    -- 1. the candidates, locked (the generated function through its router, as the table
    -- owner); without a lease row in the inbox it skips its lease exclusion (only an
    -- optimisation: what decides is step 2; a settled open claim has just written some), and
    -- under SERIALIZABLE it excludes with a lookup per row, never by reading every lease
    -- (a predicate lock on the whole lease table: part 35, claim builder)
    v_rows := mailbox._inbox_route_claim(v_inbox, p_batch_size, v_now,
                  CASE WHEN NOT (v_found.leased OR v_found.open) THEN FALSE
                       WHEN pg_catalog.current_setting('transaction_isolation') = 'serializable' THEN NULL
                       ELSE TRUE END);
    IF coalesce(pg_catalog.cardinality(v_rows), 0) = 0 THEN
        PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, TRUE); -- nothing: wake me (part 33, wake-ups)
        RETURN;
    END IF;
    -- 2a. READ COMMITTED, no ordering: the row locks hold the messages while this transaction
    -- is open; keep those without a live lease or retry time now (this statement's snapshot
    -- postdates the locks, so it sees any lease committed before them) and record the claim in
    -- one row, which becomes lease rows at commit for what is still pending (part 37, claim
    -- settle). When that statement finds no lease row of the inbox at all, it would find none
    -- for any of these rows: one index probe then stands for the per-row re-read.
    IF v_inbox.ordering_first_sequence IS NULL
       AND pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        -- (and a configuration change that committed while step 1 waited: part 37)
        SELECT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key) AS leased,
               EXISTS (SELECT 1 FROM mailbox._inbox AS i WHERE i.inbox_key = v_inbox.inbox_key
                          AND (i.ordering_first_sequence, i.columns, i.priority_tiers) IS DISTINCT FROM
                              (v_inbox.ordering_first_sequence, v_inbox.columns, v_inbox.priority_tiers)) AS changed
          INTO v_again;
        IF v_again.changed THEN
            PERFORM mailbox._inbox_check_unchanged(v_inbox); -- raises 40001
        END IF;
        IF v_again.leased THEN
            -- (a filtered scan of the array keeps its order; one primary-key lookup per
            -- claimed message, fenced by OFFSET 0: left to the planner, it became a hash
            -- anti-join that read every lease row of the inbox on every claim)
            v_rows := ARRAY(SELECT m FROM pg_catalog.unnest(v_rows) AS m
                             WHERE NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS l
                                                WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = m.event_id
                                                  AND (l.lease_until > v_now OR l.next_attempt_at > v_now)
                                                OFFSET 0));
            IF pg_catalog.cardinality(v_rows) = 0 THEN
                PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, TRUE);
                RETURN;
            END IF;
        END IF;
        IF v_found.waiting THEN
            PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, FALSE); -- busy: no wake-up
        END IF;
        -- whether the messages this transaction claimed from the inbox have no lease row
        -- (none of the inbox had one after the locks): then the named mark has no lease to
        -- end (part 37, claim settle, "Marks without a lease")
        PERFORM pg_catalog.set_config('mailbox.claim_unleased_' || v_inbox.inbox_key,
                                      CASE WHEN v_again.leased THEN '' ELSE 'on' END, TRUE);
        RETURN QUERY -- (one statement: each costs an executor start-up)
        WITH claim AS (
            INSERT INTO mailbox._inbox_open_claim (inbox_key, event_ids, lease_until, leased_by, leased_by_pid)
            VALUES (v_inbox.inbox_key, ARRAY(SELECT m.event_id FROM pg_catalog.unnest(v_rows) AS m), v_until,
                    p_worker, pg_catalog.pg_backend_pid())
        )
        SELECT m.event_id, m.event_type, m.source, m.aggregate_id, m.sequence_num, m.priority, m.payload,
               m.headers, m.trace_id, m.retry_count, m.received_at, v_until
          FROM pg_catalog.unnest(v_rows) AS m;
        RETURN;
    END IF;
    -- 2b. otherwise their leases now (part 37, _inbox_claim_leases): the upsert takes a message
    -- whose lease and retry time have passed. Ordered: one message of an aggregate in flight
    -- also while another's claim is open: a claim holds its aggregates' advisory locks (part
    -- 05) and drops a message whose aggregate another open claim holds; one that committed
    -- since step 1's snapshot is seen by the upsert, or under REPEATABLE READ by its unique
    -- index on the aggregate (a serialization failure here) (docs/design.md §7.3)
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM mailbox._inbox_check_unchanged(v_inbox); -- (as in 2a)
    END IF;
    IF v_inbox.ordering_first_sequence IS NOT NULL THEN
        v_rows := ARRAY(SELECT m FROM pg_catalog.unnest(v_rows) AS m
                         WHERE pg_catalog.pg_try_advisory_xact_lock(7168636,
                                   pg_catalog.hashtext(v_inbox.inbox_key || '/' || m.aggregate_id)));
    END IF;
    IF v_inbox.ordering_first_sequence IS NOT NULL
       AND pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        BEGIN -- (a subtransaction: only where the unique index can decide)
            v_won := mailbox._inbox_claim_leases(v_inbox, v_rows, p_worker, v_now, v_until);
        EXCEPTION WHEN unique_violation THEN
            GET STACKED DIAGNOSTICS v_index = CONSTRAINT_NAME;
            IF v_index IS DISTINCT FROM '_inbox_lease_aggregate_idx' THEN
                RAISE;
            END IF;
            RAISE EXCEPTION 'inbox %: another worker claimed a message of an aggregate this claim would take, after this transaction''s snapshot', v_inbox.inbox_name
                USING ERRCODE = '40001', HINT = 'Retry the transaction, or claim from an ordered inbox in READ COMMITTED.';
        END;
    ELSE
        v_won := mailbox._inbox_claim_leases(v_inbox, v_rows, p_worker, v_now, v_until);
    END IF;
    RETURN QUERY
    SELECT m.event_id, m.event_type, m.source, m.aggregate_id, m.sequence_num, m.priority, m.payload,
           m.headers, m.trace_id, m.retry_count, m.received_at, v_until
      FROM pg_catalog.unnest(v_rows) WITH ORDINALITY AS m
      JOIN pg_catalog.unnest(v_won) AS w (id) ON w.id = m.event_id
     ORDER BY m.ordinality;
    GET DIAGNOSTICS v_claimed = ROW_COUNT;
    IF v_claimed = 0 OR v_found.waiting THEN
        PERFORM mailbox._inbox_wait(v_inbox.inbox_key, p_worker, v_claimed = 0);
    END IF;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_claim(text, text, int, int) IS
'lease up to p_batch_size pending messages (SKIP LOCKED; honours ordering and priority)';

-- sql/functions/33_inbox_replay.sql
-- Part 33 (replay): replay_inbox_messages (SPEC §3.1), the one rare write of the inbox data
-- plane: it builds its SQL from the catalog and runs it through mailbox._inbox_as_owner
-- (part 35), so the inbox table is touched only with its owner's rights; the table and its
-- columns come from the catalog mapping through format('%I'), every value is a bind parameter.

CREATE OR REPLACE FUNCTION mailbox.replay_inbox_messages(p_name text, p_event_ids text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- resets messages (as the table owner) and their leases of any inbox for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_name);
    c jsonb := v_inbox.columns;
    v_set text := '';
    v_unordered text := 'NULL::pg_catalog.text';
    v_result jsonb;
    v_ids text[];
BEGIN
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    PERFORM mailbox._inbox_check_table(v_inbox);
    IF c ? 'error' THEN
        v_set := pg_catalog.format(', %I = NULL', c ->> 'error');
    END IF;
    -- an ordered claim never takes a message without aggregate or sequence: on an ordered
    -- inbox such a message is not replayed, and if one is listed nothing is (55000, below)
    IF v_inbox.ordering_first_sequence IS NOT NULL THEN
        v_unordered := pg_catalog.format(
            '(SELECT t.%1$I::pg_catalog.text FROM %2$I.%3$I AS t WHERE t.%1$I = ANY (%4$s)'
            ' AND (t.%5$I IS NOT NULL OR t.%6$I >= ($1).max_retries) AND (t.%7$I IS NULL OR t.%8$I IS NULL)'
            ' ORDER BY 1 LIMIT 1)',
            c ->> 'event_id', v_inbox.schema_name, v_inbox.table_name,
            mailbox._inbox_param(v_inbox, 'event_id', 3, TRUE), c ->> 'processed_at', c ->> 'retry_count',
            c ->> 'aggregate_id', c ->> 'sequence_num');
    END IF;
    v_result := mailbox._inbox_as_owner(v_inbox, pg_catalog.format(
        'WITH u AS (SELECT %8$s AS id),'
        ' r AS (UPDATE %1$I.%2$I AS t SET %3$I = NULL, %4$I = 0%5$s'
        ' WHERE t.%6$I = ANY (%7$s) AND (t.%3$I IS NOT NULL OR t.%4$I >= ($1).max_retries)'
        ' AND (SELECT u.id FROM u) IS NULL'
        ' RETURNING t.%6$I::pg_catalog.text AS id)'
        ' SELECT pg_catalog.jsonb_build_object(''ids'', coalesce(pg_catalog.jsonb_agg(r.id), ''[]''),'
        ' ''unordered'', (SELECT u.id FROM u)) FROM r',
        v_inbox.schema_name, v_inbox.table_name, c ->> 'processed_at', c ->> 'retry_count', v_set,
        c ->> 'event_id', mailbox._inbox_param(v_inbox, 'event_id', 3, TRUE), v_unordered), NULL, p_event_ids);
    IF v_result ->> 'unordered' IS NOT NULL THEN
        RAISE EXCEPTION 'inbox % is ordered: a message without aggregate or sequence cannot be replayed', p_name
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('An ordered claim takes only messages with both (%s and %s); %s lacks one. Nothing was replayed.',
                                             c ->> 'aggregate_id', c ->> 'sequence_num', v_result ->> 'unordered'),
                  HINT = 'Give it an aggregate and a sequence, or disable ordering, then replay it; or leave it out.';
    END IF;
    SELECT coalesce(pg_catalog.array_agg(x.id ORDER BY x.id), ARRAY[]::text[]) INTO v_ids
      FROM pg_catalog.jsonb_array_elements_text(v_result -> 'ids') AS x (id);
    IF pg_catalog.cardinality(v_ids) > 0 THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = v_inbox.inbox_key AND l.event_id = ANY (v_ids);
        PERFORM mailbox._inbox_unclaim(v_inbox.inbox_key, v_ids);
        PERFORM mailbox._alert('inbox_replay', pg_catalog.jsonb_build_object(
            'inbox', p_name, 'count', pg_catalog.cardinality(v_ids),
            'event_ids', pg_catalog.to_jsonb(v_ids[1:100])));
    END IF;
    RETURN pg_catalog.cardinality(v_ids);
END
$$;
COMMENT ON FUNCTION mailbox.replay_inbox_messages(text, text[]) IS
'reset processed or dead-lettered messages (by id) so they are processed again; alerts inbox_replay';

-- sql/functions/33_inbox_wakeup.sql
-- Part 33 (wake-ups, issue 11), as the outbox's (part 17). NOTIFY mailbox_inbox_new is cheap
-- to send but serialises the commits of all notifying transactions of the database on one
-- lock held through the commit's WAL flush (4 single-message receivers: 3,981 commits/s
-- notifying against 6,435 without). It only helps a worker that waits, so:
--   * an inbox_claim that returns nothing records its worker as waiting on the inbox (a row
--     of the UNLOGGED mailbox._inbox_waiter, expiring after
--     mailbox.consumer_heartbeat_timeout_seconds, at most 60 s, unless it claims again); one
--     that returns messages removes it; drop_inbox and maintenance forget waits;
--   * inbox_receive and inbox_receive_batch notify only while some worker of the inbox waits.
--     Looking costs a statement of its own (an executor start-up, about a tenth of a single
--     receive), so the named receive (part 35) first reads the sequence
--     mailbox._inbox_waiting_until, a bound every wait raises past the end of any wait begun
--     by then: while no worker of any inbox has waited in the last 70 s, a receive reads one
--     sequence and no table.
-- As with the outbox, a receiver looks for waiters when it writes, not when it commits: a
-- receive written before a worker's empty claim committed and committed after it does not
-- wake that worker, which finds the message at its next claim (poll interval). Nothing is
-- lost; a wake-up is only ever earlier than the poll.

-- Records (p_waiting) or forgets the wait of the calling connection on an inbox (wake-ups,
-- above). Keyed by backend, not by worker name: claimers sharing a name (replicas of one
-- service, say) each write only their own row, so none waits for another's open
-- transaction. (Behind a transaction-pooling proxy a worker's claims may run on different
-- backends: a wait another backend registered then lasts until it expires, which only costs
-- receivers some needless notifications.)
CREATE OR REPLACE FUNCTION mailbox._inbox_wait(p_key int, p_worker text, p_waiting boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_until timestamptz;
    v_bound bigint;
BEGIN
    IF p_waiting THEN
        v_until := pg_catalog.clock_timestamp() + LEAST(mailbox._heartbeat_timeout(), INTERVAL '60 seconds');
        INSERT INTO mailbox._inbox_waiter AS w (inbox_key, backend_pid, worker, waiting_until)
        VALUES (p_key, pg_catalog.pg_backend_pid(), p_worker, v_until)
            ON CONFLICT (inbox_key, backend_pid) DO UPDATE
           SET worker = excluded.worker, waiting_until = excluded.waiting_until;
        -- raise the bound named receives read first (above) past the end of every wait that
        -- may have started by now. Not this wait's end: the read and the setval below are not
        -- atomic, so when two waits race the later setval wins even if it is the lower, and a
        -- review found both ways that left a live wait past the bound (a worker with a longer
        -- heartbeat timeout; an end time read before the upsert waited seconds for
        -- maintenance's delete). Every wait ends at most 60 s after a clock reading taken
        -- before this one, so this clock, read after the upsert, plus 60 s covers every wait
        -- whose setval could lose to this one; 10 s more cover a delay between this reading
        -- and the setval.
        v_bound := pg_catalog.ceil(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()))::bigint + 70;
        IF v_bound > COALESCE(pg_catalog.pg_sequence_last_value('mailbox._inbox_waiting_until'), 0) THEN
            PERFORM pg_catalog.setval('mailbox._inbox_waiting_until', v_bound);
        END IF;
    ELSE
        DELETE FROM mailbox._inbox_waiter AS w
         WHERE w.inbox_key = p_key AND w.backend_pid = pg_catalog.pg_backend_pid();
    END IF;
END
$$;

-- Whether a receiver of inbox p_key should notify (wake-ups, above). inbox_receive inlines it.
CREATE OR REPLACE FUNCTION mailbox._inbox_has_waiter(p_key int)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM mailbox._inbox_waiter AS w
                    WHERE w.inbox_key = p_key AND w.waiting_until > pg_catalog.now());
$$;

-- sql/functions/34_inbox_gap_fold.sql
-- Part 34 (gap fold): reading the gap state of a managed ordered inbox (part 34, gap state,
-- says how it is kept and why it is correct under concurrency). A fold takes the touched
-- rows, adds their count changes to mailbox._inbox_count, and reads the table again only for
-- the aggregates they name: an aggregate that only INSERTs touched, every one of them above
-- its head (mailbox._inbox_gap_head: its highest unprocessed sequence at the last fold), is
-- read from its head on and keeps its stored gaps (appending costs what was appended); any
-- other touched aggregate is read from its position, its gaps and head replaced.

-- The fold's read of the inbox table (run as its owner): for each aggregate of $3 (or, with
-- p_all, each aggregate with an unprocessed sequenced message), its unprocessed sequences above
-- a start, $2 (the aggregate's highest sequence at the last fold when only sequences above it
-- were added since), or where $2 is NULL its position (last processed, else first - 1). One row
-- per gap above the start (g) and one for the highest sequence (h, the aggregate's new head),
-- as a jsonb array of {a, e, f, r, g, h}.
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_scan_sql(p_inbox mailbox._inbox, p_all boolean, p_write boolean)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_aggs text;
    v_rows text;
BEGIN
    IF p_all THEN
        v_aggs := mailbox._inbox_pending_aggs_sql(p_inbox, mailbox._inbox_current_table(p_inbox)) || ', k AS (SELECT a.agg, NULL::pg_catalog.int8 AS start FROM aggs AS a)';
    ELSE
        -- the aggregates as the column's type, so the ordering index is used
        v_aggs := pg_catalog.format('WITH k AS (SELECT CAST(d.agg AS %s) AS agg, d.start'
                                    ' FROM ROWS FROM (pg_catalog.unnest($3), pg_catalog.unnest($2)) AS d (agg, start))',
                                    (mailbox._inbox_role_column(p_inbox.table_rel, 'aggregate_id',
                                                                c ->> 'aggregate_id')).full_type);
    END IF;
    v_rows := pg_catalog.format($q$
SELECT k.agg::pg_catalog.text AS a, x.prev + 1 AS e, x.seq AS f, x.recv AS r, x.seq > x.prev + 1 AS g, x.last AS h,
       k.start IS NOT NULL AS appended
  FROM k
 CROSS JOIN mailbox.%6$I AS cfg
 CROSS JOIN LATERAL (SELECT coalesce(k.start, (SELECT s.last_seq FROM mailbox.%7$I AS s WHERE s.aggregate_id = k.agg::text),
                                     cfg.ordering_first_sequence - 1) AS start) AS s
 CROSS JOIN LATERAL (
        SELECT t.%2$I::bigint AS seq, t.%5$I::timestamptz AS recv,
               coalesce(pg_catalog.lag(t.%2$I::bigint) OVER (ORDER BY t.%2$I), s.start) AS prev,
               pg_catalog.lead(t.%2$I) OVER (ORDER BY t.%2$I) IS NULL AS last
          FROM %3$s AS t
         WHERE t.%1$I = k.agg AND t.%4$I IS NULL AND t.%2$I > s.start) AS x
 WHERE x.seq > x.prev + 1 OR x.last$q$,
        c ->> 'aggregate_id', c ->> 'sequence_num', mailbox._inbox_current_table(p_inbox), c ->> 'processed_at',
        c ->> 'received_at', '_inbox_' || p_inbox.inbox_key || '_config', '_inbox_' || p_inbox.inbox_key || '_aggregate');
    IF NOT p_write THEN
        RETURN v_aggs || ' SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''a'', y.a, ''e'', y.e,'
               ' ''f'', y.f, ''r'', y.r, ''g'', y.g)), ''[]'') FROM (' || v_rows || ') AS y';
    END IF;
    -- the fold itself (a tracked inbox is managed: its owner is the extension owner): the new
    -- gaps are added, an appended aggregate's head moved, any other's head made anew
    RETURN v_aggs || pg_catalog.format(', y AS MATERIALIZED (%s),'
        ' gi AS (INSERT INTO mailbox._inbox_gap (inbox_key, aggregate_id, expected_seq, found_seq, found_received_at)'
        '        SELECT %2$s, y.a, y.e, y.f, y.r FROM y WHERE y.g RETURNING 1),'
        ' hu AS (UPDATE mailbox._inbox_gap_head AS h SET high_seq = y.f FROM y'
        '         WHERE y.h AND y.appended AND h.inbox_key = %2$s AND h.aggregate_id = y.a RETURNING 1),'
        ' hi AS (INSERT INTO mailbox._inbox_gap_head (inbox_key, aggregate_id, high_seq)'
        '        SELECT %2$s, y.a, y.f FROM y WHERE y.h AND NOT y.appended RETURNING 1)'
        ' SELECT pg_catalog.to_jsonb((SELECT pg_catalog.count(*) FROM gi) + (SELECT pg_catalog.count(*) FROM hu)'
        '                            + (SELECT pg_catalog.count(*) FROM hi))', v_rows, p_inbox.inbox_key);
END
$$;

-- Folds what was touched since the last fold (see above) when it can: returns TRUE when the
-- stored gaps, heads and counts are now current. A caller that cannot fold gets FALSE and
-- computes the answer without writing (_inbox_gap_fold, _inbox_kept_counts).
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_refresh(p_inbox mailbox._inbox)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := p_inbox.inbox_key;
    v_all boolean;
    v_recount boolean;
    v_du bigint;
    v_dp bigint;
    v_aggs text[];
    v_mins bigint[];
    v_starts bigint[];
    v_full text[];
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed'
       OR pg_catalog.current_setting('transaction_read_only') <> 'off'
       -- one fold of an inbox at a time: (7168635, inbox_key), see part 05
       OR NOT pg_catalog.pg_try_advisory_xact_lock(7168635, v_key) THEN
        RETURN FALSE;
    END IF;
    -- 1. what was touched, taken (per aggregate: the lowest sequence added if only INSERTs
    -- touched it, else NULL), and the count changes
    WITH gone AS (DELETE FROM mailbox._inbox_gap_touched AS t WHERE t.inbox_key = v_key
                  RETURNING t.aggregate_ids, t.min_seqs, t.d_unprocessed, t.d_processed),
    per AS (SELECT u.agg, CASE WHEN pg_catalog.bool_and(u.mn IS NOT NULL) THEN pg_catalog.min(u.mn) END AS mn
              FROM gone AS g, ROWS FROM (pg_catalog.unnest(g.aggregate_ids), pg_catalog.unnest(g.min_seqs)) AS u (agg, mn)
             WHERE u.agg IS NOT NULL
             GROUP BY u.agg)
    SELECT coalesce((SELECT pg_catalog.bool_or(g.aggregate_ids IS NULL) FROM gone AS g), FALSE),
           coalesce((SELECT pg_catalog.bool_or(g.d_unprocessed IS NULL OR g.d_processed IS NULL) FROM gone AS g), FALSE),
           (SELECT pg_catalog.sum(g.d_unprocessed) FROM gone AS g), (SELECT pg_catalog.sum(g.d_processed) FROM gone AS g),
           (SELECT pg_catalog.array_agg(p.agg ORDER BY p.agg) FROM per AS p),
           (SELECT pg_catalog.array_agg(p.mn ORDER BY p.agg) FROM per AS p)
      INTO v_all, v_recount, v_du, v_dp, v_aggs, v_mins;
    -- 2. the counts
    IF v_all OR v_recount OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_count AS n WHERE n.inbox_key = v_key) THEN
        INSERT INTO mailbox._inbox_count AS n (inbox_key, unprocessed, processed)
        SELECT v_key, (x.c ->> 'unprocessed')::bigint, (x.c ->> 'processed')::bigint
          FROM (SELECT mailbox._inbox_count_rows(p_inbox, TRUE) AS c) AS x
            ON CONFLICT (inbox_key) DO UPDATE SET unprocessed = excluded.unprocessed, processed = excluded.processed;
    ELSIF v_du <> 0 OR v_dp <> 0 THEN
        UPDATE mailbox._inbox_count AS n SET unprocessed = n.unprocessed + v_du, processed = n.processed + v_dp
         WHERE n.inbox_key = v_key;
    END IF;
    -- 3. the gaps and heads, read in a later statement than the touched rows: it sees every
    -- message they stand for. An aggregate only INSERTs touched, all above its head, is read
    -- from its head on and keeps its gaps; any other is read again from its position.
    IF v_all THEN
        DELETE FROM mailbox._inbox_gap AS g WHERE g.inbox_key = v_key;
        DELETE FROM mailbox._inbox_gap_head AS h WHERE h.inbox_key = v_key;
        PERFORM mailbox._inbox_as_owner(p_inbox, mailbox._inbox_gap_scan_sql(p_inbox, TRUE, TRUE));
    ELSIF v_aggs IS NOT NULL THEN
        -- the head of each (one index probe each), kept as the start when only appended to
        SELECT pg_catalog.array_agg(CASE WHEN u.mn > u.high THEN u.high END ORDER BY u.ord),
               pg_catalog.array_agg(u.agg) FILTER (WHERE NOT coalesce(u.mn > u.high, FALSE))
          INTO v_starts, v_full
          FROM (SELECT u.agg, u.mn, u.ord,
                       (SELECT h.high_seq FROM mailbox._inbox_gap_head AS h
                         WHERE h.inbox_key = v_key AND h.aggregate_id = u.agg) AS high
                  FROM ROWS FROM (pg_catalog.unnest(v_aggs), pg_catalog.unnest(v_mins)) WITH ORDINALITY
                       AS u (agg, mn, ord)) AS u;
        IF v_full IS NOT NULL THEN
            DELETE FROM mailbox._inbox_gap AS g WHERE g.inbox_key = v_key AND g.aggregate_id = ANY (v_full);
            DELETE FROM mailbox._inbox_gap_head AS h WHERE h.inbox_key = v_key AND h.aggregate_id = ANY (v_full);
        END IF;
        PERFORM mailbox._inbox_as_owner(p_inbox, mailbox._inbox_gap_scan_sql(p_inbox, FALSE, TRUE), v_starts, v_aggs);
    END IF;
    RETURN TRUE;
END
$$;

-- Every gap of a tracked inbox as the jsonb array of _inbox_gap_list (part 34), ordered by
-- aggregate and expected sequence: folds what was touched since the last fold when it can,
-- else computes the same answer without writing (the stored gaps of the aggregates nobody
-- touched, the touched ones read again from their positions).
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_fold(p_inbox mailbox._inbox)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := p_inbox.inbox_key;
    v_all boolean := FALSE;
    v_aggs text[];
    v_fresh jsonb := '[]';
BEGIN
    IF NOT mailbox._inbox_gap_refresh(p_inbox) THEN
        WITH seen AS (SELECT t.aggregate_ids FROM mailbox._inbox_gap_touched AS t WHERE t.inbox_key = v_key)
        SELECT coalesce(pg_catalog.bool_or(seen.aggregate_ids IS NULL), FALSE),
               (SELECT pg_catalog.array_agg(DISTINCT a.agg) FROM seen AS s2, pg_catalog.unnest(s2.aggregate_ids) AS a (agg))
          INTO v_all, v_aggs FROM seen;
        IF v_all OR v_aggs IS NOT NULL THEN
            v_fresh := mailbox._inbox_as_owner(p_inbox, mailbox._inbox_gap_scan_sql(p_inbox, v_all, FALSE), NULL, v_aggs);
        END IF;
    END IF;
    RETURN (SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                        'aggregate_id', g.a, 'expected_seq', g.e, 'found_seq', g.f,
                        'gap_age_sec', pg_catalog.date_part('epoch', pg_catalog.now() - g.r))
                        ORDER BY g.a, g.e), '[]')
              FROM (SELECT s.aggregate_id AS a, s.expected_seq AS e, s.found_seq AS f, s.found_received_at AS r
                      FROM mailbox._inbox_gap AS s
                     WHERE s.inbox_key = v_key AND NOT v_all
                       AND (v_aggs IS NULL OR s.aggregate_id <> ALL (v_aggs))
                    UNION ALL
                    SELECT f.a, f.e, f.f, f.r
                      FROM pg_catalog.jsonb_to_recordset(v_fresh) AS f (a text, e bigint, f bigint, r timestamptz, g boolean)
                     WHERE f.g) AS g);
END
$$;

-- The unprocessed and processed counts of a tracked inbox from its table (as the owner; a
-- managed inbox's owner is the extension owner). With p_unfolded, less the changes of the
-- touched rows the same statement sees, which a later fold adds: so a count taken while
-- writers commit is neither lost nor counted twice.
CREATE OR REPLACE FUNCTION mailbox._inbox_count_rows(p_inbox mailbox._inbox, p_unfolded boolean)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
BEGIN
    RETURN mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'SELECT pg_catalog.jsonb_build_object(''unprocessed'', (SELECT pg_catalog.count(*) FROM %1$s AS t'
        ' WHERE t.%2$I IS NULL) - u.du, ''processed'', (SELECT pg_catalog.count(*) FROM %1$s AS t'
        ' WHERE t.%2$I IS NOT NULL) - u.dp) FROM (SELECT coalesce(pg_catalog.sum(x.d_unprocessed), 0) AS du,'
        ' coalesce(pg_catalog.sum(x.d_processed), 0) AS dp FROM mailbox._inbox_gap_touched AS x'
        ' WHERE x.inbox_key = %3$s AND %4$s) AS u',
        mailbox._inbox_current_table(p_inbox), c ->> 'processed_at', p_inbox.inbox_key,
        CASE WHEN p_unfolded THEN 'TRUE' ELSE 'FALSE' END));
END
$$;

-- The unprocessed and processed counts of a tracked inbox now: those of the last fold plus
-- the changes of the touched rows this statement sees (exact for its snapshot), or counted
-- from the table when a touched row asks for it (TRUNCATE) or nothing was folded yet.
CREATE OR REPLACE FUNCTION mailbox._inbox_kept_counts(p_inbox mailbox._inbox)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_counts jsonb;
BEGIN
    SELECT CASE WHEN NOT coalesce(pg_catalog.bool_or(t.inbox_key IS NOT NULL
                                                  AND (t.d_unprocessed IS NULL OR t.d_processed IS NULL)), FALSE)
                THEN pg_catalog.jsonb_build_object(
                    'unprocessed', n.unprocessed + coalesce(pg_catalog.sum(t.d_unprocessed), 0),
                    'processed', n.processed + coalesce(pg_catalog.sum(t.d_processed), 0)) END
      INTO v_counts
      FROM mailbox._inbox_count AS n
      LEFT JOIN mailbox._inbox_gap_touched AS t ON t.inbox_key = n.inbox_key
     WHERE n.inbox_key = p_inbox.inbox_key
     GROUP BY n.unprocessed, n.processed;
    RETURN coalesce(v_counts, mailbox._inbox_count_rows(p_inbox, FALSE));
END
$$;

-- The rows of inbox_ordering_gaps: a managed inbox that can fold reads its kept gaps in index
-- order (a volatile function, so the read sees the fold's writes); otherwise the gap list.
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_rows(p_inbox mailbox._inbox)
RETURNS TABLE (aggregate_id text, expected_seq bigint, found_seq bigint, gap_age_sec double precision)
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF mailbox._inbox_gap_tracked(p_inbox) AND mailbox._inbox_gap_refresh(p_inbox) THEN
        RETURN QUERY
        SELECT g.aggregate_id, g.expected_seq, g.found_seq,
               pg_catalog.date_part('epoch', pg_catalog.now() - g.found_received_at)
          FROM mailbox._inbox_gap AS g
         WHERE g.inbox_key = p_inbox.inbox_key
         ORDER BY g.aggregate_id, g.expected_seq;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT g.aggregate_id, g.expected_seq, g.found_seq, g.gap_age_sec
      FROM pg_catalog.jsonb_to_recordset(mailbox._inbox_gap_list(p_inbox))
           AS g (aggregate_id text, expected_seq bigint, found_seq bigint, gap_age_sec double precision)
     ORDER BY g.aggregate_id, g.expected_seq;
END
$$;

-- sql/functions/34_inbox_gap_state.sql
-- Part 34 (gap state): the ordering gaps of a managed ordered inbox, kept so that
-- inbox_ordering_gaps and inbox_health cost what changed since they last ran, not the whole
-- pending backlog (issue 11; docs/inbox.md, "How gaps are kept").
--
-- A hole can be anywhere among an aggregate's unprocessed sequences, so finding the gaps from
-- scratch reads every unprocessed message (part 31, _inbox_gaps_sql). Instead:
--   * statement triggers on the inbox table (AFTER INSERT / UPDATE / DELETE with transition
--     tables, AFTER TRUNCATE) record which aggregates a statement touched in
--     mailbox._inbox_gap_touched, in the writer's transaction: one insert-only row per
--     statement (the array of its aggregates, for an INSERT the lowest sequence it added to
--     each, and the statement's change of the unprocessed and processed counts), no lock on
--     anything shared, so racing
--     receivers never wait for each other, and a row commits (or aborts) with the messages
--     it stands for. Every writer is seen: inbox_receive, the batch forms, marks, replay,
--     retention, and plain INSERT / UPDATE / DELETE by hand. A row with NULL aggregates
--     means "every aggregate" (TRUNCATE, enabling ordering);
--   * mailbox._inbox_gap holds every gap of the inbox as of the last fold, _inbox_gap_head
--     each aggregate's highest unprocessed sequence and _inbox_count the message counts. A
--     fold (part 34, gap fold: when inbox_ordering_gaps, inbox_health or maintenance read the
--     gaps) deletes the touched rows it sees, adds their count changes, and reads again from
--     the table (as its owner) exactly the aggregates they name: from the head on for an
--     aggregate only appended to (every INSERT above its head), keeping its gaps; from its
--     position for any other, replacing its gaps and head.
-- Correct under concurrency because the touched rows are read (and deleted) by one statement
-- and the aggregates recomputed by a later one: whatever the first saw committed, the second
-- sees too, and a writer that commits after the first leaves its row for the next fold.
-- Folds of one inbox take a transaction advisory lock (try, never wait), so no fold can
-- overwrite a newer one with an older snapshot; a caller that cannot fold (lock busy,
-- REPEATABLE READ or SERIALIZABLE, a read-only transaction or a standby) computes the same
-- answer without writing: the stored gaps of untouched aggregates plus the touched ones
-- recomputed, the stored counts plus the changes of the touched rows its statement sees.
-- A count taken from the table during a fold subtracts, in the same statement, the changes
-- of the touched rows that statement sees but the fold did not take (a later fold adds
-- them), so nothing is counted twice. A head is only ever too high for an aggregate whose
-- touched row the fold did not take: that row's lowest sequence is then not above the head
-- and the next fold reads the aggregate from its position. Aggregate positions (last_seq)
-- move only when a message is marked processed, which updates its row (touched), or when
-- ordering is enabled (everything touched).
--
-- Only managed inboxes (create_inbox) get the triggers: pg_mailbox adds nothing to a table it
-- adopted (enable_inbox_tracking), so an adopted ordered inbox still finds its gaps by the
-- scan. The trigger function is generated per inbox with the inbox's columns written in
-- (static SQL, so PL/pgSQL caches its plans), owned by the table's owner (the extension owner
-- for a managed inbox), not an extension member (pg_dump dumps it with the table's triggers)
-- but dropped with the extension (DEPENDS ON EXTENSION), triggers and all.

-- Whether the inbox keeps its gaps (above) rather than scanning for them.
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_tracked(p_inbox mailbox._inbox)
RETURNS boolean
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NOT NULL;
$$;

-- The body of an inbox's trigger function: the aggregates of unprocessed messages a statement
-- added or removed, and every aggregate an UPDATE touched (a mark moves its position, a
-- replay brings a message back). Identifiers come from the catalog through format('%I').
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_touch_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
BEGIN
    RETURN pg_catalog.format($b$
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) %5$L::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function touch of inbox %% must run as %%', %6$L, %5$L::pg_catalog.name
            USING ERRCODE = '42501', HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;
    -- per statement: the aggregates whose gaps may change (for an INSERT with the lowest
    -- sequence it added to each) and the change of the unprocessed and processed counts. An
    -- INSERT of a pending message (neither processed nor a dead letter: max_retries never
    -- changes) without aggregate or sequence, which no ordered claim takes, is refused: a
    -- receive that ran the previous configuration's code after waiting for the enable that
    -- made this trigger (part 34, ordering switch)
    IF TG_OP = 'INSERT' THEN
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT CASE WHEN x.bad THEN mailbox._inbox_refuse_unaggregated(%6$L) ELSE %4$s END,
               coalesce(x.aggs, '{}'), coalesce(x.mins, '{}'), x.du, x.dp FROM (
            SELECT pg_catalog.array_agg(y.agg) FILTER (WHERE y.agg IS NOT NULL) AS aggs,
                   pg_catalog.array_agg(y.mn) FILTER (WHERE y.agg IS NOT NULL) AS mins,
                   pg_catalog.sum(y.du)::pg_catalog.int8 AS du, pg_catalog.sum(y.dp)::pg_catalog.int8 AS dp,
                   pg_catalog.bool_or(y.bad) AS bad
              FROM (SELECT CASE WHEN n.%3$I IS NULL AND n.%2$I IS NOT NULL THEN n.%1$I::pg_catalog.text END AS agg,
                           pg_catalog.min(n.%2$I::pg_catalog.int8) AS mn,
                           pg_catalog.count(*) FILTER (WHERE n.%3$I IS NULL) AS du,
                           pg_catalog.count(*) FILTER (WHERE n.%3$I IS NOT NULL) AS dp,
                           pg_catalog.bool_or(n.%3$I IS NULL AND n.%8$I < %9$s AND (n.%1$I IS NULL OR n.%2$I IS NULL)) AS bad
                      FROM mailbox_new_rows AS n GROUP BY 1) AS y) AS x
         WHERE x.aggs IS NOT NULL OR x.du OPERATOR(pg_catalog.<>) 0 OR x.dp OPERATOR(pg_catalog.<>) 0;
    ELSIF TG_OP = 'UPDATE' THEN
        -- an UPDATE keeps the number of rows: processed changes by minus the unprocessed change
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT %4$s, coalesce(x.aggs, '{}'), NULL, c.du, -c.du FROM (
            SELECT pg_catalog.array_agg(DISTINCT y.agg) AS aggs FROM (
                SELECT o.%1$I::pg_catalog.text AS agg FROM mailbox_old_rows AS o WHERE o.%1$I IS NOT NULL
                UNION ALL
                SELECT n.%1$I::pg_catalog.text FROM mailbox_new_rows AS n WHERE n.%1$I IS NOT NULL) AS y) AS x,
            (SELECT (SELECT pg_catalog.count(*) FROM mailbox_new_rows AS n WHERE n.%3$I IS NULL)
                    OPERATOR(pg_catalog.-)
                    (SELECT pg_catalog.count(*) FROM mailbox_old_rows AS o WHERE o.%3$I IS NULL) AS du) AS c
         WHERE x.aggs IS NOT NULL OR c.du OPERATOR(pg_catalog.<>) 0;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids, min_seqs, d_unprocessed, d_processed)
        SELECT %4$s, coalesce(x.aggs, '{}'), NULL, -x.du, -x.dp FROM (
            SELECT pg_catalog.array_agg(DISTINCT o.%1$I::pg_catalog.text)
                       FILTER (WHERE o.%3$I IS NULL AND o.%1$I IS NOT NULL AND o.%2$I IS NOT NULL) AS aggs,
                   pg_catalog.count(*) FILTER (WHERE o.%3$I IS NULL) AS du,
                   pg_catalog.count(*) FILTER (WHERE o.%3$I IS NOT NULL) AS dp
              FROM mailbox_old_rows AS o) AS x
         WHERE x.aggs IS NOT NULL OR x.du OPERATOR(pg_catalog.<>) 0 OR x.dp OPERATOR(pg_catalog.<>) 0;
    ELSE
        -- TRUNCATE: every aggregate, and count again
        INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids) VALUES (%4$s, NULL);
    END IF;
    RETURN NULL;
END$b$,
        c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at', p_inbox.inbox_key,
        mailbox._inbox_owner(p_inbox), p_inbox.inbox_name, NULL, c ->> 'retry_count', p_inbox.max_retries);
END
$$;

-- Removes an inbox's gap triggers (when its table still exists), trigger function and gap rows.
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_untrack(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_trigger name;
    v_fn regprocedure := pg_catalog.to_regprocedure(
        pg_catalog.format('mailbox.%I()', '_inbox_' || p_inbox.inbox_key || '_touch'));
BEGIN
    FOR v_trigger IN
        SELECT t.tgname FROM pg_catalog.pg_trigger AS t
         WHERE t.tgrelid = p_inbox.table_rel
           AND t.tgname = ANY (ARRAY['mailbox_gap_insert', 'mailbox_gap_update', 'mailbox_gap_delete',
                                     'mailbox_gap_truncate'])
    LOOP
        EXECUTE pg_catalog.format('DROP TRIGGER %I ON %s', v_trigger, p_inbox.table_rel::regclass);
    END LOOP;
    IF v_fn IS NOT NULL THEN
        EXECUTE pg_catalog.format('DROP FUNCTION %s', v_fn);
    END IF;
    DELETE FROM mailbox._inbox_gap WHERE inbox_key = p_inbox.inbox_key;
    DELETE FROM mailbox._inbox_gap_touched WHERE inbox_key = p_inbox.inbox_key;
    DELETE FROM mailbox._inbox_gap_head WHERE inbox_key = p_inbox.inbox_key;
    DELETE FROM mailbox._inbox_count WHERE inbox_key = p_inbox.inbox_key;
END
$$;

-- After a settings change (part 34, _inbox_reconfigure): a managed ordered inbox gets its
-- trigger function and triggers (again), and its gaps are recomputed at the next read (every
-- aggregate touched: the columns or positions may have changed); any other inbox has none.
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_sync(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_fn text := pg_catalog.format('mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_touch');
    v_table regclass := p_inbox.table_rel;
BEGIN
    PERFORM mailbox._inbox_gap_untrack(p_inbox);
    IF NOT mailbox._inbox_gap_tracked(p_inbox) THEN
        RETURN;
    END IF;
    -- SECURITY DEFINER: it records touched aggregates for any writer of the table (a producer
    -- has no rights on mailbox's tables); it runs as the table's owner, like every generated
    -- function of the inbox, and writes only this inbox's own key
    EXECUTE pg_catalog.format(
        'CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql VOLATILE SECURITY DEFINER'
        ' SET search_path = pg_catalog, mailbox, pg_temp AS %s',
        v_fn, pg_catalog.quote_literal(mailbox._inbox_gap_touch_sql(p_inbox)));
    EXECUTE pg_catalog.format('ALTER FUNCTION %s() OWNER TO %I', v_fn, mailbox._inbox_owner(p_inbox));
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s() FROM PUBLIC', v_fn);
    -- not an extension member (pg_dump must dump it with the table's triggers), but dropped
    -- with the extension, triggers and all
    EXECUTE pg_catalog.format('ALTER FUNCTION %s() DEPENDS ON EXTENSION pg_mailbox', v_fn);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s() IS %s', v_fn, pg_catalog.quote_literal(
        'pg_mailbox: records the aggregates whose ordering gaps a statement may change, inbox '
        || p_inbox.inbox_name));
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_insert AFTER INSERT ON %s REFERENCING NEW TABLE AS mailbox_new_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_update AFTER UPDATE ON %s'
        ' REFERENCING OLD TABLE AS mailbox_old_rows NEW TABLE AS mailbox_new_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_delete AFTER DELETE ON %s REFERENCING OLD TABLE AS mailbox_old_rows'
        ' FOR EACH STATEMENT EXECUTE FUNCTION %s()', v_table, v_fn);
    EXECUTE pg_catalog.format(
        'CREATE TRIGGER mailbox_gap_truncate AFTER TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()',
        v_table, v_fn);
    INSERT INTO mailbox._inbox_gap_touched (inbox_key, aggregate_ids) VALUES (p_inbox.inbox_key, NULL);
END
$$;

-- sql/functions/34_inbox_ordering.sql
-- Part 34: ordering, priority and partitions (SPEC §3.2).

-- Ordering and priority each decide which message a claim takes first; together they would
-- contradict each other, so an inbox has at most one of them.
CREATE OR REPLACE FUNCTION mailbox._inbox_conflict(p_inbox text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'inbox ordering and priority conflict for inbox: %', p_inbox
        USING ERRCODE = '55000',
              DETAIL = 'Ordering claims messages in sequence per aggregate; priority claims the lowest priority value first.',
              HINT = 'Use separate inboxes: an ordered one and a prioritised one, or disable the other feature first.';
END
$$;

-- Rebuilds the views, indexes and generated functions after a settings change (the catalog
-- row is already updated).
CREATE OR REPLACE FUNCTION mailbox._inbox_reconfigure(p_old mailbox._inbox, p_new mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._inbox_drop_views(p_old);
    PERFORM mailbox._inbox_create_views(p_new);
    PERFORM mailbox._inbox_sync_indexes(p_new);
    PERFORM mailbox._inbox_generate(p_new);
    PERFORM mailbox._inbox_gap_sync(p_new);
END
$$;

-- Maps p_role to p_column of the inbox's table: the column must exist with a type the role
-- accepts (part 30, the same rule as adoption) and play no other role.
CREATE OR REPLACE FUNCTION mailbox._inbox_map_column(p_inbox mailbox._inbox, p_role text, p_column text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._require(p_column, 'column for ' || p_role);
    PERFORM mailbox._inbox_role_column(p_inbox.table_rel, p_role, p_column);
    PERFORM mailbox._inbox_check_distinct_columns(
        (p_inbox.columns - p_role) || pg_catalog.jsonb_build_object(p_role, p_column));
    RETURN pg_catalog.jsonb_build_object(p_role, p_column);
END
$$;

-- The per-aggregate state when ordering is enabled (SPEC §3.2: the head is last processed + 1,
-- p_first_sequence only for a new aggregate). An aggregate's position is the highest
-- sequence among its processed rows, merged with the state kept from an earlier ordered
-- period (disable keeps it: retention may have deleted the processed rows since). The
-- highest, not the end of the contiguous run: that is what inbox_mark_processed records
-- while ordering is on (a message processed out of turn raises last_seq past a hole), so
-- enabling on history gives the same state as having been ordered all along, and history
-- with holes does not block an aggregate on sequences that may never come. Aggregates
-- without processed history are new. Mapping other columns starts over from the history.
-- One pass over the processed rows, at enable time only (never on the per-message path).
CREATE OR REPLACE FUNCTION mailbox._inbox_seed_aggregates(p_old mailbox._inbox, p_new mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_new.columns;
BEGIN
    IF p_old.columns ->> 'aggregate_id' IS DISTINCT FROM c ->> 'aggregate_id'
       OR p_old.columns ->> 'sequence_num' IS DISTINCT FROM c ->> 'sequence_num' THEN
        DELETE FROM mailbox._inbox_aggregate WHERE inbox_key = p_new.inbox_key;
        DELETE FROM mailbox._inbox_gap_alert WHERE inbox_key = p_new.inbox_key;
    END IF;
    -- the history is read with the table owner's rights; what comes back is data for this
    -- inbox's own key only
    INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq)
    SELECT p_new.inbox_key, h.aggregate_id, h.last_seq
      FROM pg_catalog.jsonb_to_recordset(mailbox._inbox_as_owner(p_new, pg_catalog.format(
        'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''aggregate_id'', h.agg,'
        ' ''last_seq'', h.seq)), ''[]'') FROM (SELECT t.%1$I::pg_catalog.text AS agg,'
        ' pg_catalog.max(t.%2$I)::pg_catalog.int8 AS seq FROM %4$I.%5$I AS t'
        ' WHERE t.%3$I IS NOT NULL AND t.%1$I IS NOT NULL AND t.%2$I IS NOT NULL GROUP BY t.%1$I) AS h',
        c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at', p_new.schema_name, p_new.table_name)))
           AS h (aggregate_id text, last_seq bigint)
     WHERE h.aggregate_id IS NOT NULL AND h.last_seq IS NOT NULL
        ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
       SET last_seq = pg_catalog.int8larger(a.last_seq, excluded.last_seq), updated_at = excluded.updated_at;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.enable_inbox_ordering(
    p_inbox text,
    p_aggregate_id_col text DEFAULT 'aggregate_id',
    p_sequence_num_col text DEFAULT 'sequence_num',
    p_first_sequence bigint DEFAULT 1
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_first_sequence, 'p_first_sequence');
    -- _inbox_hold_in_flight below must see the leases of claims that commit while this waits
    -- for them, which a REPEATABLE READ or SERIALIZABLE snapshot cannot
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'enable_inbox_ordering must run in READ COMMITTED, not %',
                        pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = '55000',
                  DETAIL = 'It waits for the inbox''s open claims and then reads the leases they wrote.',
                  HINT = 'Run it in a READ COMMITTED transaction: SET TRANSACTION ISOLATION LEVEL READ COMMITTED first, or SET default_transaction_isolation = ''read committed''.';
    END IF;
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.priority_tiers IS NOT NULL THEN
        PERFORM mailbox._inbox_conflict(p_inbox);
    END IF;
    v_new := v_old;
    v_new.columns := v_old.columns
        || mailbox._inbox_map_column(v_old, 'aggregate_id', p_aggregate_id_col)
        || mailbox._inbox_map_column(v_old, 'sequence_num', p_sequence_num_col);
    IF v_new.columns ->> 'aggregate_id' = p_sequence_num_col THEN
        RAISE EXCEPTION 'column mapped to more than one role: %', p_sequence_num_col
            USING ERRCODE = '22023', HINT = 'Aggregate id and sequence number need their own columns.';
    END IF;
    v_new.ordering_first_sequence := p_first_sequence;
    -- wait for the transactions that claimed from (or wrote to) the inbox: an open claim's
    -- leases are written at its commit, and _inbox_hold_in_flight below must see them all
    -- (after the checks above, so a refused call never waits)
    EXECUTE pg_catalog.format('LOCK TABLE %I.%I IN EXCLUSIVE MODE', v_old.schema_name, v_old.table_name);
    PERFORM mailbox._inbox_refuse_unorderable(v_old, v_new);
    UPDATE mailbox._inbox SET columns = v_new.columns, ordering_first_sequence = p_first_sequence
     WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_seed_aggregates(v_old, v_new);
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
    PERFORM mailbox._inbox_hold_in_flight(v_new);
END
$$;
COMMENT ON FUNCTION mailbox.enable_inbox_ordering(text, text, text, bigint) IS
'process messages in sequence per aggregate: views next_<inbox> and gaps_<inbox>, ordered claims';

CREATE OR REPLACE FUNCTION mailbox.disable_inbox_ordering(p_inbox text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.ordering_first_sequence IS NULL THEN
        IF p_if_exists THEN
            RAISE NOTICE 'inbox ordering not enabled, skipping: %', p_inbox;
            RETURN;
        END IF;
        RAISE EXCEPTION 'inbox ordering not enabled: %', p_inbox
            USING ERRCODE = '55000', HINT = 'Pass p_if_exists => true to ignore this.';
    END IF;
    v_new := v_old;
    v_new.ordering_first_sequence := NULL;
    UPDATE mailbox._inbox SET ordering_first_sequence = NULL WHERE inbox_key = v_old.inbox_key;
    -- the per-aggregate positions stay: enabling again merges them with the processed history
    -- (which retention may have thinned meanwhile); gaps are announced afresh
    DELETE FROM mailbox._inbox_gap_alert WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
END
$$;
COMMENT ON FUNCTION mailbox.disable_inbox_ordering(text, boolean) IS
'stop ordering an inbox: drops next_<inbox> and gaps_<inbox> (each aggregate''s position is kept)';

-- Every gap of an ordered inbox as a jsonb array of {aggregate_id, expected_seq, found_seq,
-- gap_age_sec}: a managed inbox's kept gaps (part 34, gap state), or read with the table
-- owner's rights (the SQL of gaps_<i>, not that view: a view in the table's schema may be
-- replaced by that schema's owner).
CREATE OR REPLACE FUNCTION mailbox._inbox_gap_list(p_inbox mailbox._inbox)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF mailbox._inbox_gap_tracked(p_inbox) THEN
        RETURN mailbox._inbox_gap_fold(p_inbox);
    END IF;
    RETURN mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''aggregate_id'', g.aggregate_id,'
        ' ''expected_seq'', g.expected_seq, ''found_seq'', g.found_seq, ''gap_age_sec'', g.gap_age_sec)), ''[]'')'
        ' FROM (%s) AS g', mailbox._inbox_gaps_sql(p_inbox, mailbox._inbox_current_table(p_inbox))));
END
$$;

CREATE OR REPLACE FUNCTION mailbox.inbox_ordering_gaps(p_inbox text)
RETURNS TABLE (aggregate_id text, expected_seq bigint, found_seq bigint, gap_age_sec double precision)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads any inbox table (as its owner) and the ordering state for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_inbox);
BEGIN
    PERFORM mailbox._inbox_check_table(v_inbox);
    IF v_inbox.ordering_first_sequence IS NULL THEN
        RAISE EXCEPTION 'inbox ordering not enabled: %', p_inbox
            USING ERRCODE = '55000', HINT = 'Enable it with mailbox.enable_inbox_ordering().';
    END IF;
    RETURN QUERY SELECT * FROM mailbox._inbox_gap_rows(v_inbox);
END
$$;
COMMENT ON FUNCTION mailbox.inbox_ordering_gaps(text) IS
'every hole in the sequences of an ordered inbox, including the one after the last processed message';

CREATE OR REPLACE FUNCTION mailbox._inbox_tiers_py(p_tiers jsonb)
RETURNS jsonb
LANGUAGE plpython3u IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "0.2.0":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, inbox_tiers
return errors.envelope(plpy, inbox_tiers.validate_sql, p_tiers)
$$;

CREATE OR REPLACE FUNCTION mailbox.enable_inbox_priority(
    p_inbox text, p_priority_col text DEFAULT 'priority', p_tiers jsonb DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
    v_tiers jsonb;
BEGIN
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.ordering_first_sequence IS NOT NULL THEN
        PERFORM mailbox._inbox_conflict(p_inbox);
    END IF;
    v_tiers := mailbox._unwrap(mailbox._inbox_tiers_py(p_tiers));
    v_new := v_old;
    v_new.columns := v_old.columns
        || mailbox._inbox_map_column(v_old, 'priority', p_priority_col);
    v_new.priority_tiers := v_tiers;
    UPDATE mailbox._inbox SET columns = v_new.columns, priority_tiers = v_tiers WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
END
$$;
COMMENT ON FUNCTION mailbox.enable_inbox_priority(text, text, jsonb) IS
'claim lower priority values first; one view pending_<inbox>_<tier> per tier';

CREATE OR REPLACE FUNCTION mailbox.disable_inbox_priority(p_inbox text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.priority_tiers IS NULL THEN
        IF p_if_exists THEN
            RAISE NOTICE 'inbox priority not enabled, skipping: %', p_inbox;
            RETURN;
        END IF;
        RAISE EXCEPTION 'inbox priority not enabled: %', p_inbox
            USING ERRCODE = '55000', HINT = 'Pass p_if_exists => true to ignore this.';
    END IF;
    v_new := v_old;
    v_new.priority_tiers := NULL;
    UPDATE mailbox._inbox SET priority_tiers = NULL WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
END
$$;
COMMENT ON FUNCTION mailbox.disable_inbox_priority(text, boolean) IS
'stop prioritising an inbox: drops the tier views, claims go back to arrival order';

CREATE OR REPLACE FUNCTION mailbox.inbox_is_my_partition(p_aggregate_id text, p_worker_id int, p_total_workers int)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_worker_id IS NULL OR p_total_workers IS NULL THEN
        RAISE EXCEPTION 'p_worker_id and p_total_workers must not be null'
            USING ERRCODE = '22004', HINT = 'Pass this worker''s number (0 to total - 1) and the number of workers.';
    END IF;
    IF p_total_workers <= 0 THEN
        RAISE EXCEPTION 'invalid number of workers: %', p_total_workers
            USING ERRCODE = '22023', HINT = 'p_total_workers is 1 or more.';
    END IF;
    IF p_worker_id < 0 OR p_worker_id >= p_total_workers THEN
        RAISE EXCEPTION 'invalid worker id: % of % workers', p_worker_id, p_total_workers
            USING ERRCODE = '22023', HINT = pg_catalog.format('p_worker_id is 0 to %s.', p_total_workers - 1);
    END IF;
    -- bigint before abs(): abs(-2147483648) does not fit in an int; NULL aggregates are nobody's
    RETURN pg_catalog.abs(pg_catalog.hashtext(p_aggregate_id)::bigint) % p_total_workers = p_worker_id;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_is_my_partition(text, int, int) IS
'true when the aggregate belongs to this worker: abs(hashtext(id)) % total = worker';

-- sql/functions/34_inbox_ordering_switch.sql
-- Part 34 (ordering switch): what enable_inbox_ordering does for an inbox that already has
-- messages, beyond its catalog change (part 34, ordering): refuse while a pending message
-- could never be claimed once ordered, and hold the aggregates whose messages are in flight;
-- and the code generated for an unordered inbox (part 35) that refuses to run on after an
-- enable it waited for.

-- Messages in flight when ordering is enabled were claimed without it: their lease rows carry
-- no aggregate, and a claim's walk looks at leases only up to an aggregate's head, so a3
-- leased while ordering was off let a1 be claimed beside it once ordering was on. Now, for each
-- aggregate with a live lease on a pending message, the lease of the highest sequence carries
-- the aggregate (one row per aggregate: the unique index), lasting until the last of the
-- aggregate's leases ends. Every ordered claim leaves out a message whose aggregate another
-- message's row carries, and gives the aggregate back once that lease has ended (part 37,
-- _inbox_claim_leases). Processing the carrier ends it too, but raises last_seq to at least
-- every other sequence in flight, and a head whose aggregate has a message in flight up to
-- last_seq + 1 is never claimed (part 35, builders). Only the carrier failing (a retry time)
-- frees the aggregate while others of it still run (docs/design.md §7.3). Every lease is
-- seen: enable_inbox_ordering runs in READ COMMITTED and first waits for the open claims of
-- the inbox (their leases are written at commit); the caller's own are settled here.
-- Aggregates that rows carried in an earlier ordered period, or under another mapping, are
-- cleared first. The leases' messages are read with the table owner's rights; what comes
-- back is ids, aggregates and times of this inbox.
CREATE OR REPLACE FUNCTION mailbox._inbox_hold_in_flight(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
BEGIN
    -- this transaction's own open claims of the inbox (the only ones it can see) lease now
    PERFORM mailbox._inbox_settle(o.claim_no) FROM mailbox._inbox_open_claim AS o
      WHERE o.inbox_key = p_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned();
    UPDATE mailbox._inbox_lease AS l SET aggregate_id = NULL
     WHERE l.inbox_key = p_inbox.inbox_key AND l.aggregate_id IS NOT NULL;
    UPDATE mailbox._inbox_lease AS l SET aggregate_id = h.agg, lease_until = GREATEST(l.lease_until, h.until)
      FROM pg_catalog.jsonb_to_recordset(mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''id'', h.id, ''agg'', h.agg,'
        ' ''until'', h.until)), ''[]'') FROM (SELECT DISTINCT ON (1) %1$s::pg_catalog.text AS agg, l.event_id AS id,'
        ' pg_catalog.max(l.lease_until) OVER (PARTITION BY %1$s) AS until'
        ' FROM mailbox.%2$I AS l JOIN %3$I.%4$I AS t ON %5$s = %6$s'
        ' WHERE l.lease_until > pg_catalog.clock_timestamp() AND %1$s IS NOT NULL AND %7$s IS NULL'
        ' ORDER BY 1, %8$s DESC NULLS LAST, l.event_id) AS h',
        mailbox._inbox_col(c, 'aggregate_id'), '_inbox_' || p_inbox.inbox_key || '_lease',
        p_inbox.schema_name, p_inbox.table_name, mailbox._inbox_col(c, 'event_id'),
        CASE WHEN p_inbox.casts ? 'event_id'
             THEN pg_catalog.format('CAST(l.event_id AS %s)', p_inbox.casts ->> 'event_id')
             ELSE 'l.event_id' END,
        mailbox._inbox_col(c, 'processed_at'), mailbox._inbox_col(c, 'sequence_num')))) AS h (id text, agg text, until timestamptz)
     WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = h.id;
    -- while such a lease lasts, ordered claims probe each candidate head's aggregate
    UPDATE mailbox._inbox AS i
       SET held_until = (SELECT pg_catalog.max(l.lease_until) FROM mailbox._inbox_lease AS l
                          WHERE l.inbox_key = p_inbox.inbox_key AND l.aggregate_id IS NOT NULL)
     WHERE i.inbox_key = p_inbox.inbox_key;
END
$$;

-- An ordered claim takes only messages with an aggregate and a sequence, and inbox_receive
-- requires both once the inbox is ordered; a pending message without them would never be
-- claimed after the enable. So the enable is refused while the inbox has one (read after
-- the enable's lock, so no open receive adds one later; dead letters are not counted).
CREATE OR REPLACE FUNCTION mailbox._inbox_refuse_unorderable(p_old mailbox._inbox, p_new mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_new.columns;
    v_found jsonb := mailbox._inbox_as_owner(p_old, pg_catalog.format(
        'SELECT pg_catalog.jsonb_build_object(''n'', pg_catalog.count(*), ''id'', pg_catalog.min(%1$s::pg_catalog.text))'
        ' FROM %2$s AS t WHERE %3$s IS NULL AND %4$s < ($1).max_retries AND (%5$s IS NULL OR %6$s IS NULL)',
        mailbox._inbox_col(c, 'event_id'), mailbox._inbox_table_sql(p_old), mailbox._inbox_col(c, 'processed_at'),
        mailbox._inbox_col(c, 'retry_count'), mailbox._inbox_col(c, 'aggregate_id'), mailbox._inbox_col(c, 'sequence_num')));
BEGIN
    IF (v_found ->> 'n')::bigint > 0 THEN
        RAISE EXCEPTION 'inbox % has % pending message(s) without aggregate or sequence', p_old.inbox_name, v_found ->> 'n'
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('An ordered inbox claims only messages with both (%s and %s); these would never be claimed. One of them: %s.',
                                             c ->> 'aggregate_id', c ->> 'sequence_num', v_found ->> 'id'),
                  HINT = 'Let the workers process them first, or set their aggregate and sequence, then enable ordering.';
    END IF;
END
$$;

-- A mark or receive of an unordered inbox runs the unordered code. One that looked the inbox
-- up before an enable_inbox_ordering committed and then waited for the enable's lock on the
-- table must not go on as if the inbox were still unordered: a mark records no aggregate
-- position (the aggregate would wait for a sequence already processed), a receive stores a
-- message without aggregate or sequence (no ordered claim takes it). Its statement reads the
-- ordering again (in READ COMMITTED its snapshot is taken after the lock, so it sees the
-- enable; one subquery of the statement, no statement of its own) and the call is refused
-- with 40001 (p_call names it), as such a claim is (part 37, _inbox_check_unchanged).
-- Ordered code needs no such check, and neither does a managed inbox's receive: the insert
-- trigger the enable adds refuses what it stores (_inbox_refuse_unaggregated, below).
-- _inbox_build_ordered_now: the value to read (FALSE for an ordered inbox). The extension
-- owner's code reads the catalog table; a table owner's, the inbox's config view (part 31),
-- which drop_inbox drops: a worker that reads it while a drop_inbox waits for another view
-- it holds can deadlock (docs/inbox.md, drop_inbox), so only adopted tables pay that.
-- _inbox_build_refuse_ordered: the refusal when p_var holds TRUE.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_ordered_now(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL THEN 'FALSE'
                WHEN mailbox._inbox_owner(p_inbox) = pg_catalog.pg_get_userbyid(mailbox._extension_owner())
                THEN pg_catalog.format('(SELECT i.ordering_first_sequence FROM mailbox._inbox AS i'
                                       ' WHERE i.inbox_key = %s) IS NOT NULL', p_inbox.inbox_key)
                ELSE pg_catalog.format('(SELECT c.ordering_first_sequence FROM mailbox.%I AS c) IS NOT NULL',
                                       '_inbox_' || p_inbox.inbox_key || '_config') END;
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_build_refuse_ordered(p_inbox mailbox._inbox, p_var text, p_call text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL THEN '' ELSE pg_catalog.format($b$
    IF %s THEN
        RAISE EXCEPTION 'inbox %% changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This %s read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;$b$, p_var, p_call) END;
$$;

-- Raised by a managed ordered inbox's insert trigger (part 34, gap state) for a statement that
-- stored a pending message without aggregate or sequence. The ordered receive refuses those
-- before it inserts (22004), so this is a receive that looked the inbox up before
-- enable_inbox_ordering committed (on an unordered inbox, or again with other columns) and
-- then waited for the enable's lock (the trigger came with the enable, and the INSERT,
-- planned after the wait, fires it), in any isolation level; or an INSERT by hand, which a
-- retry does not mend (the HINT says so). Returns nothing: it only raises (its int result
-- fits the trigger's statement).
CREATE OR REPLACE FUNCTION mailbox._inbox_refuse_unaggregated(p_inbox text)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'inbox % is ordered: a pending message needs an aggregate and a sequence', p_inbox
        USING ERRCODE = '40001',
              DETAIL = 'This receive read the inbox before ordering was enabled or changed, then waited for the enable''s lock and ran the previous configuration''s code (an INSERT by hand without them is refused the same way).',
              HINT = 'Retry a receive: the next one runs the ordered code, which requires p_aggregate_id and p_sequence_num. A row written by hand needs both, or processed_at.';
END
$$;

-- sql/functions/35_inbox_builders.sql
-- Part 35 (builders): the bodies of an inbox's generated per-message functions, one builder
-- per function. Each takes the inbox's catalog row and returns the PL/pgSQL statements that
-- _inbox_define (part 35) wraps with the owner check. Identifiers come from the catalog
-- through format('%I'); values stay bind parameters ($1 is always the catalog row). What
-- they build for a managed and an adopted inbox is committed in
-- tests/expected/inbox_generated_*.sql.

-- The test "not processed yet" (`t.<processed_at> IS NULL`) of a statement that finds its
-- rows by id: a mark, a failure report, the commit's settle. Written as a CASE, which means the
-- same, so that the planner cannot prove from it the predicate of the pending index
-- (`WHERE processed_at IS NULL`): it could then read that index, filtered by id, instead of
-- the primary key. A plan made while the table was nearly empty, when both cost nothing, did
-- so, and read every pending message at each call once a burst had arrived (docs/inbox.md,
-- "Plans made on an empty queue"). Only the primary key can find these rows now.
CREATE OR REPLACE FUNCTION mailbox._inbox_sql_unprocessed(p_column text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('CASE WHEN t.%I IS NULL THEN TRUE END', p_column);
$$;

-- What a receive's INSERT is made of, from the catalog row (see _inbox_build_receive).
CREATE OR REPLACE FUNCTION mailbox._inbox_receive_parts(p_inbox mailbox._inbox)
RETURNS TABLE (cols text[], vals text[], unmapped int[], smallint_priority boolean)
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_roles text[] := mailbox._inbox_receive_roles();
BEGIN
    cols := ARRAY[]::text[];
    vals := ARRAY[]::text[];
    unmapped := ARRAY[]::int[];
    FOR i IN 1 .. pg_catalog.array_length(v_roles, 1) LOOP
        IF c ? v_roles[i] THEN
            cols := cols || pg_catalog.quote_ident(c ->> v_roles[i]);
            vals := vals || mailbox._inbox_param(p_inbox, v_roles[i], i + 1);
        ELSE
            unmapped := unmapped || (i + 1);
        END IF;
    END LOOP;
    -- an adopted table's columns may lack defaults: a new message is unprocessed, never tried
    cols := cols || pg_catalog.quote_ident(c ->> 'received_at') || pg_catalog.quote_ident(c ->> 'retry_count');
    vals := vals || 'pg_catalog.now()'::text || '0'::text;
    -- a priority that does not fit a smallint column is the caller's error, named as such
    smallint_priority := mailbox._inbox_column_base_type(p_inbox, 'priority') = 'int2';
    RETURN NEXT;
END
$$;

-- receive(row, event_id, payload, event_type, source, aggregate_id, sequence_num, headers,
-- trace_id, priority): its checks, then the insert. Role i of _inbox_receive_roles() is
-- parameter $(i + 1): the insert's columns and values, the roles the table has no column
-- for, and whether its priority is a smallint come from _inbox_receive_parts (above), which
-- the named receive (part 35, named receive) shares.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_receive(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_roles text[] := mailbox._inbox_receive_roles();
    v_parts record;
    v_checks text := '';
    n int;
BEGIN
    SELECT * INTO v_parts FROM mailbox._inbox_receive_parts(p_inbox);
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        v_checks := $c$
    IF $6 IS NULL OR $7 IS NULL THEN
        RAISE EXCEPTION 'inbox % is ordered: p_aggregate_id and p_sequence_num must not be null', ($1).inbox_name
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;$c$;
    END IF;
    FOREACH n IN ARRAY v_parts.unmapped LOOP
        -- v_roles[n - 1] is a role name of the registry (part 30), never caller text
        v_checks := v_checks || pg_catalog.format($c$
    IF $%s IS NOT NULL THEN
        RAISE EXCEPTION 'inbox %% has no column for %s', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;$c$, n, v_roles[n - 1]);
    END LOOP;
    IF v_parts.smallint_priority THEN
        v_checks := v_checks || $c$
    IF $10 NOT BETWEEN -32768 AND 32767 THEN
        RAISE EXCEPTION 'p_priority out of range for inbox %: %', ($1).inbox_name, $10
            USING ERRCODE = '22023',
                  HINT = 'p_priority is -32768 to 32767 (the inbox''s priority column is a smallint); lower values are claimed first.';
    END IF;$c$;
    END IF;
    -- a receive that looked the inbox up before enable_inbox_ordering committed and then
    -- waited for its lock runs this unordered code: it must not store a message without
    -- aggregate or sequence, which no ordered claim takes. On a managed inbox the insert
    -- trigger that the enable adds refuses it (part 34, gap state), at no cost before; an
    -- adopted table gets no trigger, so its receive reads the ordering again in its INSERT
    -- (a subquery of RETURNING, part 34, ordering switch)
    RETURN pg_catalog.format($b$%1$s
    INSERT INTO %2$s AS t (%3$s) VALUES (%4$s) ON CONFLICT (%5$I) DO NOTHING%6$s;%7$s
    RETURN FOUND;$b$,
        v_checks, mailbox._inbox_table_sql(p_inbox), pg_catalog.array_to_string(v_parts.cols, ', '),
        pg_catalog.array_to_string(v_parts.vals, ', '), c ->> 'event_id',
        CASE WHEN NOT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NULL
             THEN ' RETURNING ' || mailbox._inbox_build_ordered_now(p_inbox) || ' INTO v_ordered' ELSE '' END,
        CASE WHEN NOT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NULL
             THEN mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'receive') ELSE '' END);
END
$$;

-- The base type (pg_type.typname, through domains) of the column a role is mapped to; NULL
-- when the role is not mapped.
CREATE OR REPLACE FUNCTION mailbox._inbox_column_base_type(p_inbox mailbox._inbox, p_role text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT b.typname::text
      FROM pg_catalog.pg_attribute AS a
      JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
      JOIN pg_catalog.pg_type AS b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
     WHERE a.attrelid = p_inbox.table_rel AND a.attname = p_inbox.columns ->> p_role AND NOT a.attisdropped;
$$;

-- The per-inbox view of the inbox's own lease rows (part 31), as written into generated SQL.
CREATE OR REPLACE FUNCTION mailbox._inbox_lease_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('mailbox.%I', '_inbox_' || p_inbox.inbox_key || '_lease');
$$;

-- A head p_alias (a row of the inbox table) is free to claim: no live lease or pending retry
-- of its own, no other message of its aggregate up to the head under a live lease, and no
-- live lease carrying its aggregate: a message claimed beyond the head before ordering was
-- enabled carries it (part 34, _inbox_hold_in_flight). That index probe runs only while such
-- a lease may last (the catalog row's held_until); without it the head was taken as a
-- candidate and only dropped at the lease upsert (part 37), so a claim of one could come
-- back empty while other aggregates had heads. Otherwise every lease carrying an aggregate
-- is its head's, which the probes before already see. The aggregate's messages are read in
-- the ordering index's order (ORDER BY): the pending index, whose predicate is the same,
-- would need a sort, so the planner takes the ordering index even for a plan made on a
-- nearly empty table, where it took the pending index and read it whole at every head
-- (docs/inbox.md, "Plans made on an empty queue").
CREATE OR REPLACE FUNCTION mailbox._inbox_build_head_free(p_inbox mailbox._inbox, p_alias text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format(
        'NOT EXISTS (SELECT 1 FROM %3$s AS l'
        ' WHERE l.event_id = %2$I.%1$I::text AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0)'
        ' AND NOT EXISTS (SELECT 1 FROM %4$s AS s'
        ' WHERE s.%5$I = %2$I.%5$I AND s.%7$I IS NULL AND s.%6$I <= coalesce((SELECT a.last_seq'
        ' FROM mailbox.%8$I AS a WHERE a.aggregate_id = %2$I.%5$I::text),'
        ' ($1).ordering_first_sequence - 1) + 1'
        ' AND EXISTS (SELECT 1 FROM %3$s AS l WHERE l.event_id = s.%1$I::text AND l.lease_until > $3 OFFSET 0)'
        ' ORDER BY s.%5$I, s.%6$I OFFSET 0)'
        ' AND (($1).held_until IS NULL OR ($1).held_until <= $3 OR NOT EXISTS (SELECT 1 FROM %3$s AS l'
        ' WHERE l.aggregate_id = %2$I.%5$I::text AND l.lease_until > $3 OFFSET 0))',
        c ->> 'event_id', p_alias, mailbox._inbox_lease_sql(p_inbox), mailbox._inbox_table_sql(p_inbox),
        c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at',
        '_inbox_' || p_inbox.inbox_key || '_aggregate')
      FROM (SELECT p_inbox.columns AS c) AS x;
$$;

-- processed(row, event_id): marks it and returns its id (with aggregate and sequence when the
-- inbox is ordered); inbox_mark_processed settles lease and ordering.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_processed(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp() WHERE t.%3$I = %4$s AND %9$s
    RETURNING t.%3$I::pg_catalog.text, %5$s, %6$s, %7$s INTO v_id, v_aggregate, v_seq, v_ordered;%8$s
    RETURN ROW(v_id, v_aggregate, v_seq)::mailbox._inbox_done;$b$,
        mailbox._inbox_table_sql(p_inbox), c ->> 'processed_at', c ->> 'event_id',
        mailbox._inbox_param(p_inbox, 'event_id', 2),
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.text'
             ELSE mailbox._inbox_item(c, 'aggregate_id', 'pg_catalog.text') END,
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.int8'
             ELSE mailbox._inbox_item(c, 'sequence_num', 'pg_catalog.int8') END,
        mailbox._inbox_build_ordered_now(p_inbox), mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'mark'),
        mailbox._inbox_sql_unprocessed(c ->> 'processed_at'))
      FROM (SELECT p_inbox.columns AS c) AS x;
$$;

-- failed(row, event_id, error): counts the failure (and records the error where the table
-- has a column for it), or says why not; inbox_mark_failed settles the lease.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_failed(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = t.%2$I + 1%3$s
     WHERE t.%4$I = %5$s AND %7$s AND t.%2$I < ($1).max_retries
    RETURNING t.%4$I::pg_catalog.text, t.%2$I INTO v_id, v_retries;
    IF v_id IS NOT NULL THEN
        RETURN ROW(v_id, v_retries, 'counted')::mailbox._inbox_attempt;
    END IF;
    SELECT t.%6$I IS NOT NULL INTO v_processed FROM %1$s AS t WHERE t.%4$I = %5$s;
    RETURN ROW(NULL, NULL, CASE WHEN v_processed IS NULL THEN 'missing' WHEN v_processed THEN 'processed'
                                ELSE 'dead' END)::mailbox._inbox_attempt;$b$,
        mailbox._inbox_table_sql(p_inbox), c ->> 'retry_count',
        CASE WHEN c ? 'error' THEN pg_catalog.format(', %I = $3', c ->> 'error') ELSE '' END,
        c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2), c ->> 'processed_at',
        mailbox._inbox_sql_unprocessed(c ->> 'processed_at'))
      FROM (SELECT p_inbox.columns AS c) AS x;
$$;

-- sql/functions/35_inbox_claim_builder.sql
-- Part 35 (claim builder): the generated claim's query (issue 11), one of the builders of
-- part 35 (builders), which writes the other generated functions' SQL: an ordered inbox's
-- heads, the claimed message's fields, and the claim itself, with its exclusion of leased
-- messages.

-- For an ordered inbox, the claim's extra condition: only aggregate heads, oldest first (at
-- most 4 x batch + 16 of them), collected by an InitPlan so the claim itself is a
-- primary-key lookup. At most one in flight per aggregate: a head that is leased (or waits
-- for its retry time) is skipped, and so is a head whose aggregate has another message under
-- a live lease: a lower sequence that arrived (or was replayed) after its successor was
-- claimed is the head again, but waits until that successor is settled. A message in flight
-- was a head when it was claimed, so its sequence is at most last_seq + 1 (last_seq never
-- decreases): the probe reads only the aggregate's unprocessed rows up to there (the
-- ordering index), usually the head alone. Empty for an unordered inbox.
-- The heads come from one of two reads that give the same answer (issue 11):
--   * the walk: next_<i>'s SQL (written in here: a view in the table's schema may be
--     replaced by that schema's owner), one skip-scan step per aggregate with unprocessed
--     messages, so a claim costs per busy aggregate;
--   * for a managed inbox (whose pending index is known) with more busy aggregates than the
--     claim wants heads (a skip scan that stops there counts them), the arrival read:
--     unprocessed messages oldest first (the pending index), dead letters passed over (they
--     are never heads, and they stay oldest for days), keeping each that is its aggregate's
--     head by the walk's rule (no unprocessed message of the aggregate, dead letters
--     included, with a lower sequence, or the same sequence and a lower id; its sequence at
--     most last_seq + 1; free), until 4 x batch + 16 are kept or
--     2 x (4 x batch + 16) were read (the inner LIMIT; the outer one stops the read early, so
--     the kept heads are the first in the inner subquery's received_at order). Any head
--     older than the last message read is among those read, so when the read keeps enough,
--     or reads every unprocessed message, its heads are the walk's oldest (up to ties in
--     received_at); when it does not (heads thinly spread over arrival order), the walk runs.
-- The walk is written once, as the fallback of coalesce: the read gives NULL when it is not
-- tried (few busy aggregates) or does not answer.
-- The head test's NOT EXISTS is fenced (OFFSET 0): left to the planner it becomes a hash
-- anti-join over the whole table; and it reads in the ordering index's order, as the head
-- test of part 35, builders (_inbox_build_head_free), says why. So is the array (h) fenced:
-- pulled up, the planner copies it into both places that use it and runs the read twice.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_claim_heads(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN ''
                WHEN NOT p_inbox.is_managed THEN pg_catalog.format(' AND t.%I = ANY (%s)', c ->> 'event_id', walk)
                ELSE pg_catalog.format(
        ' AND t.%1$I = ANY (coalesce(CASE WHEN (%2$s SELECT pg_catalog.count(*) FROM (SELECT 1 FROM aggs LIMIT $2 * 4 + 17) AS b)'
        ' > $2 * 4 + 16 THEN (SELECT CASE WHEN pg_catalog.cardinality(h.heads) >= $2 * 4 + 16'
        ' OR (SELECT pg_catalog.count(*) FROM (SELECT 1 FROM %9$s AS t WHERE t.%10$I IS NULL'
        ' AND t.%7$I < ($1).max_retries LIMIT ($2 * 4 + 16) * 2) AS c) < ($2 * 4 + 16) * 2 THEN h.heads END'
        ' FROM (SELECT ARRAY(SELECT r.%1$I FROM (SELECT t.%1$I, t.%5$I, t.%6$I, t.%4$I FROM %9$s AS t'
        ' WHERE t.%10$I IS NULL AND t.%7$I < ($1).max_retries ORDER BY t.%4$I LIMIT ($2 * 4 + 16) * 2) AS r'
        ' WHERE r.%5$I IS NOT NULL AND r.%6$I IS NOT NULL'
        ' AND r.%6$I <= coalesce((SELECT a.last_seq FROM mailbox.%8$I AS a WHERE a.aggregate_id = r.%5$I::text),'
        ' ($1).ordering_first_sequence - 1) + 1'
        ' AND NOT EXISTS (SELECT 1 FROM %9$s AS s WHERE s.%5$I = r.%5$I AND s.%10$I IS NULL'
        ' AND s.%6$I <= r.%6$I AND (s.%6$I < r.%6$I OR s.%1$I < r.%1$I) ORDER BY s.%5$I, s.%6$I OFFSET 0)'
        ' AND %11$s LIMIT $2 * 4 + 16) AS heads OFFSET 0) AS h) END, %3$s))',
        c ->> 'event_id', mailbox._inbox_pending_aggs_sql(p_inbox, mailbox._inbox_table_sql(p_inbox)), walk,
        c ->> 'received_at', c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'retry_count',
        '_inbox_' || p_inbox.inbox_key || '_aggregate', mailbox._inbox_table_sql(p_inbox), c ->> 'processed_at',
        mailbox._inbox_build_head_free(p_inbox, 'r')) END
      FROM (SELECT p_inbox.columns AS c,
                   pg_catalog.format('ARRAY(SELECT n.%1$I FROM (%2$s) AS n WHERE %3$s ORDER BY n.%4$I LIMIT $2 * 4 + 16)',
                                     p_inbox.columns ->> 'event_id', mailbox._inbox_next_sql(p_inbox),
                                     mailbox._inbox_build_head_free(p_inbox, 'n'),
                                     p_inbox.columns ->> 'received_at') AS walk) AS x;
$$;

-- The claimed message's fields (_inbox_message, in its order) read from the inbox table t:
-- each mapped column cast to the API type, or a typed NULL.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_message_items(p_columns jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format(
        't.%1$I::pg_catalog.text, %2$s, %3$s, %4$s,
                   %5$s, %6$s, %7$s, %8$s, %9$s,
                   %10$s, %11$s',
        p_columns ->> 'event_id', mailbox._inbox_item(p_columns, 'event_type', 'text'),
        mailbox._inbox_item(p_columns, 'source', 'text'), mailbox._inbox_item(p_columns, 'aggregate_id', 'text'),
        mailbox._inbox_item(p_columns, 'sequence_num', 'bigint'), mailbox._inbox_item(p_columns, 'priority', 'int'),
        mailbox._inbox_item(p_columns, 'payload', 'jsonb'), mailbox._inbox_item(p_columns, 'headers', 'jsonb'),
        mailbox._inbox_item(p_columns, 'trace_id', 'text'), mailbox._inbox_item(p_columns, 'retry_count', 'int'),
        mailbox._inbox_item(p_columns, 'received_at', 'timestamptz'));
$$;

-- claim(row, batch size, now, leases exist): the candidates, locked, oldest (lowest priority)
-- first; inbox_claim then leases them, and that upsert (or, in READ COMMITTED, its re-read of
-- the leases) decides who wins a message (see part 33). The lease exclusion only spares
-- locking a leased message: inbox_claim passes FALSE as $4 when the inbox had no lease row at
-- all a moment before (the documented claim-and-mark-in-one-transaction pattern writes none),
-- and then it is skipped: that case is a statement of its own, whose plan has no lease
-- subplan to start (their start-up cost about 8 us of every claim while they were one
-- statement with an OR, docs/benchmarks.md). A lease committed in between is
-- caught by what decides; the claim then returns fewer rows, which a claim may. TRUE excludes
-- with the hashed set where there is one (below); NULL always with a lookup per row:
-- inbox_claim passes NULL under SERIALIZABLE, where reading the whole set (a sequential scan
-- of mailbox._inbox_lease once the planner expects most of it to be the inbox's) would take a
-- predicate lock on the whole table, and every transaction writing a lease would then be in
-- conflict with the claim. (CASE runs one arm, so only the chosen exclusion is evaluated.)
-- How it excludes (the per-inbox lease views are security barriers, which a join cannot see
-- into):
--   * without ordering or priority, leased messages are the oldest pending ones (claims take
--     the oldest, and new messages arrive behind them), so every claim passes over all of
--     them: a NOT IN against the inbox's live leases, read once per claim into an array and
--     hashed (a hashed SubPlan: a hash probe per row passed over, not an index lookup). The
--     array's unnest keeps the planner's estimate of the set at its default for a
--     non-constant array (10 rows), so the plan is always the hashed one, whatever the
--     statistics of the lease table say: a NOT IN over the view itself would fall back to a
--     scan of the whole set per row once the planner expected it to exceed hash_mem. Leases
--     are NOT NULL (primary key); an adopted table's id may be NULL (a UNIQUE column), and
--     such a row is not leased, as before (IS NULL OR: NULL NOT IN a set is NULL). (4,000
--     leased messages at the head: 5.9 ms per claim of 10 + batch mark instead of 11.7 with
--     a lookup per row, docs/benchmarks.md);
--   * with priority, a message of a better priority arrives ahead of the leased ones, which
--     a claim then need not pass, and an ordered inbox's candidates are a few heads (below),
--     whose aggregates may have many leases between them: reading the whole set would cost
--     more than one primary-key lookup per row (a subquery kept apart by OFFSET 0): 12.9 ms
--     against 1.6 for a claim of 10 priority-1 messages with 20,000 priority-9 ones leased.
-- The array takes the rows as the locking scan returns them, in the subquery's order (an empty array
-- when there are none): no window, aggregate or sort of whole messages on top, which cost
-- about a third of the function. (So the rows keep the order in which they were sorted
-- before they were locked: a row whose priority or received_at another transaction changed
-- just before the lock comes back with its new value in its old place, as with any
-- ORDER BY ... FOR UPDATE.) It always uses the generic plan (inbox_claim sets
-- plan_cache_mode, and _inbox_define for another role's SECURITY DEFINER function): with LIMIT $2 the
-- planner costs it for 10% of the pending rows, far above a custom plan for a batch of 10, so
-- the plan cache would never pick it and would plan every claim again (about 100 us); the
-- generic plan has the same shape (index order, lease exclusion per row). That cost grows with
-- the backlog and passes jit_above_cost (with a lookup per row, at some 120,000 pending rows;
-- with the hashed set, at some 26 million), so the same SET clauses turn jit off: compiling
-- the query cost every claim about 8 ms.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_claim(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    IF $4 IS FALSE THEN -- no lease row in the inbox a moment ago: no exclusion, no lease subplan
        RETURN ARRAY(
            SELECT ROW(%1$s)::mailbox._inbox_message
              FROM (SELECT t.* FROM %3$s AS t
                     WHERE %4$s AND t.%5$I < ($1).max_retries%6$s
                     ORDER BY %2$s
                     LIMIT $2
                       FOR UPDATE OF t SKIP LOCKED) AS t);
    END IF;
    RETURN ARRAY(
        SELECT ROW(%1$s)::mailbox._inbox_message
          FROM (SELECT t.* FROM %3$s AS t
                 WHERE %4$s AND t.%5$I < ($1).max_retries%6$s
                   AND %7$s
                 ORDER BY %2$s
                 LIMIT $2
                   FOR UPDATE OF t SKIP LOCKED) AS t);$b$,
        mailbox._inbox_build_message_items(c),
        CASE WHEN p_inbox.priority_tiers IS NOT NULL THEN mailbox._inbox_col(c, 'priority') || ', ' ELSE '' END
            || mailbox._inbox_col(c, 'received_at'),
        mailbox._inbox_table_sql(p_inbox),
        -- an ordered claim takes its heads by id: by the primary key, never a partial index
        -- read whole and filtered (part 35, builders, _inbox_sql_unprocessed)
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN pg_catalog.format('t.%I IS NULL', c ->> 'processed_at')
             ELSE mailbox._inbox_sql_unprocessed(c ->> 'processed_at') END,
        c ->> 'retry_count', mailbox._inbox_build_claim_heads(p_inbox),
        CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL OR p_inbox.priority_tiers IS NOT NULL THEN lookup
             ELSE pg_catalog.format($x$CASE WHEN $4 THEN t.%2$I IS NULL OR t.%2$I::pg_catalog.text NOT IN (
                                    SELECT pg_catalog.unnest(ARRAY(SELECT l.event_id FROM %1$s AS l
                                     WHERE l.lease_until > $3 OR l.next_attempt_at > $3)))
                        ELSE %3$s END$x$, mailbox._inbox_lease_sql(p_inbox), c ->> 'event_id', lookup) END)
      FROM (SELECT p_inbox.columns AS c,
                   -- the lookup per row (ordering, priority, and TRUE's alternative)
                   pg_catalog.format($x$NOT EXISTS (SELECT 1 FROM %1$s AS l
                                    WHERE l.event_id = t.%2$I::pg_catalog.text
                                      AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0)$x$,
                                     mailbox._inbox_lease_sql(p_inbox), p_inbox.columns ->> 'event_id') AS lookup) AS x;
$$;

-- sql/functions/35_inbox_codegen.sql
-- Part 35: per-inbox functions, the only code that reads or writes an inbox table.
--
-- An inbox's table and columns are known only from its catalog row, so a generic function
-- must build its SQL at run time, and PostgreSQL parses and plans dynamic SQL on every call.
-- Instead, whenever an inbox is created, adopted or reconfigured (ordering, priority), the
-- functions below are (re)generated for it: mailbox._inbox_<key>_receive, _claim,
-- _processed and _failed hold STATIC SQL with the inbox's identifiers written in through
-- format('%I') (values stay parameters), so PL/pgSQL caches their plans per session. The
-- public functions check their arguments and dispatch through a router inlined into their
-- cached plans (part 35, routes), or for an inbox without an arm there, with one trivial
-- dynamic call (SELECT mailbox._inbox_<key>_<kind>($1, ...), part 35, dispatch). The control
-- plane (replay, drains, counts, gaps, ordering seed) builds its SQL from the catalog as
-- before and runs it through the fifth, mailbox._inbox_<key>_query.
--
-- Whose rights (docs/security.md, "Inbox tables"): a table runs its owner's code
-- (triggers, defaults, check constraints, index expressions, domain checks, casts, RLS
-- policies) with the rights of whoever touches it. The public inbox functions are SECURITY
-- DEFINER (the extension owner, a superuser), so they never touch an inbox table themselves:
-- the generated functions run as THE TABLE'S OWNER, who owns them (SECURITY DEFINER, or see
-- below for the extension owner's own), hold
-- only this file's fixed SQL, take values as parameters and touch nothing but that table and
-- three per-inbox views of the inbox's own lease, ordering and settings rows (part 31).
-- Leases, ordering state and the catalog are written only by extension-owned code, from
-- values the generated functions return; those values are data the table owner could have
-- chosen, so they are only ever bind parameters, and only for that inbox's own key.
-- For a managed inbox (create_inbox) the table's owner is the extension owner; the public
-- functions already run as that owner, so its generated functions are SECURITY INVOKER
-- with no SET clause (each SET costs a GUC save and restore per call): they run with the
-- pinned search_path of the public function that called them, and their owner check (below)
-- refuses any other caller, since nobody else may execute them.
--
-- The table owner may ALTER its functions (SECURITY INVOKER, SET search_path, ...) though
-- it cannot replace their bodies (that needs CREATE on schema mailbox). A function made
-- SECURITY INVOKER would run our SQL, and so the table's code, as the extension owner: so
-- every body starts by checking that it runs as the table owner (CURRENT_USER, an explicit
-- pg_catalog operator and pg_catalog types, so no search_path it was given is consulted
-- first) and raises 42501 otherwise. Every declared variable has a pg_catalog type for the
-- same reason (PL/pgSQL checks a domain's constraints when it initialises a variable).
--
-- A session picks up regenerated functions when it next processes catalog invalidations: at
-- its next transaction, or when it next takes a lock it does not hold. A transaction that
-- already called an inbox's functions may so keep running their old bodies after
-- enable/disable_inbox_ordering or _priority committed, while its public functions read the
-- new catalog row: an unordered receive into an ordered inbox would store a message no
-- ordered claim ever takes. So every body that depends on the configuration (receive, claim,
-- processed and the batch forms) first compares what it was generated for (ordering on or
-- off, the column mapping, which enabling ordering or priority may change; the claim also
-- priority on or off) with the catalog row it is passed, and raises 40001 (retry the
-- transaction) when they differ. failed and unsettled read only columns no setting remaps,
-- so a commit that settles a claim never fails for it; the control plane's query takes SQL
-- built from that row.
--
-- Generated functions:
--   * take the inbox's catalog row as their first argument; besides carrying max_retries and
--     the name, that argument type makes them depend on the extension, so
--     DROP EXTENSION pg_mailbox CASCADE drops them like the inbox views;
--   * have unnamed parameters ($n) and #variable_conflict use_column, so no column name of an
--     inbox table can ever be taken for a variable;
--   * are executable by nobody but their owner (the extension owner is a superuser), but a
--     managed inbox's named receive and named mark, which mailbox_producer and
--     mailbox_consumer may execute while their routers have its arm (part 35, named receive);
--   * are dropped by drop_inbox.

-- The names of an inbox's generated functions (_inbox_define builds the same names).
CREATE OR REPLACE FUNCTION mailbox._inbox_fn_names(p_inbox mailbox._inbox)
RETURNS text[]
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY(SELECT '_inbox_' || p_inbox.inbox_key || '_' || kind
                   FROM pg_catalog.unnest(ARRAY['receive', 'claim', 'processed', 'failed', 'query', 'receive_batch',
                                                      'processed_batch', 'processed_count', 'unsettled',
                                                      'receive_named', 'processed_named']) AS kind);
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_drop_functions(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_fn regprocedure;
BEGIN
    -- (drop_inbox, the only caller, has waited for the table's writers already: part 35,
    -- named receive)
    FOR v_fn IN
        SELECT p.oid FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname = ANY (mailbox._inbox_fn_names(p_inbox))
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', v_fn);
    END LOOP;
    PERFORM mailbox._inbox_build_routes(); -- no route may name a dropped function (part 35, routes)
END
$$;

-- Whether a generated function of kind p_kind owned by p_owner is SECURITY DEFINER with a
-- pinned search_path: every one an owner other than the extension owner owns, and a managed
-- inbox's named receive and named mark, which the callers of the inlined inbox_receive and
-- inbox_mark_processed call themselves (part 35, named receive). _inbox_define makes them so;
-- maintenance regenerates an inbox whose functions differ (part 43).
CREATE OR REPLACE FUNCTION mailbox._inbox_fn_is_definer(p_kind text, p_owner oid)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_owner <> mailbox._extension_owner() OR p_kind IN ('receive_named', 'processed_named');
$$;

-- Creates (or replaces) one generated function, owned by the table's owner. p_args,
-- p_returns, p_declare and p_set are fixed text written in _inbox_generate; p_body is built
-- there from the catalog through format('%I'). The owner check comes first (see above).
CREATE OR REPLACE FUNCTION mailbox._inbox_define(
    p_inbox mailbox._inbox, p_kind text, p_args text, p_returns text, p_declare text, p_body text,
    p_set text DEFAULT ''
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_owner name := mailbox._inbox_owner(p_inbox);
    v_sig text := pg_catalog.format('mailbox.%I(mailbox._inbox, %s)',
                                    '_inbox_' || p_inbox.inbox_key || '_' || p_kind, p_args);
BEGIN
    -- the extension owner's functions (every managed inbox's) are reached only from the
    -- pinned, SECURITY DEFINER public functions, which already run as that owner: no switch
    -- of user and search_path of their own, which costs each call a GUC save and restore
    -- (see above, "Whose rights")
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %s RETURNS %s LANGUAGE plpgsql VOLATILE %s AS %s',
        v_sig, p_returns,
        -- (but a named receive or mark: _inbox_fn_is_definer)
        CASE WHEN NOT mailbox._inbox_fn_is_definer(p_kind, (SELECT r.oid FROM pg_catalog.pg_roles AS r
                                                                WHERE r.rolname = v_owner))
             THEN 'SECURITY INVOKER'
             ELSE 'SECURITY DEFINER SET search_path = pg_catalog, mailbox, pg_temp' || p_set END,
        pg_catalog.quote_literal(pg_catalog.format($b$
#variable_conflict use_column
DECLARE%1$s
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) %2$s::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function %% must run as %%', %3$s, %2$s::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %%s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;%5$s%4$s
END$b$, p_declare, pg_catalog.quote_literal(v_owner),
            pg_catalog.quote_literal(pg_catalog.format('%s of inbox %s', p_kind, p_inbox.inbox_name)), p_body,
            CASE WHEN p_kind IN ('receive', 'receive_batch', 'claim', 'processed', 'processed_batch',
                                'processed_count')
                 THEN pg_catalog.format($c$
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) %s%s
       OR ($1).columns OPERATOR(pg_catalog.<>) %s::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox %% changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;$c$, CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'TRUE' ELSE 'FALSE' END,
                CASE WHEN p_kind = 'claim' THEN pg_catalog.format(
                    '
       OR (($1).priority_tiers IS NULL) OPERATOR(pg_catalog.<>) %s',
                    CASE WHEN p_inbox.priority_tiers IS NULL THEN 'TRUE' ELSE 'FALSE' END) ELSE '' END,
                pg_catalog.quote_literal(p_inbox.columns::text)) ELSE '' END)));
    EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', v_sig, v_owner);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_sig);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %s', v_sig, pg_catalog.quote_literal(
        pg_catalog.format('pg_mailbox: %s of inbox %s, generated from its catalog row; runs as the table owner',
                          p_kind, p_inbox.inbox_name)));
END
$$;

-- Runs control-plane SQL built from the catalog (never from a generated function's output)
-- with the rights of the inbox table's owner, through the inbox's generated query function.
-- The SQL sees the catalog row as $1, p_ints as $2 and p_texts as $3, and returns one jsonb.
CREATE OR REPLACE FUNCTION mailbox._inbox_as_owner(
    p_inbox mailbox._inbox, p_sql text, p_ints bigint[] DEFAULT NULL, p_texts text[] DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_result jsonb;
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2, $3, $4)', '_inbox_' || p_inbox.inbox_key || '_query')
        INTO v_result
        USING p_inbox, p_sql, p_ints, p_texts;
    RETURN v_result;
END
$$;

-- (Re)generates an inbox's functions from its (current) catalog row: each body comes from a
-- small builder (part 35, builders), so what one generated function does is read in one
-- place. tests/expected/inbox_generated_*.sql hold the output for a managed and an adopted
-- inbox (docs/development.md).
CREATE OR REPLACE FUNCTION mailbox._inbox_generate(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    -- a transaction that wrote a managed inbox's table ends before its new functions commit
    -- (part 35, named receive)
    PERFORM mailbox._inbox_quiesce(p_inbox);
    PERFORM mailbox._inbox_define(p_inbox, 'receive',
        (SELECT pg_catalog.string_agg(r.receive_type, ', ' ORDER BY r.receive_position)
           FROM mailbox._inbox_roles() AS r WHERE r.receive_position IS NOT NULL),
        'boolean', CASE WHEN p_inbox.is_managed OR p_inbox.ordering_first_sequence IS NOT NULL THEN '' ELSE $d$
    v_ordered pg_catalog.bool;$d$ END, mailbox._inbox_build_receive(p_inbox));
    PERFORM mailbox._inbox_define(p_inbox, 'claim', 'int, timestamptz, boolean', 'mailbox._inbox_message[]', '',
        mailbox._inbox_build_claim(p_inbox), ' SET plan_cache_mode = force_generic_plan SET jit = off');
    PERFORM mailbox._inbox_define(p_inbox, 'processed', 'text', 'mailbox._inbox_done', $d$
    v_id pg_catalog.text;
    v_aggregate pg_catalog.text;
    v_seq pg_catalog.int8;
    v_ordered pg_catalog.bool;$d$, mailbox._inbox_build_processed(p_inbox));
    PERFORM mailbox._inbox_define(p_inbox, 'failed', 'text, text', 'mailbox._inbox_attempt', $d$
    v_id pg_catalog.text;
    v_retries pg_catalog.int4;
    v_processed pg_catalog.bool;$d$, mailbox._inbox_build_failed(p_inbox));
    -- query(row, sql, ints, texts): the control plane's SQL (mailbox._inbox_as_owner)
    PERFORM mailbox._inbox_define(p_inbox, 'query', 'text, bigint[], text[]', 'jsonb', $d$
    v_result pg_catalog.jsonb;$d$, $b$
    EXECUTE $2 INTO v_result USING $1, $3, $4;
    RETURN v_result;$b$);
    -- the batch forms' receive_batch and processed_batch (part 36)
    PERFORM mailbox._inbox_generate_batch(p_inbox);
    -- a managed inbox's single receive and mark without a lookup (part 35, named receive)
    IF p_inbox.is_managed THEN
        PERFORM mailbox._inbox_define(p_inbox, 'receive_named',
            (SELECT pg_catalog.string_agg(r.receive_type, ', ' ORDER BY r.receive_position)
               FROM mailbox._inbox_roles() AS r WHERE r.receive_position IS NOT NULL),
            'boolean', $d$
    v_new pg_catalog.bool;$d$, mailbox._inbox_build_receive_named(p_inbox, mailbox._inbox_named_version(p_inbox)));
        -- (its UPDATE and lease DELETE: plans made on an empty queue, part 33, inbox_claim)
        PERFORM mailbox._inbox_define(p_inbox, 'processed_named', 'text', 'boolean', $d$
    v_done pg_catalog.bool;$d$, mailbox._inbox_build_processed_named(p_inbox, mailbox._inbox_named_version(p_inbox)),
            ' SET enable_seqscan = off SET jit = off');
    END IF;
    -- the public functions reach the new ones without a dynamic call (part 35, routes)
    PERFORM mailbox._inbox_build_routes();
END
$$;

-- sql/functions/35_inbox_dispatch.sql
-- Part 35 (dispatch): the dynamic calls of an inbox's generated functions, the ELSE arm of
-- every router (part 35, routes): the path of an inbox the routers have no arm for (an
-- adopted table owned by someone other than the extension owner, or any inbox until the
-- routers are rebuilt after a restore). Each parses and plans its one statement per call;
-- the function name comes from the catalog row's key, every value is a bind parameter.

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_receive(
    mailbox._inbox, text, jsonb, text, text, text, bigint, jsonb, text, int
)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_new boolean;
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)',
                              '_inbox_' || ($1).inbox_key || '_receive')
        INTO v_new
        USING $1, $2, $3, $4, $5, $6, $7, $8, $9, $10;
    RETURN v_new;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_claim(mailbox._inbox, int, timestamptz, boolean)
RETURNS mailbox._inbox_message[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_rows mailbox._inbox_message[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2, $3, $4)', '_inbox_' || ($1).inbox_key || '_claim')
        INTO v_rows
        USING $1, $2, $3, $4;
    RETURN v_rows;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_processed(mailbox._inbox, text)
RETURNS mailbox._inbox_done
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_done mailbox._inbox_done;
BEGIN
    EXECUTE pg_catalog.format('SELECT * FROM mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_processed')
        INTO v_done
        USING $1, $2;
    RETURN v_done;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_failed(mailbox._inbox, text, text)
RETURNS mailbox._inbox_attempt
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_attempt mailbox._inbox_attempt;
BEGIN
    EXECUTE pg_catalog.format('SELECT * FROM mailbox.%I($1, $2, $3)', '_inbox_' || ($1).inbox_key || '_failed')
        INTO v_attempt
        USING $1, $2, $3;
    RETURN v_attempt;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_receive_batch(mailbox._inbox, jsonb)
RETURNS boolean[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_new boolean[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_receive_batch')
        INTO v_new
        USING $1, $2;
    RETURN v_new;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_processed_batch(mailbox._inbox, text[])
RETURNS mailbox._inbox_done[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_done mailbox._inbox_done[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_processed_batch')
        INTO v_done
        USING $1, $2;
    RETURN v_done;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_processed_count(mailbox._inbox, text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_count bigint;
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_processed_count')
        INTO v_count
        USING $1, $2;
    RETURN v_count;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_dispatch_unsettled(mailbox._inbox, text[])
RETURNS text[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_left text[];
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2)', '_inbox_' || ($1).inbox_key || '_unsettled')
        INTO v_left
        USING $1, $2;
    RETURN v_left;
END
$$;

-- sql/functions/35_inbox_named_receive.sql
-- Part 35 (named receive, issue 11): the single inbox_receive of a managed inbox without
-- grants of its own, in one call that looks nothing up.
--
-- inbox_receive used to start with a catalog lookup (the inbox's row, whether it has grants,
-- whether its table was moved, whether a worker waits), a statement of its own: on a 2-core
-- machine about as much backend time as the INSERT it guards, and the main reason a single
-- receive ran at 0.6-0.7 of a plain INSERT. For a managed inbox (create_inbox: the extension
-- owner's table with the standard columns) everything the lookup found is known when its
-- functions are generated, or can ride in the INSERT:
--   * inbox_receive itself is a one-expression SQL function (part 33) that the planner
--     inlines into the caller's statement: the router below, or else (NULL) the full path
--     _inbox_receive_full. The named receive is SECURITY DEFINER with a pinned search_path,
--     the call's only function frame (a PL/pgSQL frame around it cost about 7.5 us, 7% of a
--     receive). Being inlined, the caller calls the router and the named receives with its
--     own rights: mailbox_producer may execute the router, the full path, and each named
--     receive exactly while the router has its arm (_inbox_build_named_routes keeps that in
--     the transaction that changes the arms);
--   * the router mailbox._inbox_route_receive_named, a one-expression SQL function inlined
--     into inbox_receive's cached plan (like the key routers, part 35, routes), maps the name
--     to _inbox_<key>_receive_named(NULL, ...). It has an arm for a managed inbox whose
--     functions the extension owner owns and that has NO GRANTS: an inbox with grants (and
--     every adopted table) takes the full path, which checks them. Its ELSE is NULL;
--   * _inbox_<key>_receive_named checks the arguments and that its table is still the one it
--     was generated for (to_regclass, as the full path does), and returns NULL for anything
--     it would refuse, so that the full path raises the error (one place for every message);
--     then it inserts and, only when the bound mailbox._inbox_waiting_until is in the future
--     (part 33, wake-ups), reads whether a worker waits;
--   * after the INSERT, whose lock makes the session read the catalog changes committed
--     before it (AcceptInvalidationMessages), it asks the second router,
--     _inbox_route_named_version, whether the name still routes to the function it runs,
--     generated from the catalog row as it is now (the key and a digest of the body): a
--     session that ran routers or a body from before a first grant, a reconfiguration, a
--     drop or a re-creation that committed while its transaction was open raises 40001
--     instead of storing the message (nothing stays);
--   * a transaction that already wrote the table takes no new lock there, so reads no
--     catalog change: grant_inbox (a first grant, part 39), every regeneration of a managed
--     inbox's functions (_inbox_generate) and drop_inbox take a SHARE lock on its table
--     first (_inbox_quiesce), so such a transaction ends before they commit.
-- What the arm skips is what the lookup gave; the ordering, priority and column checks are
-- the generated receive's, baked in (the table's insert trigger also refuses an unordered
-- message once ordering is on, part 34, gap state).
--
-- The named mark (issue 11) does the same for the single inbox_mark_processed of such an
-- inbox when it is not ordered: inbox_mark_processed(text, text) is inlined the same way
-- (part 33, marks; the full path _inbox_mark_processed_full), and
-- _inbox_route_processed_named calls _inbox_<key>_processed_named(NULL, event_id), SECURITY
-- DEFINER with a pinned search_path, which marks the message and ends its lease, then checks
-- the version as the named receive does (an ordered inbox's is only RETURN NULL: its marks
-- record the aggregate's position on the full path, and its router has no arm for it).
-- mailbox_consumer may execute the router, the full path and each named mark exactly while
-- that router has its arm.
--
-- These functions touch _inbox_waiter, which the other generated functions never do: they
-- exist only for the extension owner's own tables, so they run with no rights beyond the
-- public functions (a named receive called directly by a producer does what inbox_receive
-- of that inbox does, with the same checks; a hostile $1 is never read).

-- Waits for the transactions that wrote a managed inbox's table (they would keep its named
-- receive as it was, above) and makes new ones wait for this one's commit: the first step of
-- grant_inbox's first grant, of a regeneration and of a drop (before it drops the views
-- such a transaction may read next).
-- p_nowait: fail at once (55P03) instead of waiting, for maintenance (part 43).
CREATE OR REPLACE FUNCTION mailbox._inbox_quiesce(p_inbox mailbox._inbox, p_nowait boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF p_inbox.is_managed AND EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = p_inbox.table_rel) THEN
        EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE%s', p_inbox.table_rel,
                                  CASE WHEN p_nowait THEN ' NOWAIT' ELSE '' END);
    END IF;
END
$$;

-- The first test of a named function: whether its table is no longer the one it was made
-- for. It opens that table by oid first (pg_relation_is_updatable takes and releases an
-- ACCESS SHARE lock), which makes the session read the catalog changes committed before,
-- so that to_regclass sees a rename, a drop or a table put in its place, even in a
-- transaction that began before them (a review found the stale answer: the statement then
-- ran on whatever table had the name). A dropped table is 0 updatable events. (p_version
-- NULL: the text _inbox_named_version digests, without the table's oid, which a restore
-- changes.)
CREATE OR REPLACE FUNCTION mailbox._inbox_build_named_table_check(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('pg_catalog.pg_relation_is_updatable(%1$s::pg_catalog.regclass, FALSE) OPERATOR(pg_catalog.=) 0'
                             || pg_catalog.chr(10) || '       OR pg_catalog.to_regclass(%2$L) IS DISTINCT FROM %1$s::pg_catalog.regclass',
                             CASE WHEN p_version IS NULL THEN 0 ELSE p_inbox.table_rel::oid END,
                             mailbox._inbox_table_sql(p_inbox));
$$;

-- The check a named function makes after its statement, whose new table lock made the
-- session read the catalog changes committed before it: 40001 unless the name still routes
-- to a function of p_version (nothing the statement did stays).
CREATE OR REPLACE FUNCTION mailbox._inbox_build_named_check(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    IF mailbox._inbox_route_named_version(%1$L) IS DISTINCT FROM %2$L THEN
        RAISE EXCEPTION 'inbox %% changed while this transaction was open', %1$L
            USING ERRCODE = '40001',
                  DETAIL = 'It was granted, reconfigured, dropped or made again after this session last read the catalog.',
                  HINT = 'Retry the transaction.';
    END IF;$b$, p_inbox.inbox_name, COALESCE(p_version, ''));
$$;

-- The body of _inbox_<key>_receive_named (only for a managed inbox). Parameters as the
-- generated receive's: $1 the catalog row (always NULL here: the type only makes the
-- function depend on the extension), then role i of _inbox_receive_roles() is $(i + 1).
CREATE OR REPLACE FUNCTION mailbox._inbox_build_receive_named(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_parts record; -- _inbox_receive_parts, shared with the receive (part 35, builders)
    v_table text := mailbox._inbox_table_sql(p_inbox);
    -- what the full path refuses, in the full path's order (it raises the error)
    v_refuse text[] := ARRAY[
        mailbox._inbox_build_named_table_check(p_inbox, p_version),
        '$2 IS NULL', 'pg_catalog.octet_length($2) OPERATOR(pg_catalog.>) 1000'];
    n int;
BEGIN
    SELECT * INTO v_parts FROM mailbox._inbox_receive_parts(p_inbox);
    IF NOT p_inbox.is_managed THEN
        RAISE EXCEPTION 'inbox % is not managed: it has no named receive', p_inbox.inbox_name
            USING ERRCODE = 'XX000';
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        v_refuse := v_refuse || '$6 IS NULL'::text || '$7 IS NULL'::text;
    END IF;
    FOREACH n IN ARRAY v_parts.unmapped LOOP
        v_refuse := v_refuse || pg_catalog.format('$%s IS NOT NULL', n);
    END LOOP;
    IF v_parts.smallint_priority THEN
        v_refuse := v_refuse || '$10 NOT BETWEEN -32768 AND 32767'::text;
    END IF;
    RETURN pg_catalog.format($b$
    IF %1$s THEN
        RETURN NULL; -- inbox_receive's full path raises the error
    END IF;
    INSERT INTO %2$s AS t (%3$s) VALUES (%4$s) ON CONFLICT (%5$I) DO NOTHING;
    v_new := FOUND;%9$s
    -- (part 33, wake-ups: no worker waits past the bound every wait raises)
    -- (an unset bound, NULL, is no wait: COALESCE, or AND would go on to the probe)
    IF v_new AND COALESCE(pg_catalog.pg_sequence_last_value('mailbox._inbox_waiting_until'::pg_catalog.regclass), 0)
                 OPERATOR(pg_catalog.>) pg_catalog.date_part('epoch', pg_catalog.now())
       AND mailbox._inbox_has_waiter(%6$s) THEN
        PERFORM pg_catalog.pg_notify('mailbox_inbox_new', %7$L);
    END IF;
    RETURN v_new;$b$,
        pg_catalog.array_to_string(v_refuse, pg_catalog.chr(10) || '       OR '), v_table,
        pg_catalog.array_to_string(v_parts.cols, ', '), pg_catalog.array_to_string(v_parts.vals, ', '),
        p_inbox.columns ->> 'event_id',
        p_inbox.inbox_key, p_inbox.inbox_name, COALESCE(p_version, ''),
        mailbox._inbox_build_named_check(p_inbox, p_version));
END
$$;

-- The body of _inbox_<key>_processed_named (only for a managed inbox): $1 as above, $2 the
-- event id. NULL for what the full path refuses (it raises the error) and for an ordered
-- inbox. The lease ends after the UPDATE, unless this transaction's claims of the inbox
-- found no lease row (part 37, claim settle, "Marks without a lease"): a lease the DELETE
-- does not see, or does not look for, holds nothing until it expires (a processed message
-- is never claimed, counted in flight or replayed with its lease; the full path re-reads
-- only for an ordered inbox, part 33, marks). Two statements, not one with a CTE: the
-- CTE's two table updates cost an executor start-up each even when there is no lease. The id
-- is compared in the default collation, that of a managed table's column, whatever collation
-- a direct caller's argument carries (a nondeterministic one would match other ids).
CREATE OR REPLACE FUNCTION mailbox._inbox_build_processed_named(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_table text := mailbox._inbox_table_sql(p_inbox);
BEGIN
    IF NOT p_inbox.is_managed THEN
        RAISE EXCEPTION 'inbox % is not managed: it has no named mark', p_inbox.inbox_name
            USING ERRCODE = 'XX000';
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        RETURN pg_catalog.format($b$
    RETURN NULL; -- ordered: inbox_mark_processed's full path records the aggregate's position
    -- version %s$b$, pg_catalog.quote_literal(COALESCE(p_version, '')));
    END IF;
    RETURN pg_catalog.format($b$
    IF %1$s
       OR $2 IS NULL THEN
        RETURN NULL; -- inbox_mark_processed's full path raises the error
    END IF;
    UPDATE %2$s AS t SET %3$I = pg_catalog.clock_timestamp()
     WHERE t.%4$I = $2 COLLATE pg_catalog."default" AND %8$s;
    v_done := FOUND;
    IF v_done AND pg_catalog.current_setting(%7$L, TRUE) IS DISTINCT FROM 'on' THEN
        DELETE FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key OPERATOR(pg_catalog.=) %5$s
           AND l.event_id OPERATOR(pg_catalog.=) $2 COLLATE pg_catalog."default";
    END IF;%6$s
    RETURN v_done;$b$,
        mailbox._inbox_build_named_table_check(p_inbox, p_version), v_table,
        p_inbox.columns ->> 'processed_at', p_inbox.columns ->> 'event_id', p_inbox.inbox_key,
        mailbox._inbox_build_named_check(p_inbox, p_version), 'mailbox.claim_unleased_' || p_inbox.inbox_key,
        mailbox._inbox_sql_unprocessed(p_inbox.columns ->> 'processed_at'));
END
$$;

-- What a named receive and mark were generated from: the inbox's key and a digest of their
-- bodies (built without version and table oid, so a restored database has the same versions).
CREATE OR REPLACE FUNCTION mailbox._inbox_named_version(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_inbox.inbox_key || '/' || pg_catalog.md5(mailbox._inbox_build_receive_named(p_inbox, NULL)
                                                      || mailbox._inbox_build_processed_named(p_inbox, NULL));
$$;

-- Whether an inbox's named receive and mark exist, are the extension owner's, and were
-- generated from its catalog row as it is now and for its table as it is now (the oid: a
-- restored database's functions name the dumped one until maintenance regenerates them,
-- part 43; an ordered inbox's named mark names no table).
CREATE OR REPLACE FUNCTION mailbox._inbox_named_current(p_inbox mailbox._inbox)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.count(*) = 2
      FROM pg_catalog.pg_proc AS p, (SELECT pg_catalog.quote_literal(mailbox._inbox_named_version(p_inbox)) AS v) AS n
     WHERE p.pronamespace = 'mailbox'::regnamespace
       AND p.proname IN ('_inbox_' || p_inbox.inbox_key || '_receive_named',
                         '_inbox_' || p_inbox.inbox_key || '_processed_named')
       AND p.proowner = mailbox._extension_owner()
       AND pg_catalog.strpos(p.prosrc, n.v) > 0
       AND (p.proname LIKE '%\_processed\_named' AND p_inbox.ordering_first_sequence IS NOT NULL
            OR pg_catalog.strpos(p.prosrc, ' ' || p_inbox.table_rel::oid || '::pg_catalog.regclass') > 0);
$$;

-- sql/functions/35_inbox_named_routes.sql
-- Part 35 (named routes, issue 11): the three routers by inbox name of part 35, named
-- receive (the named receive, the named mark and their version), their arms, their rebuild,
-- who may execute the named receives and marks they name, and every router's state for
-- maintenance.

-- The inboxes the named routers have an arm for, sorted by name in the "C" collation (the
-- routers split on it): managed, without grants, with a named receive and mark that the
-- extension owner owns and that were generated from the catalog row as it is now (the named
-- mark's router leaves out the ordered ones).
CREATE OR REPLACE FUNCTION mailbox._inbox_named_arms()
RETURNS TABLE (inbox_name text, inbox_key int, version text, ordered boolean)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT i.inbox_name, i.inbox_key, mailbox._inbox_named_version(i), i.ordering_first_sequence IS NOT NULL
      FROM mailbox._inbox AS i
     WHERE i.is_managed AND NOT i.has_grants
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = i.table_rel)
       AND mailbox._inbox_named_current(i)
     ORDER BY i.inbox_name COLLATE "C";
$$;

-- The bodies of the three named routers for the inboxes that have an arm now:
-- receive_named(name, event_id, ...) calls the inbox's named receive, processed_named(name,
-- event_id) its named mark (not ordered inboxes'); named_version(name) is what those functions
-- were generated from.
CREATE OR REPLACE FUNCTION mailbox._inbox_route_named_sql(p_kind text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_names text[];
    v_keys text[];
    v_versions text[];
BEGIN
    SELECT pg_catalog.array_agg(a.inbox_name ORDER BY a.inbox_name COLLATE "C"),
           pg_catalog.array_agg(a.inbox_key::text ORDER BY a.inbox_name COLLATE "C"),
           pg_catalog.array_agg(pg_catalog.quote_literal(a.version) || '::pg_catalog.text' ORDER BY a.inbox_name COLLATE "C")
      INTO v_names, v_keys, v_versions
      FROM mailbox._inbox_named_arms() AS a
     WHERE p_kind <> 'processed_named' OR NOT a.ordered; -- (an ordered inbox's mark: the full path)
    IF v_names IS NULL THEN
        RETURN CASE WHEN p_kind = 'named_version' THEN 'SELECT NULL::pg_catalog.text' ELSE 'SELECT NULL::pg_catalog.bool' END;
    END IF;
    -- arms by name, split in the "C" collation the names are sorted in (part 35, routes)
    RETURN 'SELECT ' || mailbox._inbox_case('$1',
        ARRAY(SELECT pg_catalog.quote_literal(n) || '::pg_catalog.text' FROM pg_catalog.unnest(v_names) WITH ORDINALITY AS u (n, o) ORDER BY o),
        CASE p_kind
            WHEN 'receive_named' THEN ARRAY(
                SELECT 'mailbox._inbox_' || k || '_receive_named(NULL::mailbox._inbox, $2, $3, $4, $5, $6, $7, $8, $9, $10)'
                  FROM pg_catalog.unnest(v_keys) WITH ORDINALITY AS u (k, o) ORDER BY o)
            WHEN 'processed_named' THEN ARRAY(
                SELECT 'mailbox._inbox_' || k || '_processed_named(NULL::mailbox._inbox, $2)'
                  FROM pg_catalog.unnest(v_keys) WITH ORDINALITY AS u (k, o) ORDER BY o)
            ELSE v_versions END,
        CASE WHEN p_kind = 'named_version' THEN 'NULL::pg_catalog.text' ELSE 'NULL::pg_catalog.bool' END,
        ' COLLATE pg_catalog."C"');
END
$$;

-- Who may execute each named receive and mark: inbox_receive and inbox_mark_processed(text,
-- text) are inlined into their caller's statement, so the caller calls the routers and the
-- functions they name with its own rights. mailbox_producer may execute a named receive, and
-- mailbox_consumer a named mark, exactly while its router has the arm (a managed inbox
-- without grants of its own; for the mark, not ordered): armed. A first grant revokes it in
-- the transaction that takes the arm away (_inbox_build_named_routes); the version check
-- after the write stays behind it. Maintenance repairs a right changed by hand (part 43).
CREATE OR REPLACE FUNCTION mailbox._inbox_named_rights()
RETURNS TABLE (fn regprocedure, role text, armed boolean)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH arms AS (SELECT a.inbox_key, a.ordered FROM mailbox._inbox_named_arms() AS a)
    SELECT p.oid::pg_catalog.regprocedure,
           CASE WHEN p.proname LIKE '%\_receive\_named' THEN 'mailbox_producer' ELSE 'mailbox_consumer' END,
           p.proname IN (SELECT '_inbox_' || a.inbox_key || '_receive_named' FROM arms AS a
                         UNION ALL
                         SELECT '_inbox_' || a.inbox_key || '_processed_named' FROM arms AS a WHERE NOT a.ordered)
      FROM pg_catalog.pg_proc AS p
     WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname ~ '^_inbox_[0-9]+_(receive|processed)_named$';
$$;

-- The three named routers: kind (as _inbox_route_named_sql and _inbox_route_body name it), the
-- function, its arguments, its result and its volatility.
CREATE OR REPLACE FUNCTION mailbox._inbox_named_route_kinds()
RETURNS TABLE (kind text, fn text, args text, returns text, volatility text)
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES ('receive_named', '_inbox_route_receive_named', 'text, text, jsonb, text, text, text, bigint, jsonb, text, int',
            'boolean', 'VOLATILE'),
           ('processed_named', '_inbox_route_processed_named', 'text, text', 'boolean', 'VOLATILE'),
           ('named_version', '_inbox_route_named_version', 'text', 'text', 'STABLE');
$$;

-- Rebuilds the named routers whose body is not what the catalog asks for now (callers hold
-- the DDL lock; _inbox_build_routes calls it). Returns how many were rebuilt.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_named_routes()
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_sql text;
    v_built int := 0;
    v_fn regprocedure;
    v_role text;
    v_arm boolean;
    v_router record;
BEGIN
    FOR v_router IN SELECT * FROM mailbox._inbox_named_route_kinds() LOOP
        v_sql := mailbox._inbox_route_named_sql(v_router.kind);
        IF v_sql IS DISTINCT FROM mailbox._inbox_route_body(v_router.kind) THEN
            EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION mailbox.%I(%s) RETURNS %s LANGUAGE sql %s'
                                      ' SECURITY INVOKER AS %L', v_router.fn, v_router.args, v_router.returns,
                                      v_router.volatility, v_sql);
            v_built := v_built + 1;
        END IF;
    END LOOP;
    -- who may execute the named receives and marks (_inbox_named_rights): only a change is
    -- written (each one invalidates the plans that name the function)
    FOR v_fn, v_role, v_arm IN
        SELECT r.fn, r.role, r.armed FROM mailbox._inbox_named_rights() AS r
         WHERE r.armed IS DISTINCT FROM pg_catalog.has_function_privilege(r.role, r.fn, 'EXECUTE')
    LOOP
        EXECUTE pg_catalog.format(CASE WHEN v_arm THEN 'GRANT EXECUTE ON FUNCTION %s TO %I'
                                       ELSE 'REVOKE EXECUTE ON FUNCTION %s FROM %I' END, v_fn, v_role);
    END LOOP;
    RETURN v_built;
END
$$;

-- The named routers as the extension script makes them: no arm, every inbox through the full
-- path, until the first rebuild (the script's last step, and every inbox DDL).
CREATE OR REPLACE FUNCTION mailbox._inbox_route_receive_named(text, text, jsonb, text, text, text, bigint, jsonb, text, int)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT NULL::pg_catalog.bool$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_processed_named(text, text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT NULL::pg_catalog.bool$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_named_version(text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
AS $$SELECT NULL::pg_catalog.text$$;

-- Every router (the key routers of part 35, routes, and the three above) with the body it has
-- and the body the catalog asks for now: maintenance rebuilds them when one differs.
CREATE OR REPLACE FUNCTION mailbox._inbox_route_states()
RETURNS TABLE (kind text, body text, wanted text)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT k.kind, mailbox._inbox_route_body(k.kind), mailbox._inbox_route_sql(k.kind, k.nargs)
      FROM mailbox._inbox_route_kinds() AS k
    UNION ALL
    SELECT n.kind, mailbox._inbox_route_body(n.kind), mailbox._inbox_route_named_sql(n.kind)
      FROM mailbox._inbox_named_route_kinds() AS n;
$$;

-- sql/functions/35_inbox_routes.sql
-- Part 35 (routes): static dispatch from the public per-message functions to an inbox's
-- generated functions (issue 11).
--
-- The data plane used to reach the generated function of an inbox with
-- EXECUTE 'SELECT mailbox._inbox_<key>_<kind>(...)', which PostgreSQL parses and plans on
-- every call: about a quarter of what a single receive costs on the server, and more than
-- the lookup itself when a claim settles at commit. Instead, each kind the data plane calls
-- (receive, claim, processed, failed, receive_batch, processed_batch, processed_count,
-- unsettled; only the control plane's query stays dynamic) has a router, a one-expression SQL
-- function
--
--     SELECT CASE WHEN ($1).inbox_key OPERATOR(pg_catalog.=) 1 THEN mailbox._inbox_1_receive($1, ...)
--                 WHEN ...
--                 ELSE mailbox._inbox_dispatch_receive($1, ...) END
--
-- that the planner inlines into the caller's cached plan: one call per message, no parse, no
-- plan. The routers are a cache, never the only way through:
--   * every arm names a generated function that exists (pg_proc) for an inbox of the
--     catalog and is owned by the extension owner (every managed inbox's; an adopted table's
--     only if that superuser owns the table); any other inbox takes the ELSE arm, the old
--     dynamic call. An adopted table's owner owns its generated functions and may drop
--     them: an arm naming one would then fail every session's inlining of the router, so
--     every inbox's calls, not only that owner's (tests/inbox/test_inbox_codegen.py);
--   * they are rebuilt, under the DDL lock, whenever an inbox's generated functions are made
--     or dropped (create, adopt, reconfigure, drop, extension update), so other sessions'
--     cached plans are invalidated at that commit and re-inline the new body;
--   * they are extension members, so pg_dump does not dump them: a restored database starts
--     with the script's routers, ELSE only, and works at the dynamic call's speed until
--     mailbox.run_maintenance() (or the next inbox DDL) rebuilds them.
-- A router has no SET clause, because a function with one is never inlined. It needs none:
-- it is only ever called from the public functions, whose search_path is pinned, and its body
-- names nothing a search_path could redirect: schema-qualified functions with arguments of
-- their exact declared types, an OPERATOR(pg_catalog.=) between integers, integer literals
-- (tests/security, test_the_routers_name_nothing_a_search_path_could_redirect). Keys above
-- 8 arms are split in halves (nested CASE on OPERATOR(pg_catalog.<)), so a call tests about
-- log2(inboxes) + 8 keys, not every inbox.

-- The routed kinds with their generated functions' argument types (after the catalog row)
-- and result: the same as _inbox_generate writes (part 35, codegen).
CREATE OR REPLACE FUNCTION mailbox._inbox_route_kinds()
RETURNS TABLE (kind text, args text, nargs int, returns text)
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES ('receive', 'text, jsonb, text, text, text, bigint, jsonb, text, int', 10, 'boolean'),
           ('claim', 'int, timestamptz, boolean', 4, 'mailbox._inbox_message[]'),
           ('processed', 'text', 2, 'mailbox._inbox_done'),
           ('failed', 'text, text', 3, 'mailbox._inbox_attempt'),
           ('receive_batch', 'jsonb', 2, 'boolean[]'),
           ('processed_batch', 'text[]', 2, 'mailbox._inbox_done[]'),
           ('processed_count', 'text[]', 2, 'bigint'),
           ('unsettled', 'text[]', 2, 'text[]');
$$;

-- The CASE of a router (the key routers here, the named ones in part 35, named receive):
-- arm i is taken when p_subject equals p_values[i] (SQL constants, sorted as p_split_suffix
-- makes OPERATOR(pg_catalog.<) compare them); anything else is p_else. Up to 8 arms one WHEN
-- each, more split in halves, so a call tests about log2(n) + 8 of them.
CREATE OR REPLACE FUNCTION mailbox._inbox_case(
    p_subject text, p_values text[], p_arms text[], p_else text, p_split_suffix text DEFAULT ''
)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_n int := pg_catalog.cardinality(p_values);
    v_half int := v_n / 2;
BEGIN
    IF v_n <= 8 THEN
        RETURN pg_catalog.format('CASE%s ELSE %s END',
            (SELECT pg_catalog.string_agg(pg_catalog.format(' WHEN %s OPERATOR(pg_catalog.=) %s THEN %s',
                                                            p_subject, v, p_arms[o]), '' ORDER BY o)
               FROM pg_catalog.unnest(p_values) WITH ORDINALITY AS u (v, o)),
            p_else);
    END IF;
    RETURN pg_catalog.format('CASE WHEN %s OPERATOR(pg_catalog.<) %s%s THEN %s ELSE %s END',
        p_subject, p_values[v_half + 1], p_split_suffix,
        mailbox._inbox_case(p_subject, p_values[1:v_half], p_arms[1:v_half], p_else, p_split_suffix),
        mailbox._inbox_case(p_subject, p_values[v_half + 1:], p_arms[v_half + 1:], p_else, p_split_suffix));
END
$$;

-- The body of p_kind's router for the inboxes whose generated function exists now.
CREATE OR REPLACE FUNCTION mailbox._inbox_route_sql(p_kind text, p_nargs int)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_params text := (SELECT pg_catalog.string_agg('$' || g, ', ' ORDER BY g)
                        FROM pg_catalog.generate_series(1, p_nargs) AS g);
    v_keys int[] := ARRAY(
        SELECT i.inbox_key FROM mailbox._inbox AS i
         WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                        WHERE p.pronamespace = 'mailbox'::regnamespace
                          AND p.proname = '_inbox_' || i.inbox_key || '_' || p_kind
                          AND p.proowner = mailbox._extension_owner())
         ORDER BY i.inbox_key);
BEGIN
    IF pg_catalog.cardinality(v_keys) = 0 THEN
        RETURN pg_catalog.format('SELECT mailbox.%I(%s)', '_inbox_dispatch_' || p_kind, v_params);
    END IF;
    RETURN 'SELECT ' || mailbox._inbox_case('($1).inbox_key', v_keys::text[],
        ARRAY(SELECT pg_catalog.format('mailbox.%I(%s)', '_inbox_' || k || '_' || p_kind, v_params)
                FROM pg_catalog.unnest(v_keys) WITH ORDINALITY AS u (k, o) ORDER BY o),
        pg_catalog.format('mailbox.%I(%s)', '_inbox_dispatch_' || p_kind, v_params));
END
$$;

-- The body p_kind's router has now.
CREATE OR REPLACE FUNCTION mailbox._inbox_route_body(p_kind text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.prosrc FROM pg_catalog.pg_proc AS p
     WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname = '_inbox_route_' || p_kind;
$$;

-- Rebuilds the routers whose body is not what the catalog asks for now (callers hold the DDL
-- lock). Replacing a function invalidates every session's plans that inlined it, so an
-- unchanged router is left alone. Returns how many were rebuilt.
CREATE OR REPLACE FUNCTION mailbox._inbox_build_routes()
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    r record;
    v_sql text;
    v_built int := 0;
BEGIN
    -- REPEATABLE READ or SERIALIZABLE: the routers would be built from this transaction's
    -- snapshot, which can predate an inbox change committed before this transaction got the
    -- DDL lock (a review found a first grant lost that way: the rebuilt named router kept the
    -- arm that skips the grant check). Locking the catalog rows fails with 40001 on any row
    -- changed or dropped since the snapshot. An inbox made since has no arm until the next
    -- rebuild; its calls take the full path meanwhile.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM FROM mailbox._inbox FOR SHARE;
    END IF;
    FOR r IN SELECT * FROM mailbox._inbox_route_kinds() LOOP
        v_sql := mailbox._inbox_route_sql(r.kind, r.nargs);
        IF v_sql IS DISTINCT FROM mailbox._inbox_route_body(r.kind) THEN
            EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION mailbox.%I(mailbox._inbox, %s) RETURNS %s'
                                      ' LANGUAGE sql VOLATILE SECURITY INVOKER AS %L',
                                      '_inbox_route_' || r.kind, r.args, r.returns, v_sql);
            v_built := v_built + 1;
        END IF;
    END LOOP;
    RETURN v_built + mailbox._inbox_build_named_routes(); -- part 35, named receive
END
$$;

-- The routers as the extension script makes them: every inbox through the dynamic call,
-- until the first rebuild (the script's last step, and every inbox DDL).
CREATE OR REPLACE FUNCTION mailbox._inbox_route_receive(mailbox._inbox, text, jsonb, text, text, text, bigint, jsonb, text, int)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_receive($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_claim(mailbox._inbox, int, timestamptz, boolean)
RETURNS mailbox._inbox_message[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_claim($1, $2, $3, $4)$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_processed(mailbox._inbox, text)
RETURNS mailbox._inbox_done
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_processed($1, $2)$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_failed(mailbox._inbox, text, text)
RETURNS mailbox._inbox_attempt
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_failed($1, $2, $3)$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_receive_batch(mailbox._inbox, jsonb)
RETURNS boolean[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_receive_batch($1, $2)$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_processed_batch(mailbox._inbox, text[])
RETURNS mailbox._inbox_done[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_processed_batch($1, $2)$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_processed_count(mailbox._inbox, text[])
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_processed_count($1, $2)$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_route_unsettled(mailbox._inbox, text[])
RETURNS text[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_unsettled($1, $2)$$;

-- sql/functions/36_inbox_batch_codegen.sql
-- Part 36: the batch forms of receive and mark (issue 11): many messages per call, in the
-- caller's transaction, with the semantics and errors of the per-message forms (part 33).
--
-- A per-message call pays its fixed costs (catalog lookup, grant probe, table-name check,
-- dispatch to the generated function, a statement per side table) once per message; a batch
-- pays them once per call and touches the inbox table with one set-based statement. The
-- per-inbox generated functions _inbox_<key>_receive_batch and _processed_batch (made here,
-- by mailbox._inbox_define like the others of part 35, owned by the table's owner and
-- refusing to run as anyone else) alone touch the inbox table; leases, ordering state and
-- notifications are written here from what they return (data: bind parameters only, for
-- this inbox's own key). inbox_mark_failed's batch form runs the per-message logic for each
-- id in turn (failures are rare; one code path keeps the fencing rules of part 33 exact).

-- (Re)generates an inbox's batch functions from its catalog row (called by
-- _inbox_generate, part 35).
CREATE OR REPLACE FUNCTION mailbox._inbox_generate_batch(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_table_sql(p_inbox);
    -- (the marks' and the settle's test by id: part 35, builders, _inbox_sql_unprocessed)
    v_unprocessed text := mailbox._inbox_sql_unprocessed(p_inbox.columns ->> 'processed_at');
    v_roles text[] := mailbox._inbox_receive_roles();
    v_tests text[] := ARRAY[]::text[];
    v_raise text := '';
    v_cols text[] := ARRAY[]::text[];
    v_vals text[] := ARRAY[]::text[];
    v_id text := 'm.p_event_id';
    v_priority_type text;
    -- an adopted table's unordered receive re-reads the ordering (part 35, builders, receive)
    v_recheck boolean := NOT p_inbox.is_managed AND p_inbox.ordering_first_sequence IS NULL;
BEGIN
    IF p_inbox.casts ? 'event_id' THEN
        v_id := pg_catalog.format('CAST(m.p_event_id AS %s)', p_inbox.casts ->> 'event_id');
    END IF;
    v_priority_type := mailbox._inbox_column_base_type(p_inbox, 'priority');
    -- the checks of the generated receive (part 35) over the whole batch, computed by the
    -- statement that inserts it (v_tests[i] is true when some message breaks check i): a
    -- failed check raises, which undoes the insert, so the batch is parsed only once. A
    -- priority out of range is inserted as NULL first, so the check raises, not the cast.
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        v_tests := v_tests || 'pg_catalog.bool_or(m.p_aggregate_id IS NULL OR m.p_sequence_num IS NULL)'::text;
        v_raise := v_raise || pg_catalog.format($c$
    IF v_bad[%s] THEN
        RAISE EXCEPTION 'inbox %% is ordered: p_aggregate_id and p_sequence_num must not be null', ($1).inbox_name
            USING ERRCODE = '22004',
                  HINT = 'Pass the aggregate and its sequence number, or use an inbox without ordering.';
    END IF;$c$, pg_catalog.cardinality(v_tests));
    END IF;
    FOR i IN 1 .. pg_catalog.array_length(v_roles, 1) LOOP
        IF c ? v_roles[i] THEN
            v_cols := v_cols || pg_catalog.quote_ident(c ->> v_roles[i]);
            v_vals := v_vals || CASE WHEN p_inbox.casts ? v_roles[i]
                                     THEN pg_catalog.format('CAST(m.%I AS %s)', 'p_' || v_roles[i],
                                                            p_inbox.casts ->> v_roles[i])
                                     WHEN v_roles[i] = 'priority' AND v_priority_type = 'int2'
                                     THEN 'CASE WHEN m.p_priority BETWEEN -32768 AND 32767 THEN m.p_priority END'
                                     ELSE 'm.p_' || v_roles[i] END;
        ELSE
            -- v_roles[i] is one of the fixed role names above, never caller text
            v_tests := v_tests || pg_catalog.format('pg_catalog.bool_or(m.p_%s IS NOT NULL)', v_roles[i]);
            v_raise := v_raise || pg_catalog.format($c$
    IF v_bad[%s] THEN
        RAISE EXCEPTION 'inbox %% has no column for %s', ($1).inbox_name
            USING ERRCODE = '22023',
                  HINT = 'Pass NULL for it, or map a column to it (see mailbox.enable_inbox_tracking()).';
    END IF;$c$, pg_catalog.cardinality(v_tests), v_roles[i]);
        END IF;
    END LOOP;
    IF v_priority_type = 'int2' THEN
        v_tests := v_tests || 'pg_catalog.bool_or(m.p_priority NOT BETWEEN -32768 AND 32767)'::text;
        v_raise := v_raise || pg_catalog.format($c$
    IF v_bad[%s] THEN
        RAISE EXCEPTION 'p_priority out of range for inbox %%: %%', ($1).inbox_name,
            (SELECT m.p_priority FROM pg_catalog.jsonb_to_recordset($2) AS m (p_priority pg_catalog.int4)
              WHERE m.p_priority NOT BETWEEN -32768 AND 32767 LIMIT 1)
            USING ERRCODE = '22023',
                  HINT = 'p_priority is -32768 to 32767 (the inbox''s priority column is a smallint); lower values are claimed first.';
    END IF;$c$, pg_catalog.cardinality(v_tests));
    END IF;
    v_tests := v_tests || 'FALSE'::text;
    v_cols := v_cols || pg_catalog.quote_ident(c ->> 'received_at') || pg_catalog.quote_ident(c ->> 'retry_count');
    v_vals := v_vals || 'pg_catalog.now()'::text || '0'::text;
    -- receive_batch(row, messages): the messages (a json array of objects keyed by the
    -- inbox_receive parameter names, checked by inbox_receive_batch) parsed in one pass; true
    -- for each message stored, in input order; of ids repeated in the batch only the first
    -- is stored (later ones are duplicates); refused when ordering was enabled while it
    -- waited (as the single receive, part 35, builders)
    PERFORM mailbox._inbox_define(p_inbox, 'receive_batch', 'jsonb', 'boolean[]', $d$
    v_bad pg_catalog.bool[];
    v_result pg_catalog.bool[];$d$ || CASE WHEN v_recheck THEN $d$
    v_ordered pg_catalog.bool;$d$ ELSE '' END,
        pg_catalog.format($b$
        WITH m AS (
            SELECT m.*, pg_catalog.row_number() OVER (PARTITION BY %5$s ORDER BY m.n) AS k
              FROM ROWS FROM (pg_catalog.jsonb_to_recordset($2) AS (%7$s)) WITH ORDINALITY AS m (%8$s, n)
        ), ins AS (
            INSERT INTO %2$s AS t (%3$s)
            SELECT %4$s FROM m WHERE m.k OPERATOR(pg_catalog.=) 1%12$s ORDER BY m.n
                ON CONFLICT (%6$I) DO NOTHING
            RETURNING t.%6$I AS id
        )
        SELECT pg_catalog.array_agg(m.k OPERATOR(pg_catalog.=) 1 AND ins.id IS NOT NULL ORDER BY m.n),
               ARRAY[%1$s]%10$s
          INTO v_result, v_bad%13$s
          FROM m LEFT JOIN ins ON ins.id = %5$s;%11$s%9$s
    RETURN v_result;$b$,
        pg_catalog.array_to_string(v_tests, ', '), v_table, pg_catalog.array_to_string(v_cols, ', '), pg_catalog.array_to_string(v_vals, ', '),
        v_id, c ->> 'event_id', mailbox._inbox_batch_columns(),
        (SELECT pg_catalog.string_agg('p_' || r, ', ') FROM pg_catalog.unnest(v_roles) AS r), v_raise,
        CASE WHEN v_recheck THEN ', ' || mailbox._inbox_build_ordered_now(p_inbox) ELSE '' END,
        CASE WHEN v_recheck THEN mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'receive') ELSE '' END,
        -- (ordered: a message without aggregate or sequence is not inserted, so the check
        -- above raises 22004, not the insert trigger of a managed inbox, part 34, gap state)
        CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL
             THEN ' AND m.p_aggregate_id IS NOT NULL AND m.p_sequence_num IS NOT NULL' ELSE '' END,
        CASE WHEN v_recheck THEN ', v_ordered' ELSE '' END));

    -- processed_batch(row, ids): marks those unprocessed (= ANY of the ids: one primary-key
    -- scan for the whole array, 0.65 us a message less than a join with unnest(ids), see
    -- docs/benchmarks.md; a repeated id is marked once); what it marked (id, and for ordering
    -- its aggregate and sequence), for inbox_mark_processed to settle leases; refused when
    -- ordering was enabled while it waited (part 34, ordering switch, _inbox_build_refuse_ordered)
    PERFORM mailbox._inbox_define(p_inbox, 'processed_batch', 'text[]', 'mailbox._inbox_done[]', $d$
    v_result mailbox._inbox_done[];
    v_ordered pg_catalog.bool;$d$,
        pg_catalog.format($b$
        WITH d AS (
            UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp()
             WHERE t.%3$I = ANY (%4$s) AND %9$s
            RETURNING ROW(t.%3$I::pg_catalog.text, %5$s, %6$s)::mailbox._inbox_done AS r
        )
        SELECT pg_catalog.array_agg(d.r), pg_catalog.bool_or(%7$s) INTO v_result, v_ordered FROM d;%8$s
    RETURN v_result;$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2, TRUE),
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.text'
             ELSE mailbox._inbox_item(c, 'aggregate_id', 'pg_catalog.text') END,
        CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'NULL::pg_catalog.int8'
             ELSE mailbox._inbox_item(c, 'sequence_num', 'pg_catalog.int8') END,
        mailbox._inbox_build_ordered_now(p_inbox), mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'mark'),
        v_unprocessed));

    -- processed_count(row, ids): the same mark returning only how many it marked, for
    -- inbox_mark_processed when the ids are exactly a claim of its transaction on an unordered
    -- inbox (part 37, batch api): no lease to end, no ordering state, so nothing it marked need
    -- come back. A plain UPDATE, the ordering read again after it (in READ COMMITTED a later
    -- statement's snapshot postdates the lock the UPDATE may have waited for, as that
    -- statement's own does): a CTE returning a row per message, aggregated, cost 30-40 us a
    -- batch of 100 more (docs/benchmarks.md)
    PERFORM mailbox._inbox_define(p_inbox, 'processed_count', 'text[]', 'bigint', $d$
    v_result pg_catalog.int8;
    v_ordered pg_catalog.bool;$d$,
        pg_catalog.format($b$
    UPDATE %1$s AS t SET %2$I = pg_catalog.clock_timestamp()
     WHERE t.%3$I = ANY (%4$s) AND %7$s;
    GET DIAGNOSTICS v_result = ROW_COUNT;
    IF v_result > 0 THEN
        v_ordered := %5$s;
    END IF;%6$s
    RETURN v_result;$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2, TRUE),
        mailbox._inbox_build_ordered_now(p_inbox), mailbox._inbox_build_refuse_ordered(p_inbox, 'v_ordered', 'mark'),
        v_unprocessed));

    -- unsettled(row, ids): those of the ids whose messages are still pending (neither
    -- processed nor dead letters), for the commit-time settling of a claim (part 37)
    PERFORM mailbox._inbox_define(p_inbox, 'unsettled', 'text[]', 'text[]', $d$
    v_result pg_catalog.text[];$d$,
        pg_catalog.format($b$
        SELECT pg_catalog.array_agg(t.%3$I::pg_catalog.text) INTO v_result
          FROM %1$s AS t
         WHERE t.%3$I = ANY (%4$s) AND %6$s AND t.%5$I < ($1).max_retries;
    RETURN v_result;$b$,
        v_table, c ->> 'processed_at', c ->> 'event_id', mailbox._inbox_param(p_inbox, 'event_id', 2, TRUE),
        c ->> 'retry_count', v_unprocessed));
END
$$;

-- sql/functions/37_inbox_batch_api.sql
-- Part 37: the batch forms of receive and mark (issue 11), the public functions; their
-- generated halves are made by part 36, which explains the split of work.

-- The common start of every batch form: the inbox's catalog row after the checks the
-- per-message forms inline (grant, table-name check); p_privilege is 'receive' or 'process'.
CREATE OR REPLACE FUNCTION mailbox._inbox_batch_start(p_inbox text, p_privilege text)
RETURNS mailbox._inbox
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
BEGIN
    SELECT i.* INTO v_inbox FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        v_inbox := mailbox._inbox_get(p_inbox); -- raises 22004 or 42704
    END IF;
    IF v_inbox.has_grants THEN
        PERFORM mailbox._authorize('inbox', v_inbox.inbox_key, p_privilege);
    END IF;
    IF pg_catalog.pg_relation_is_updatable(v_inbox.table_rel, FALSE) = 0 -- (part 30, _inbox_check_table)
       OR pg_catalog.to_regclass(pg_catalog.format('%I.%I', v_inbox.schema_name, v_inbox.table_name))
          IS DISTINCT FROM v_inbox.table_rel THEN
        PERFORM mailbox._inbox_table_moved(v_inbox); -- raises 55000
    END IF;
    RETURN v_inbox;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.inbox_receive_batch(p_inbox text, p_messages jsonb)
RETURNS TABLE (event_id text, inserted boolean)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- calls any inbox's generated functions (which run as the table owner) for mailbox_producer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_batch_start(p_inbox, 'receive');
    v_bad record;
    v_ids text[];
    v_first_bad bigint;
    v_new boolean[];
    v_keys text[] := ARRAY(SELECT 'p_' || r FROM pg_catalog.unnest(mailbox._inbox_receive_roles()) AS r);
BEGIN
    PERFORM mailbox._require(p_messages, 'p_messages');
    IF pg_catalog.jsonb_typeof(p_messages) <> 'array' THEN
        RAISE EXCEPTION 'p_messages must be a json array, not %', pg_catalog.jsonb_typeof(p_messages)
            USING ERRCODE = '22023',
                  HINT = 'Pass [{"p_event_id": ..., "p_payload": ...}, ...]: one object per message, '
                         'keyed by the inbox_receive parameter names.';
    END IF;
    -- every element an object whose keys are inbox_receive parameters, every id present and
    -- at most 1000 bytes (the errors of inbox_receive, naming the first bad element); the
    -- same pass collects the ids, which the result reports as given
    SELECT pg_catalog.array_agg(e.m ->> 'p_event_id' ORDER BY e.n),
           pg_catalog.min(e.n) FILTER (WHERE CASE WHEN pg_catalog.jsonb_typeof(e.m) <> 'object' THEN TRUE
                                                  ELSE e.m - v_keys <> '{}' OR e.m ->> 'p_event_id' IS NULL
                                                       OR pg_catalog.octet_length(e.m ->> 'p_event_id') > 1000 END)
      INTO v_ids, v_first_bad
      FROM pg_catalog.jsonb_array_elements(p_messages) WITH ORDINALITY AS e (m, n);
    IF v_first_bad IS NOT NULL THEN
        SELECT v_first_bad AS n, p_messages -> (v_first_bad - 1)::int AS m INTO v_bad;
        IF pg_catalog.jsonb_typeof(v_bad.m) <> 'object' THEN
            RAISE EXCEPTION 'message % of the batch is not a json object', v_bad.n
                USING ERRCODE = '22023',
                      HINT = 'Each message is an object keyed by the inbox_receive parameter names (p_event_id, ...).';
        ELSIF v_bad.m - v_keys <> '{}' THEN
            RAISE EXCEPTION 'unknown key in message % of the batch: %', v_bad.n,
                (SELECT k.key FROM pg_catalog.jsonb_object_keys(v_bad.m - v_keys) AS k (key) ORDER BY 1 LIMIT 1)
                USING ERRCODE = '22023',
                      HINT = 'Keys are the inbox_receive parameter names: p_event_id, p_payload, p_event_type, '
                             'p_source, p_aggregate_id, p_sequence_num, p_headers, p_trace_id, p_priority.';
        ELSIF v_bad.m ->> 'p_event_id' IS NULL THEN
            RAISE EXCEPTION 'event id must not be null'
                USING ERRCODE = '22004', DETAIL = pg_catalog.format('Message %s of the batch has no p_event_id.', v_bad.n),
                      HINT = 'Pass the message''s unique id (the broker''s message id, say).';
        END IF;
        RAISE EXCEPTION 'p_event_id too long: % bytes', pg_catalog.octet_length(v_bad.m ->> 'p_event_id')
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('Message %s of the batch.', v_bad.n),
                  HINT = 'p_event_id is at most 1000 bytes; pass the broker''s message id, not the message.';
    END IF;
    IF pg_catalog.jsonb_array_length(p_messages) = 0 THEN
        RETURN;
    END IF;
    -- the generated function parses the batch, checks ordering, unmapped roles and the
    -- priority's range, and inserts with the table owner's rights
    v_new := mailbox._inbox_route_receive_batch(v_inbox, p_messages); -- part 35, routes
    IF TRUE = ANY (v_new) AND mailbox._inbox_has_waiter(v_inbox.inbox_key) THEN -- part 33, wake-ups
        PERFORM pg_catalog.pg_notify('mailbox_inbox_new', v_inbox.inbox_name);
    END IF;
    RETURN QUERY
    SELECT e.id, e.new
      FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_new)) WITH ORDINALITY AS e (id, new, n)
     ORDER BY e.n;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_receive_batch(text, jsonb) IS
'store many messages (a json array of inbox_receive arguments) in one call; per message, true when new';

CREATE OR REPLACE FUNCTION mailbox.inbox_mark_processed(p_inbox text, p_event_ids text[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease/ordering state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_batch_start(p_inbox, 'process');
    v_done mailbox._inbox_done[];
    v_exact boolean;
    v_count bigint;
BEGIN
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    IF pg_catalog.array_position(p_event_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'p_event_ids must not contain null'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('Element %s is null.', pg_catalog.array_position(p_event_ids, NULL)),
                  HINT = 'Pass the ids of the messages to mark.';
    END IF;
    IF pg_catalog.cardinality(p_event_ids) = 0 THEN
        RETURN 0;
    END IF;
    -- A worker marking exactly the batch it claimed in this transaction, from an unordered
    -- inbox (the documented pattern): its messages have no lease rows to end (part 37, claim
    -- settle) and there is no ordering state to keep, so the generated mark returns only how
    -- many it marked; then, as in the general path below, the claim is settled by deleting
    -- it if the mark marked something, and left to its commit if it marked nothing (a table
    -- owner's trigger can refuse every row). (An exact match is an index probe; the
    -- containment test below initialises a hashed subplan even when it is not needed. A
    -- transaction has at most one open claim per inbox: a claim settles the earlier ones.)
    IF v_inbox.ordering_first_sequence IS NULL THEN
        SELECT mailbox._inbox_route_processed_count(v_inbox, p_event_ids) INTO v_count -- part 35, routes
         WHERE EXISTS (SELECT 1 FROM mailbox._inbox_open_claim AS o
                        WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()
                          AND o.event_ids OPERATOR(pg_catalog.=) p_event_ids);
        IF FOUND THEN
            IF v_count > 0 THEN
                DELETE FROM mailbox._inbox_open_claim AS o
                 WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()
                   AND o.event_ids OPERATOR(pg_catalog.=) p_event_ids;
            END IF;
            RETURN v_count;
        END IF;
    END IF;
    v_done := mailbox._inbox_route_processed_batch(v_inbox, p_event_ids); -- part 35, routes
    IF v_done IS NULL THEN
        RETURN 0;
    END IF;
    -- A claim of this transaction whose ids are all in p_event_ids has nothing left to lease
    -- (part 37, claim settle: every id is now processed), so it is settled here and its
    -- commit looks nothing up. When one such claim is exactly p_event_ids (a worker marking
    -- the batch it claimed), the messages have no lease rows to delete; otherwise their
    -- leases are deleted. (Containment by hashing: the array operators compare every
    -- element with every other.)
    WITH settled AS (
        DELETE FROM mailbox._inbox_open_claim AS o
         WHERE o.inbox_key = v_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned()
           AND (o.event_ids OPERATOR(pg_catalog.=) p_event_ids
                OR NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(o.event_ids) AS e (id)
                                WHERE e.id NOT IN (SELECT pg_catalog.unnest(p_event_ids))))
        RETURNING o.event_ids OPERATOR(pg_catalog.=) p_event_ids AS exact
    )
    SELECT coalesce(pg_catalog.bool_or(s.exact), FALSE) INTO v_exact FROM settled AS s;
    IF NOT v_exact THEN
        DELETE FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key = v_inbox.inbox_key
           AND l.event_id = ANY (ARRAY(SELECT d.event_id FROM pg_catalog.unnest(v_done) AS d));
    END IF;
    -- the ordering state exactly as inbox_mark_processed keeps it (a new aggregate starts at
    -- no less than first sequence - 1, an existing one only moves up to what was processed),
    -- one upsert per aggregate, in aggregate order so concurrent batches lock alike
    IF v_inbox.ordering_first_sequence IS NOT NULL THEN
        INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq, updated_at)
        SELECT v_inbox.inbox_key, d.aggregate_id,
               pg_catalog.int8larger(pg_catalog.max(d.sequence_num), v_inbox.ordering_first_sequence - 1),
               pg_catalog.clock_timestamp()
          FROM pg_catalog.unnest(v_done) AS d
         WHERE d.aggregate_id IS NOT NULL AND d.sequence_num IS NOT NULL
         GROUP BY d.aggregate_id
         ORDER BY d.aggregate_id
            ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
           SET last_seq = pg_catalog.int8larger(a.last_seq, (SELECT pg_catalog.max(d.sequence_num)
                                                               FROM pg_catalog.unnest(v_done) AS d
                                                              WHERE d.aggregate_id = a.aggregate_id)),
               updated_at = excluded.updated_at;
    END IF;
    RETURN pg_catalog.cardinality(v_done);
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_processed(text, text[]) IS
'mark many messages processed in one call; how many were marked (missing or processed ids are skipped)';

-- One failed attempt of one message (inbox_mark_failed, both forms), after the argument
-- checks: counts it (the generated function, as the table owner) and settles its lease: the
-- fencing rules of docs/inbox.md, "A late failure report".
CREATE OR REPLACE FUNCTION mailbox._inbox_fail_one(p_inbox mailbox._inbox, p_event_id text, p_error text, p_delay int)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_attempt mailbox._inbox_attempt;
    v_id text;
    v_retries int;
    v_state text;
BEGIN
    v_attempt := mailbox._inbox_route_failed(p_inbox, p_event_id, p_error); -- part 35, routes
    v_id := v_attempt.event_id;
    v_retries := v_attempt.retry_count;
    v_state := v_attempt.state;
    IF v_id IS NULL THEN
        IF v_state = 'missing' THEN
            RAISE EXCEPTION 'inbox message not found: %', p_event_id
                USING ERRCODE = '42704', DETAIL = pg_catalog.format('Inbox %s has no message with this id.',
                                                                    p_inbox.inbox_name);
        ELSIF v_state = 'processed' THEN
            RAISE EXCEPTION 'inbox message already processed: %', p_event_id
                USING ERRCODE = '55000',
                      HINT = 'Replay it with mailbox.replay_inbox_messages() to process it again.';
        END IF;
        RETURN 'dead_letter'; -- already in the DLQ: nothing changes
    END IF;
    -- a claim of this transaction does not lease it at commit (part 37, claim settle)
    PERFORM mailbox._inbox_unclaim(p_inbox.inbox_key, ARRAY[v_id]);
    IF v_retries >= p_inbox.max_retries THEN
        -- a dead letter is not claimable; another backend's live lease still says it is in
        -- flight (see below) and expires by itself
        DELETE FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = v_id
           AND (l.lease_until IS NULL OR l.lease_until <= pg_catalog.clock_timestamp()
                OR l.leased_by_pid IS NOT DISTINCT FROM pg_catalog.pg_backend_pid());
        INSERT INTO mailbox._inbox_dlq_event (inbox_key, event_id, error, retry_count)
        VALUES (p_inbox.inbox_key, v_id, p_error, v_retries);
        RETURN 'dead_letter';
    END IF;
    -- a live lease taken by another backend is not the caller's to end: this is a late
    -- report of a worker whose lease expired (the message was reclaimed). The failure counts,
    -- the holder keeps its lease, and the retry comes due no earlier than that lease ends.
    UPDATE mailbox._inbox_lease AS l
       SET next_attempt_at = GREATEST(l.lease_until,
                                      pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_delay))
     WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = v_id AND l.lease_until > pg_catalog.clock_timestamp()
       AND l.leased_by_pid IS DISTINCT FROM pg_catalog.pg_backend_pid();
    IF FOUND THEN
        RETURN 'retry';
    END IF;
    IF p_delay > 0 THEN
        -- a lease row of this transaction (part 37, claim settle, "Marks without a lease")
        PERFORM pg_catalog.set_config('mailbox.claim_unleased_' || p_inbox.inbox_key, '', TRUE);
        INSERT INTO mailbox._inbox_lease AS l (inbox_key, event_id, lease_until, leased_by, next_attempt_at)
        VALUES (p_inbox.inbox_key, v_id, NULL, NULL,
                pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_delay))
            ON CONFLICT (inbox_key, event_id) DO UPDATE
           SET lease_until = NULL, leased_by = NULL, next_attempt_at = excluded.next_attempt_at,
               leased_by_pid = NULL;
    ELSE
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = v_id;
    END IF;
    RETURN 'retry';
END
$$;

CREATE OR REPLACE FUNCTION mailbox.inbox_mark_failed(
    p_inbox text, p_event_ids text[], p_error text, p_retry_after_seconds int DEFAULT NULL
)
RETURNS TABLE (event_id text, outcome text)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- updates the lease state of any inbox for mailbox_consumer
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_batch_start(p_inbox, 'process');
    v_delay int := p_retry_after_seconds;
BEGIN
    IF v_delay IS NULL THEN
        v_delay := mailbox._setting_int('inbox_retry_delay_seconds');
    END IF;
    PERFORM mailbox._require(p_event_ids, 'p_event_ids');
    IF pg_catalog.array_position(p_event_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'p_event_ids must not contain null'
            USING ERRCODE = '22004',
                  DETAIL = pg_catalog.format('Element %s is null.', pg_catalog.array_position(p_event_ids, NULL)),
                  HINT = 'Pass the ids of the messages whose attempt failed.';
    END IF;
    IF v_delay < 0 THEN
        RAISE EXCEPTION 'invalid retry delay: % seconds', v_delay
            USING ERRCODE = '22023', HINT = 'p_retry_after_seconds is NULL (mailbox.inbox_retry_delay_seconds) or 0 or more.';
    END IF;
    -- each id in turn, exactly as inbox_mark_failed(text, text, ...) would: an id listed
    -- twice is two failed attempts
    FOR i IN 1 .. coalesce(pg_catalog.array_length(p_event_ids, 1), 0) LOOP
        event_id := p_event_ids[i];
        outcome := mailbox._inbox_fail_one(v_inbox, p_event_ids[i], p_error, v_delay);
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_mark_failed(text, text[], text, int) IS
'record a failed attempt of many messages: per id ''retry'' or ''dead_letter'' (as the one-id form)';

-- sql/functions/37_inbox_claim_settle.sql
-- Part 37 (claim settle): claims whose leases are written only if they outlive their
-- transaction (issue 11).
--
-- A claim must keep other workers off its messages for its visibility timeout. While the
-- claiming transaction is open, its row locks (FOR UPDATE, taken by the generated claim)
-- already do that: every claimer skips locked rows. A lease row is needed only once the
-- transaction commits with messages still pending (claim in one transaction, mark in a
-- later one). So in READ COMMITTED, for an inbox without ordering, inbox_claim writes one
-- mailbox._inbox_open_claim row per call (the ids, holder and lease end) instead of a
-- lease row per message, and the deferred constraint trigger below settles it at commit:
-- the ids still pending (neither processed nor dead letters, asked of the generated
-- unsettled function as the table owner) become lease rows, and the claim row is deleted.
-- A claim whose messages are marked in its own transaction (the documented exactly-once
-- pattern) so writes no lease row at all, and its mark deletes none.
--
-- Why no other claimer can win a message in between (docs/design.md §7.1): the lease
-- rows are written before the commit releases the row locks and become visible with it. A
-- claimer whose statement snapshot predates that commit can still lock the row after it,
-- so inbox_claim re-reads the leases of the rows it locked in a new statement (a new
-- snapshot in READ COMMITTED, taken after the lock was granted, so after that commit) and
-- keeps only those without a live lease or pending retry time (that statement is skipped
-- when a probe after the locks finds no lease row of the inbox at all). Under REPEATABLE READ or
-- SERIALIZABLE a statement cannot see past the transaction's snapshot, so there (and for
-- ordered inboxes, whose claim reads other messages' leases to keep one message of an
-- aggregate in flight) inbox_claim writes the lease rows at once and the ON CONFLICT
-- upsert decides, as before.
--
-- Only extension-owned code writes mailbox._inbox_open_claim, so the ids a commit leases are
-- ids its transaction claimed; a failure report (part 37, _inbox_fail_one) and a replay
-- take their ids out of the open claims of their own transaction, so those messages are
-- claimable again at once rather than leased at commit.
--
-- Marks without a lease. The named mark (part 35, named receive) ends a message's lease with
-- a DELETE, an executor start-up on another table that cost about a tenth of a mark. A
-- message this transaction claimed has no lease row to end when no lease row of the inbox
-- existed after the claim's locks: no other transaction can lease a row this one holds
-- locked, and this one writes lease rows only by settling, by a claim that leases at once
-- (step 2b, after ordering was enabled in the same transaction) or by a failure report. So
-- inbox_claim, step 2a, sets the transaction-local setting mailbox.claim_unleased_<key> to
-- 'on' when that probe found none (and clears it when it found some), and every writer of
-- this transaction's lease rows (_inbox_settle and _inbox_claim_leases below,
-- _inbox_fail_one) clears it; the named mark skips its DELETE while it is 'on'. A mark of a
-- message that another transaction claimed, made while the setting is on, leaves that
-- lease, which holds nothing (as above, a processed message is never claimed, counted in
-- flight or replayed with its lease) and is deleted by maintenance once it has expired.
-- Setting it by hand only does the same.

-- Settles one open claim now: the ids still pending (neither processed nor dead letters, as
-- the table owner sees them) become lease rows and the claim row is deleted. Called at commit
-- by the deferred trigger below, and by inbox_claim for the open claims of its own
-- transaction before it claims again (so the new claim, like every claim, skips them by
-- their lease rows), and by _inbox_hold_in_flight (part 34).
-- No SET clause: its callers are those three, SECURITY DEFINER or pinned themselves, whose
-- search_path it runs with (nobody else may execute it). At commit a SET of search_path here
-- cost about 40 us of backend CPU per claim, a tenth of what a claim of 10 adds to a plain
-- SKIP LOCKED claim (docs/benchmarks.md). Even so its body names nothing a search_path could
-- redirect, as the routers' (part 35, routes): every function, operator and type qualified.
CREATE OR REPLACE FUNCTION mailbox._inbox_settle(p_claim_no bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
AS $$
DECLARE
    v_claim record;
    v_inbox mailbox._inbox;
    v_left pg_catalog.text[];
    v_won pg_catalog.int8;
BEGIN
    -- one statement: the row as it is now (a failure report may have taken ids out since the
    -- insert), deleted, with its inbox (drop_inbox deletes the open claims of its transaction)
    -- and the ids still pending (part 35, routes). No row: settled already (by a batch mark
    -- or an earlier call), or nothing is left.
    WITH d AS (
        DELETE FROM mailbox._inbox_open_claim AS o WHERE o.claim_no OPERATOR(pg_catalog.=) p_claim_no
        RETURNING o.inbox_key, o.event_ids, o.lease_until, o.leased_by, o.leased_by_pid
    )
    SELECT d.inbox_key, d.lease_until, d.leased_by, d.leased_by_pid, i AS inbox,
           mailbox._inbox_route_unsettled(i, d.event_ids) AS pending
      INTO v_claim
      FROM d JOIN mailbox._inbox AS i ON i.inbox_key OPERATOR(pg_catalog.=) d.inbox_key
     WHERE pg_catalog.cardinality(d.event_ids) OPERATOR(pg_catalog.>) 0;
    IF v_claim.pending IS NULL THEN
        RETURN;
    END IF;
    v_inbox := v_claim.inbox;
    v_left := v_claim.pending;
    -- this transaction now has lease rows of the inbox (Marks without a lease, above)
    PERFORM pg_catalog.set_config(pg_catalog.concat('mailbox.claim_unleased_', v_claim.inbox_key), '', TRUE);
    -- the claim held these rows locked since it re-read their leases, so no live lease or
    -- retry time of another worker can be in the way; the WHERE only keeps that true
    WITH won AS (
        INSERT INTO mailbox._inbox_lease AS x (inbox_key, event_id, lease_until, leased_by, next_attempt_at,
                                               leased_by_pid)
        SELECT v_claim.inbox_key, m.id, v_claim.lease_until, v_claim.leased_by, NULL, v_claim.leased_by_pid
          FROM pg_catalog.unnest(v_left) AS m (id)
            ON CONFLICT ON CONSTRAINT _inbox_lease_pkey DO UPDATE
           SET lease_until = excluded.lease_until, leased_by = excluded.leased_by, next_attempt_at = NULL,
               leased_by_pid = excluded.leased_by_pid
         WHERE (x.lease_until IS NULL OR x.lease_until OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
           AND (x.next_attempt_at IS NULL OR x.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
        RETURNING 1
    )
    SELECT pg_catalog.count(*) INTO v_won FROM won;
    IF v_won OPERATOR(pg_catalog.<>) pg_catalog.cardinality(v_left) THEN
        RAISE EXCEPTION 'inbox claim of % could not be settled: % of % leases are held by another worker',
            v_inbox.inbox_name, pg_catalog.cardinality(v_left) OPERATOR(pg_catalog.-) v_won,
            pg_catalog.cardinality(v_left)
            USING ERRCODE = 'XX000',
                  HINT = 'This is a bug in pg_mailbox; the transaction was rolled back, so no message was lost.';
    END IF;
END
$$;

-- The lease rows of a claim that writes them at once (inbox_claim, step 2b: an ordered inbox,
-- or REPEATABLE READ and SERIALIZABLE): the ids of p_rows it won. The upsert takes a message
-- whose lease and retry time have passed; ON CONFLICT judges the latest committed lease row.
-- An ordered inbox's leases carry their aggregate, at most one row per aggregate (a unique
-- index): the row of the message in flight. So, first, other messages' rows of these
-- aggregates whose lease ended (expired, or a failure's retry time) give their aggregate back
-- (a claimed message's own row keeps it: the upsert sets it again, and a REPEATABLE READ
-- claim would fail on a row maintenance deleted since its snapshot); then the upsert leaves
-- out a message whose aggregate another message's row still carries: a live lease, or one
-- that ended after the give-back's snapshot (it is claimable next time). In READ
-- COMMITTED its snapshot is taken after inbox_claim holds the aggregates' locks, so it sees
-- the lease of a claim that held one and committed since the claim's scan; under REPEATABLE
-- READ it cannot, and that lease's row fails the unique index instead (inbox_claim turns
-- that into a serialization failure). docs/design.md §7.3.
CREATE OR REPLACE FUNCTION mailbox._inbox_claim_leases(
    p_inbox mailbox._inbox, p_rows mailbox._inbox_message[], p_worker text, p_now timestamptz,
    p_until timestamptz
)
RETURNS text[]
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_ordered boolean := p_inbox.ordering_first_sequence IS NOT NULL;
    v_won text[];
BEGIN
    -- this transaction writes lease rows of the inbox (Marks without a lease, above): a claim
    -- of this transaction may have set the setting before ordering was enabled in it
    PERFORM pg_catalog.set_config('mailbox.claim_unleased_' || p_inbox.inbox_key, '', TRUE);
    IF v_ordered THEN
        UPDATE mailbox._inbox_lease AS o SET aggregate_id = NULL
         WHERE o.inbox_key = p_inbox.inbox_key
           AND o.aggregate_id = ANY (ARRAY(SELECT m.aggregate_id FROM pg_catalog.unnest(p_rows) AS m))
           AND o.event_id <> ALL (ARRAY(SELECT m.event_id FROM pg_catalog.unnest(p_rows) AS m))
           AND (o.lease_until IS NULL OR o.lease_until <= p_now);
    END IF;
    WITH won AS (
        INSERT INTO mailbox._inbox_lease AS x (inbox_key, event_id, lease_until, leased_by, next_attempt_at,
                                               leased_by_pid, aggregate_id)
        SELECT p_inbox.inbox_key, m.event_id, p_until, p_worker, NULL, pg_catalog.pg_backend_pid(),
               CASE WHEN v_ordered THEN m.aggregate_id END
          FROM pg_catalog.unnest(p_rows) AS m
         WHERE NOT v_ordered OR m.aggregate_id IS NULL
            OR NOT EXISTS (SELECT 1 FROM mailbox._inbox_lease AS o
                            WHERE o.inbox_key = p_inbox.inbox_key AND o.aggregate_id = m.aggregate_id
                              AND o.event_id <> m.event_id)
            ON CONFLICT ON CONSTRAINT _inbox_lease_pkey DO UPDATE
           SET lease_until = excluded.lease_until, leased_by = excluded.leased_by, next_attempt_at = NULL,
               leased_by_pid = excluded.leased_by_pid, aggregate_id = excluded.aggregate_id
         WHERE (x.lease_until IS NULL OR x.lease_until <= p_now)
           AND (x.next_attempt_at IS NULL OR x.next_attempt_at <= p_now)
        RETURNING x.event_id
    )
    SELECT pg_catalog.array_agg(won.event_id) INTO v_won FROM won;
    RETURN coalesce(v_won, '{}');
END
$$;

-- Raises 40001 when the inbox's configuration (ordering, column mapping, priority) differs
-- from p_inbox, the catalog row inbox_claim looked up. In READ COMMITTED, called after the
-- claim's scan (a later statement, so a newer snapshot), it stops a claim that ran the old
-- configuration's generated code: one that looked the inbox up before a change committed and
-- then waited for the change's lock (enable_inbox_ordering's on the table) before it scanned.
-- Such a claim must not hand out what it found (docs/inbox-ordering.md, switching while
-- workers run). The generated functions raise the same error when their own check, before
-- they run, finds the change. (PL/pgSQL: its statement's plan is kept for the session; a SQL
-- function with a SET clause would be planned again at every call.)
CREATE OR REPLACE FUNCTION mailbox._inbox_check_unchanged(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM mailbox._inbox AS i
                WHERE i.inbox_key = p_inbox.inbox_key
                  AND (i.ordering_first_sequence, i.columns, i.priority_tiers)
                      IS DISTINCT FROM (p_inbox.ordering_first_sequence, p_inbox.columns, p_inbox.priority_tiers)) THEN
        RAISE EXCEPTION 'inbox % changed its ordering or priority while this transaction was open', p_inbox.inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This claim read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;
END
$$;

-- The deferred trigger on mailbox._inbox_open_claim: settles one claim at commit (or at
-- SET CONSTRAINTS ... IMMEDIATE, after which later marks delete the lease rows as usual).
CREATE OR REPLACE FUNCTION mailbox._inbox_settle_claim()
RETURNS trigger
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the leases of any inbox at the commit of a mailbox_consumer's claim
SET search_path = pg_catalog, mailbox, pg_temp
SET enable_seqscan = off -- plans made on an empty queue (part 33, inbox_claim)
SET jit = off -- (and why, with it: part 33, inbox_claim)
AS $$
BEGIN
    -- a claim marked in full by a batch mark was settled (deleted) there: nothing to call
    -- (one index probe; without it such a claim pays a call and the settle's statement.
    -- bench/inbox_variants.py --batch 100 --batch-mark read 70 and 119 us more per claim
    -- without it, but 44 for the same code in a third run: this mode's noise; it stays)
    IF EXISTS (SELECT 1 FROM mailbox._inbox_open_claim AS o WHERE o.claim_no = NEW.claim_no) THEN
        PERFORM mailbox._inbox_settle(NEW.claim_no);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION mailbox._inbox_settle_claim() IS
'pg_mailbox: at commit, turns the still pending messages of an inbox claim into lease rows';

DROP TRIGGER IF EXISTS _inbox_settle_claim ON mailbox._inbox_open_claim;
CREATE CONSTRAINT TRIGGER _inbox_settle_claim
AFTER INSERT ON mailbox._inbox_open_claim
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION mailbox._inbox_settle_claim();

-- Takes ids out of the open claims of the caller's own transaction (the only claim rows it
-- can see), so its commit does not lease them: a failure report or replay settles them.
CREATE OR REPLACE FUNCTION mailbox._inbox_unclaim(p_inbox_key int, p_event_ids text[])
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    UPDATE mailbox._inbox_open_claim AS o
       SET event_ids = ARRAY(SELECT e.id FROM pg_catalog.unnest(o.event_ids) AS e (id)
                              WHERE e.id <> ALL (p_event_ids))
     WHERE o.inbox_key = p_inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned() AND o.event_ids && p_event_ids;
$$;

-- sql/functions/38_inbox_status.sql
-- Part 38: inbox health and status (SPEC §3.1), and the retention drain of one inbox.
--
-- Each reads (or deletes from) the inbox's own table under its current name (after a rename
-- too; see part 30) with the table owner's rights, through mailbox._inbox_as_owner. What
-- comes back is data the table owner could have chosen: counts reported as they are, and ids
-- that are only ever bind parameters for this inbox's own leases.

-- One inbox's counts as jsonb: pending, dead, processed, oldest_age; with p_detail also
-- avg_sec and last_minute (processed in the last hour / minute), in_flight, and for an
-- ordered inbox blocked (aggregates behind a dead letter) and gaps. NULL when the table was
-- dropped.
CREATE OR REPLACE FUNCTION mailbox._inbox_counts(p_inbox mailbox._inbox, p_detail boolean)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_current_table(p_inbox);
    v_proc text := mailbox._inbox_col(c, 'processed_at');
    v_retry text := mailbox._inbox_col(c, 'retry_count');
    v_recv text := mailbox._inbox_col(c, 'received_at');
    v_sql text := 'SELECT pg_catalog.jsonb_build_object(''pending'', u.pending, ''dead'', u.dead,'
                  ' ''processed'', u.processed, ''oldest_age'', u.oldest_age)';
    v_from text;
    v_gaps int;
    v_kept bigint[];
BEGIN
    IF v_table IS NULL THEN
        RETURN NULL;
    END IF;
    -- a managed ordered inbox keeps its gaps and counts (part 34, gap fold): fold first, then
    -- the kept gaps are counted by index and the kept counts are current
    -- (docs/inbox-ordering.md, "How gaps are kept"); any other ordered inbox lists its gaps
    IF p_detail AND p_inbox.ordering_first_sequence IS NOT NULL THEN
        IF mailbox._inbox_gap_tracked(p_inbox) AND mailbox._inbox_gap_refresh(p_inbox) THEN
            SELECT pg_catalog.count(*) INTO v_gaps FROM mailbox._inbox_gap AS g WHERE g.inbox_key = p_inbox.inbox_key;
        ELSE
            v_gaps := pg_catalog.jsonb_array_length(mailbox._inbox_gap_list(p_inbox));
        END IF;
    END IF;
    IF mailbox._inbox_gap_tracked(p_inbox) THEN
        SELECT ARRAY[(k.c ->> 'unprocessed')::bigint, (k.c ->> 'processed')::bigint] INTO v_kept
          FROM (SELECT mailbox._inbox_kept_counts(p_inbox) AS c) AS k;
    END IF;
    IF p_inbox.is_managed THEN
        -- a managed table's retry_count is NOT NULL, so pending = unprocessed - dead; each count
        -- is its own index-only scan (pending, dead-letter and processed partial indexes; the
        -- dead-letter one was made with max_retries written in, hence the literal)
        v_from := pg_catalog.format(
            ' FROM (SELECT c.unprocessed - c.dead AS pending, c.dead, c.processed, c.oldest_age FROM (SELECT'
            ' %6$s AS unprocessed,'
            ' (SELECT pg_catalog.count(*) FROM %1$s AS t WHERE %2$s IS NULL AND %3$s >= %5$s) AS dead,'
            ' %7$s AS processed,'
            ' (SELECT pg_catalog.date_part(''epoch'', pg_catalog.now() - %4$s::pg_catalog.timestamptz) FROM %1$s AS t'
            ' WHERE %2$s IS NULL AND %3$s < %5$s AND %4$s IS NOT NULL ORDER BY %4$s LIMIT 1) AS oldest_age) AS c) AS u',
            v_table, v_proc, v_retry, v_recv, p_inbox.max_retries,
            CASE WHEN v_kept IS NULL THEN pg_catalog.format('(SELECT pg_catalog.count(*) FROM %s AS t WHERE %s IS NULL)',
                                                            v_table, v_proc) ELSE '$2[1]' END,
            CASE WHEN v_kept IS NULL THEN pg_catalog.format('(SELECT pg_catalog.count(*) FROM %s AS t WHERE %s IS NOT NULL)',
                                                            v_table, v_proc) ELSE '$2[2]' END);
    ELSE
        v_from := pg_catalog.format(
            ' FROM (SELECT pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s < ($1).max_retries) AS pending,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NULL AND %3$s >= ($1).max_retries) AS dead,'
            ' pg_catalog.count(*) FILTER (WHERE %2$s IS NOT NULL) AS processed,'
            ' pg_catalog.date_part(''epoch'', pg_catalog.now() - pg_catalog.min(%4$s::pg_catalog.timestamptz)'
            ' FILTER (WHERE %2$s IS NULL AND %3$s < ($1).max_retries)) AS oldest_age FROM %1$s AS t) AS u',
            v_table, v_proc, v_retry, v_recv);
    END IF;
    IF p_detail THEN
        v_sql := v_sql || pg_catalog.format(
            ' || (SELECT pg_catalog.jsonb_build_object(''avg_sec'', pg_catalog.avg(pg_catalog.date_part(''epoch'','
            ' %2$s::pg_catalog.timestamptz - %4$s::pg_catalog.timestamptz)), ''last_minute'','
            ' pg_catalog.count(*) FILTER (WHERE %2$s >= pg_catalog.now() - interval ''1 minute''))'
            ' FROM %1$s AS t WHERE %2$s >= pg_catalog.now() - interval ''1 hour'')'
            ' || pg_catalog.jsonb_build_object(''in_flight'', (SELECT pg_catalog.count(*) FROM mailbox.%5$I AS l'
            ' WHERE l.lease_until > pg_catalog.clock_timestamp() AND EXISTS (SELECT 1 FROM %1$s AS t'
            ' WHERE %6$s = %7$s AND %2$s IS NULL AND %3$s < ($1).max_retries)))',
            v_table, v_proc, v_retry, v_recv, '_inbox_' || p_inbox.inbox_key || '_lease',
            mailbox._inbox_col(c, 'event_id'),
            CASE WHEN p_inbox.casts ? 'event_id'
                 THEN pg_catalog.format('CAST(l.event_id AS %s)', p_inbox.casts ->> 'event_id')
                 ELSE 'l.event_id' END);
        IF p_inbox.ordering_first_sequence IS NOT NULL THEN
            -- a dead letter at or before an aggregate's next position blocks that aggregate
            v_sql := v_sql || pg_catalog.format(
                ' || pg_catalog.jsonb_build_object(''blocked'', (SELECT pg_catalog.count(DISTINCT %4$s)'
                ' FROM %1$s AS t WHERE %2$s IS NULL AND %3$s AND %4$s IS NOT NULL'
                ' AND %5$s <= coalesce((SELECT s.last_seq FROM mailbox.%6$I AS s'
                ' WHERE s.aggregate_id = %4$s::pg_catalog.text), ($1).ordering_first_sequence - 1) + 1))',
                v_table, v_proc,
                CASE WHEN p_inbox.is_managed THEN pg_catalog.format('%s >= %s', v_retry, p_inbox.max_retries)
                     ELSE pg_catalog.format('%s >= ($1).max_retries', v_retry) END,
                mailbox._inbox_col(c, 'aggregate_id'), mailbox._inbox_col(c, 'sequence_num'),
                '_inbox_' || p_inbox.inbox_key || '_aggregate');
            -- the gaps themselves, counted above
            RETURN mailbox._inbox_as_owner(p_inbox, v_sql || v_from, v_kept)
                   || pg_catalog.jsonb_build_object('gaps', v_gaps);
        END IF;
    END IF;
    RETURN mailbox._inbox_as_owner(p_inbox, v_sql || v_from, v_kept);
END
$$;

-- Deletes up to p_batch rows of the inbox table that retention lets go: processed more than
-- p_hours ago, or (p_dead) dead letters received more than p_hours ago, skipping rows locked
-- by a worker; then their leases. Returns how many rows it deleted (0 for a dropped table).
CREATE OR REPLACE FUNCTION mailbox._inbox_drain(p_inbox mailbox._inbox, p_dead boolean, p_hours int, p_batch int)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
    v_table text := mailbox._inbox_current_table(p_inbox);
    v_proc text := mailbox._inbox_col(c, 'processed_at');
    v_ids text[];
BEGIN
    IF v_table IS NULL THEN
        RETURN 0;
    END IF;
    SELECT coalesce(pg_catalog.array_agg(x.id), ARRAY[]::text[]) INTO v_ids
      FROM pg_catalog.jsonb_array_elements_text(mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'WITH doomed AS (SELECT %2$s AS key FROM %1$s AS t WHERE %3$s'
        ' LIMIT $2[2] FOR UPDATE OF t SKIP LOCKED),'
        ' gone AS (DELETE FROM %1$s AS t USING doomed WHERE %2$s = doomed.key'
        ' RETURNING doomed.key::pg_catalog.text AS id)'
        ' SELECT coalesce(pg_catalog.jsonb_agg(gone.id), ''[]'') FROM gone',
        v_table, mailbox._inbox_col(c, 'event_id'),
        CASE WHEN p_dead
             THEN pg_catalog.format('%1$s IS NULL AND %2$s >= ($1).max_retries AND %3$s < pg_catalog.now()'
                                    ' - pg_catalog.make_interval(hours => $2[1]::pg_catalog.int4)',
                                    v_proc, mailbox._inbox_col(c, 'retry_count'), mailbox._inbox_col(c, 'received_at'))
             ELSE pg_catalog.format('%1$s IS NOT NULL AND %1$s < pg_catalog.now()'
                                    ' - pg_catalog.make_interval(hours => $2[1]::pg_catalog.int4)', v_proc) END),
        ARRAY[p_hours, p_batch]::bigint[])) AS x (id);
    IF pg_catalog.cardinality(v_ids) > 0 THEN
        DELETE FROM mailbox._inbox_lease AS l WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = ANY (v_ids);
    END IF;
    RETURN pg_catalog.cardinality(v_ids);
END
$$;

CREATE OR REPLACE FUNCTION mailbox._inbox_health_py(p_name text)
RETURNS jsonb
LANGUAGE plpython3u STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "0.2.0":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, inbox_health
return errors.envelope(plpy, inbox_health.inbox_health, p_name)
$$;

CREATE OR REPLACE FUNCTION mailbox.inbox_health(p_name text)
RETURNS jsonb
LANGUAGE sql STABLE
SECURITY DEFINER -- reads any inbox table (as its owner) and the extension catalogs for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._unwrap(mailbox._inbox_health_py(p_name));
$$;
COMMENT ON FUNCTION mailbox.inbox_health(text) IS
'counts and health (healthy, degraded, critical) of one inbox as jsonb (see docs/inbox.md)';

CREATE OR REPLACE FUNCTION mailbox.inbox_status(p_name text DEFAULT NULL)
RETURNS TABLE (
    inbox_name text, inbox_schema text, table_name text, max_retries int, pending_count bigint,
    dead_letter_count bigint, processed_count bigint, is_managed boolean, ordering boolean, priority boolean,
    created_at timestamptz
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads any inbox table (as its owner) and the catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
    v_table text;
    v_counts jsonb;
BEGIN
    IF p_name IS NOT NULL THEN
        PERFORM mailbox._inbox_get(p_name); -- 42704 for an unknown inbox
    END IF;
    FOR v_inbox IN
        SELECT * FROM mailbox._inbox AS i WHERE p_name IS NULL OR i.inbox_name = p_name ORDER BY i.inbox_name
    LOOP
        -- the inbox's own table (table_rel) under its current name: after a rename another
        -- table may carry the stored name (the per-message functions then refuse, 55000)
        v_table := NULL;
        SELECT c.relname, pg_catalog.format('%I.%I', n.nspname, c.relname) INTO table_name, v_table
          FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
         WHERE c.oid = v_inbox.table_rel;
        inbox_name := v_inbox.inbox_name;
        inbox_schema := v_inbox.schema_name;
        table_name := coalesce(table_name, v_inbox.table_name);
        max_retries := v_inbox.max_retries;
        is_managed := v_inbox.is_managed;
        ordering := v_inbox.ordering_first_sequence IS NOT NULL;
        priority := v_inbox.priority_tiers IS NOT NULL;
        created_at := v_inbox.created_at;
        pending_count := NULL;
        dead_letter_count := NULL;
        processed_count := NULL;
        IF v_table IS NOT NULL THEN -- NULL counts when the table was dropped by hand
            -- read with the table owner's rights; listing every inbox, one whose table (or
            -- generated function) fails is shown with NULL counts and a WARNING, not an error
            BEGIN
                v_counts := mailbox._inbox_counts(v_inbox, FALSE);
            EXCEPTION WHEN OTHERS THEN
                IF p_name IS NOT NULL THEN
                    RAISE;
                END IF;
                RAISE WARNING 'counting messages of inbox % failed: %', v_inbox.inbox_name, SQLERRM
                    USING HINT = pg_catalog.format('SELECT * FROM mailbox.inbox_status(%s) shows the error.',
                                                   pg_catalog.quote_literal(v_inbox.inbox_name));
                v_counts := NULL;
            END;
            pending_count := (v_counts ->> 'pending')::bigint;
            dead_letter_count := (v_counts ->> 'dead')::bigint;
            processed_count := (v_counts ->> 'processed')::bigint;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_status(text) IS
'every inbox (or one) with its table, settings and message counts';

-- sql/functions/39_authority.sql
-- Part 39: per-object authority (SPEC §0). The role-level grants (mailbox_producer,
-- mailbox_consumer) say which functions a role may call; these grants say which outboxes and
-- inboxes it may use them on. An object with no grant at all stays open to the role-level
-- grants, so outboxes and inboxes made before their first grant keep working unchanged.

-- 42501 unless the caller may use the object this way. Called by the public SECURITY DEFINER
-- functions right after they looked the object up; the common case (an object without
-- grants) costs one index probe.
CREATE OR REPLACE FUNCTION mailbox._authorize(p_kind text, p_key int, p_privilege text)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_caller name;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailbox._object_grant AS g
                    WHERE g.object_kind = p_kind AND g.object_key = p_key) THEN
        RETURN;
    END IF;
    v_caller := mailbox._caller();
    IF pg_catalog.pg_has_role(v_caller, 'mailbox_admin', 'MEMBER') THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._object_grant AS g
                WHERE g.object_kind = p_kind AND g.object_key = p_key AND g.privilege = p_privilege
                  AND pg_catalog.pg_has_role(v_caller, g.grantee::oid, 'MEMBER')) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'permission denied to % % %: %', p_privilege, p_kind,
                    mailbox._object_name(p_kind, p_key), v_caller
        USING ERRCODE = '42501',
              DETAIL = pg_catalog.format('This %s has per-object grants, and role %s holds no %s grant on it.',
                                         p_kind, v_caller, p_privilege),
              HINT = pg_catalog.format('A member of mailbox_admin can run mailbox.grant_%s(%s, %s, %s).',
                                       p_kind, pg_catalog.quote_literal(mailbox._object_name(p_kind, p_key)),
                                       pg_catalog.quote_literal(v_caller), pg_catalog.quote_literal(p_privilege));
END
$$;

CREATE OR REPLACE FUNCTION mailbox._object_name(p_kind text, p_key int)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT CASE p_kind
        WHEN 'outbox' THEN (SELECT o.outbox_name FROM mailbox._outbox AS o WHERE o.outbox_key = p_key)
        ELSE (SELECT i.inbox_name FROM mailbox._inbox AS i WHERE i.inbox_key = p_key)
    END;
$$;

-- Dropping an outbox or inbox forgets its grants, so a new object of the same name starts open.
CREATE OR REPLACE FUNCTION mailbox._forget_grants(p_kind text, p_key int)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    DELETE FROM mailbox._object_grant AS g WHERE g.object_kind = p_kind AND g.object_key = p_key;
$$;

-- grant_* and revoke_*: one place that checks the arguments and writes the catalog.
CREATE OR REPLACE FUNCTION mailbox._set_grant(p_kind text, p_name text, p_role regrole, p_privilege text, p_grant boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_allowed text[] := CASE p_kind WHEN 'outbox' THEN ARRAY['publish', 'consume']
                                    ELSE ARRAY['receive', 'process'] END;
    v_key int;
    v_inbox mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_role, 'p_role');
    IF p_role = 0 THEN
        RAISE EXCEPTION 'invalid role for a grant: %', pg_catalog.quote_literal(p_role::text)
            USING ERRCODE = '22023', HINT = 'p_role names an existing role (''-'' and 0 name none).';
    END IF;
    PERFORM mailbox._require(p_privilege, 'p_privilege');
    IF NOT p_privilege = ANY (v_allowed) THEN
        RAISE EXCEPTION 'invalid % privilege: %', p_kind, pg_catalog.quote_literal(p_privilege)
            USING ERRCODE = '22023',
                  HINT = pg_catalog.format('p_privilege is one of %s.', pg_catalog.array_to_string(v_allowed, ', '));
    END IF;
    IF p_kind = 'outbox' THEN
        v_key := mailbox._outbox_key(p_name);
    ELSE
        -- the DDL lock first, as every inbox DDL takes it: a first grant or a last revoke
        -- rebuilds the named routers below (part 35, named receive)
        PERFORM mailbox._ddl_lock();
        v_key := (mailbox._inbox_get(p_name)).inbox_key;
        -- the inbox's has_grants flag says whether it has grants (the data plane checks
        -- grants only then). Its row is locked first, so the grant changes of one inbox run
        -- one after another and the recount below, a later statement, sees every change
        -- committed before it (under REPEATABLE READ a concurrent change fails this lock
        -- with 40001 instead). A stale TRUE would only cost a probe; FALSE never is stale.
        SELECT i.* INTO v_inbox FROM mailbox._inbox AS i WHERE i.inbox_key = v_key FOR NO KEY UPDATE;
        -- a first grant of a managed inbox takes its named receive away: a transaction that
        -- already wrote the table (and so takes no new lock, which would make it read the
        -- new routers) ends first, and a later one waits for this one's commit
        IF p_grant AND NOT v_inbox.has_grants THEN
            PERFORM mailbox._inbox_quiesce(v_inbox);
        END IF;
    END IF;
    IF p_grant THEN
        INSERT INTO mailbox._object_grant (object_kind, object_key, grantee, privilege)
        VALUES (p_kind, v_key, p_role, p_privilege)
        ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM mailbox._object_grant AS g
         WHERE g.object_kind = p_kind AND g.object_key = v_key AND g.grantee = p_role AND g.privilege = p_privilege;
    END IF;
    IF p_kind = 'inbox' THEN
        UPDATE mailbox._inbox AS i
           SET has_grants = EXISTS (SELECT 1 FROM mailbox._object_grant AS g
                                     WHERE g.object_kind = 'inbox' AND g.object_key = v_key)
         WHERE i.inbox_key = v_key;
        PERFORM mailbox._inbox_build_routes(); -- only a changed router is replaced
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.grant_outbox(p_outbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('outbox', p_outbox, p_role, p_privilege, TRUE);
$$;
COMMENT ON FUNCTION mailbox.grant_outbox(text, regrole, text) IS
'let a role publish to (publish) or read through every group of (consume) one outbox; '
'once an outbox has a grant, only grantees and mailbox_admin may use it that way';

CREATE OR REPLACE FUNCTION mailbox.revoke_outbox(p_outbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('outbox', p_outbox, p_role, p_privilege, FALSE);
$$;
COMMENT ON FUNCTION mailbox.revoke_outbox(text, regrole, text) IS
'take back a grant_outbox; an outbox left without any grant is open to the role-level grants again';

CREATE OR REPLACE FUNCTION mailbox.grant_inbox(p_inbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('inbox', p_inbox, p_role, p_privilege, TRUE);
$$;
COMMENT ON FUNCTION mailbox.grant_inbox(text, regrole, text) IS
'let a role write (receive) or claim and mark (process) one inbox; '
'once an inbox has a grant, only grantees and mailbox_admin may use it that way';

CREATE OR REPLACE FUNCTION mailbox.revoke_inbox(p_inbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('inbox', p_inbox, p_role, p_privilege, FALSE);
$$;
COMMENT ON FUNCTION mailbox.revoke_inbox(text, regrole, text) IS
'take back a grant_inbox; an inbox left without any grant is open to the role-level grants again';

-- The grants as a view for mailbox_admin.
CREATE OR REPLACE VIEW mailbox.object_grants AS
SELECT
    g.object_kind,
    coalesce(o.outbox_name, i.inbox_name) AS object_name,
    g.grantee,
    g.privilege,
    g.granted_at
FROM mailbox._object_grant AS g
LEFT JOIN mailbox._outbox AS o ON g.object_kind = 'outbox' AND o.outbox_key = g.object_key
LEFT JOIN mailbox._inbox AS i ON g.object_kind = 'inbox' AND i.inbox_key = g.object_key;
COMMENT ON VIEW mailbox.object_grants IS 'pg_mailbox: per-outbox and per-inbox grants';

-- sql/functions/40_maintenance.sql
-- Part 40: run_maintenance() (SPEC §4), the control plane's scheduled job.

CREATE OR REPLACE FUNCTION mailbox._run_maintenance_py()
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "0.2.0":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, maintenance
return errors.envelope(plpy, maintenance.run)
$$;

CREATE OR REPLACE FUNCTION mailbox.run_maintenance()
RETURNS jsonb
LANGUAGE sql VOLATILE
SECURITY DEFINER -- drains and reaps in extension tables for mailbox_admin and pg_cron
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._unwrap(mailbox._run_maintenance_py());
$$;
COMMENT ON FUNCTION mailbox.run_maintenance() IS
'retention drains, lease expiry, consumer health and reaping, alerts; returns counts as jsonb';

-- TRUNCATE an outbox's tables when they hold no rows, without waiting for their lock (a
-- producer or reader holding it makes this fail at once with 55P03; maintenance retries on
-- its next run). The emptiness check repeats under the lock, so no committed row is lost.
CREATE OR REPLACE FUNCTION mailbox._truncate_outbox_if_empty(p_key int)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_name text := (SELECT o.outbox_name FROM mailbox._outbox AS o WHERE o.outbox_key = p_key);
BEGIN
    EXECUTE pg_catalog.format('LOCK TABLE mailbox.%I, mailbox.%I IN ACCESS EXCLUSIVE MODE NOWAIT',
                              mailbox._outbox_relname(v_name, 'log'), mailbox._outbox_relname(v_name, 'delta'));
    IF EXISTS (SELECT 1 FROM mailbox._outbox_log AS l WHERE l.outbox_key = p_key) THEN
        RETURN false;
    END IF;
    EXECUTE pg_catalog.format('TRUNCATE mailbox.%I, mailbox.%I',
                              mailbox._outbox_relname(v_name, 'delta'), mailbox._outbox_relname(v_name, 'log'));
    RETURN true;
END
$$;

-- sql/functions/41_outbox_retention.sql
-- Part 41: outbox retention, the statements maintenance (plpython outbox_maintenance.py)
-- orchestrates.

-- Drains outbox p_key's numbered rows up to offset p_limit, oldest chunk first, about p_budget
-- rows at most, and returns how many rows it deleted. A row goes when it is older than
-- p_retention_hours and, if it is a claim-check row, every group (or '' = all) recorded
-- reading it; p_force drains regardless of reads. A chunk goes once all its rows are gone,
-- and the low mark (every offset at or below it drained) follows the chunks, in order: it
-- stops at the first chunk that keeps a row.
--
-- Set-based: three statements however many chunks there are. Under load a chunk is what one
-- poll or numberer pass numbered, often a few dozen rows, so a statement per chunk (as this
-- was first written) drained a few thousand rows a second and fell behind producers: the
-- outbox grew without bound (the soak in bench/outbox_bench.py).
CREATE OR REPLACE FUNCTION mailbox._drain_outbox_rows(
    p_key int, p_limit bigint, p_retention_hours int, p_force boolean, p_budget bigint
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_last bigint;
    v_drained bigint;
    v_kept bigint;
    v_low bigint;
BEGIN
    -- the chunks in reach: wholly at or below the limit, oldest first, the first one always,
    -- then while the rows before them stay within the budget
    SELECT pg_catalog.max(e.base_offset) INTO v_last
      FROM (SELECT c.base_offset,
                   pg_catalog.sum(c.row_count) OVER (ORDER BY c.base_offset) - c.row_count AS before
              FROM mailbox._outbox_chunk AS c
             WHERE c.outbox_key = p_key AND c.base_offset + c.row_count <= p_limit) AS e
     WHERE e.before < p_budget;
    IF v_last IS NULL THEN
        RETURN 0;
    END IF;
    WITH ids AS (
        SELECT u.id FROM mailbox._outbox_chunk AS c CROSS JOIN LATERAL pg_catalog.unnest(c.ids) AS u (id)
         WHERE c.outbox_key = p_key AND c.base_offset <= v_last
    ), gone AS (
        DELETE FROM mailbox._outbox_log AS l
         USING ids
         WHERE l.outbox_key = p_key AND l._id = ids.id
           AND l.created_at < pg_catalog.now() - pg_catalog.make_interval(hours => p_retention_hours)
           AND (p_force OR NOT l.is_claim_check
                OR EXISTS (SELECT 1 FROM mailbox._claim_check_consumed AS cc
                            WHERE cc.outbox_key = p_key AND cc.row_key = l._id AND cc.group_name = '')
                OR (EXISTS (SELECT 1 FROM mailbox._consumer_group AS g WHERE g.outbox_key = p_key)
                    AND NOT EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                                     WHERE g.outbox_key = p_key
                                       AND NOT EXISTS (SELECT 1 FROM mailbox._claim_check_consumed AS cc
                                                        WHERE cc.outbox_key = p_key AND cc.row_key = l._id
                                                          AND cc.group_name = g.group_name))))
        RETURNING l._id
    ), forgotten AS (
        DELETE FROM mailbox._claim_check_consumed AS cc
         WHERE cc.outbox_key = p_key AND cc.row_key IN (SELECT gone._id FROM gone)
    )
    SELECT pg_catalog.count(*) INTO v_drained FROM gone;
    -- the first chunk in reach that keeps a row (too young, or a claim-check row not read)
    SELECT pg_catalog.min(c.base_offset) INTO v_kept
      FROM mailbox._outbox_chunk AS c
     WHERE c.outbox_key = p_key AND c.base_offset <= v_last
       AND EXISTS (SELECT 1 FROM pg_catalog.unnest(c.ids) AS u (id)
                    WHERE EXISTS (SELECT 1 FROM mailbox._outbox_log AS l
                                   WHERE l.outbox_key = p_key AND l._id = u.id));
    WITH dropped AS (
        DELETE FROM mailbox._outbox_chunk AS c
         WHERE c.outbox_key = p_key AND c.base_offset <= v_last
           AND (v_kept IS NULL OR c.base_offset < v_kept)
        RETURNING c.base_offset + c.row_count AS high
    )
    SELECT pg_catalog.max(d.high) INTO v_low FROM dropped AS d;
    IF v_low IS NOT NULL THEN
        UPDATE mailbox._outbox_retention SET low_offset = greatest(low_offset, v_low) WHERE outbox_key = p_key;
    END IF;
    RETURN v_drained;
END
$$;

-- sql/functions/42_outbox_maintenance_steps.sql
-- Part 42: the statements of the outbox's maintenance steps, one private function each.
-- mailbox_server/outbox_maintenance.py orchestrates them (order, budgets, alerts); every
-- statement lives here, where sqlfluff lints it and the API snapshot shows it.

-- Consumer rows are locked in (group, consumer) order, the order seek_offset and
-- drop_consumer_group use, so maintenance cannot deadlock with them.

-- Consumers whose heartbeat just passed the timeout: marked, returned once (one
-- consumer_unhealthy alert per healthy -> unhealthy transition).
CREATE OR REPLACE FUNCTION mailbox._mark_unhealthy_consumers(p_timeout_seconds int)
RETURNS TABLE (group_name text, consumer_id text, last_heartbeat_at text)
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._consumer AS c
       SET unhealthy_since = pg_catalog.now()
      FROM (SELECT x.group_name, x.consumer_id FROM mailbox._consumer AS x
             WHERE x.unhealthy_since IS NULL AND x.reaped_at IS NULL
               AND x.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(secs => p_timeout_seconds)
             ORDER BY x.group_name, x.consumer_id
               FOR NO KEY UPDATE) AS t
     WHERE c.group_name = t.group_name AND c.consumer_id = t.consumer_id
    RETURNING c.group_name, c.consumer_id, c.last_heartbeat_at::text;
$$;

-- Consumers silent past the dead threshold: marked reaped and returned (their leases are
-- released by _release_consumer_leases, one call each, so each alert carries its count).
CREATE OR REPLACE FUNCTION mailbox._reap_dead_consumers(p_dead_hours int)
RETURNS TABLE (group_name text, consumer_id text, last_heartbeat_at text)
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._consumer AS c
       SET reaped_at = pg_catalog.now()
      FROM (SELECT x.group_name, x.consumer_id FROM mailbox._consumer AS x
             WHERE x.reaped_at IS NULL
               AND x.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(hours => p_dead_hours)
             ORDER BY x.group_name, x.consumer_id
               FOR NO KEY UPDATE) AS t
     WHERE c.group_name = t.group_name AND c.consumer_id = t.consumer_id
    RETURNING c.group_name, c.consumer_id, c.last_heartbeat_at::text;
$$;

-- Expires a reaped consumer's live leases now; returns how many rows they covered.
CREATE OR REPLACE FUNCTION mailbox._release_consumer_leases(p_group text, p_consumer text)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH released AS (
        UPDATE mailbox._lease AS l SET lease_until = pg_catalog.now()
         WHERE l.group_name = p_group AND l.consumer_id = p_consumer AND l.lease_until > pg_catalog.now()
        RETURNING l.last_offset - l.first_offset + 1 AS n
    )
    SELECT coalesce(pg_catalog.sum(released.n), 0)::bigint FROM released;
$$;

-- Forgets consumers without commits (and silent) for p_days that hold no lease.
CREATE OR REPLACE FUNCTION mailbox._forget_stale_consumers(p_days int)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._consumer AS c
         WHERE coalesce(c.last_commit_at, c.registered_at)
               <= pg_catalog.now() - pg_catalog.make_interval(days => p_days)
           AND c.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(days => p_days)
           AND NOT EXISTS (SELECT 1 FROM mailbox._lease AS l
                            WHERE l.group_name = c.group_name AND l.consumer_id = c.consumer_id)
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

CREATE OR REPLACE FUNCTION mailbox._count_expired_leases()
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.count(*) FROM mailbox._lease AS l WHERE l.lease_until <= pg_catalog.now();
$$;

-- The lowest offset any group of the outbox still needs (NULL: no group). A partitioned
-- group stores its offset only now and then (part 27): it is computed.
CREATE OR REPLACE FUNCTION mailbox._outbox_min_group_offset(p_key int)
RETURNS bigint
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.min(CASE WHEN EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                                             WHERE pl.group_name = g.group_name)
                               THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
                               ELSE g.group_offset END)
      FROM mailbox._consumer_group AS g WHERE g.outbox_key = p_key;
$$;

-- After forced retention moved the low mark past a group, the group continues after the
-- drained rows: its leases below the mark go and its offsets move up to it.
CREATE OR REPLACE FUNCTION mailbox._catch_up_groups(p_key int)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH low AS (SELECT r.low_offset FROM mailbox._outbox_retention AS r WHERE r.outbox_key = p_key),
    trimmed AS (
        DELETE FROM mailbox._lease AS l USING mailbox._consumer_group AS g, low
         WHERE g.outbox_key = p_key AND l.group_name = g.group_name AND l.last_offset <= low.low_offset
    )
    UPDATE mailbox._consumer_group AS g
       SET delivered_offset = greatest(g.delivered_offset, low.low_offset),
           group_offset = greatest(g.group_offset, low.low_offset)
      FROM low
     WHERE g.outbox_key = p_key AND g.group_offset < low.low_offset;
$$;

CREATE OR REPLACE FUNCTION mailbox._record_drain(p_key int, p_count bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._outbox_retention
       SET last_drained_at = pg_catalog.now(), last_drained_count = p_count
     WHERE outbox_key = p_key;
$$;

-- An outbox's size and whether a storage alert is standing for it.
CREATE OR REPLACE FUNCTION mailbox._outbox_storage_state(p_key int, OUT total_bytes bigint, OUT alerted boolean)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailbox._outbox_bytes(o.outbox_name), coalesce(r.storage_alerted, false)
      FROM mailbox._outbox AS o
      LEFT JOIN mailbox._outbox_retention AS r ON r.outbox_key = o.outbox_key
     WHERE o.outbox_key = p_key;
$$;

CREATE OR REPLACE FUNCTION mailbox._set_storage_alerted(p_key int, p_alerted boolean)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE mailbox._outbox_retention SET storage_alerted = p_alerted WHERE outbox_key = p_key;
$$;

-- Outboxes that hold no rows but whose log still takes more than p_min_bytes on disk.
CREATE OR REPLACE FUNCTION mailbox._outboxes_to_truncate(p_min_bytes bigint)
RETURNS TABLE (outbox_key int, outbox_name text)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.outbox_key, o.outbox_name FROM mailbox._outbox AS o
     WHERE NOT EXISTS (SELECT 1 FROM mailbox._outbox_log AS l WHERE l.outbox_key = o.outbox_key)
       AND pg_catalog.pg_relation_size(pg_catalog.format(
               'mailbox.%I', mailbox._outbox_relname(o.outbox_name, 'log'))::regclass) > p_min_bytes
     ORDER BY o.outbox_key;
$$;

-- Every outbox with what retention needs of it, in key order.
CREATE OR REPLACE FUNCTION mailbox._outboxes_to_maintain()
RETURNS TABLE (outbox_key int, outbox_name text, retention_hours int)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT o.outbox_key, o.outbox_name, o.retention_hours FROM mailbox._outbox AS o ORDER BY o.outbox_key;
$$;

-- sql/functions/43_inbox_maintenance_steps.sql
-- Part 43: the statements of the inbox's maintenance steps, and the alert log's drain, one
-- private function each (as part 42 is for the outbox). mailbox_server/inbox_maintenance.py
-- and alerts.py orchestrate them: which inboxes, in which subtransaction, which alerts.

-- Deletes lease rows that no longer hold anything: expired, and no retry time pending.
CREATE OR REPLACE FUNCTION mailbox._expire_inbox_leases()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._inbox_lease AS l
         WHERE (l.lease_until IS NULL OR l.lease_until < pg_catalog.clock_timestamp())
           AND (l.next_attempt_at IS NULL OR l.next_attempt_at < pg_catalog.clock_timestamp())
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- Deletes open claims that outlived their transaction unsettled. Such a row can only exist
-- when its transaction committed without firing the settle trigger (a superuser session with
-- session_replication_role = replica, or the trigger disabled), or was restored with triggers
-- disabled. What it claimed has no lease and is claimable at once; every lookup asks for its
-- own transaction's rows (xact_id, part 30), so the row only takes space. It also carries a
-- transaction id that a restored cluster could hand out again. Every row this statement sees
-- is such a row, except the rows of the caller's own transaction, which it leaves alone:
-- another transaction's open claims are not committed, so they are invisible here.
CREATE OR REPLACE FUNCTION mailbox._forget_unsettled_inbox_claims()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._inbox_open_claim AS o
         WHERE o.xact_id IS DISTINCT FROM pg_catalog.pg_current_xact_id_if_assigned()
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- Rebuilds the routers (part 35, routes) when one of them is not what the catalog asks for:
-- after a restore, whose routers are the extension script's (every call takes the dynamic
-- path until then). Checked without a lock; rebuilt under the DDL lock, if it is free.
-- First regenerates the functions of an inbox whose generated functions' rights no longer fit
-- their owner (part 35, codegen, _inbox_fn_is_definer):
-- a dump restored by another superuser, who becomes the extension owner, brings back the old
-- owner's invoker functions, which then refuse every call (42501) until this runs. Every
-- restore also brings back managed inboxes' named receives made for the dumped tables' oids,
-- which the named routers skip until this regenerates them (part 35, named receive).
CREATE OR REPLACE FUNCTION mailbox._inbox_refresh_routes()
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_misfit mailbox._inbox[] := ARRAY(
        SELECT i FROM mailbox._inbox AS i
         WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = i.table_rel)
           AND (EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                         WHERE p.pronamespace = 'mailbox'::regnamespace
                           AND p.proname = ANY (mailbox._inbox_fn_names(i))
                           AND p.prosecdef <> mailbox._inbox_fn_is_definer(
                                   pg_catalog.regexp_replace(p.proname, '^_inbox_[0-9]+_', ''), p.proowner))
                -- a managed inbox's named receive made for another table oid (a restore)
                OR (i.is_managed AND NOT mailbox._inbox_named_current(i)))
         ORDER BY i.inbox_key);
    v_inbox mailbox._inbox;
    v_before jsonb;
BEGIN
    IF (pg_catalog.cardinality(v_misfit) = 0
        AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_route_states() AS r
                         WHERE r.wanted IS DISTINCT FROM r.body)
        -- (and who may execute the named receives and marks: part 35, named routes)
        AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_named_rights() AS r
                         WHERE r.armed IS DISTINCT FROM pg_catalog.has_function_privilege(r.role, r.fn, 'EXECUTE')))
       OR NOT mailbox._try_ddl_lock() THEN
        RETURN 0;
    END IF;
    IF pg_catalog.cardinality(v_misfit) = 0 THEN
        RETURN mailbox._inbox_build_routes();
    END IF;
    v_before := (SELECT pg_catalog.jsonb_object_agg(r.kind, r.body) FROM mailbox._inbox_route_states() AS r);
    FOREACH v_inbox IN ARRAY v_misfit LOOP
        BEGIN -- one inbox that cannot be regenerated leaves the others (and maintenance) alone
            -- a managed table some transaction writes now is left for the next pass, rather
            -- than waited for (it would hold up that inbox's receivers meanwhile, and could
            -- deadlock with a receiver that holds another inbox this pass locked)
            PERFORM mailbox._inbox_quiesce(v_inbox, p_nowait => TRUE);
            PERFORM mailbox._inbox_generate(v_inbox); -- (rebuilds the routers too)
        EXCEPTION
            WHEN lock_not_available THEN
                NULL;
            WHEN OTHERS THEN
                RAISE WARNING 'regenerating the functions of inbox % failed: %', v_inbox.inbox_name, SQLERRM;
        END;
    END LOOP;
    PERFORM mailbox._inbox_build_routes();
    -- the routers whose body changed
    RETURN (SELECT pg_catalog.count(*) FROM mailbox._inbox_route_states() AS r
             WHERE r.body IS DISTINCT FROM v_before ->> r.kind);
END
$$;

-- Forgets inbox workers' waits that expired (part 33, wake-ups): a worker that stopped
-- claiming, or one whose name changes with every restart.
CREATE OR REPLACE FUNCTION mailbox._forget_expired_inbox_waiters()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    -- (a row a worker's open transaction is rewriting is its own again: skipped, never waited for)
    WITH gone AS (
        DELETE FROM mailbox._inbox_waiter AS w
         WHERE w.ctid = ANY (ARRAY(SELECT x.ctid FROM mailbox._inbox_waiter AS x
                                    WHERE x.waiting_until <= pg_catalog.now() FOR UPDATE SKIP LOCKED))
           AND w.waiting_until <= pg_catalog.now()
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- Takes every dead letter not announced yet, oldest first (one maintenance pass consumes them
-- all and announces them, up to its cap, as alerts).
CREATE OR REPLACE FUNCTION mailbox._take_inbox_dlq_events()
RETURNS TABLE (event_no bigint, inbox_name text, event_id text, error text, retry_count int, dead_at text)
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (DELETE FROM mailbox._inbox_dlq_event RETURNING *)
    SELECT gone.event_no, i.inbox_name, gone.event_id, gone.error, gone.retry_count, gone.dead_at::text
      FROM gone JOIN mailbox._inbox AS i ON i.inbox_key = gone.inbox_key
     ORDER BY gone.event_no;
$$;

-- The gaps of an inbox already announced by an inbox_ordering_gap alert.
CREATE OR REPLACE FUNCTION mailbox._inbox_gaps_alerted(p_inbox_key int)
RETURNS TABLE (aggregate_id text, expected_seq bigint)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.aggregate_id, a.expected_seq FROM mailbox._inbox_gap_alert AS a WHERE a.inbox_key = p_inbox_key;
$$;

CREATE OR REPLACE FUNCTION mailbox._record_inbox_gap_alert(p_inbox_key int, p_aggregate_id text, p_expected_seq bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO mailbox._inbox_gap_alert (inbox_key, aggregate_id, expected_seq)
    VALUES (p_inbox_key, p_aggregate_id, p_expected_seq)
        ON CONFLICT DO NOTHING;
$$;

-- A gap that closed: the next time it opens it is announced again.
CREATE OR REPLACE FUNCTION mailbox._forget_inbox_gap_alert(p_inbox_key int, p_aggregate_id text, p_expected_seq bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM mailbox._inbox_gap_alert AS a
     WHERE a.inbox_key = p_inbox_key AND a.aggregate_id = p_aggregate_id AND a.expected_seq = p_expected_seq;
$$;

-- Retention of one inbox by key: processed rows (p_dead false) or dead letters (true) older
-- than p_hours, at most p_batch, deleted with the table owner's rights (part 38).
CREATE OR REPLACE FUNCTION mailbox._drain_inbox(p_inbox_key int, p_dead boolean, p_hours int, p_batch int)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailbox._inbox_drain(i, p_dead, p_hours, p_batch) FROM mailbox._inbox AS i WHERE i.inbox_key = p_inbox_key;
$$;

-- Every gap of an ordered inbox by key, as the jsonb array of mailbox._inbox_gap_list (part 34).
CREATE OR REPLACE FUNCTION mailbox._inbox_gaps(p_inbox_key int)
RETURNS jsonb
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailbox._inbox_gap_list(i) FROM mailbox._inbox AS i WHERE i.inbox_key = p_inbox_key;
$$;

-- Deletes alert_log rows older than mailbox.alert_retention_hours; returns how many.
CREATE OR REPLACE FUNCTION mailbox._drain_alert_log()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox.alert_log AS a
         WHERE a.created_at < pg_catalog.now()
               - pg_catalog.make_interval(hours => mailbox._setting_int('alert_retention_hours'))
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- sql/functions/44_schedules.sql
-- Part 44: pg_cron jobs. pg_mailbox schedules two kinds, one job per database each:
-- 'maintenance' (mailbox.run_maintenance() on the caller's schedule) and 'numberer'
-- (CALL mailbox.run_numberer(59) every minute, so the next run finds the lock free). A job
-- is named pg_mailbox_<kind>:<database> and replaced when scheduled again; without pg_cron
-- both calls are 55000 with a HINT naming the command that does the job instead.

CREATE OR REPLACE FUNCTION mailbox._cron_schedule(p_kind text, p_schedule text, p_command text, p_hint text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_job bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000', HINT = p_hint;
    END IF;
    EXECUTE 'SELECT cron.schedule_in_database($1, $2, $3, $4)'
       INTO v_job
      USING 'pg_mailbox_' || p_kind || ':' || pg_catalog.current_database(), p_schedule, p_command,
            pg_catalog.current_database();
    RETURN v_job;
END
$$;

CREATE OR REPLACE FUNCTION mailbox._cron_unschedule(p_kind text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_name text := 'pg_mailbox_' || p_kind || ':' || pg_catalog.current_database();
    v_done boolean := false;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000', HINT = 'Nothing is scheduled without pg_cron.';
    END IF;
    IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = v_name) THEN
        EXECUTE 'SELECT cron.unschedule($1)' INTO v_done USING v_name;
    END IF;
    RETURN v_done;
END
$$;

CREATE OR REPLACE FUNCTION mailbox.schedule_maintenance(p_schedule text DEFAULT '* * * * *')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- creates a pg_cron job that runs as the extension owner
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._require(p_schedule, 'p_schedule');
    RETURN mailbox._cron_schedule('maintenance', p_schedule, 'SELECT mailbox.run_maintenance()',
        'Install pg_cron (shared_preload_libraries and CREATE EXTENSION pg_cron), or run "pg-mailbox maintain" to call mailbox.run_maintenance() on an interval.');
END
$$;
COMMENT ON FUNCTION mailbox.schedule_maintenance(text) IS
'run mailbox.run_maintenance() on a cron schedule with pg_cron; returns the job id';

CREATE OR REPLACE FUNCTION mailbox.unschedule_maintenance()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- removes the pg_cron job made by schedule_maintenance
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    RETURN mailbox._cron_unschedule('maintenance');
END
$$;
COMMENT ON FUNCTION mailbox.unschedule_maintenance() IS
'remove the pg_cron job of mailbox.schedule_maintenance(); false when there was none';

CREATE OR REPLACE FUNCTION mailbox.schedule_numberer()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- creates a pg_cron job that runs as the extension owner
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    RETURN mailbox._cron_schedule('numberer', '* * * * *', 'CALL mailbox.run_numberer(59)',
        'Install pg_cron, or run "pg-mailbox numberer" (or a relay, which runs it too).');
END
$$;
COMMENT ON FUNCTION mailbox.schedule_numberer() IS
'run mailbox.run_numberer() continuously with pg_cron (a job every minute); returns the job id';

CREATE OR REPLACE FUNCTION mailbox.unschedule_numberer()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- removes the pg_cron job made by schedule_numberer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    RETURN mailbox._cron_unschedule('numberer');
END
$$;
COMMENT ON FUNCTION mailbox.unschedule_numberer() IS
'remove the pg_cron job of mailbox.schedule_numberer(); false when there was none';

-- sql/90_privileges.sql
-- Part 90: who may call what (SPEC §0), every grant of the extension's own objects in one
-- place (the per-object grants that inboxes and captured tables get at run time are made by
-- the functions that create them). Runs last so it covers every function above; below the
-- role sections, the grants of each part under its name.

-- (upgrade) REVOKE ALL ON ALL FUNCTIONS IN SCHEMA mailbox FROM PUBLIC; -- on the extension's members only
DO $revoke$
DECLARE
    v_object text;
BEGIN
    FOR v_object IN SELECT p.oid::regprocedure::text FROM pg_catalog.pg_proc AS p
        JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_proc'::regclass
         AND d.objid = p.oid AND d.deptype = 'e'
        JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'pg_mailbox'
       WHERE p.prokind IN ('f', 'p') ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', v_object);
    END LOOP;
END
$revoke$;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA mailbox FROM PUBLIC;
-- (upgrade) REVOKE ALL ON ALL TABLES IN SCHEMA mailbox FROM PUBLIC; -- on the extension's members only
DO $revoke$
DECLARE
    v_object text;
BEGIN
    FOR v_object IN SELECT c.oid::regclass::text FROM pg_catalog.pg_class AS c
        JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_class'::regclass
         AND d.objid = c.oid AND d.deptype = 'e'
        JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'pg_mailbox'
       WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %s FROM PUBLIC', v_object);
    END LOOP;
END
$revoke$;
-- (upgrade) REVOKE ALL ON ALL SEQUENCES IN SCHEMA mailbox FROM PUBLIC; -- on the extension's members only
DO $revoke$
DECLARE
    v_object text;
BEGIN
    FOR v_object IN SELECT c.oid::regclass::text FROM pg_catalog.pg_class AS c
        JOIN pg_catalog.pg_depend AS d ON d.classid = 'pg_catalog.pg_class'::regclass
         AND d.objid = c.oid AND d.deptype = 'e'
        JOIN pg_catalog.pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'pg_mailbox'
       WHERE c.relkind = 'S' ORDER BY 1
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON SEQUENCE %s FROM PUBLIC', v_object);
    END LOOP;
END
$revoke$;

-- mailbox_admin: lifecycle, status and maintenance (it is also a producer and a consumer)
GRANT EXECUTE ON FUNCTION
    mailbox.create_outbox(text, int, int, int),
    mailbox.alter_outbox_partitions(text, int),
    mailbox.enable_outbox(text, int, int, text, boolean, int),
    mailbox._check_partitions(int),
    mailbox._set_outbox_partitions(text, int),
    mailbox._enable_outbox(oid, int, int, text),
    mailbox.disable_outbox(text, boolean),
    mailbox.drop_outbox(text, boolean),
    mailbox.outbox_snapshot(text),
    mailbox.repair_outbox_capture(text),
    mailbox.grant_outbox(text, regrole, text),
    mailbox.revoke_outbox(text, regrole, text),
    mailbox.grant_inbox(text, regrole, text),
    mailbox.revoke_inbox(text, regrole, text),
    mailbox.outbox_status(text),
    mailbox.create_consumer_group(text, text, text),
    mailbox.drop_consumer_group(text, boolean)
TO mailbox_admin;
GRANT SELECT ON mailbox.outboxes, mailbox.alert_log, mailbox.object_grants TO mailbox_admin;

-- mailbox_producer: publishing
GRANT EXECUTE ON FUNCTION
    mailbox.outbox_publish(text, jsonb, jsonb, text, text),
    mailbox.outbox_publish_batch(text, jsonb[], jsonb, text, text)
TO mailbox_producer;

-- mailbox_consumer: reading
GRANT EXECUTE ON FUNCTION
    mailbox.outbox_delta_rows(text, bigint, int, int),
    mailbox.outbox_rows_consumed(text, bigint, text),
    mailbox.poll_outbox(text, text, int, int),
    mailbox.commit_offset(text, text, bigint),
    mailbox.extend_lease(text, text, int),
    mailbox.seek_offset(text, text, bigint),
    mailbox.consumer_heartbeat(text, text),
    mailbox.consumer_lag(text)
TO mailbox_consumer;
GRANT SELECT ON mailbox.consumer_status, mailbox.consumer_group_lag, mailbox.consumer_active_leases
TO mailbox_consumer;

-- 24_groups_numberer.sql: mailbox_admin runs the numberer (the relay and
-- "pg-mailbox numberer" connect as it)
GRANT EXECUTE ON PROCEDURE mailbox.run_numberer(int) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION
    mailbox._numberer_start(int),
    mailbox._numberer_beat(boolean),
    mailbox._numberer_pass(),
    mailbox._numberer_has_waiters()
TO mailbox_admin;

-- 27_groups_partition_commit.sql
GRANT SELECT ON mailbox.consumer_partition_lag, mailbox.outbox_parked TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox._readable_group_outboxes() TO mailbox_consumer;
-- the views of parts 23 and 27 compute partitioned groups' state with these
GRANT EXECUTE ON FUNCTION mailbox._partition_counts(text), mailbox._partitioned_group_offset(text, int)
    TO mailbox_consumer;

-- 28_groups_park.sql
GRANT EXECUTE ON FUNCTION
    mailbox.outbox_park(text, text, bigint, text),
    mailbox.outbox_unpark(text, bigint)
TO mailbox_consumer;

-- 32_inbox_api.sql
GRANT EXECUTE ON FUNCTION mailbox.create_inbox(text, text, int, text, boolean, boolean, int) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.enable_inbox_tracking(text, text, text, text, text, text, text, text, int, text, text)
TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.drop_inbox(text, boolean, boolean) TO mailbox_admin;

-- 33_inbox_messages.sql, 33_inbox_marks.sql
GRANT EXECUTE ON FUNCTION mailbox.inbox_receive(text, text, jsonb, text, text, text, bigint, jsonb, text, int)
TO mailbox_producer;
-- inbox_receive is inlined into its caller, who so calls these with its own rights (part 35,
-- named receive; the named receives themselves are granted with their router's arms)
GRANT EXECUTE ON FUNCTION mailbox._inbox_receive_full(text, text, jsonb, text, text, text, bigint, jsonb, text, int),
    mailbox._inbox_route_receive_named(text, text, jsonb, text, text, text, bigint, jsonb, text, int)
TO mailbox_producer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_claim(text, text, int, int) TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_processed(text, text) TO mailbox_consumer;
-- and inbox_mark_processed(text, text) is inlined the same way (the named marks: likewise)
GRANT EXECUTE ON FUNCTION mailbox._inbox_mark_processed_full(text, text),
    mailbox._inbox_route_processed_named(text, text)
TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_failed(text, text, text, int) TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.replay_inbox_messages(text, text[]) TO mailbox_admin;

-- 34_inbox_ordering.sql
GRANT EXECUTE ON FUNCTION mailbox.enable_inbox_ordering(text, text, text, bigint) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.disable_inbox_ordering(text, boolean) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.inbox_ordering_gaps(text) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.enable_inbox_priority(text, text, jsonb) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.disable_inbox_priority(text, boolean) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.inbox_is_my_partition(text, int, int) TO mailbox_consumer;

-- 37_inbox_batch_api.sql
GRANT EXECUTE ON FUNCTION mailbox.inbox_receive_batch(text, jsonb) TO mailbox_producer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_processed(text, text[]) TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_failed(text, text[], text, int) TO mailbox_consumer;

-- 38_inbox_status.sql
GRANT EXECUTE ON FUNCTION mailbox.inbox_health(text) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.inbox_status(text) TO mailbox_admin;

-- 40_maintenance.sql
GRANT EXECUTE ON FUNCTION mailbox.run_maintenance() TO mailbox_admin;
-- 44_schedules.sql
GRANT EXECUTE ON FUNCTION
    mailbox.schedule_maintenance(text),
    mailbox.unschedule_maintenance(),
    mailbox.schedule_numberer(),
    mailbox.unschedule_numberer()
TO mailbox_admin;

-- sql/upgrade/regenerate.sql
-- The end of every upgrade script (scripts/build-upgrade.py), after the functions and the
-- privileges: the code the old version generated per object is rebuilt by the new functions,
-- so an upgraded database runs the new code everywhere (docs/upgrading.md):
--   * a captured table's capture functions and triggers (part 14: _remove_capture, then
--     _install_capture for the table's current owner, as mailbox.repair_outbox_capture());
--   * an inbox's views, indexes and generated functions (part 34, _inbox_reconfigure: what a
--     settings change rebuilds), and its lease view (part 31, _inbox_create_lease_view).
--     Only the views pg_mailbox made are dropped and re-made: a view of the user's that
--     reads one of them makes the update fail (2BP01) and change nothing; drop it before,
--     re-create it after.
--
-- These objects are not extension members (pg_dump dumps them with the tables they belong
-- to), but PostgreSQL makes everything an extension script creates a member, and refuses
-- CREATE OR REPLACE of a non-member in one. So the old objects are dropped, not replaced,
-- and every object that became a member here is released again (ALTER EXTENSION DROP).
DO $regenerate$
DECLARE
    v_ext oid := (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox');
    v_members text[];
    v_key int;
    v_inbox mailbox._inbox;
    v_object record;
BEGIN
    PERFORM mailbox._ddl_lock();
    v_members := ARRAY(
        SELECT d.classid::text || '/' || d.objid::text FROM pg_catalog.pg_depend AS d
         WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = v_ext AND d.deptype = 'e'
    );
    FOR v_key IN
        SELECT o.outbox_key FROM mailbox._outbox AS o
         WHERE o.source_rel IS NOT NULL
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = o.source_rel)
         ORDER BY o.outbox_key
    LOOP
        PERFORM mailbox._remove_capture(v_key);
        PERFORM mailbox._install_capture(v_key);
    END LOOP;
    FOR v_inbox IN SELECT * FROM mailbox._inbox AS i ORDER BY i.inbox_key LOOP
        PERFORM mailbox._inbox_drop_functions(v_inbox);
        EXECUTE pg_catalog.format('DROP VIEW IF EXISTS mailbox.%I', '_inbox_' || v_inbox.inbox_key || '_lease');
        PERFORM mailbox._inbox_create_lease_view(v_inbox);
        PERFORM mailbox._inbox_reconfigure(v_inbox, v_inbox);
    END LOOP;
    FOR v_object IN
        SELECT o.type, o.identity
          FROM pg_catalog.pg_depend AS d,
               LATERAL pg_catalog.pg_identify_object(d.classid, d.objid, d.objsubid) AS o
         WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = v_ext AND d.deptype = 'e'
           AND NOT d.classid::text || '/' || d.objid::text = ANY (v_members)
         ORDER BY 1, 2
    LOOP
        -- identity is pg_identify_object's quoted, schema-qualified name of the object
        EXECUTE pg_catalog.format('ALTER EXTENSION pg_mailbox DROP %s %s', v_object.type, v_object.identity);
    END LOOP;
END
$regenerate$;

-- pg_init_privs: while an extension script runs, PostgreSQL records the whole ACL of every
-- object it GRANTs or REVOKEs on (members or not) as the extension's initial privileges, and
-- pg_dump dumps only the difference from those. The grants above (sql/90_privileges.sql, and
-- _install_capture's on the outbox partitions, the schema and the setting parsers for each
-- captured table's owner) would so record grants made at run time (to table owners and to
-- per-outbox and per-inbox roles) as the extension's own, and a dump would leave them out:
-- the restored capture functions could not run. So, as after a fresh install: the members'
-- and the schema's initial privileges keep only the extension owner's, PUBLIC's and the
-- mailbox_* roles' entries, and objects that are no extension's members have none.
DO $init_privs$
DECLARE
    v_ext oid := (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox');
    v_schema oid := (SELECT e.extnamespace FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox');
    v_own oid[] := ARRAY(
        SELECT r.oid FROM pg_catalog.pg_roles AS r
         WHERE r.rolname IN ('mailbox_admin', 'mailbox_producer', 'mailbox_consumer')
    ) || ARRAY[0::oid, (SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox')];
BEGIN
    UPDATE pg_catalog.pg_init_privs AS ip
       SET initprivs = ARRAY(
               SELECT a FROM pg_catalog.unnest(ip.initprivs) AS a
                WHERE (SELECT x.grantee FROM pg_catalog.aclexplode(ARRAY[a]) AS x LIMIT 1) = ANY (v_own)
           )
     WHERE ip.privtype = 'e'
       AND ((ip.classoid = 'pg_catalog.pg_namespace'::regclass AND ip.objoid = v_schema)
            OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                        WHERE d.classid = ip.classoid AND d.objid = ip.objoid AND d.deptype = 'e'
                          AND d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = v_ext));
    DELETE FROM pg_catalog.pg_init_privs AS ip
     WHERE ip.privtype = 'e'
       AND (ip.initprivs = '{}'::aclitem[]
            OR (NOT (ip.classoid = 'pg_catalog.pg_namespace'::regclass AND ip.objoid = v_schema)
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                                 WHERE d.classid = ip.classoid AND d.objid = ip.objoid AND d.deptype = 'e'
                                   AND d.refclassid = 'pg_catalog.pg_extension'::regclass)));
END
$init_privs$;
