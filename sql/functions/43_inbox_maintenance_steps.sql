-- Part 43: the statements of the inbox's maintenance steps, and the alert log's drain, one
-- private function each (as part 42 is for the outbox). mailbox_server/inbox_maintenance.py
-- and alerts.py orchestrate them: which inboxes, in which subtransaction, which alerts.

-- Deletes lease rows that no longer hold anything: expired, and no retry time pending.
CREATE FUNCTION mailbox._expire_inbox_leases()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._inbox_lease AS l
         WHERE (l.lease_until IS NULL OR l.lease_until < pg_catalog.clock_timestamp())
           AND (l.next_attempt_at IS NULL OR l.next_attempt_at < pg_catalog.clock_timestamp())
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- Deletes open claims that outlived their transaction unsettled. Such a row can only exist
-- when its transaction committed without firing the settle trigger (a superuser session with
-- session_replication_role = replica, or the trigger disabled), or was restored with triggers
-- disabled. What it claimed has no lease and is claimable at once; every lookup asks for its
-- own transaction's rows (xact_id, part 30), so the row only takes space. It also carries a
-- transaction id that a restored cluster could hand out again. Every row this statement sees
-- is such a row, except the rows of the caller's own transaction, which it leaves alone:
-- another transaction's open claims are not committed, so they are invisible here.
CREATE FUNCTION mailbox._forget_unsettled_inbox_claims()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox._inbox_open_claim AS o
         WHERE o.xact_id IS DISTINCT FROM pg_catalog.pg_current_xact_id_if_assigned()
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- Rebuilds the routers (part 35, routes) when one of them is not what the catalog asks for:
-- after a restore, whose routers are the extension script's (every call takes the dynamic
-- path until then). Checked without a lock; rebuilt under the DDL lock, if it is free.
-- First regenerates the functions of an inbox whose generated functions' rights no longer fit
-- their owner (part 35, codegen, _inbox_fn_is_definer):
-- a dump restored by another superuser, who becomes the extension owner, brings back the old
-- owner's invoker functions, which then refuse every call (42501) until this runs. Every
-- restore also brings back managed inboxes' named receives made for the dumped tables' oids,
-- which the named routers skip until this regenerates them (part 35, named receive).
CREATE FUNCTION mailbox._inbox_refresh_routes()
RETURNS int
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_misfit mailbox._inbox[] := ARRAY(
        SELECT i FROM mailbox._inbox AS i
         WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = i.table_rel)
           AND (EXISTS (SELECT 1 FROM pg_catalog.pg_proc AS p
                         WHERE p.pronamespace = 'mailbox'::regnamespace
                           AND p.proname = ANY (mailbox._inbox_fn_names(i))
                           AND p.prosecdef <> mailbox._inbox_fn_is_definer(
                                   pg_catalog.regexp_replace(p.proname, '^_inbox_[0-9]+_', ''), p.proowner))
                -- a managed inbox's named receive made for another table oid (a restore)
                OR (i.is_managed AND NOT mailbox._inbox_named_current(i)))
         ORDER BY i.inbox_key);
    v_inbox mailbox._inbox;
    v_before jsonb;
BEGIN
    IF (pg_catalog.cardinality(v_misfit) = 0
        AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_route_states() AS r
                         WHERE r.wanted IS DISTINCT FROM r.body)
        -- (and who may execute the named receives and marks: part 35, named routes)
        AND NOT EXISTS (SELECT 1 FROM mailbox._inbox_named_rights() AS r
                         WHERE r.armed IS DISTINCT FROM pg_catalog.has_function_privilege(r.role, r.fn, 'EXECUTE')))
       OR NOT mailbox._try_ddl_lock() THEN
        RETURN 0;
    END IF;
    IF pg_catalog.cardinality(v_misfit) = 0 THEN
        RETURN mailbox._inbox_build_routes();
    END IF;
    v_before := (SELECT pg_catalog.jsonb_object_agg(r.kind, r.body) FROM mailbox._inbox_route_states() AS r);
    FOREACH v_inbox IN ARRAY v_misfit LOOP
        BEGIN -- one inbox that cannot be regenerated leaves the others (and maintenance) alone
            -- a managed table some transaction writes now is left for the next pass, rather
            -- than waited for (it would hold up that inbox's receivers meanwhile, and could
            -- deadlock with a receiver that holds another inbox this pass locked)
            PERFORM mailbox._inbox_quiesce(v_inbox, p_nowait => TRUE);
            PERFORM mailbox._inbox_generate(v_inbox); -- (rebuilds the routers too)
        EXCEPTION
            WHEN lock_not_available THEN
                NULL;
            WHEN OTHERS THEN
                RAISE WARNING 'regenerating the functions of inbox % failed: %', v_inbox.inbox_name, SQLERRM;
        END;
    END LOOP;
    PERFORM mailbox._inbox_build_routes();
    -- the routers whose body changed
    RETURN (SELECT pg_catalog.count(*) FROM mailbox._inbox_route_states() AS r
             WHERE r.body IS DISTINCT FROM v_before ->> r.kind);
