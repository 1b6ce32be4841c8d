-- Part 24: the background numberer (SPEC §2.2.4, issue 8).
--
-- PostgreSQL has no autonomous transactions: whatever a transaction writes -- offsets, the
-- sequencer state, a group's delivered offset -- stays invisible, and its rows locked, until
-- that transaction ends. A consumer that polls in a transaction it then keeps open (psycopg's
-- default: poll, process, commit_offset, commit) would hold the outbox's sequencer and its
-- group's row for as long as it works or idles, and every group would stall behind it.
-- So while a numberer runs, numbering happens only in its own short transactions (PgQ's
-- ticker is the precedent):
--
--   * mailbox.run_numberer() loops: number every outbox with new rows, hand each group the
--     new offsets as slots (lease rows without a holder, mailbox.consumer_slot_rows each),
--     store each group's offset, COMMIT, NOTIFY the outboxes with waiting consumers;
--   * polls claim slots and expired leases with FOR UPDATE SKIP LOCKED and write nothing
--     else a peer needs; commits lock only their own rows. An open poll transaction then
--     holds back exactly the rows it claimed (until it ends: a lease row it locked cannot be
--     taken over even after its lease expires, docs/design.md §5).
--
-- It holds a session advisory lock while it runs (one numberer per database) and writes a
-- heartbeat after its passes. Polls believe a numberer is alive only when all of these hold:
-- the heartbeat is at most 2 s old, its backend is still running the statement that wrote
-- it (so a numberer that was cancelled or errored out, and whose session keeps the lock,
-- counts as stopped at once), and that backend holds the lock. A role that merely takes the
-- advisory lock (any role that can connect can) writes no heartbeat and fakes nothing: polls
-- then number inline. Without a numberer, polls number inline and allocate under the group
-- row's lock, as before; an installation without a numberer behaves as it always did.

-- Written only by mailbox._numberer_beat() (a definer), one row; UNLOGGED: it means nothing
-- after a crash, and its updates cost no WAL.
CREATE UNLOGGED TABLE mailbox._numberer_heartbeat (
    singleton boolean PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    pid int NOT NULL,
    beat_at timestamptz
);
-- dumped like every extension table (tests/upgrade/test_dump_restore.py); a restored beat is older
-- than 2 s, so it means nothing
SELECT pg_catalog.pg_extension_config_dump('mailbox._numberer_heartbeat', '');

-- The numberer's heartbeat: p_alive false clears it as its run ends.
CREATE FUNCTION mailbox._numberer_beat(p_alive boolean)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- the heartbeat table is written only here, for run_numberer's caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    INSERT INTO mailbox._numberer_heartbeat AS h (singleton, pid, beat_at)
    VALUES (true, pg_catalog.pg_backend_pid(), CASE WHEN p_alive THEN pg_catalog.clock_timestamp() END)
    ON CONFLICT (singleton) DO UPDATE SET pid = excluded.pid, beat_at = excluded.beat_at
     WHERE p_alive OR h.pid = excluded.pid;
$$;

-- Whether a numberer runs (see above). It takes no lock, so it cannot leave one behind. It
-- reads one row and, while a numberer runs, that backend's status; the lock table (pg_locks,
-- ~0.1 ms) is read once per numberer run and session: the run (pid, statement start) found
-- holding the lock is remembered in mailbox.numberer_verified, and a run keeps its lock until
-- its statement ends (costs measured in docs/design.md §4.1).
CREATE FUNCTION mailbox._numberer_alive()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- reads the heartbeat table and other backends' status for any poller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_pid int;
    v_at timestamptz;
    v_start timestamptz;
    v_run text;
BEGIN
    SELECT h.pid, h.beat_at INTO v_pid, v_at FROM mailbox._numberer_heartbeat AS h;
    IF v_at IS NULL OR v_at < pg_catalog.clock_timestamp() - interval '2 s' THEN
        RETURN false;
    END IF;
    -- the backend still runs the statement that wrote the heartbeat (read afresh: backend
    -- status is otherwise a snapshot taken once per transaction)
    PERFORM pg_catalog.pg_stat_clear_snapshot();
    v_start := (SELECT a.query_start FROM pg_catalog.pg_stat_get_activity(v_pid) AS a
                 WHERE a.state = 'active' AND a.query_start <= v_at);
    IF v_start IS NULL THEN
        RETURN false;
    END IF;
    v_run := v_pid::text || '@' || v_start::text;
    IF pg_catalog.current_setting('mailbox.numberer_verified', true) IS NOT DISTINCT FROM v_run THEN
        RETURN true;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l
                    WHERE l.locktype = 'advisory' AND l.pid = v_pid -- a backend has one database
                      AND l.classid = 7168634 AND l.objid = 0 AND l.objsubid = 2 AND l.granted) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config('mailbox.numberer_verified', v_run, false);
    RETURN true;
END
$$;

