-- Part 17: wake-ups that cost producers almost nothing (issue 8).
--
-- NOTIFY is cheap to send but expensive to commit: PostgreSQL serialises the commits of all
-- notifying transactions of a database on one lock held through the commit's WAL flush, so
-- producers that notify lose group commit and run at about 0.4x of a bare INSERT. A wake-up
-- is only useful to a consumer that is actually waiting, so producers notify only then:
--
--   * a poll that returns no rows records its consumer as waiting on the outbox (a row here,
--     expiring after mailbox.consumer_heartbeat_timeout_seconds, at most 60 s, unless the
--     consumer polls again); a poll that returns rows removes it, and so do dropping its
--     group or outbox: a busy or gone consumer needs no wake-up;
--   * a producer (outbox_publish, outbox_publish_batch, capture, snapshots) sends
--     NOTIFY mailbox_outbox_new only while some consumer of the outbox is waiting.
--
-- Under load consumers are busy and no producer notifies; an idle consumer is woken by the
-- first commit after it went idle, in about a millisecond. One race remains: producers look
-- for waiters when they write, not when they commit, so a producer that wrote before a
-- consumer's empty poll committed and commits after that poll read does not notify. The
-- relay (and docs/consumer-groups.md's loop) polls once more a few milliseconds after an
-- empty poll, which catches the usual short producer transaction; a producer transaction
-- that runs on longer is caught by the consumer's poll interval. Rows are never lost, only
-- delivered up to one poll interval later.
-- The table is UNLOGGED: it is soft state, rebuilt by the next empty poll after a crash.

-- Whether a producer of outbox p_key should notify. Inlined by the hot paths; this helper is
-- for the rest (snapshots, publish_batch).
CREATE FUNCTION mailbox._outbox_has_waiter(p_key int)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w
                    WHERE w.outbox_key = p_key AND w.waiting_until > pg_catalog.now());
$$;

-- Maintenance forgets waits that expired (a consumer that stopped polling, or one whose id
-- changes with every restart), so the producers' check stays one short index range.
CREATE FUNCTION mailbox._forget_expired_waiters()
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    -- (a row a consumer's open transaction is rewriting is its own again: skipped, never
    -- waited for)
    WITH gone AS (
        DELETE FROM mailbox._outbox_waiter AS w
         WHERE w.ctid = ANY (ARRAY(SELECT x.ctid FROM mailbox._outbox_waiter AS x
                                    WHERE x.waiting_until <= pg_catalog.now() FOR UPDATE SKIP LOCKED))
           AND w.waiting_until <= pg_catalog.now()
        RETURNING 1
    )
    SELECT pg_catalog.count(*) FROM gone;
$$;
