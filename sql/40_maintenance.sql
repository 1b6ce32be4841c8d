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

GRANT EXECUTE ON FUNCTION mailbox.run_maintenance() TO mailbox_admin;
