-- Part 30: the inbox catalog and the side tables every inbox shares (SPEC §3).
--
-- An inbox is a table (made by create_inbox, or an existing one adopted by
-- enable_inbox_tracking) plus a catalog row that maps the inbox's roles (event_id,
-- processed_at, ...) to that table's column names. Every inbox function reads the mapping;
-- no function hard-codes a column name of an inbox table. Leases, retry times, ordering state
-- and alert bookkeeping live in the side tables below for managed and adopted inboxes alike,
-- so an adopted table's columns are never altered (see docs/inbox.md).
--
-- The side tables reference the catalog by inbox_key without a foreign key on purpose: a
-- foreign key check would take a KEY SHARE lock on the catalog row on every claim, and
-- concurrent claimers would turn that row into a multixact hot spot. drop_inbox deletes the
-- side rows itself.

CREATE TABLE mailbox._inbox (
    inbox_key int GENERATED ALWAYS AS IDENTITY UNIQUE,
    inbox_name text PRIMARY KEY,
    table_rel regclass NOT NULL UNIQUE,
    schema_name text NOT NULL,
    table_name text NOT NULL,
    is_managed boolean NOT NULL,
    -- role -> column name, e.g. {"event_id": "msg_id", "processed_at": "done_at"}; a role
    -- without a column (adopted tables) is absent
    columns jsonb NOT NULL,
    -- roles whose text argument is CAST to the column's type: role -> format_type() of the
    -- column (a uuid or integer id, say); catalog output, never caller text
    casts jsonb NOT NULL DEFAULT '{}',
    max_retries int NOT NULL CHECK (max_retries >= 1),
    -- processed-row retention; NULL means mailbox.inbox_processed_retention_hours
    retention_hours int CHECK (retention_hours >= 0),
    schedule text,
    with_dead_letter boolean NOT NULL DEFAULT TRUE,
    with_stats boolean NOT NULL DEFAULT TRUE,
    -- ordering: NULL when off, else the first sequence number of a new aggregate
    ordering_first_sequence bigint,
    -- priority: NULL when off, else the validated tiers [{"name", "min", "max"}, ...]
    priority_tiers jsonb,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE mailbox._inbox IS 'pg_mailbox catalog: one row per inbox and its column mapping';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox', '');
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_inbox_key_seq', '');

-- A row exists while a message is leased (claimed) or waiting for its retry time. A message
-- is claimable when it has no row, or its row's lease and retry time have both passed.
-- leased_by_pid is the backend that claimed it: inbox_mark_failed has no worker argument
-- (SPEC §3.1), so it tells the lease holder's own failure report (which ends the lease)
-- from a late one of a worker whose lease expired (which must not end another worker's
-- live lease; see docs/inbox.md).
CREATE TABLE mailbox._inbox_lease (
    inbox_key int NOT NULL,
    event_id text NOT NULL,
    lease_until timestamptz,
    leased_by text,
    next_attempt_at timestamptz,
    leased_by_pid int,
    PRIMARY KEY (inbox_key, event_id)
) WITH (fillfactor = 70);
COMMENT ON TABLE mailbox._inbox_lease IS
'pg_mailbox: inbox messages that are leased by a worker or wait for their retry time';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_lease', '');

-- Claims not yet settled: one row per inbox_claim call of an open transaction (READ
-- COMMITTED, unordered inbox; see part 37, "claim settle"). A claim locks its messages and
-- writes this one row instead of a lease row per message; at commit a deferred trigger
-- turns the messages still pending into lease rows (the claim outlives its transaction) and
-- deletes the row, so a claim whose messages are marked in its own transaction writes no
-- lease at all. Rows are only ever visible to their own transaction.
CREATE TABLE mailbox._inbox_open_claim (
    claim_no bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    inbox_key int NOT NULL,
    event_ids text[] NOT NULL,
    lease_until timestamptz NOT NULL,
    leased_by text NOT NULL,
    leased_by_pid int NOT NULL
);
COMMENT ON TABLE mailbox._inbox_open_claim IS
'pg_mailbox: inbox claims of open transactions, settled into leases at commit';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_open_claim', '');
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_open_claim_claim_no_seq', '');

-- Ordering state: the highest sequence processed per aggregate. Ordering reads this instead
-- of the processed history, so its cost does not grow with history (and survives retention).
CREATE TABLE mailbox._inbox_aggregate (
    inbox_key int NOT NULL,
    aggregate_id text NOT NULL,
    last_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (inbox_key, aggregate_id)
) WITH (fillfactor = 70);
COMMENT ON TABLE mailbox._inbox_aggregate IS
'pg_mailbox: highest processed sequence number per aggregate of an ordered inbox';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_aggregate', '');

-- Messages that reached the dead-letter queue and were not yet announced; run_maintenance()
-- turns them into inbox_dlq_message / inbox_dlq_batch alerts and deletes them.
CREATE TABLE mailbox._inbox_dlq_event (
    event_no bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    inbox_key int NOT NULL,
    event_id text NOT NULL,
    error text,
    retry_count int,
    dead_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
COMMENT ON TABLE mailbox._inbox_dlq_event IS
'pg_mailbox: dead letters waiting to be announced by run_maintenance()';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_dlq_event', '');
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_dlq_event_event_no_seq', '');

-- Ordering gaps already announced, so inbox_ordering_gap fires once per gap.
CREATE TABLE mailbox._inbox_gap_alert (
    inbox_key int NOT NULL,
    aggregate_id text NOT NULL,
    expected_seq bigint NOT NULL,
    alerted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (inbox_key, aggregate_id, expected_seq)
);
COMMENT ON TABLE mailbox._inbox_gap_alert IS 'pg_mailbox: ordering gaps already announced';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_gap_alert', '');

-- An inbox's catalog row by name, or 42704 (22004 for NULL). Every inbox function starts here.
CREATE FUNCTION mailbox._inbox_get(p_inbox text)
RETURNS mailbox._inbox
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_inbox mailbox._inbox;
BEGIN
    IF p_inbox IS NULL THEN
        RAISE EXCEPTION 'inbox name must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the name of an inbox (see mailbox.inbox_status()).';
    END IF;
    SELECT * INTO v_inbox FROM mailbox._inbox AS i WHERE i.inbox_name = p_inbox;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'inbox not found: %', p_inbox
            USING ERRCODE = '42704',
                  HINT = 'Create it with mailbox.create_inbox() or mailbox.enable_inbox_tracking(); '
                         'mailbox.inbox_status() lists them.';
    END IF;
    RETURN v_inbox;
END
$$;

-- The role whose rights the inbox's generated functions and views run with: its table's owner
-- (docs/inbox.md, "Whose rights run what").
CREATE FUNCTION mailbox._inbox_owner(p_inbox mailbox._inbox)
RETURNS name
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.pg_get_userbyid(c.relowner) FROM pg_catalog.pg_class AS c WHERE c.oid = p_inbox.table_rel;
$$;

-- The inbox's own table (table_rel) under its current name, quoted; NULL when it was dropped.
-- The control plane reads a renamed inbox's table by this name, never by the stored one.
CREATE FUNCTION mailbox._inbox_current_table(p_inbox mailbox._inbox)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_inbox.table_rel;
$$;

-- Raises 55000 for an inbox whose stored schema.table no longer names its table (table_rel):
-- the table was renamed, moved to another schema, dropped, or another table took its name.
-- The generated functions (part 35) address the table by that name for speed, so the
-- per-message functions compare to_regclass(stored name) with table_rel on every call (one
-- name lookup) and call this only on a mismatch; nothing is ever read from or written to a
-- table that merely took the old name (docs/inbox.md, "Renaming an inbox table").
CREATE FUNCTION mailbox._inbox_table_moved(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_now text;
BEGIN
    SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) INTO v_now
      FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = p_inbox.table_rel;
    IF v_now IS NULL THEN
        RAISE EXCEPTION 'inbox table of inbox % was dropped', p_inbox.inbox_name
            USING ERRCODE = '55000',
                  DETAIL = pg_catalog.format('The inbox was made for table %s, which no longer exists.',
                                             pg_catalog.format('%I.%I', p_inbox.schema_name, p_inbox.table_name)),
                  HINT = 'Drop the inbox with mailbox.drop_inbox().';
    END IF;
    RAISE EXCEPTION 'inbox table of inbox % was renamed', p_inbox.inbox_name
        USING ERRCODE = '55000',
              DETAIL = pg_catalog.format('The inbox table %s is now %s; pg_mailbox never uses a table that '
                                         'merely took the old name.',
                                         pg_catalog.format('%I.%I', p_inbox.schema_name, p_inbox.table_name), v_now),
              HINT = pg_catalog.format('Rename the table back to %s, or drop the inbox with mailbox.drop_inbox() '
                                       '(without p_cascade the table is kept) and adopt %s with '
                                       'mailbox.enable_inbox_tracking().',
                                       pg_catalog.format('%I.%I', p_inbox.schema_name, p_inbox.table_name), v_now);
END
$$;

-- The same check for the control plane: raises 55000 (above) unless the stored name still
-- names the inbox's table.
CREATE FUNCTION mailbox._inbox_check_table(p_inbox mailbox._inbox)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    IF pg_catalog.to_regclass(pg_catalog.format('%I.%I', p_inbox.schema_name, p_inbox.table_name))
       IS DISTINCT FROM p_inbox.table_rel THEN
        PERFORM mailbox._inbox_table_moved(p_inbox);
    END IF;
END
$$;

-- The column mapped to a role, quoted for dynamic SQL as alias.column, or NULL when the role
-- has no column. Identifiers only ever reach SQL text through format('%I').
CREATE FUNCTION mailbox._inbox_col(p_columns jsonb, p_role text, p_alias text DEFAULT 't')
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_columns ->> p_role IS NOT NULL
                THEN pg_catalog.format('%I.%I', p_alias, p_columns ->> p_role) END;
$$;

-- A select-list item for a role: the mapped column cast to the API type, or a typed NULL.
-- p_type is one of the fixed API types written in this file's callers, never caller text.
CREATE FUNCTION mailbox._inbox_item(p_columns jsonb, p_role text, p_type text, p_alias text DEFAULT 't')
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.format('CAST(%s AS %s)',
                             coalesce(mailbox._inbox_col(p_columns, p_role, p_alias), 'NULL'), p_type);
$$;

-- A bind parameter for a role's value: $n, or CAST($n AS <column type>) when the column does
-- not take text by assignment (see casts above).
CREATE FUNCTION mailbox._inbox_param(p_inbox mailbox._inbox, p_role text, p_n int, p_array boolean DEFAULT FALSE)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_inbox.casts ? p_role
                THEN pg_catalog.format('CAST($%s AS %s%s)', p_n, p_inbox.casts ->> p_role,
                                       CASE WHEN p_array THEN '[]' ELSE '' END)
                ELSE '$' || p_n END;
$$;
