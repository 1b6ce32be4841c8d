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
CREATE FUNCTION mailbox._capture_function_sql(p_key int, p_name text, p_threshold int)
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