-- Hands a group the offsets after its delivered offset up to p_head as slots, and stores
-- its group offset. Skips a group whose row someone holds (a seek, a commit without a
-- numberer): the next pass does it. Only groups of one partition (part 28: a group draining
-- a change of the partition count uses its old count, and gets slots up to the boundary).
-- Returns the number of offsets handed out.
CREATE FUNCTION mailbox._slot_groups(p_key int, p_head bigint)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_slot int := mailbox._setting_int('consumer_slot_rows');
    v_group text;
    v_stored bigint;
    v_delivered bigint;
    v_offset bigint;
    v_total bigint := 0;
    v_head bigint;
BEGIN
    FOR v_group, v_stored IN
        SELECT g.group_name, g.group_offset FROM mailbox._consumer_group AS g
         WHERE g.outbox_key = p_key
           AND (g.delivered_offset < p_head
                OR g.group_offset <> mailbox._group_offset(g.group_name, g.delivered_offset))
           AND mailbox._group_partitions(g.group_name, p_key) = 1
         ORDER BY g.group_name
    LOOP
        SELECT g.delivered_offset INTO v_delivered FROM mailbox._consumer_group AS g
         WHERE g.group_name = v_group
           FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        -- read again under the group's lock, which a partition change's switch takes too
        CONTINUE WHEN mailbox._group_partitions(v_group, p_key) > 1;
        v_head := least(p_head, mailbox._group_head(v_group, p_key));
        IF v_delivered < v_head THEN
            INSERT INTO mailbox._lease (group_name, first_offset, last_offset, consumer_id, lease_until)
            SELECT v_group, s, least(s + v_slot - 1, v_head), NULL, NULL
              FROM pg_catalog.generate_series(v_delivered + 1, v_head, v_slot) AS s;
            v_total := v_total + (v_head - v_delivered);
            v_delivered := v_head;
        END IF;
        v_offset := mailbox._group_offset(v_group, v_delivered);
        UPDATE mailbox._consumer_group AS g
           SET delivered_offset = v_delivered, group_offset = v_offset
         WHERE g.group_name = v_group
           AND (g.delivered_offset, g.group_offset) IS DISTINCT FROM (v_delivered, v_offset);
    END LOOP;
    RETURN v_total;
END
$$;

-- One pass over every outbox; returns the rows numbered plus the offsets handed to groups.
CREATE FUNCTION mailbox._numberer_pass()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- writes the sequencer and lease catalog for run_numberer's caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_name text;
    v_head bigint;
    v_slotted bigint;
    v_n bigint;
    v_total bigint := 0;
BEGIN
    FOR v_key, v_name IN SELECT o.outbox_key, o.outbox_name FROM mailbox._outbox AS o ORDER BY o.outbox_key LOOP
        v_n := mailbox._sequence_outbox(v_key, 10000);
        v_total := v_total + v_n;
        v_head := (SELECT o.head_offset FROM mailbox._outbox AS o WHERE o.outbox_key = v_key);
        -- groups that drained a change of the partition count switch to the new one (part 28)
        v_slotted := (SELECT pg_catalog.count(*) FROM mailbox._partition_change AS x
                        JOIN mailbox._consumer_group AS g ON g.group_name = x.group_name
                       WHERE g.outbox_key = v_key
                         AND mailbox._finish_partition_change(x.group_name, v_key, FALSE));
        -- partitioned groups read the numbered rows by partition: no slots (part 26); a group
        -- draining a change of the partition count uses its old count (part 28)
        IF EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                    WHERE g.outbox_key = v_key AND mailbox._group_partitions(g.group_name, v_key) > 1) THEN
            v_slotted := v_slotted + v_n;
            PERFORM mailbox._store_partitioned_group_offset(g.group_name, v_key)
               FROM mailbox._consumer_group AS g
              WHERE g.outbox_key = v_key AND mailbox._group_partitions(g.group_name, v_key) > 1
              ORDER BY g.group_name;
        END IF;
        v_slotted := v_slotted + mailbox._slot_groups(v_key, v_head);
        v_total := v_total + v_slotted;
        IF v_slotted > 0 AND mailbox._outbox_has_waiter(v_key) THEN
            PERFORM pg_catalog.pg_notify('mailbox_outbox_new', v_name);
        END IF;
    END LOOP;
    RETURN v_total;
END
$$;

-- Takes the numberer's lock, retrying for up to p_wait_ms (a numberer ending its run gives
-- it up). False when another session has it.
CREATE FUNCTION mailbox._numberer_start(p_wait_ms int)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_until timestamptz := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_wait_ms / 1000.0);
BEGIN
    LOOP
        IF pg_catalog.pg_try_advisory_lock(7168634, 0) THEN
            RETURN true;
        END IF;
        EXIT WHEN pg_catalog.clock_timestamp() >= v_until;
        PERFORM pg_catalog.pg_sleep(0.002);
    END LOOP;
    RETURN false;
END
$$;

-- Whether a consumer waits for a wake-up on some outbox (the numberer then sleeps briefly).
CREATE FUNCTION mailbox._numberer_has_waiters()
RETURNS boolean
LANGUAGE sql STABLE
SECURITY DEFINER -- reads the waiter table for run_numberer's caller
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w WHERE w.waiting_until > pg_catalog.now());
$$;

