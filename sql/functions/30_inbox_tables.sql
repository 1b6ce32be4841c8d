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
CREATE FUNCTION mailbox._inbox_get(p_inbox text)
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
CREATE FUNCTION mailbox._inbox_owner(p_inbox mailbox._inbox)
RETURNS name
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class AS c WHERE c.oid = p_inbox.table_rel;
$$;

-- The inbox's own table (table_rel) under its current name, quoted; NULL when it was dropped.
-- The control plane reads a renamed inbox's table by this name, never by the stored one.
CREATE FUNCTION mailbox._inbox_current_table(p_inbox mailbox._inbox)
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
CREATE FUNCTION mailbox._inbox_table_moved(p_inbox mailbox._inbox)
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
CREATE FUNCTION mailbox._inbox_check_table(p_inbox mailbox._inbox)
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
CREATE FUNCTION mailbox._inbox_col(p_columns jsonb, p_role text, p_alias text DEFAULT 't')
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_columns ->> p_role IS NOT NULL
                THEN pg_catalog.format('%I.%I', p_alias, p_columns ->> p_role) END;
$$;

-- The inbox table as written into SQL (generated code, views, control-plane queries): schema.table, quoted.
CREATE FUNCTION mailbox._inbox_table_sql(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('%I.%I', p_inbox.schema_name, p_inbox.table_name);
$$;

-- A select-list item for a role: the mapped column cast to the API type, or a typed NULL.
-- p_type is one of the fixed API types written in this file's callers, never caller text.
CREATE FUNCTION mailbox._inbox_item(p_columns jsonb, p_role text, p_type text, p_alias text DEFAULT 't')
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('CAST(%s AS %s)',
                             coalesce(mailbox._inbox_col(p_columns, p_role, p_alias), 'NULL'), p_type);
$$;

-- A bind parameter for a role's value: $n, or CAST($n AS <column type>) when the column does
-- not take text by assignment (see casts above).
CREATE FUNCTION mailbox._inbox_param(p_inbox mailbox._inbox, p_role text, p_n int, p_array boolean DEFAULT FALSE)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.casts ? p_role
                THEN pg_catalog.format('CAST($%s AS %s%s)', p_n, p_inbox.casts ->> p_role,
                                       CASE WHEN p_array THEN '[]' ELSE '' END)
                ELSE '$' || p_n END;
$$;
