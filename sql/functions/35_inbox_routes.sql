-- Part 35 (routes): static dispatch from the public per-message functions to an inbox's
-- generated functions (issue 11).
--
-- The data plane used to reach the generated function of an inbox with
-- EXECUTE 'SELECT mailbox._inbox_<key>_<kind>(...)', which PostgreSQL parses and plans on
-- every call: about a quarter of what a single receive costs on the server, and more than
-- the lookup itself when a claim settles at commit. Instead, each kind the data plane calls
-- (receive, claim, processed, failed, receive_batch, processed_batch, processed_count,
-- unsettled; only the control plane's query stays dynamic) has a router, a one-expression SQL
-- function
--
--     SELECT CASE WHEN ($1).inbox_key OPERATOR(pg_catalog.=) 1 THEN mailbox._inbox_1_receive($1, ...)
--                 WHEN ...
--                 ELSE mailbox._inbox_dispatch_receive($1, ...) END
--
-- that the planner inlines into the caller's cached plan: one call per message, no parse, no
-- plan. The routers are a cache, never the only way through:
--   * every arm names a generated function that exists (pg_proc) for an inbox of the
--     catalog and is owned by the extension owner (every managed inbox's; an adopted table's
--     only if that superuser owns the table); any other inbox takes the ELSE arm, the old
--     dynamic call. An adopted table's owner owns its generated functions and may drop
--     them: an arm naming one would then fail every session's inlining of the router, so
--     every inbox's calls, not only that owner's (tests/inbox/test_inbox_codegen.py);
--   * they are rebuilt, under the DDL lock, whenever an inbox's generated functions are made
--     or dropped (create, adopt, reconfigure, drop, extension update), so other sessions'
--     cached plans are invalidated at that commit and re-inline the new body;
--   * they are extension members, so pg_dump does not dump them: a restored database starts
--     with the script's routers, ELSE only, and works at the dynamic call's speed until
--     mailbox.run_maintenance() (or the next inbox DDL) rebuilds them.
-- A router has no SET clause, because a function with one is never inlined. It needs none:
-- it is only ever called from the public functions, whose search_path is pinned, and its body
-- names nothing a search_path could redirect: schema-qualified functions with arguments of
-- their exact declared types, an OPERATOR(pg_catalog.=) between integers, integer literals
-- (tests/security, test_the_routers_name_nothing_a_search_path_could_redirect). Keys above
-- 8 arms are split in halves (nested CASE on OPERATOR(pg_catalog.<)), so a call tests about
-- log2(inboxes) + 8 keys, not every inbox.

-- The routed kinds with their generated functions' argument types (after the catalog row)
-- and result: the same as _inbox_generate writes (part 35, codegen).
CREATE FUNCTION mailbox._inbox_route_kinds()
RETURNS TABLE (kind text, args text, nargs int, returns text)
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES ('receive', 'text, jsonb, text, text, text, bigint, jsonb, text, int', 10, 'boolean'),
           ('claim', 'int, timestamptz, boolean', 4, 'mailbox._inbox_message[]'),
           ('processed', 'text', 2, 'mailbox._inbox_done'),
           ('failed', 'text, text', 3, 'mailbox._inbox_attempt'),
           ('receive_batch', 'jsonb', 2, 'boolean[]'),
           ('processed_batch', 'text[]', 2, 'mailbox._inbox_done[]'),
           ('processed_count', 'text[]', 2, 'bigint'),
           ('unsettled', 'text[]', 2, 'text[]');
$$;

-- The CASE of a router (the key routers here, the named ones in part 35, named receive):
-- arm i is taken when p_subject equals p_values[i] (SQL constants, sorted as p_split_suffix
-- makes OPERATOR(pg_catalog.<) compare them); anything else is p_else. Up to 8 arms one WHEN
-- each, more split in halves, so a call tests about log2(n) + 8 of them.
CREATE FUNCTION mailbox._inbox_case(
    p_subject text, p_values text[], p_arms text[], p_else text, p_split_suffix text DEFAULT ''
)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_n int := pg_catalog.cardinality(p_values);
    v_half int := v_n / 2;
BEGIN
    IF v_n <= 8 THEN
        RETURN pg_catalog.format('CASE%s ELSE %s END',
            (SELECT pg_catalog.string_agg(pg_catalog.format(' WHEN %s OPERATOR(pg_catalog.=) %s THEN %s',
                                                            p_subject, v, p_arms[o]), '' ORDER BY o)
               FROM pg_catalog.unnest(p_values) WITH ORDINALITY AS u (v, o)),
            p_else);
    END IF;
    RETURN pg_catalog.format('CASE WHEN %s OPERATOR(pg_catalog.<) %s%s THEN %s ELSE %s END',
        p_subject, p_values[v_half + 1], p_split_suffix,
        mailbox._inbox_case(p_subject, p_values[1:v_half], p_arms[1:v_half], p_else, p_split_suffix),
        mailbox._inbox_case(p_subject, p_values[v_half + 1:], p_arms[v_half + 1:], p_else, p_split_suffix));
END
$$;

-- The body of p_kind's router for the inboxes whose generated function exists now.
CREATE FUNCTION mailbox._inbox_route_sql(p_kind text, p_nargs int)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_params text := (SELECT pg_catalog.string_agg('$' || g, ', ' ORDER BY g)
                        FROM pg_catalog.generate_series(1, p_nargs) AS g);
    v_keys int[] := ARRAY(
        SELECT i.inbox_key FROM mailbox._inbox AS i
         WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                        WHERE p.pronamespace = 'mailbox'::regnamespace
                          AND p.proname = '_inbox_' || i.inbox_key || '_' || p_kind
                          AND p.proowner = mailbox._extension_owner())
         ORDER BY i.inbox_key);
