-- Part 04: the settings registry. Every mailbox.* GUC is one row of mailbox._settings():
-- its name, kind, default, bounds, area and meaning. The SQL readers below, the server-side
-- Python (mailbox_server/settings.py) and docs/configuration.md (which
-- tests/maintenance/test_settings.py checks lists exactly these rows) all take them from
-- here; no call site repeats a default or a bound.
--
-- Settings are custom GUCs: an unset GUC means the default; a value that does not parse or
-- is out of range is an error naming the GUC (22023), never a silent default.

CREATE FUNCTION mailbox._settings()
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
CREATE FUNCTION mailbox._setting_missing(p_name text, p_kind text)
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
CREATE FUNCTION mailbox._setting_int(p_name text)
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

CREATE FUNCTION mailbox._setting_bool(p_name text)
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
CREATE FUNCTION mailbox._setting_default(p_name text)
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
