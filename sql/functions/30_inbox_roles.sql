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
CREATE FUNCTION mailbox._inbox_roles()
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
CREATE FUNCTION mailbox._inbox_receive_roles()
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
CREATE FUNCTION mailbox._inbox_batch_columns()
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
CREATE FUNCTION mailbox._inbox_managed_columns()
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
CREATE FUNCTION mailbox._inbox_role_column(
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
CREATE FUNCTION mailbox._inbox_check_distinct_columns(p_columns jsonb)
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
CREATE FUNCTION mailbox._inbox_resolve_columns(p_rel oid, p_requested jsonb)
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
