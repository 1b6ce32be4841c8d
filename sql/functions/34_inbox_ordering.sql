-- Part 34: ordering, priority and partitions (SPEC §3.2).

-- Ordering and priority each decide which message a claim takes first; together they would
-- contradict each other, so an inbox has at most one of them.
CREATE FUNCTION mailbox._inbox_conflict(p_inbox text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'inbox ordering and priority conflict for inbox: %', p_inbox
        USING ERRCODE = '55000',
              DETAIL = 'Ordering claims messages in sequence per aggregate; priority claims the lowest priority value first.',
              HINT = 'Use separate inboxes: an ordered one and a prioritised one, or disable the other feature first.';
END
$$;

-- Rebuilds the views, indexes and generated functions after a settings change (the catalog
-- row is already updated).
CREATE FUNCTION mailbox._inbox_reconfigure(p_old mailbox._inbox, p_new mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._inbox_drop_views(p_old);
    PERFORM mailbox._inbox_create_views(p_new);
    PERFORM mailbox._inbox_sync_indexes(p_new);
    PERFORM mailbox._inbox_generate(p_new);
    PERFORM mailbox._inbox_gap_sync(p_new);
END
$$;

-- Maps p_role to p_column of the inbox's table: the column must exist with a type the role
-- accepts (part 30, the same rule as adoption) and play no other role.
CREATE FUNCTION mailbox._inbox_map_column(p_inbox mailbox._inbox, p_role text, p_column text)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._require(p_column, 'column for ' || p_role);
    PERFORM mailbox._inbox_role_column(p_inbox.table_rel, p_role, p_column);
    PERFORM mailbox._inbox_check_distinct_columns(
        (p_inbox.columns - p_role) || pg_catalog.jsonb_build_object(p_role, p_column));
    RETURN pg_catalog.jsonb_build_object(p_role, p_column);
END
$$;

-- The per-aggregate state when ordering is enabled (SPEC §3.2: the head is last processed + 1,
-- p_first_sequence only for a new aggregate). An aggregate's position is the highest
-- sequence among its processed rows, merged with the state kept from an earlier ordered
-- period (disable keeps it: retention may have deleted the processed rows since). The
-- highest, not the end of the contiguous run: that is what inbox_mark_processed records
-- while ordering is on (a message processed out of turn raises last_seq past a hole), so
-- enabling on history gives the same state as having been ordered all along, and history
-- with holes does not block an aggregate on sequences that may never come. Aggregates
-- without processed history are new. Mapping other columns starts over from the history.
-- One pass over the processed rows, at enable time only (never on the per-message path).
CREATE FUNCTION mailbox._inbox_seed_aggregates(p_old mailbox._inbox, p_new mailbox._inbox)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    c jsonb := p_new.columns;
BEGIN
    IF p_old.columns ->> 'aggregate_id' IS DISTINCT FROM c ->> 'aggregate_id'
       OR p_old.columns ->> 'sequence_num' IS DISTINCT FROM c ->> 'sequence_num' THEN
        DELETE FROM mailbox._inbox_aggregate WHERE inbox_key = p_new.inbox_key;
        DELETE FROM mailbox._inbox_gap_alert WHERE inbox_key = p_new.inbox_key;
    END IF;
    -- the history is read with the table owner's rights; what comes back is data for this
    -- inbox's own key only
    INSERT INTO mailbox._inbox_aggregate AS a (inbox_key, aggregate_id, last_seq)
    SELECT p_new.inbox_key, h.aggregate_id, h.last_seq
      FROM pg_catalog.jsonb_to_recordset(mailbox._inbox_as_owner(p_new, pg_catalog.format(
        'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''aggregate_id'', h.agg,'
        ' ''last_seq'', h.seq)), ''[]'') FROM (SELECT t.%1$I::pg_catalog.text AS agg,'
        ' pg_catalog.max(t.%2$I)::pg_catalog.int8 AS seq FROM %4$I.%5$I AS t'
        ' WHERE t.%3$I IS NOT NULL AND t.%1$I IS NOT NULL AND t.%2$I IS NOT NULL GROUP BY t.%1$I) AS h',
        c ->> 'aggregate_id', c ->> 'sequence_num', c ->> 'processed_at', p_new.schema_name, p_new.table_name)))
           AS h (aggregate_id text, last_seq bigint)
     WHERE h.aggregate_id IS NOT NULL AND h.last_seq IS NOT NULL
        ON CONFLICT (inbox_key, aggregate_id) DO UPDATE
       SET last_seq = pg_catalog.int8larger(a.last_seq, excluded.last_seq), updated_at = excluded.updated_at;
END
$$;

CREATE FUNCTION mailbox.enable_inbox_ordering(
    p_inbox text,
    p_aggregate_id_col text DEFAULT 'aggregate_id',
    p_sequence_num_col text DEFAULT 'sequence_num',
    p_first_sequence bigint DEFAULT 1
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_first_sequence, 'p_first_sequence');
    -- _inbox_hold_in_flight below must see the leases of claims that commit while this waits
    -- for them, which a REPEATABLE READ or SERIALIZABLE snapshot cannot
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'enable_inbox_ordering must run in READ COMMITTED, not %',
                        pg_catalog.current_setting('transaction_isolation')
            USING ERRCODE = '55000',
                  DETAIL = 'It waits for the inbox''s open claims and then reads the leases they wrote.',
                  HINT = 'Run it in a READ COMMITTED transaction: SET TRANSACTION ISOLATION LEVEL READ COMMITTED first, or SET default_transaction_isolation = ''read committed''.';
    END IF;
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.priority_tiers IS NOT NULL THEN
        PERFORM mailbox._inbox_conflict(p_inbox);
    END IF;
    v_new := v_old;
    v_new.columns := v_old.columns
        || mailbox._inbox_map_column(v_old, 'aggregate_id', p_aggregate_id_col)
        || mailbox._inbox_map_column(v_old, 'sequence_num', p_sequence_num_col);
    IF v_new.columns ->> 'aggregate_id' = p_sequence_num_col THEN
        RAISE EXCEPTION 'column mapped to more than one role: %', p_sequence_num_col
            USING ERRCODE = '22023', HINT = 'Aggregate id and sequence number need their own columns.';
    END IF;
    v_new.ordering_first_sequence := p_first_sequence;
    -- wait for the transactions that claimed from (or wrote to) the inbox: an open claim's
    -- leases are written at its commit, and _inbox_hold_in_flight below must see them all
    -- (after the checks above, so a refused call never waits)
    EXECUTE pg_catalog.format('LOCK TABLE %I.%I IN EXCLUSIVE MODE', v_old.schema_name, v_old.table_name);
    PERFORM mailbox._inbox_refuse_unorderable(v_old, v_new);
    UPDATE mailbox._inbox SET columns = v_new.columns, ordering_first_sequence = p_first_sequence
     WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_seed_aggregates(v_old, v_new);
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
    PERFORM mailbox._inbox_hold_in_flight(v_new);
END
$$;
COMMENT ON FUNCTION mailbox.enable_inbox_ordering(text, text, text, bigint) IS
'process messages in sequence per aggregate: views next_<inbox> and gaps_<inbox>, ordered claims';

CREATE FUNCTION mailbox.disable_inbox_ordering(p_inbox text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.ordering_first_sequence IS NULL THEN
        IF p_if_exists THEN
            RAISE NOTICE 'inbox ordering not enabled, skipping: %', p_inbox;
            RETURN;
        END IF;
        RAISE EXCEPTION 'inbox ordering not enabled: %', p_inbox
            USING ERRCODE = '55000', HINT = 'Pass p_if_exists => true to ignore this.';
    END IF;
    v_new := v_old;
    v_new.ordering_first_sequence := NULL;
    UPDATE mailbox._inbox SET ordering_first_sequence = NULL WHERE inbox_key = v_old.inbox_key;
    -- the per-aggregate positions stay: enabling again merges them with the processed history
    -- (which retention may have thinned meanwhile); gaps are announced afresh
    DELETE FROM mailbox._inbox_gap_alert WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
END
$$;
COMMENT ON FUNCTION mailbox.disable_inbox_ordering(text, boolean) IS
'stop ordering an inbox: drops next_<inbox> and gaps_<inbox> (each aggregate''s position is kept)';

-- Every gap of an ordered inbox as a jsonb array of {aggregate_id, expected_seq, found_seq,
-- gap_age_sec}: a managed inbox's kept gaps (part 34, gap state), or read with the table
-- owner's rights (the SQL of gaps_<i>, not that view: a view in the table's schema may be
-- replaced by that schema's owner).
CREATE FUNCTION mailbox._inbox_gap_list(p_inbox mailbox._inbox)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF mailbox._inbox_gap_tracked(p_inbox) THEN
        RETURN mailbox._inbox_gap_fold(p_inbox);
    END IF;
    RETURN mailbox._inbox_as_owner(p_inbox, pg_catalog.format(
        'SELECT coalesce(pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(''aggregate_id'', g.aggregate_id,'
        ' ''expected_seq'', g.expected_seq, ''found_seq'', g.found_seq, ''gap_age_sec'', g.gap_age_sec)), ''[]'')'
        ' FROM (%s) AS g', mailbox._inbox_gaps_sql(p_inbox, mailbox._inbox_current_table(p_inbox))));
END
$$;

CREATE FUNCTION mailbox.inbox_ordering_gaps(p_inbox text)
RETURNS TABLE (aggregate_id text, expected_seq bigint, found_seq bigint, gap_age_sec double precision)
LANGUAGE plpgsql STABLE
SECURITY DEFINER -- reads any inbox table (as its owner) and the ordering state for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox := mailbox._inbox_get(p_inbox);
BEGIN
    PERFORM mailbox._inbox_check_table(v_inbox);
    IF v_inbox.ordering_first_sequence IS NULL THEN
        RAISE EXCEPTION 'inbox ordering not enabled: %', p_inbox
            USING ERRCODE = '55000', HINT = 'Enable it with mailbox.enable_inbox_ordering().';
    END IF;
    RETURN QUERY SELECT * FROM mailbox._inbox_gap_rows(v_inbox);
END
$$;
COMMENT ON FUNCTION mailbox.inbox_ordering_gaps(text) IS
'every hole in the sequences of an ordered inbox, including the one after the last processed message';

CREATE FUNCTION mailbox._inbox_tiers_py(p_tiers jsonb)
RETURNS jsonb
LANGUAGE plpython3u IMMUTABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
if GD.get("mailbox.version") != "@EXTVERSION@":
    plpy.execute("SELECT mailbox._python_load()")
from mailbox_server import errors, inbox_tiers
return errors.envelope(plpy, inbox_tiers.validate_sql, p_tiers)
$$;

CREATE FUNCTION mailbox.enable_inbox_priority(
    p_inbox text, p_priority_col text DEFAULT 'priority', p_tiers jsonb DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
    v_tiers jsonb;
BEGIN
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.ordering_first_sequence IS NOT NULL THEN
        PERFORM mailbox._inbox_conflict(p_inbox);
    END IF;
    v_tiers := mailbox._unwrap(mailbox._inbox_tiers_py(p_tiers));
    v_new := v_old;
    v_new.columns := v_old.columns
        || mailbox._inbox_map_column(v_old, 'priority', p_priority_col);
    v_new.priority_tiers := v_tiers;
    UPDATE mailbox._inbox SET columns = v_new.columns, priority_tiers = v_tiers WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
END
$$;
COMMENT ON FUNCTION mailbox.enable_inbox_priority(text, text, jsonb) IS
'claim lower priority values first; one view pending_<inbox>_<tier> per tier';

CREATE FUNCTION mailbox.disable_inbox_priority(p_inbox text, p_if_exists boolean DEFAULT FALSE)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- rebuilds the inbox views and indexes for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_old mailbox._inbox;
    v_new mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_if_exists, 'p_if_exists');
    PERFORM mailbox._ddl_lock();
    v_old := mailbox._inbox_get(p_inbox);
    PERFORM mailbox._inbox_check_table(v_old);
    IF v_old.priority_tiers IS NULL THEN
        IF p_if_exists THEN
            RAISE NOTICE 'inbox priority not enabled, skipping: %', p_inbox;
            RETURN;
        END IF;
        RAISE EXCEPTION 'inbox priority not enabled: %', p_inbox
            USING ERRCODE = '55000', HINT = 'Pass p_if_exists => true to ignore this.';
    END IF;
    v_new := v_old;
    v_new.priority_tiers := NULL;
    UPDATE mailbox._inbox SET priority_tiers = NULL WHERE inbox_key = v_old.inbox_key;
    PERFORM mailbox._inbox_reconfigure(v_old, v_new);
END
$$;
COMMENT ON FUNCTION mailbox.disable_inbox_priority(text, boolean) IS
'stop prioritising an inbox: drops the tier views, claims go back to arrival order';

CREATE FUNCTION mailbox.inbox_is_my_partition(p_aggregate_id text, p_worker_id int, p_total_workers int)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_worker_id IS NULL OR p_total_workers IS NULL THEN
        RAISE EXCEPTION 'p_worker_id and p_total_workers must not be null'
            USING ERRCODE = '22004', HINT = 'Pass this worker''s number (0 to total - 1) and the number of workers.';
    END IF;
    IF p_total_workers <= 0 THEN
        RAISE EXCEPTION 'invalid number of workers: %', p_total_workers
            USING ERRCODE = '22023', HINT = 'p_total_workers is 1 or more.';
    END IF;
    IF p_worker_id < 0 OR p_worker_id >= p_total_workers THEN
        RAISE EXCEPTION 'invalid worker id: % of % workers', p_worker_id, p_total_workers
            USING ERRCODE = '22023', HINT = pg_catalog.format('p_worker_id is 0 to %s.', p_total_workers - 1);
    END IF;
    -- bigint before abs(): abs(-2147483648) does not fit in an int; NULL aggregates are nobody's
    RETURN pg_catalog.abs(pg_catalog.hashtext(p_aggregate_id)::bigint) % p_total_workers = p_worker_id;
END
$$;
COMMENT ON FUNCTION mailbox.inbox_is_my_partition(text, int, int) IS
'true when the aggregate belongs to this worker: abs(hashtext(id)) % total = worker';
