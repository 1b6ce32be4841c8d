-- Part 35 (named receive, issue 11): the single inbox_receive of a managed inbox without
-- grants of its own, in one call that looks nothing up.
--
-- inbox_receive used to start with a catalog lookup (the inbox's row, whether it has grants,
-- whether its table was moved, whether a worker waits), a statement of its own: on a 2-core
-- machine about as much backend time as the INSERT it guards, and the main reason a single
-- receive ran at 0.6-0.7 of a plain INSERT. For a managed inbox (create_inbox: the extension
-- owner's table with the standard columns) everything the lookup found is known when its
-- functions are generated, or can ride in the INSERT:
--   * inbox_receive itself is a one-expression SQL function (part 33) that the planner
--     inlines into the caller's statement: the router below, or else (NULL) the full path
--     _inbox_receive_full. The named receive is SECURITY DEFINER with a pinned search_path,
--     the call's only function frame (a PL/pgSQL frame around it cost about 7.5 us, 7% of a
--     receive). Being inlined, the caller calls the router and the named receives with its
--     own rights: mailbox_producer may execute the router, the full path, and each named
--     receive exactly while the router has its arm (_inbox_build_named_routes keeps that in
--     the transaction that changes the arms);
--   * the router mailbox._inbox_route_receive_named, a one-expression SQL function inlined
--     into inbox_receive's cached plan (like the key routers, part 35, routes), maps the name
--     to _inbox_<key>_receive_named(NULL, ...). It has an arm for a managed inbox whose
--     functions the extension owner owns and that has NO GRANTS: an inbox with grants (and
--     every adopted table) takes the full path, which checks them. Its ELSE is NULL;
--   * _inbox_<key>_receive_named checks the arguments and that its table is still the one it
--     was generated for (to_regclass, as the full path does), and returns NULL for anything
--     it would refuse, so that the full path raises the error (one place for every message);
--     then it inserts and, only when the bound mailbox._inbox_waiting_until is in the future
--     (part 33, wake-ups), reads whether a worker waits;
--   * after the INSERT, whose lock makes the session read the catalog changes committed
--     before it (AcceptInvalidationMessages), it asks the second router,
--     _inbox_route_named_version, whether the name still routes to the function it runs,
--     generated from the catalog row as it is now (the key and a digest of the body): a
--     session that ran routers or a body from before a first grant, a reconfiguration, a
--     drop or a re-creation that committed while its transaction was open raises 40001
--     instead of storing the message (nothing stays);
--   * a transaction that already wrote the table takes no new lock there, so reads no
--     catalog change: grant_inbox (a first grant, part 39), every regeneration of a managed
--     inbox's functions (_inbox_generate) and drop_inbox take a SHARE lock on its table
--     first (_inbox_quiesce), so such a transaction ends before they commit.
-- What the arm skips is what the lookup gave; the ordering, priority and column checks are
-- the generated receive's, baked in (the table's insert trigger also refuses an unordered
-- message once ordering is on, part 34, gap state).
--
-- The named mark (issue 11) does the same for the single inbox_mark_processed of such an
-- inbox when it is not ordered: inbox_mark_processed(text, text) is inlined the same way
-- (part 33, marks; the full path _inbox_mark_processed_full), and
-- _inbox_route_processed_named calls _inbox_<key>_processed_named(NULL, event_id), SECURITY
-- DEFINER with a pinned search_path, which marks the message and ends its lease, then checks
-- the version as the named receive does (an ordered inbox's is only RETURN NULL: its marks
-- record the aggregate's position on the full path, and its router has no arm for it).
-- mailbox_consumer may execute the router, the full path and each named mark exactly while
-- that router has its arm.
--
-- These functions touch _inbox_waiter, which the other generated functions never do: they
-- exist only for the extension owner's own tables, so they run with no rights beyond the
-- public functions (a named receive called directly by a producer does what inbox_receive
-- of that inbox does, with the same checks; a hostile $1 is never read).

-- Waits for the transactions that wrote a managed inbox's table (they would keep its named
-- receive as it was, above) and makes new ones wait for this one's commit: the first step of
-- grant_inbox's first grant, of a regeneration and of a drop (before it drops the views
-- such a transaction may read next).
-- p_nowait: fail at once (55P03) instead of waiting, for maintenance (part 43).
CREATE FUNCTION mailbox._inbox_quiesce(p_inbox mailbox._inbox, p_nowait boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF p_inbox.is_managed AND EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = p_inbox.table_rel) THEN
        EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE MODE%s', p_inbox.table_rel,
                                  CASE WHEN p_nowait THEN ' NOWAIT' ELSE '' END);
    END IF;
