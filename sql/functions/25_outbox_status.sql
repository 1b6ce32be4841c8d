-- Part 25: outbox status (after part 20, whose groups it reports).

CREATE FUNCTION mailbox._outbox_status_py(p_name text)
RETURNS jsonb
LANGUAGE plpython3u STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "@EXTVERSION@":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, outbox_status
return errors.envelope(plpy, outbox_status.outbox_status, p_name)
$$;

CREATE FUNCTION mailbox.outbox_status(p_name text)
RETURNS jsonb
LANGUAGE sql STABLE
SECURITY DEFINER -- reads extension catalogs and sizes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._unwrap(mailbox._outbox_status_py(p_name));
$$;
COMMENT ON FUNCTION mailbox.outbox_status(text) IS
'health and size of one outbox as jsonb (see docs/outbox.md)';

CREATE VIEW mailbox.outboxes AS
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
