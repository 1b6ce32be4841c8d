-- Part 35 (named routes, issue 11): the three routers by inbox name of part 35, named
-- receive (the named receive, the named mark and their version), their arms, their rebuild,
-- who may execute the named receives and marks they name, and every router's state for
-- maintenance.

-- The inboxes the named routers have an arm for, sorted by name in the "C" collation (the
-- routers split on it): managed, without grants, with a named receive and mark that the
-- extension owner owns and that were generated from the catalog row as it is now (the named
-- mark's router leaves out the ordered ones).
CREATE FUNCTION mailbox._inbox_named_arms()
RETURNS TABLE (inbox_name text, inbox_key int, version text, ordered boolean)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT i.inbox_name, i.inbox_key, mailbox._inbox_named_version(i), i.ordering_first_sequence IS NOT NULL
      FROM mailbox._inbox AS i
     WHERE i.is_managed AND NOT i.has_grants
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = i.table_rel)
       AND mailbox._inbox_named_current(i)
     ORDER BY i.inbox_name COLLATE "C";
$$;

-- The bodies of the three named routers for the inboxes that have an arm now:
-- receive_named(name, event_id, ...) calls the inbox's named receive, processed_named(name,
-- event_id) its named mark (not ordered inboxes'); named_version(name) is what those functions
-- were generated from.
CREATE FUNCTION mailbox._inbox_route_named_sql(p_kind text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_names text[];
    v_keys text[];
    v_versions text[];
BEGIN
    SELECT pg_catalog.array_agg(a.inbox_name ORDER BY a.inbox_name COLLATE "C"),
           pg_catalog.array_agg(a.inbox_key::text ORDER BY a.inbox_name COLLATE "C"),
           pg_catalog.array_agg(pg_catalog.quote_literal(a.version) || '::pg_catalog.text' ORDER BY a.inbox_name COLLATE "C")
      INTO v_names, v_keys, v_versions
      FROM mailbox._inbox_named_arms() AS a
     WHERE p_kind <> 'processed_named' OR NOT a.ordered; -- (an ordered inbox's mark: the full path)
    IF v_names IS NULL THEN
        RETURN CASE WHEN p_kind = 'named_version' THEN 'SELECT NULL::pg_catalog.text' ELSE 'SELECT NULL::pg_catalog.bool' END;
    END IF;
    -- arms by name, split in the "C" collation the names are sorted in (part 35, routes)
    RETURN 'SELECT ' || mailbox._inbox_case('$1',
        ARRAY(SELECT pg_catalog.quote_literal(n) || '::pg_catalog.text' FROM pg_catalog.unnest(v_names) WITH ORDINALITY AS u (n, o) ORDER BY o),
        CASE p_kind
            WHEN 'receive_named' THEN ARRAY(
                SELECT 'mailbox._inbox_' || k || '_receive_named(NULL::mailbox._inbox, $2, $3, $4, $5, $6, $7, $8, $9, $10)'
                  FROM pg_catalog.unnest(v_keys) WITH ORDINALITY AS u (k, o) ORDER BY o)
            WHEN 'processed_named' THEN ARRAY(
                SELECT 'mailbox._inbox_' || k || '_processed_named(NULL::mailbox._inbox, $2)'
                  FROM pg_catalog.unnest(v_keys) WITH ORDINALITY AS u (k, o) ORDER BY o)
            ELSE v_versions END,
        CASE WHEN p_kind = 'named_version' THEN 'NULL::pg_catalog.text' ELSE 'NULL::pg_catalog.bool' END,
        ' COLLATE pg_catalog."C"');
END
$$;

-- Who may execute each named receive and mark: inbox_receive and inbox_mark_processed(text,
-- text) are inlined into their caller's statement, so the caller calls the routers and the
-- functions they name with its own rights. mailbox_producer may execute a named receive, and
-- mailbox_consumer a named mark, exactly while its router has the arm (a managed inbox
-- without grants of its own; for the mark, not ordered): armed. A first grant revokes it in
-- the transaction that takes the arm away (_inbox_build_named_routes); the version check
-- after the write stays behind it. Maintenance repairs a right changed by hand (part 43).
CREATE FUNCTION mailbox._inbox_named_rights()
RETURNS TABLE (fn regprocedure, role text, armed boolean)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH arms AS (SELECT a.inbox_key, a.ordered FROM mailbox._inbox_named_arms() AS a)
    SELECT p.oid::pg_catalog.regprocedure,
           CASE WHEN p.proname LIKE '%\_receive\_named' THEN 'mailbox_producer' ELSE 'mailbox_consumer' END,
           p.proname IN (SELECT '_inbox_' || a.inbox_key || '_receive_named' FROM arms AS a
                         UNION ALL
                         SELECT '_inbox_' || a.inbox_key || '_processed_named' FROM arms AS a WHERE NOT a.ordered)
      FROM pg_catalog.pg_proc AS p
     WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname ~ '^_inbox_[0-9]+_(receive|processed)_named$';
$$;

-- The three named routers: kind (as _inbox_route_named_sql and _inbox_route_body name it), the
-- function, its arguments, its result and its volatility.
CREATE FUNCTION mailbox._inbox_named_route_kinds()
RETURNS TABLE (kind text, fn text, args text, returns text, volatility text)
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES ('receive_named', '_inbox_route_receive_named', 'text, text, jsonb, text, text, text, bigint, jsonb, text, int',
            'boolean', 'VOLATILE'),
           ('processed_named', '_inbox_route_processed_named', 'text, text', 'boolean', 'VOLATILE'),
           ('named_version', '_inbox_route_named_version', 'text', 'text', 'STABLE');
$$;

-- Rebuilds the named routers whose body is not what the catalog asks for now (callers hold
-- the DDL lock; _inbox_build_routes calls it). Returns how many were rebuilt.
CREATE FUNCTION mailbox._inbox_build_named_routes()
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_sql text;
    v_built int := 0;
    v_fn regprocedure;
    v_role text;
    v_arm boolean;
    v_router record;
BEGIN
    FOR v_router IN SELECT * FROM mailbox._inbox_named_route_kinds() LOOP
        v_sql := mailbox._inbox_route_named_sql(v_router.kind);
        IF v_sql IS DISTINCT FROM mailbox._inbox_route_body(v_router.kind) THEN
            EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION mailbox.%I(%s) RETURNS %s LANGUAGE sql %s'
                                      ' SECURITY INVOKER AS %L', v_router.fn, v_router.args, v_router.returns,
                                      v_router.volatility, v_sql);
            v_built := v_built + 1;
        END IF;
    END LOOP;
    -- who may execute the named receives and marks (_inbox_named_rights): only a change is
    -- written (each one invalidates the plans that name the function)
    FOR v_fn, v_role, v_arm IN
        SELECT r.fn, r.role, r.armed FROM mailbox._inbox_named_rights() AS r
         WHERE r.armed IS DISTINCT FROM pg_catalog.has_function_privilege(r.role, r.fn, 'EXECUTE')
    LOOP
        EXECUTE pg_catalog.format(CASE WHEN v_arm THEN 'GRANT EXECUTE ON FUNCTION %s TO %I'
                                       ELSE 'REVOKE EXECUTE ON FUNCTION %s FROM %I' END, v_fn, v_role);
    END LOOP;
    RETURN v_built;
END
$$;

-- The named routers as the extension script makes them: no arm, every inbox through the full
-- path, until the first rebuild (the script's last step, and every inbox DDL).
CREATE FUNCTION mailbox._inbox_route_receive_named(text, text, jsonb, text, text, text, bigint, jsonb, text, int)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT NULL::pg_catalog.bool$$;

CREATE FUNCTION mailbox._inbox_route_processed_named(text, text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT NULL::pg_catalog.bool$$;

CREATE FUNCTION mailbox._inbox_route_named_version(text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
AS $$SELECT NULL::pg_catalog.text$$;

-- Every router (the key routers of part 35, routes, and the three above) with the body it has
-- and the body the catalog asks for now: maintenance rebuilds them when one differs.
CREATE FUNCTION mailbox._inbox_route_states()
RETURNS TABLE (kind text, body text, wanted text)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT k.kind, mailbox._inbox_route_body(k.kind), mailbox._inbox_route_sql(k.kind, k.nargs)
      FROM mailbox._inbox_route_kinds() AS k
    UNION ALL
    SELECT n.kind, mailbox._inbox_route_body(n.kind), mailbox._inbox_route_named_sql(n.kind)
      FROM mailbox._inbox_named_route_kinds() AS n;
$$;
