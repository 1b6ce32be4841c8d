-- Part 33 (wake-ups, issue 11), as the outbox's (part 17). NOTIFY mailbox_inbox_new is cheap
-- to send but serialises the commits of all notifying transactions of the database on one
-- lock held through the commit's WAL flush (4 single-message receivers: 3,981 commits/s
-- notifying against 6,435 without). It only helps a worker that waits, so:
--   * an inbox_claim that returns nothing records its worker as waiting on the inbox (a row
--     of the UNLOGGED mailbox._inbox_waiter, expiring after
--     mailbox.consumer_heartbeat_timeout_seconds, at most 60 s, unless it claims again); one
--     that returns messages removes it; drop_inbox and maintenance forget waits;
--   * inbox_receive and inbox_receive_batch notify only while some worker of the inbox waits.
--     Looking costs a statement of its own (an executor start-up, about a tenth of a single
--     receive), so the named receive (part 35) first reads the sequence
--     mailbox._inbox_waiting_until, a bound every wait raises past the end of any wait begun
--     by then: while no worker of any inbox has waited in the last 70 s, a receive reads one
--     sequence and no table.
-- As with the outbox, a receiver looks for waiters when it writes, not when it commits: a
-- receive written before a worker's empty claim committed and committed after it does not
-- wake that worker, which finds the message at its next claim (poll interval). Nothing is
-- lost; a wake-up is only ever earlier than the poll.

-- Records (p_waiting) or forgets the wait of the calling connection on an inbox (wake-ups,
-- above). Keyed by backend, not by worker name: claimers sharing a name (replicas of one
-- service, say) each write only their own row, so none waits for another's open
-- transaction. (Behind a transaction-pooling proxy a worker's claims may run on different
-- backends: a wait another backend registered then lasts until it expires, which only costs
-- receivers some needless notifications.)
CREATE FUNCTION mailbox._inbox_wait(p_key int, p_worker text, p_waiting boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_until timestamptz;
    v_bound bigint;
BEGIN
    IF p_waiting THEN
        v_until := pg_catalog.clock_timestamp() + LEAST(mailbox._heartbeat_timeout(), INTERVAL '60 seconds');
        INSERT INTO mailbox._inbox_waiter AS w (inbox_key, backend_pid, worker, waiting_until)
        VALUES (p_key, pg_catalog.pg_backend_pid(), p_worker, v_until)
            ON CONFLICT (inbox_key, backend_pid) DO UPDATE
           SET worker = excluded.worker, waiting_until = excluded.waiting_until;
        -- raise the bound named receives read first (above) past the end of every wait that
        -- may have started by now. Not this wait's end: the read and the setval below are not
        -- atomic, so when two waits race the later setval wins even if it is the lower, and a
        -- review found both ways that left a live wait past the bound (a worker with a longer
        -- heartbeat timeout; an end time read before the upsert waited seconds for
        -- maintenance's delete). Every wait ends at most 60 s after a clock reading taken
        -- before this one, so this clock, read after the upsert, plus 60 s covers every wait
        -- whose setval could lose to this one; 10 s more cover a delay between this reading
        -- and the setval.
        v_bound := pg_catalog.ceil(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()))::bigint + 70;
        IF v_bound > COALESCE(pg_catalog.pg_sequence_last_value('mailbox._inbox_waiting_until'), 0) THEN
            PERFORM pg_catalog.setval('mailbox._inbox_waiting_until', v_bound);
        END IF;
    ELSE
        DELETE FROM mailbox._inbox_waiter AS w
         WHERE w.inbox_key = p_key AND w.backend_pid = pg_catalog.pg_backend_pid();
    END IF;
END
$$;

-- Whether a receiver of inbox p_key should notify (wake-ups, above). inbox_receive inlines it.
CREATE FUNCTION mailbox._inbox_has_waiter(p_key int)
RETURNS boolean
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM mailbox._inbox_waiter AS w
                    WHERE w.inbox_key = p_key AND w.waiting_until > pg_catalog.now());
$$;
