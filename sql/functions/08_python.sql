-- Part 08: how PL/Python finds the mailbox_server package.
--
-- `make install` copies plpython/mailbox_server to
-- $SHAREDIR/extension/pg_mailbox/python/<version>/. Every PL/Python function starts with
--     if GD.get("mailbox.version") != "<version>": plpy.execute("SELECT mailbox._python_load()")
-- with <version> baked into its body by this script. After ALTER EXTENSION UPDATE the new
-- bodies carry the new version, so a pooled session that imported the old package reloads
-- the new one on its next call instead of running stale code (see docs/design.md).

CREATE FUNCTION mailbox._python_load()
RETURNS text
LANGUAGE plpython3u VOLATILE SECURITY DEFINER
-- definer: reading pg_config (SHAREDIR) is reserved to superusers
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
import sys

version = "@EXTVERSION@"
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
CREATE FUNCTION mailbox._unwrap(p_envelope jsonb)
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
