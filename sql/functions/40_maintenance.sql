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