END
$$;

-- The first test of a named function: whether its table is no longer the one it was made
-- for. It opens that table by oid first (pg_relation_is_updatable takes and releases an
-- ACCESS SHARE lock), which makes the session read the catalog changes committed before,
-- so that to_regclass sees a rename, a drop or a table put in its place, even in a
-- transaction that began before them (a review found the stale answer: the statement then
-- ran on whatever table had the name). A dropped table is 0 updatable events. (p_version
-- NULL: the text _inbox_named_version digests, without the table's oid, which a restore
-- changes.)
CREATE FUNCTION mailbox._inbox_build_named_table_check(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('pg_catalog.pg_relation_is_updatable(%1$s::pg_catalog.regclass, FALSE) OPERATOR(pg_catalog.=) 0'
                             || pg_catalog.chr(10) || '       OR pg_catalog.to_regclass(%2$L) IS DISTINCT FROM %1$s::pg_catalog.regclass',
                             CASE WHEN p_version IS NULL THEN 0 ELSE p_inbox.table_rel::oid END,
                             mailbox._inbox_table_sql(p_inbox));
$$;

-- The check a named function makes after its statement, whose new table lock made the
-- session read the catalog changes committed before it: 40001 unless the name still routes
-- to a function of p_version (nothing the statement did stays).
CREATE FUNCTION mailbox._inbox_build_named_check(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE sql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format($b$
    IF mailbox._inbox_route_named_version(%1$L) IS DISTINCT FROM %2$L THEN
        RAISE EXCEPTION 'inbox %% changed while this transaction was open', %1$L
            USING ERRCODE = '40001',
                  DETAIL = 'It was granted, reconfigured, dropped or made again after this session last read the catalog.',
                  HINT = 'Retry the transaction.';
    END IF;$b$, p_inbox.inbox_name, COALESCE(p_version, ''));
$$;

-- The body of _inbox_<key>_receive_named (only for a managed inbox). Parameters as the
-- generated receive's: $1 the catalog row (always NULL here: the type only makes the
-- function depend on the extension), then role i of _inbox_receive_roles() is $(i + 1).
CREATE FUNCTION mailbox._inbox_build_receive_named(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_parts record; -- _inbox_receive_parts, shared with the receive (part 35, builders)
    v_table text := mailbox._inbox_table_sql(p_inbox);
    -- what the full path refuses, in the full path's order (it raises the error)
    v_refuse text[] := ARRAY[
        mailbox._inbox_build_named_table_check(p_inbox, p_version),
        '$2 IS NULL', 'pg_catalog.octet_length($2) OPERATOR(pg_catalog.>) 1000'];
    n int;
BEGIN
    SELECT * INTO v_parts FROM mailbox._inbox_receive_parts(p_inbox);
    IF NOT p_inbox.is_managed THEN
        RAISE EXCEPTION 'inbox % is not managed: it has no named receive', p_inbox.inbox_name
            USING ERRCODE = 'XX000';
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        v_refuse := v_refuse || '$6 IS NULL'::text || '$7 IS NULL'::text;
    END IF;
    FOREACH n IN ARRAY v_parts.unmapped LOOP
        v_refuse := v_refuse || pg_catalog.format('$%s IS NOT NULL', n);
    END LOOP;
    IF v_parts.smallint_priority THEN
        v_refuse := v_refuse || '$10 NOT BETWEEN -32768 AND 32767'::text;
    END IF;
    RETURN pg_catalog.format($b$
    IF %1$s THEN
        RETURN NULL; -- inbox_receive's full path raises the error
    END IF;
    INSERT INTO %2$s AS t (%3$s) VALUES (%4$s) ON CONFLICT (%5$I) DO NOTHING;
    v_new := FOUND;%9$s
    -- (part 33, wake-ups: no worker waits past the bound every wait raises)
    -- (an unset bound, NULL, is no wait: COALESCE, or AND would go on to the probe)
    IF v_new AND COALESCE(pg_catalog.pg_sequence_last_value('mailbox._inbox_waiting_until'::pg_catalog.regclass), 0)
                 OPERATOR(pg_catalog.>) pg_catalog.date_part('epoch', pg_catalog.now())
       AND mailbox._inbox_has_waiter(%6$s) THEN
        PERFORM pg_catalog.pg_notify('mailbox_inbox_new', %7$L);
    END IF;
    RETURN v_new;$b$,
        pg_catalog.array_to_string(v_refuse, pg_catalog.chr(10) || '       OR '), v_table,
        pg_catalog.array_to_string(v_parts.cols, ', '), pg_catalog.array_to_string(v_parts.vals, ', '),
        p_inbox.columns ->> 'event_id',
        p_inbox.inbox_key, p_inbox.inbox_name, COALESCE(p_version, ''),
        mailbox._inbox_build_named_check(p_inbox, p_version));
END
$$;

-- The body of _inbox_<key>_processed_named (only for a managed inbox): $1 as above, $2 the
-- event id. NULL for what the full path refuses (it raises the error) and for an ordered
-- inbox. The lease ends after the UPDATE, unless this transaction's claims of the inbox
-- found no lease row (part 37, claim settle, "Marks without a lease"): a lease the DELETE
-- does not see, or does not look for, holds nothing until it expires (a processed message
-- is never claimed, counted in flight or replayed with its lease; the full path re-reads
-- only for an ordered inbox, part 33, marks). Two statements, not one with a CTE: the
-- CTE's two table updates cost an executor start-up each even when there is no lease. The id
-- is compared in the default collation, that of a managed table's column, whatever collation
-- a direct caller's argument carries (a nondeterministic one would match other ids).
CREATE FUNCTION mailbox._inbox_build_processed_named(p_inbox mailbox._inbox, p_version text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_table text := mailbox._inbox_table_sql(p_inbox);
BEGIN
    IF NOT p_inbox.is_managed THEN
        RAISE EXCEPTION 'inbox % is not managed: it has no named mark', p_inbox.inbox_name
            USING ERRCODE = 'XX000';
    END IF;
    IF p_inbox.ordering_first_sequence IS NOT NULL THEN
        RETURN pg_catalog.format($b$
    RETURN NULL; -- ordered: inbox_mark_processed's full path records the aggregate's position
    -- version %s$b$, pg_catalog.quote_literal(COALESCE(p_version, '')));
    END IF;
    RETURN pg_catalog.format($b$
    IF %1$s
       OR $2 IS NULL THEN
        RETURN NULL; -- inbox_mark_processed's full path raises the error
    END IF;
    UPDATE %2$s AS t SET %3$I = pg_catalog.clock_timestamp()
     WHERE t.%4$I = $2 COLLATE pg_catalog."default" AND %8$s;
    v_done := FOUND;
    IF v_done AND pg_catalog.current_setting(%7$L, TRUE) IS DISTINCT FROM 'on' THEN
        DELETE FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key OPERATOR(pg_catalog.=) %5$s
           AND l.event_id OPERATOR(pg_catalog.=) $2 COLLATE pg_catalog."default";
    END IF;%6$s
    RETURN v_done;$b$,
        mailbox._inbox_build_named_table_check(p_inbox, p_version), v_table,
        p_inbox.columns ->> 'processed_at', p_inbox.columns ->> 'event_id', p_inbox.inbox_key,
        mailbox._inbox_build_named_check(p_inbox, p_version), 'mailbox.claim_unleased_' || p_inbox.inbox_key,
        mailbox._inbox_sql_unprocessed(p_inbox.columns ->> 'processed_at'));
END
$$;

-- What a named receive and mark were generated from: the inbox's key and a digest of their
-- bodies (built without version and table oid, so a restored database has the same versions).
CREATE FUNCTION mailbox._inbox_named_version(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p_inbox.inbox_key || '/' || pg_catalog.md5(mailbox._inbox_build_receive_named(p_inbox, NULL)
                                                      || mailbox._inbox_build_processed_named(p_inbox, NULL));
$$;

-- Whether an inbox's named receive and mark exist, are the extension owner's, and were
-- generated from its catalog row as it is now and for its table as it is now (the oid: a
-- restored database's functions name the dumped one until maintenance regenerates them,
-- part 43; an ordered inbox's named mark names no table).
CREATE FUNCTION mailbox._inbox_named_current(p_inbox mailbox._inbox)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.count(*) = 2
      FROM pg_catalog.pg_proc AS p, (SELECT pg_catalog.quote_literal(mailbox._inbox_named_version(p_inbox)) AS v) AS n
     WHERE p.pronamespace = 'mailbox'::regnamespace
       AND p.proname IN ('_inbox_' || p_inbox.inbox_key || '_receive_named',
                         '_inbox_' || p_inbox.inbox_key || '_processed_named')
       AND p.proowner = mailbox._extension_owner()
       AND pg_catalog.strpos(p.prosrc, n.v) > 0
       AND (p.proname LIKE '%\_processed\_named' AND p_inbox.ordering_first_sequence IS NOT NULL
            OR pg_catalog.strpos(p.prosrc, ' ' || p_inbox.table_rel::oid || '::pg_catalog.regclass') > 0);
$$;
