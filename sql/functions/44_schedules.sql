-- Part 44: pg_cron jobs. pg_mailbox schedules two kinds, one job per database each:
-- 'maintenance' (mailbox.run_maintenance() on the caller's schedule) and 'numberer'
-- (CALL mailbox.run_numberer(59) every minute, so the next run finds the lock free). A job
-- is named pg_mailbox_<kind>:<database> and replaced when scheduled again; without pg_cron
-- both calls are 55000 with a HINT naming the command that does the job instead.

CREATE FUNCTION mailbox._cron_schedule(p_kind text, p_schedule text, p_command text, p_hint text)
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

CREATE FUNCTION mailbox._cron_unschedule(p_kind text)
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

CREATE FUNCTION mailbox.schedule_maintenance(p_schedule text DEFAULT '* * * * *')
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

CREATE FUNCTION mailbox.unschedule_maintenance()
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

CREATE FUNCTION mailbox.schedule_numberer()
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

CREATE FUNCTION mailbox.unschedule_numberer()
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
