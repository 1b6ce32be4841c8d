-- Schema delta 0.1.0 -> 0.2.0, run first by pg_mailbox--0.1.0--0.2.0.sql (`make migration`;
-- docs/development.md, "Schema and functions"). Everything sql/functions/ re-creates is
-- re-created after this; what goes here is what CREATE OR REPLACE cannot do:
--   * new tables, columns (at the end, as in sql/schema/), types, indexes, sequences, their
--     pg_extension_config_dump() calls and comments, new roles;
--   * DROP FUNCTION / DROP VIEW of objects 0.2.0 removes, renames, or whose result type,
--     parameter names or defaults change (re-created afterwards from sql/functions/);
--   * moving data between changed tables.
-- Released upgrade scripts never change; this one may until 0.2.0 is released.

-- New tables (sql/schema/, with their comments and config_dump calls).

-- Issue 11: whether an inbox has per-object grants, kept by _set_grant (part 39), read by the
-- data plane's lookup instead of a probe of _object_grant.
ALTER TABLE mailbox._inbox ADD COLUMN has_grants boolean NOT NULL DEFAULT FALSE;
ALTER TABLE mailbox._inbox ADD COLUMN held_until timestamptz;
UPDATE mailbox._inbox AS i
   SET has_grants = TRUE
 WHERE EXISTS (SELECT 1 FROM mailbox._object_grant AS g WHERE g.object_kind = 'inbox' AND g.object_key = i.inbox_key);
-- Issue 11: a transaction's open claims looked up by inbox and transaction through an index
-- (part 30), not a heap of dead rows. The table is empty outside open transactions.
ALTER TABLE mailbox._inbox_open_claim ADD COLUMN xact_id xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id();
CREATE INDEX _inbox_open_claim_xact_idx ON mailbox._inbox_open_claim (inbox_key, xact_id);
-- Issue 11: open claims write no WAL (part 30: a row never outlives its transaction; the table
-- is empty outside open transactions, so the rewrite is instant).
ALTER TABLE mailbox._inbox_open_claim SET UNLOGGED;
-- Issue 11: the aggregate of an ordered inbox's lease, one row per aggregate at most (part 37,
-- _inbox_claim_leases). A lease taken before the update has none: it still counts in every
-- claim's scan, only not in the re-read after the aggregate's lock, until it ends.
ALTER TABLE mailbox._inbox_lease ADD COLUMN aggregate_id text;
CREATE UNIQUE INDEX _inbox_lease_aggregate_idx ON mailbox._inbox_lease (inbox_key, aggregate_id)
    WHERE aggregate_id IS NOT NULL;

-- Issue 11: gap state of managed ordered inboxes (part 34, gap state): every gap as of the inbox's last
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

-- Issue 11: inbox workers waiting for a wake-up (part 33): receivers notify only while one is.
CREATE UNLOGGED TABLE mailbox._inbox_waiter (
    inbox_key int NOT NULL,
    -- one row per connection, not per worker name: several connections may claim under one
    -- name, and each writes only its own row, so no claimer ever waits for another's
    backend_pid int NOT NULL,
    worker text NOT NULL,
    waiting_until timestamptz NOT NULL,
    PRIMARY KEY (inbox_key, backend_pid)
);
COMMENT ON TABLE mailbox._inbox_waiter IS
'pg_mailbox: inbox workers waiting for a wake-up (their last claim was empty); receivers notify only while one is';
-- Issue 11: a bound on every wait, which a named receive reads before it looks for waiters.
CREATE SEQUENCE mailbox._inbox_waiting_until;
DO $$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::int >= 150000 THEN
        ALTER SEQUENCE mailbox._inbox_waiting_until SET UNLOGGED;
    END IF;
END
$$;
COMMENT ON SEQUENCE mailbox._inbox_waiting_until IS
'pg_mailbox: seconds since the epoch until which some inbox worker may be waiting for a wake-up';

-- Issue 13: groups still draining their old layout after alter_outbox_partitions (part 28).
CREATE TABLE mailbox._partition_change (
    group_name text PRIMARY KEY REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    -- the count this group still uses, for the rows up to boundary
    partitions int NOT NULL CHECK (partitions BETWEEN 1 AND 256),
    boundary bigint NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE mailbox._partition_change IS
'pg_mailbox: groups still draining their old partition layout after alter_outbox_partitions';
SELECT pg_catalog.pg_extension_config_dump('mailbox._partition_change', '');

-- Functions 0.2.0 no longer has (issue 12: the inbox role registry, _check_user_table): the
-- re-created parts would leave them behind.
DROP FUNCTION mailbox._check_capturable(oid);
DROP FUNCTION mailbox._inbox_map_column(mailbox._inbox, text, text, text[]);
DROP FUNCTION mailbox._inbox_tracking_py(oid, jsonb, jsonb);
