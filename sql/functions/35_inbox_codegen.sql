-- Part 35: per-inbox functions, the only code that reads or writes an inbox table.
--
-- An inbox's table and columns are known only from its catalog row, so a generic function
-- must build its SQL at run time, and PostgreSQL parses and plans dynamic SQL on every call.
-- Instead, whenever an inbox is created, adopted or reconfigured (ordering, priority), the
-- functions below are (re)generated for it: mailbox._inbox_<key>_receive, _claim,
-- _processed and _failed hold STATIC SQL with the inbox's identifiers written in through
-- format('%I') (values stay parameters), so PL/pgSQL caches their plans per session. The
-- public functions check their arguments and dispatch through a router inlined into their
-- cached plans (part 35, routes), or for an inbox without an arm there, with one trivial
-- dynamic call (SELECT mailbox._inbox_<key>_<kind>($1, ...), part 35, dispatch). The control
-- plane (replay, drains, counts, gaps, ordering seed) builds its SQL from the catalog as
-- before and runs it through the fifth, mailbox._inbox_<key>_query.
--
-- Whose rights (docs/security.md, "Inbox tables"): a table runs its owner's code
-- (triggers, defaults, check constraints, index expressions, domain checks, casts, RLS
-- policies) with the rights of whoever touches it. The public inbox functions are SECURITY
-- DEFINER (the extension owner, a superuser), so they never touch an inbox table themselves:
-- the generated functions run as THE TABLE'S OWNER, who owns them (SECURITY DEFINER, or see
-- below for the extension owner's own), hold
-- only this file's fixed SQL, take values as parameters and touch nothing but that table and
-- three per-inbox views of the inbox's own lease, ordering and settings rows (part 31).
-- Leases, ordering state and the catalog are written only by extension-owned code, from
-- values the generated functions return; those values are data the table owner could have
-- chosen, so they are only ever bind parameters, and only for that inbox's own key.
-- For a managed inbox (create_inbox) the table's owner is the extension owner; the public
-- functions already run as that owner, so its generated functions are SECURITY INVOKER
-- with no SET clause (each SET costs a GUC save and restore per call): they run with the
-- pinned search_path of the public function that called them, and their owner check (below)
-- refuses any other caller, since nobody else may execute them.
--
-- The table owner may ALTER its functions (SECURITY INVOKER, SET search_path, ...) though
-- it cannot replace their bodies (that needs CREATE on schema mailbox). A function made
-- SECURITY INVOKER would run our SQL, and so the table's code, as the extension owner: so
-- every body starts by checking that it runs as the table owner (CURRENT_USER, an explicit
-- pg_catalog operator and pg_catalog types, so no search_path it was given is consulted
-- first) and raises 42501 otherwise. Every declared variable has a pg_catalog type for the
-- same reason (PL/pgSQL checks a domain's constraints when it initialises a variable).
--
-- A session picks up regenerated functions when it next processes catalog invalidations: at
-- its next transaction, or when it next takes a lock it does not hold. A transaction that
-- already called an inbox's functions may so keep running their old bodies after
-- enable/disable_inbox_ordering or _priority committed, while its public functions read the
-- new catalog row: an unordered receive into an ordered inbox would store a message no
-- ordered claim ever takes. So every body that depends on the configuration (receive, claim,
-- processed and the batch forms) first compares what it was generated for (ordering on or
-- off, the column mapping, which enabling ordering or priority may change; the claim also
-- priority on or off) with the catalog row it is passed, and raises 40001 (retry the
-- transaction) when they differ. failed and unsettled read only columns no setting remaps,
-- so a commit that settles a claim never fails for it; the control plane's query takes SQL
-- built from that row.
--
-- Generated functions:
--   * take the inbox's catalog row as their first argument; besides carrying max_retries and
--     the name, that argument type makes them depend on the extension, so
--     DROP EXTENSION pg_mailbox CASCADE drops them like the inbox views;
--   * have unnamed parameters ($n) and #variable_conflict use_column, so no column name of an
--     inbox table can ever be taken for a variable;
--   * are executable by nobody but their owner (the extension owner is a superuser), but a
--     managed inbox's named receive and named mark, which mailbox_producer and
--     mailbox_consumer may execute while their routers have its arm (part 35, named receive);
--   * are dropped by drop_inbox.

-- The names of an inbox's generated functions (_inbox_define builds the same names).
CREATE FUNCTION mailbox._inbox_fn_names(p_inbox mailbox._inbox)
RETURNS text[]
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY(SELECT '_inbox_' || p_inbox.inbox_key || '_' || kind
                   FROM pg_catalog.unnest(ARRAY['receive', 'claim', 'processed', 'failed', 'query', 'receive_batch',
                                                      'processed_batch', 'processed_count', 'unsettled',
                                                      'receive_named', 'processed_named']) AS kind);
$$;

CREATE FUNCTION mailbox._inbox_drop_functions(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_fn regprocedure;
BEGIN
    -- (drop_inbox, the only caller, has waited for the table's writers already: part 35,
    -- named receive)
    FOR v_fn IN
        SELECT p.oid FROM pg_catalog.pg_proc AS p
         WHERE p.pronamespace = 'mailbox'::regnamespace AND p.proname = ANY (mailbox._inbox_fn_names(p_inbox))
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', v_fn);
    END LOOP;
    PERFORM mailbox._inbox_build_routes(); -- no route may name a dropped function (part 35, routes)
END
$$;

-- Whether a generated function of kind p_kind owned by p_owner is SECURITY DEFINER with a
-- pinned search_path: every one an owner other than the extension owner owns, and a managed
-- inbox's named receive and named mark, which the callers of the inlined inbox_receive and
-- inbox_mark_processed call themselves (part 35, named receive). _inbox_define makes them so;
-- maintenance regenerates an inbox whose functions differ (part 43).
CREATE FUNCTION mailbox._inbox_fn_is_definer(p_kind text, p_owner oid)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_owner <> mailbox._extension_owner() OR p_kind IN ('receive_named', 'processed_named');
$$;

-- Creates (or replaces) one generated function, owned by the table's owner. p_args,
-- p_returns, p_declare and p_set are fixed text written in _inbox_generate; p_body is built
-- there from the catalog through format('%I'). The owner check comes first (see above).
CREATE FUNCTION mailbox._inbox_define(
    p_inbox mailbox._inbox, p_kind text, p_args text, p_returns text, p_declare text, p_body text,
    p_set text DEFAULT ''
)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_owner name := mailbox._inbox_owner(p_inbox);
    v_sig text := pg_catalog.format('mailbox.%I(mailbox._inbox, %s)',
                                    '_inbox_' || p_inbox.inbox_key || '_' || p_kind, p_args);
BEGIN
    -- the extension owner's functions (every managed inbox's) are reached only from the
    -- pinned, SECURITY DEFINER public functions, which already run as that owner: no switch
    -- of user and search_path of their own, which costs each call a GUC save and restore
    -- (see above, "Whose rights")
    EXECUTE pg_catalog.format(
        'CREATE OR REPLACE FUNCTION %s RETURNS %s LANGUAGE plpgsql VOLATILE %s AS %s',
        v_sig, p_returns,
        -- (but a named receive or mark: _inbox_fn_is_definer)
        CASE WHEN NOT mailbox._inbox_fn_is_definer(p_kind, (SELECT r.oid FROM pg_catalog.pg_roles AS r
                                                                WHERE r.rolname = v_owner))
             THEN 'SECURITY INVOKER'
             ELSE 'SECURITY DEFINER SET search_path = pg_catalog, mailbox, pg_temp' || p_set END,
        pg_catalog.quote_literal(pg_catalog.format($b$
#variable_conflict use_column
DECLARE%1$s
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) %2$s::pg_catalog.name THEN
        RAISE EXCEPTION 'inbox function %% must run as %%', %3$s, %2$s::pg_catalog.name
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('It runs as %%s: it was not called by pg_mailbox, or its owner or SECURITY DEFINER property was changed.',
                                             CURRENT_USER),
                  HINT = 'Drop the inbox with mailbox.drop_inbox() and make it again.';
    END IF;%5$s%4$s
END$b$, p_declare, pg_catalog.quote_literal(v_owner),
            pg_catalog.quote_literal(pg_catalog.format('%s of inbox %s', p_kind, p_inbox.inbox_name)), p_body,
            CASE WHEN p_kind IN ('receive', 'receive_batch', 'claim', 'processed', 'processed_batch',
                                'processed_count')
                 THEN pg_catalog.format($c$
    IF (($1).ordering_first_sequence IS NULL) OPERATOR(pg_catalog.<>) %s%s
       OR ($1).columns OPERATOR(pg_catalog.<>) %s::pg_catalog.jsonb THEN
        RAISE EXCEPTION 'inbox %% changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This session still runs the inbox functions of the configuration it first saw.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;$c$, CASE WHEN p_inbox.ordering_first_sequence IS NULL THEN 'TRUE' ELSE 'FALSE' END,
                CASE WHEN p_kind = 'claim' THEN pg_catalog.format(
                    '
       OR (($1).priority_tiers IS NULL) OPERATOR(pg_catalog.<>) %s',
                    CASE WHEN p_inbox.priority_tiers IS NULL THEN 'TRUE' ELSE 'FALSE' END) ELSE '' END,
                pg_catalog.quote_literal(p_inbox.columns::text)) ELSE '' END)));
    EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', v_sig, v_owner);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_sig);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s IS %s', v_sig, pg_catalog.quote_literal(
        pg_catalog.format('pg_mailbox: %s of inbox %s, generated from its catalog row; runs as the table owner',
                          p_kind, p_inbox.inbox_name)));