BEGIN
    IF pg_catalog.cardinality(v_keys) = 0 THEN
        RETURN pg_catalog.format('SELECT mailbox.%I(%s)', '_inbox_dispatch_' || p_kind, v_params);
    END IF;
    RETURN 'SELECT ' || mailbox._inbox_case('($1).inbox_key', v_keys::text[],
        ARRAY(SELECT pg_catalog.format('mailbox.%I(%s)', '_inbox_' || k || '_' || p_kind, v_params)
                FROM pg_catalog.unnest(v_keys) WITH ORDINALITY AS u (k, o) ORDER BY o),
        pg_catalog.format('mailbox.%I(%s)', '_inbox_dispatch_' || p_kind, v_params));
END
$$;

-- The body p_kind's router has now.
CREATE FUNCTION mailbox._inbox_route_body(p_kind text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.prosrc FROM pg_catalog.pg_proc AS p
     WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname = '_inbox_route_' || p_kind;
$$;

-- Rebuilds the routers whose body is not what the catalog asks for now (callers hold the DDL
-- lock). Replacing a function invalidates every session's plans that inlined it, so an
-- unchanged router is left alone. Returns how many were rebuilt.
CREATE FUNCTION mailbox._inbox_build_routes()
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    r record;
    v_sql text;
    v_built int := 0;
BEGIN
    -- REPEATABLE READ or SERIALIZABLE: the routers would be built from this transaction's
    -- snapshot, which can predate an inbox change committed before this transaction got the
    -- DDL lock (a review found a first grant lost that way: the rebuilt named router kept the
    -- arm that skips the grant check). Locking the catalog rows fails with 40001 on any row
    -- changed or dropped since the snapshot. An inbox made since has no arm until the next
    -- rebuild; its calls take the full path meanwhile.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM FROM mailbox._inbox FOR SHARE;
    END IF;
    FOR r IN SELECT * FROM mailbox._inbox_route_kinds() LOOP
        v_sql := mailbox._inbox_route_sql(r.kind, r.nargs);
        IF v_sql IS DISTINCT FROM mailbox._inbox_route_body(r.kind) THEN
            EXECUTE pg_catalog.format('CREATE OR REPLACE FUNCTION mailbox.%I(mailbox._inbox, %s) RETURNS %s'
                                      ' LANGUAGE sql VOLATILE SECURITY INVOKER AS %L',
                                      '_inbox_route_' || r.kind, r.args, r.returns, v_sql);
            v_built := v_built + 1;
        END IF;
    END LOOP;
    RETURN v_built + mailbox._inbox_build_named_routes(); -- part 35, named receive
END
$$;

-- The routers as the extension script makes them: every inbox through the dynamic call,
-- until the first rebuild (the script's last step, and every inbox DDL).
CREATE FUNCTION mailbox._inbox_route_receive(mailbox._inbox, text, jsonb, text, text, text, bigint, jsonb, text, int)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_receive($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)$$;

CREATE FUNCTION mailbox._inbox_route_claim(mailbox._inbox, int, timestamptz, boolean)
RETURNS mailbox._inbox_message[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_claim($1, $2, $3, $4)$$;

CREATE FUNCTION mailbox._inbox_route_processed(mailbox._inbox, text)
RETURNS mailbox._inbox_done
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_processed($1, $2)$$;

CREATE FUNCTION mailbox._inbox_route_failed(mailbox._inbox, text, text)
RETURNS mailbox._inbox_attempt
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_failed($1, $2, $3)$$;

CREATE FUNCTION mailbox._inbox_route_receive_batch(mailbox._inbox, jsonb)
RETURNS boolean[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_receive_batch($1, $2)$$;

CREATE FUNCTION mailbox._inbox_route_processed_batch(mailbox._inbox, text[])
RETURNS mailbox._inbox_done[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_processed_batch($1, $2)$$;

CREATE FUNCTION mailbox._inbox_route_processed_count(mailbox._inbox, text[])
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_processed_count($1, $2)$$;

CREATE FUNCTION mailbox._inbox_route_unsettled(mailbox._inbox, text[])
RETURNS text[]
LANGUAGE sql VOLATILE SECURITY INVOKER
AS $$SELECT mailbox._inbox_dispatch_unsettled($1, $2)$$;
