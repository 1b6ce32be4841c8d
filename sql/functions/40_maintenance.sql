-- Part 40: run_maintenance() (SPEC §4), the control plane's scheduled job.

CREATE FUNCTION mailbox._run_maintenance_py()
RETURNS jsonb
LANGUAGE plpython3u VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "@EXTVERSION@":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, maintenance
return errors.envelope(plpy, maintenance.run)
$$;

CREATE FUNCTION mailbox.run_maintenance()
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
CREATE FUNCTION mailbox._truncate_outbox_if_empty(p_key int)
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

CREATE FUNCTION mailbox.schedule_maintenance(p_schedule text DEFAULT '* * * * *')
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- creates a pg_cron job that runs as the extension owner
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_job bigint;
BEGIN
    PERFORM mailbox._require(p_schedule, 'p_schedule');
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000',
                  HINT = 'Install pg_cron (shared_preload_libraries and CREATE EXTENSION pg_cron), or run "pg-mailbox maintain" to call mailbox.run_maintenance() on an interval.';
    END IF;
    -- one job per database, replaced when scheduled again
    EXECUTE 'SELECT cron.schedule_in_database($1, $2, $3, $4)'
       INTO v_job
      USING 'pg_mailbox_maintenance:' || pg_catalog.current_database(), p_schedule,
            'SELECT mailbox.run_maintenance()', pg_catalog.current_database();
    RETURN v_job;
END
$$;
COMMENT ON FUNCTION mailbox.schedule_maintenance(text) IS
'run mailbox.run_maintenance() on a cron schedule with pg_cron; returns the job id';

CREATE FUNCTION mailbox.unschedule_maintenance()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- removes the pg_cron job made by schedule_maintenance
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_done boolean := false;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000', HINT = 'Nothing is scheduled without pg_cron.';
    END IF;
    IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'pg_mailbox_maintenance:' || pg_catalog.current_database()) THEN
        EXECUTE 'SELECT cron.unschedule($1)' INTO v_done
          USING 'pg_mailbox_maintenance:' || pg_catalog.current_database();
    END IF;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION mailbox.unschedule_maintenance() IS
'remove the pg_cron job of mailbox.schedule_maintenance(); false when there was none';
