-- Part 34 (ordering switch): what enable_inbox_ordering does for an inbox that already has
-- messages, beyond its catalog change (part 34, ordering): refuse while a pending message
-- could never be claimed once ordered, and hold the aggregates whose messages are in flight;
-- and the code generated for an unordered inbox (part 35) that refuses to run on after an
-- enable it waited for.

-- Messages in flight when ordering is enabled were claimed without it: their lease rows carry
-- no aggregate, and a claim's walk looks at leases only up to an aggregate's head, so a3
-- leased while ordering was off let a1 be claimed beside it once ordering was on. Now, for each
-- aggregate with a live lease on a pending message, the lease of the highest sequence carries
-- the aggregate (one row per aggregate: the unique index), lasting until the last of the
-- aggregate's leases ends. Every ordered claim leaves out a message whose aggregate another
-- message's row carries, and gives the aggregate back once that lease has ended (part 37,
-- _inbox_claim_leases). Processing the carrier ends it too, but raises last_seq to at least
-- every other sequence in flight, and a head whose aggregate has a message in flight up to
-- last_seq + 1 is never claimed (part 35, builders). Only the carrier failing (a retry time)
-- frees the aggregate while others of it still run (docs/design.md §7.3). Every lease is
-- seen: enable_inbox_ordering runs in READ COMMITTED and first waits for the open claims of
-- the inbox (their leases are written at commit); the caller's own are settled here.
-- Aggregates that rows carried in an earlier ordered period, or under another mapping, are
-- cleared first. The leases' messages are read with the table owner's rights; what comes
-- back is ids, aggregates and times of this inbox.
CREATE FUNCTION mailbox._inbox_hold_in_flight(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_inbox.columns;
BEGIN
    -- this transaction's own open claims of the inbox (the only ones it can see) lease now
    PERFORM mailbox._inbox_settle(o.claim_no) FROM mailbox._inbox_open_claim AS o
      WHERE o.inbox_key = p_inbox.inbox_key AND o.xact_id = pg_catalog.pg_current_xact_id_if_assigned();
    UPDATE mailbox._inbox_lease AS l SET aggregate_id = NULL
     WHERE l.inbox_key = p_inbox.inbox_key AND l.aggregate_id IS NOT NULL;
    UPDATE mailbox._inbox_lease AS l SET aggregate_id = h.agg, lease_until = GREATEST(l.lease_until, h.until)
      FROM pg_catalog.jsonb_to_recordset(mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''id'', h.id, ''agg'', h.agg,'
        ' ''until'', h.until)), ''[]'') FROM (SELECT DISTINCT ON (1) %1$s::pg_catalog.text AS agg, l.event_id AS id,'
        ' pg_catalog.max(l.lease_until) OVER (PARTITION BY %1$s) AS until'
        ' FROM mailbox.%2$I AS l JOIN %3$I.%4$I AS t ON %5$s = %6$s'
        ' WHERE l.lease_until > pg_catalog.clock_timestamp() AND %1$s IS NOT NULL AND %7$s IS NULL'
        ' ORDER BY 1, %8$s DESC NULLS LAST, l.event_id) AS h',
        mailbox._inbox_col(c, 'aggregate_id'), '_inbox_' || p_inbox.inbox_key || '_lease',
        p_inbox.schema_name, p_inbox.table_name, mailbox._inbox_col(c, 'event_id'),
        CASE WHEN p_inbox.casts ? 'event_id'
             THEN pg_catalog.format('CAST(l.event_id AS %s)', p_inbox.casts ->> 'event_id')
             ELSE 'l.event_id' END,
        mailbox._inbox_col(c, 'processed_at'), mailbox._inbox_col(c, 'sequence_num')))) AS h (id text, agg text, until timestamptz)
     WHERE l.inbox_key = p_inbox.inbox_key AND l.event_id = h.id;
    -- while such a lease lasts, ordered claims probe each candidate head's aggregate
    UPDATE mailbox._inbox AS i
       SET held_until = (SELECT pg_catalog.max(l.lease_until) FROM mailbox._inbox_lease AS l
                          WHERE l.inbox_key = p_inbox.inbox_key AND l.aggregate_id IS NOT NULL)
     WHERE i.inbox_key = p_inbox.inbox_key;
END
$$;