END
$$;

-- Runs control-plane SQL built from the catalog (never from a generated function's output)
-- with the rights of the inbox table's owner, through the inbox's generated query function.
-- The SQL sees the catalog row as $1, p_ints as $2 and p_texts as $3, and returns one jsonb.
CREATE FUNCTION mailbox._inbox_as_owner(
    p_inbox mailbox._inbox, p_sql text, p_ints bigint[] DEFAULT NULL, p_texts text[] DEFAULT NULL
)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_result jsonb;
BEGIN
    EXECUTE pg_catalog.format('SELECT mailbox.%I($1, $2, $3, $4)', '_inbox_' || p_inbox.inbox_key || '_query')
        INTO v_result
        USING p_inbox, p_sql, p_ints, p_texts;
    RETURN v_result;
END
$$;

-- (Re)generates an inbox's functions from its (current) catalog row: each body comes from a
-- small builder (part 35, builders), so what one generated function does is read in one
-- place. tests/expected/inbox_generated_*.sql hold the output for a managed and an adopted
-- inbox (docs/development.md).
CREATE FUNCTION mailbox._inbox_generate(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    -- a transaction that wrote a managed inbox's table ends before its new functions commit
    -- (part 35, named receive)
    PERFORM mailbox._inbox_quiesce(p_inbox);
    PERFORM mailbox._inbox_define(p_inbox, 'receive',
        (SELECT pg_catalog.string_agg(r.receive_type, ', ' ORDER BY r.receive_position)
           FROM mailbox._inbox_roles() AS r WHERE r.receive_position IS NOT NULL),
        'boolean', CASE WHEN p_inbox.is_managed OR p_inbox.ordering_first_sequence IS NOT NULL THEN '' ELSE $d$
    v_ordered pg_catalog.bool;$d$ END, mailbox._inbox_build_receive(p_inbox));
    PERFORM mailbox._inbox_define(p_inbox, 'claim', 'int, timestamptz, boolean', 'mailbox._inbox_message[]', '',
        mailbox._inbox_build_claim(p_inbox), ' SET plan_cache_mode = force_generic_plan SET jit = off');
    PERFORM mailbox._inbox_define(p_inbox, 'processed', 'text', 'mailbox._inbox_done', $d$
    v_id pg_catalog.text;
    v_aggregate pg_catalog.text;
    v_seq pg_catalog.int8;
    v_ordered pg_catalog.bool;$d$, mailbox._inbox_build_processed(p_inbox));
    PERFORM mailbox._inbox_define(p_inbox, 'failed', 'text, text', 'mailbox._inbox_attempt', $d$
    v_id pg_catalog.text;
    v_retries pg_catalog.int4;
    v_processed pg_catalog.bool;$d$, mailbox._inbox_build_failed(p_inbox));
    -- query(row, sql, ints, texts): the control plane's SQL (mailbox._inbox_as_owner)
    PERFORM mailbox._inbox_define(p_inbox, 'query', 'text, bigint[], text[]', 'jsonb', $d$
    v_result pg_catalog.jsonb;$d$, $b$
    EXECUTE $2 INTO v_result USING $1, $3, $4;
    RETURN v_result;$b$);
    -- the batch forms' receive_batch and processed_batch (part 36)
    PERFORM mailbox._inbox_generate_batch(p_inbox);
    -- a managed inbox's single receive and mark without a lookup (part 35, named receive)
    IF p_inbox.is_managed THEN
        PERFORM mailbox._inbox_define(p_inbox, 'receive_named',
            (SELECT pg_catalog.string_agg(r.receive_type, ', ' ORDER BY r.receive_position)
               FROM mailbox._inbox_roles() AS r WHERE r.receive_position IS NOT NULL),
            'boolean', $d$
    v_new pg_catalog.bool;$d$, mailbox._inbox_build_receive_named(p_inbox, mailbox._inbox_named_version(p_inbox)));
        -- (its UPDATE and lease DELETE: plans made on an empty queue, part 33, inbox_claim)
        PERFORM mailbox._inbox_define(p_inbox, 'processed_named', 'text', 'boolean', $d$
    v_done pg_catalog.bool;$d$, mailbox._inbox_build_processed_named(p_inbox, mailbox._inbox_named_version(p_inbox)),
            ' SET enable_seqscan = off SET jit = off');
    END IF;
    -- the public functions reach the new ones without a dynamic call (part 35, routes)
    PERFORM mailbox._inbox_build_routes();
END
$$;
