-- Part 30, schema: the tables and types of sql/functions/30_inbox_tables.sql (run once; see
-- docs/development.md, "Schema and functions").

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
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- whether mailbox._object_grant has a row for this inbox (part 39 keeps it, under this
    -- row's lock): the data plane's lookup reads it instead of probing the grant table
    has_grants boolean NOT NULL DEFAULT FALSE,
    -- until when a lease that enable_inbox_ordering made carry an aggregate may hold one
    -- whose head is not in flight (part 34, _inbox_hold_in_flight); until then ordered
    -- claims probe each candidate head's aggregate (part 35, builders); NULL: never
    held_until timestamptz
);
COMMENT ON TABLE mailbox._inbox IS 'pg_mailbox catalog: one row per inbox and its column mapping';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox', '');
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_inbox_key_seq', '');

-- A row exists while a message is leased (claimed) or waiting for its retry time. A message
-- is claimable when it has no row, or its row's lease and retry time have both passed.
-- leased_by_pid is the backend that claimed it: inbox_mark_failed has no worker argument
-- (SPEC §3.1), so it tells the lease holder's own failure report (which ends the lease)
-- from a late one of a worker whose lease expired (which must not end another worker's
-- live lease; see docs/design.md §7.1). aggregate_id is the leased message's aggregate,
-- written by the claims of an ordered inbox only (NULL otherwise), on one row per
-- aggregate at most: the message in flight (part 37, _inbox_claim_leases; design.md §7.3).
CREATE TABLE mailbox._inbox_lease (
    inbox_key int NOT NULL,
    event_id text NOT NULL,
    lease_until timestamptz,
    leased_by text,
    next_attempt_at timestamptz,
    leased_by_pid int,
    aggregate_id text,
    PRIMARY KEY (inbox_key, event_id)
) WITH (fillfactor = 70);
CREATE UNIQUE INDEX _inbox_lease_aggregate_idx ON mailbox._inbox_lease (inbox_key, aggregate_id)
    WHERE aggregate_id IS NOT NULL;
COMMENT ON TABLE mailbox._inbox_lease IS
'pg_mailbox: inbox messages that are leased by a worker or wait for their retry time';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_lease', '');

-- Claims not yet settled: one row per inbox_claim call of an open transaction (READ
-- COMMITTED, unordered inbox; see part 37, "claim settle"). A claim locks its messages and
-- writes this one row instead of a lease row per message; at commit a deferred trigger
-- turns the messages still pending into lease rows (the claim outlives its transaction) and
-- deletes the row, so a claim whose messages are marked in its own transaction writes no
-- lease at all. Rows are only ever visible to their own transaction.
-- UNLOGGED: a row never outlives its transaction (settled, so deleted, at its commit), so a
-- crash, which ends every open transaction, loses nothing the table should keep; logged, its
-- insert and delete were the only WAL a claim-and-mark transaction wrote beyond a plain
-- SKIP LOCKED loop's (44 bytes a message at claims of 10, docs/benchmarks.md).
CREATE UNLOGGED TABLE mailbox._inbox_open_claim (
    claim_no bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    inbox_key int NOT NULL,
    event_ids text[] NOT NULL,
    lease_until timestamptz NOT NULL,
    leased_by text NOT NULL,
    leased_by_pid int NOT NULL,
    xact_id xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id()
);
COMMENT ON TABLE mailbox._inbox_open_claim IS
'pg_mailbox: inbox claims of open transactions, settled into leases at commit';
-- Every claim asks whether its transaction has an open claim of the inbox, and batch marks,
-- failure reports and replays look up the open claims of their transaction: by this index on
-- the inbox and the (top-level) transaction that wrote the row, xact_id, compared with
-- pg_current_xact_id_if_assigned(). Not by a scan of a heap that one insert and one delete
-- per claim fill with dead rows between vacuums (80 us of a claim at 5,300 dead rows), nor by
-- an index on the inbox alone: its equal keys were merged into posting lists, which an
-- index scan cannot mark dead until every row in them is, so each probe fetched every dead
-- row of the inbox since the last vacuum from the heap (150 us at 2,000; docs/benchmarks.md).
CREATE INDEX _inbox_open_claim_xact_idx ON mailbox._inbox_open_claim (inbox_key, xact_id);
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

-- Gap state of managed ordered inboxes (part 34, gap state): every gap as of the inbox's last
-- fold, and the aggregates touched since (insert-only, one row per statement with the array
-- of its aggregates and its count changes, written by the inbox table's triggers in the
-- writer's transaction; NULL aggregates mean all of them), the highest sequence per aggregate
-- and the message counts as of that fold. No index on _inbox_gap_touched: it stays small between folds,
-- and the receive path pays one heap insert per statement, nothing more.
CREATE TABLE mailbox._inbox_gap (
    inbox_key int NOT NULL,
    aggregate_id text NOT NULL,
    expected_seq bigint NOT NULL,
    found_seq bigint NOT NULL,
    found_received_at timestamptz,
    PRIMARY KEY (inbox_key, aggregate_id, expected_seq)
);
COMMENT ON TABLE mailbox._inbox_gap IS 'pg_mailbox: ordering gaps of a managed ordered inbox as of its last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_gap', '');

CREATE TABLE mailbox._inbox_gap_touched (
    inbox_key int NOT NULL,
    aggregate_ids text[],
    -- per aggregate of aggregate_ids, the lowest sequence an INSERT added (an appended run can
    -- be folded without re-reading the aggregate); NULL for UPDATE and DELETE
    min_seqs bigint[],
    -- the statement's change of the unprocessed and processed counts (NULL: count again)
    d_unprocessed bigint,
    d_processed bigint
);
COMMENT ON TABLE mailbox._inbox_gap_touched IS
'pg_mailbox: aggregates of managed ordered inboxes whose gaps changed since the last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_gap_touched', '');

-- Per aggregate with unprocessed messages above its position at the last fold, the highest
-- such sequence (an aggregate without a row had none): a later INSERT only above it appends.
CREATE TABLE mailbox._inbox_gap_head (
    inbox_key int NOT NULL,
    aggregate_id text NOT NULL,
    high_seq bigint NOT NULL,
    PRIMARY KEY (inbox_key, aggregate_id)
);
COMMENT ON TABLE mailbox._inbox_gap_head IS
'pg_mailbox: highest unprocessed sequence per aggregate of a managed ordered inbox as of its last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_gap_head', '');

-- The unprocessed and processed message counts of a managed ordered inbox as of its last fold
-- (inbox_health adds the deltas of the touched rows it sees).
CREATE TABLE mailbox._inbox_count (
    inbox_key int PRIMARY KEY,
    unprocessed bigint NOT NULL,
    processed bigint NOT NULL
);
COMMENT ON TABLE mailbox._inbox_count IS
'pg_mailbox: message counts of a managed ordered inbox as of its last fold';
SELECT pg_catalog.pg_extension_config_dump('mailbox._inbox_count', '');