-- An ordered claim takes only messages with an aggregate and a sequence, and inbox_receive
-- requires both once the inbox is ordered; a pending message without them would never be
-- claimed after the enable. So the enable is refused while the inbox has one (read after
-- the enable's lock, so no open receive adds one later; dead letters are not counted).
CREATE FUNCTION mailbox._inbox_refuse_unorderable(p_old mailbox._inbox, p_new mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_new.columns;
    v_found jsonb := mailbox._inbox_as_owner(p_old, pg_catalog.format(
        'SELECT pg_catalog.jsonb_build_object(''n'', pg_catalog.count(*), ''id'', pg_catalog.min(%1$s::pg_catalog.text))'
        ' FROM %2$s AS t WHERE %3$s IS NULL AND %4$s < ($1).max_retries AND (%5$s IS NULL OR %6$s IS NULL)',
        mailbox._inbox_col(c, 'event_id'), mailbox._inbox_table_sql(p_old), mailbox._inbox_col(c, 'processed_at'),
        mailbox._inbox_col(c, 'retry_count'), mailbox._inbox_col(c, 'aggregate_id'), mailbox._inbox_col(c, 'sequence_num')));
BEGIN
    IF (v_found ->> 'n')::bigint > 0 THEN
        RAISE EXCEPTION 'inbox % has % pending message(s) without aggregate or sequence', p_old.inbox_name, v_found ->> 'n'
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('An ordered inbox claims only messages with both (%s and %s); these would never be claimed. One of them: %s.',
                                             c ->> 'aggregate_id', c ->> 'sequence_num', v_found ->> 'id'),
                  HINT = 'Let the workers process them first, or set their aggregate and sequence, then enable ordering.';
    END IF;
END
$$;

-- A mark or receive of an unordered inbox runs the unordered code. One that looked the inbox
-- up before an enable_inbox_ordering committed and then waited for the enable's lock on the
-- table must not go on as if the inbox were still unordered: a mark records no aggregate
-- position (the aggregate would wait for a sequence already processed), a receive stores a
-- message without aggregate or sequence (no ordered claim takes it). Its statement reads the
-- ordering again (in READ COMMITTED its snapshot is taken after the lock, so it sees the
-- enable; one subquery of the statement, no statement of its own) and the call is refused
-- with 40001 (p_call names it), as such a claim is (part 37, _inbox_check_unchanged).
-- Ordered code needs no such check, and neither does a managed inbox's receive: the insert
-- trigger the enable adds refuses what it stores (_inbox_refuse_unaggregated, below).
-- _inbox_build_ordered_now: the value to read (FALSE for an ordered inbox). The extension
-- owner's code reads the catalog table; a table owner's, the inbox's config view (part 31),
-- which drop_inbox drops: a worker that reads it while a drop_inbox waits for another view
-- it holds can deadlock (docs/inbox.md, drop_inbox), so only adopted tables pay that.
-- _inbox_build_refuse_ordered: the refusal when p_var holds TRUE.
CREATE FUNCTION mailbox._inbox_build_ordered_now(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL THEN 'FALSE'
                WHEN mailbox._inbox_owner(p_inbox) = pg_catalog.pg_get_userbyid(mailbox._extension_owner())
                THEN pg_catalog.format('(SELECT i.ordering_first_sequence FROM mailbox._inbox AS i'
                                       ' WHERE i.inbox_key = %s) IS NOT NULL', p_inbox.inbox_key)
                ELSE pg_catalog.format('(SELECT c.ordering_first_sequence FROM mailbox.%I AS c) IS NOT NULL',
                                       '_inbox_' || p_inbox.inbox_key || '_config') END;
$$;

CREATE FUNCTION mailbox._inbox_build_refuse_ordered(p_inbox mailbox._inbox, p_var text, p_call text)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.ordering_first_sequence IS NOT NULL THEN '' ELSE pg_catalog.format($b$
    IF %s THEN
        RAISE EXCEPTION 'inbox %% changed its ordering or priority while this transaction was open', ($1).inbox_name
            USING ERRCODE = '40001',
                  DETAIL = 'This %s read the inbox before the change committed, then waited for the change''s lock and ran the old configuration''s code.',
                  HINT = 'Retry the transaction: the next one uses the new configuration.';
    END IF;$b$, p_var, p_call) END;
$$;

-- Raised by a managed ordered inbox's insert trigger (part 34, gap state) for a statement that
-- stored a pending message without aggregate or sequence. The ordered receive refuses those
-- before it inserts (22004), so this is a receive that looked the inbox up before
-- enable_inbox_ordering committed (on an unordered inbox, or again with other columns) and
-- then waited for the enable's lock (the trigger came with the enable, and the INSERT,
-- planned after the wait, fires it), in any isolation level; or an INSERT by hand, which a
-- retry does not mend (the HINT says so). Returns nothing: it only raises (its int result
-- fits the trigger's statement).
CREATE FUNCTION mailbox._inbox_refuse_unaggregated(p_inbox text)
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'inbox % is ordered: a pending message needs an aggregate and a sequence', p_inbox
        USING ERRCODE = '40001',
              DETAIL = 'This receive read the inbox before ordering was enabled or changed, then waited for the enable''s lock and ran the previous configuration''s code (an INSERT by hand without them is refused the same way).',
              HINT = 'Retry a receive: the next one runs the ordered code, which requires p_aggregate_id and p_sequence_num. A row written by hand needs both, or processed_at.';
END
$$;