-- The numberer. A procedure, as it commits after every pass; so it takes no SET clause
-- (PostgreSQL refuses transaction control in a procedure with one) and names every object
-- with its schema instead. Run it outside a transaction block: CALL mailbox.run_numberer();
-- pg_cron (schedule_numberer), "pg-mailbox numberer" and the relay run it.
CREATE PROCEDURE mailbox.run_numberer(p_seconds int DEFAULT 60)
LANGUAGE plpgsql
AS $$
DECLARE
    v_path text := pg_catalog.current_setting('search_path');
    v_end timestamptz;
    v_done bigint;
    v_idle_ms int := 1;
    v_beat timestamptz;
BEGIN
    -- A procedure that commits may not have a SET clause, so the search path is pinned here,
    -- first: pg_cron runs this as the scheduling role, and an operator resolved through the
    -- caller's path (a "/" in public, say) would run as it. Restored when it returns (an
    -- error leaves the pinned path in the session).
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, mailbox, pg_temp', false);
    IF p_seconds IS NULL OR p_seconds < 1 OR p_seconds > 86400 THEN
        PERFORM pg_catalog.set_config('search_path', v_path, false);
        RAISE EXCEPTION 'invalid p_seconds: %', p_seconds
            USING ERRCODE = '22023', HINT = 'Pass 1 to 86400 seconds.';
    END IF;
    -- fails here (2D000) when called inside a transaction block, before taking the lock
    COMMIT;
    IF NOT mailbox._numberer_start(2000) THEN
        RAISE NOTICE 'a numberer is already running in database %', pg_catalog.current_database()
            USING HINT = 'One numberer per database is enough; this call returns at once.';
        PERFORM pg_catalog.set_config('search_path', v_path, false);
        RETURN;
    END IF;
    v_end := pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => p_seconds);
    COMMIT;
    LOOP
        v_done := mailbox._numberer_pass();
        -- the heartbeat at most every 100 ms (polls trust one up to 2 s old)
        IF v_beat IS NULL OR pg_catalog.clock_timestamp() - v_beat >= interval '100 ms' THEN
            PERFORM mailbox._numberer_beat(true);
            v_beat := pg_catalog.clock_timestamp();
        END IF;
        COMMIT;
        EXIT WHEN pg_catalog.clock_timestamp() >= v_end;
        IF v_done > 0 THEN
            v_idle_ms := 1;
        ELSE
            -- idle: 1 ms while a consumer waits (its wake-up latency), backing off to 10 ms
            -- while none does (a busy consumer has rows to work on)
            IF mailbox._numberer_has_waiters() THEN
                v_idle_ms := 1;
            ELSE
                v_idle_ms := least(v_idle_ms * 2, 10);
            END IF;
            PERFORM pg_catalog.pg_sleep(v_idle_ms / 1000.0);
            COMMIT;
        END IF;
    END LOOP;
    PERFORM mailbox._numberer_beat(false);
    COMMIT;
    PERFORM pg_catalog.pg_advisory_unlock(7168634, 0);
    PERFORM pg_catalog.set_config('search_path', v_path, false);
END
$$;
COMMENT ON PROCEDURE mailbox.run_numberer(int) IS -- noqa: LT01
'number new outbox rows and hand them to consumer groups in short transactions of its own, for p_seconds';

CREATE FUNCTION mailbox.schedule_numberer()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- creates a pg_cron job that runs as the extension owner
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_job bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000',
                  HINT = 'Install pg_cron, or run "pg-mailbox numberer" (or a relay, which runs it too).';
    END IF;
    -- one job per database, replaced when scheduled again; each run lasts 59 s, so the next
    -- minute's run finds the lock free
    EXECUTE 'SELECT cron.schedule_in_database($1, $2, $3, $4)'
       INTO v_job
      USING 'pg_mailbox_numberer:' || pg_catalog.current_database(), '* * * * *',
            'CALL mailbox.run_numberer(59)', pg_catalog.current_database();
    RETURN v_job;
END
$$;
COMMENT ON FUNCTION mailbox.schedule_numberer() IS
'run mailbox.run_numberer() continuously with pg_cron (a job every minute); returns the job id';

CREATE FUNCTION mailbox.unschedule_numberer()
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- removes the pg_cron job made by schedule_numberer
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_done boolean := false;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'pg_cron') THEN
        RAISE EXCEPTION 'pg_cron is not installed in database %', pg_catalog.current_database()
            USING ERRCODE = '55000', HINT = 'Nothing is scheduled without pg_cron.';
    END IF;
    IF EXISTS (SELECT 1 FROM cron.job WHERE jobname = 'pg_mailbox_numberer:' || pg_catalog.current_database()) THEN
        EXECUTE 'SELECT cron.unschedule($1)' INTO v_done
          USING 'pg_mailbox_numberer:' || pg_catalog.current_database();
    END IF;
    RETURN v_done;
END
$$;
COMMENT ON FUNCTION mailbox.unschedule_numberer() IS
'remove the pg_cron job of mailbox.schedule_numberer(); false when there was none';

-- mailbox_admin runs the numberer (the relay and "pg-mailbox numberer" connect as it)
REVOKE ALL ON PROCEDURE mailbox.run_numberer(int) FROM PUBLIC;