END
$$;

-- Forgets inbox workers' waits that expired (part 33, wake-ups): a worker that stopped
-- claiming, or one whose name changes with every restart.
CREATE FUNCTION mailbox._forget_expired_inbox_waiters()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    -- (a row a worker's open transaction is rewriting is its own again: skipped, never waited for)
    WITH gone AS (
        DELETE FROM mailbox._inbox_waiter AS w
         WHERE w.ctid = ANY (ARRAY(SELECT x.ctid FROM mailbox._inbox_waiter AS x
                                    WHERE x.waiting_until <= pg_catalog.now() FOR UPDATE SKIP LOCKED))
           AND w.waiting_until <= pg_catalog.now()
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;

-- Takes every dead letter not announced yet, oldest first (one maintenance pass consumes them
-- all and announces them, up to its cap, as alerts).
CREATE FUNCTION mailbox._take_inbox_dlq_events()
RETURNS TABLE (event_no bigint, inbox_name text, event_id text, error text, retry_count int, dead_at text)
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (DELETE FROM mailbox._inbox_dlq_event RETURNING *)
    SELECT gone.event_no, i.inbox_name, gone.event_id, gone.error, gone.retry_count, gone.dead_at::text
      FROM gone JOIN mailbox._inbox AS i ON i.inbox_key = gone.inbox_key
     ORDER BY gone.event_no;
$$;

-- The gaps of an inbox already announced by an inbox_ordering_gap alert.
CREATE FUNCTION mailbox._inbox_gaps_alerted(p_inbox_key int)
RETURNS TABLE (aggregate_id text, expected_seq bigint)
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT a.aggregate_id, a.expected_seq FROM mailbox._inbox_gap_alert AS a WHERE a.inbox_key = p_inbox_key;
$$;

CREATE FUNCTION mailbox._record_inbox_gap_alert(p_inbox_key int, p_aggregate_id text, p_expected_seq bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO mailbox._inbox_gap_alert (inbox_key, aggregate_id, expected_seq)
    VALUES (p_inbox_key, p_aggregate_id, p_expected_seq)
        ON CONFLICT DO NOTHING;
$$;

-- A gap that closed: the next time it opens it is announced again.
CREATE FUNCTION mailbox._forget_inbox_gap_alert(p_inbox_key int, p_aggregate_id text, p_expected_seq bigint)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    DELETE FROM mailbox._inbox_gap_alert AS a
     WHERE a.inbox_key = p_inbox_key AND a.aggregate_id = p_aggregate_id AND a.expected_seq = p_expected_seq;
$$;

-- Retention of one inbox by key: processed rows (p_dead false) or dead letters (true) older
-- than p_hours, at most p_batch, deleted with the table owner's rights (part 38).
CREATE FUNCTION mailbox._drain_inbox(p_inbox_key int, p_dead boolean, p_hours int, p_batch int)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailbox._inbox_drain(i, p_dead, p_hours, p_batch) FROM mailbox._inbox AS i WHERE i.inbox_key = p_inbox_key;
$$;

-- Every gap of an ordered inbox by key, as the jsonb array of mailbox._inbox_gap_list (part 34).
CREATE FUNCTION mailbox._inbox_gaps(p_inbox_key int)
RETURNS jsonb
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailbox._inbox_gap_list(i) FROM mailbox._inbox AS i WHERE i.inbox_key = p_inbox_key;
$$;

-- Deletes alert_log rows older than mailbox.alert_retention_hours; returns how many.
CREATE FUNCTION mailbox._drain_alert_log()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM mailbox.alert_log AS a
         WHERE a.created_at < pg_catalog.now()
               - pg_catalog.make_interval(hours => mailbox._setting_int('alert_retention_hours'))
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;
