-- Part 10, schema: the tables and types of sql/functions/10_outbox_tables.sql (run once; see
-- docs/development.md, "Schema and functions").

CREATE TABLE mailbox._outbox (
    outbox_key int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_name text NOT NULL UNIQUE,
    -- regclass, not oid: pg_dump saves the table's name, so a restore points at the new table
    source_rel regclass,
    source_name text,
    retention_hours int NOT NULL CHECK (retention_hours >= 0),
    inline_threshold_rows int CHECK (inline_threshold_rows >= 0),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- Sequencer state, changed only under this row's lock (see _sequence_outbox):
    -- head_offset: highest offset handed out; seq_snapshot: every row visible in it has an
    -- offset; win_snapshot/win_xid/win_id: the window being numbered and how far it got.
    head_offset bigint NOT NULL DEFAULT 0,
    seq_snapshot pg_snapshot NOT NULL DEFAULT '1:1:',
    win_snapshot pg_snapshot,
    win_xid xid8,
    win_id bigint
) WITH (fillfactor = 50);
CREATE UNIQUE INDEX _outbox_source_rel_idx ON mailbox._outbox (source_rel) WHERE source_rel IS NOT NULL;
COMMENT ON TABLE mailbox._outbox IS 'pg_mailbox catalog: one row per outbox';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox', '');
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_outbox_key_seq', '');

-- Row keys are global so a claim-check row and its delta rows can be joined without the offset,
-- which a row only gets once it is visible (sequenced).
CREATE SEQUENCE mailbox._outbox_row_seq AS bigint;
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_row_seq', '');

CREATE TABLE mailbox._outbox_log (
    event_id uuid NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    source text,
    event_type text,
    key text,
    headers jsonb NOT NULL DEFAULT '{}',
    payload jsonb NOT NULL,
    inserted_count int NOT NULL DEFAULT 0,
    deleted_count int NOT NULL DEFAULT 0,
    is_claim_check boolean NOT NULL DEFAULT FALSE,
    full_refresh boolean NOT NULL DEFAULT FALSE,
    outbox_key int NOT NULL,
    _id bigint NOT NULL DEFAULT pg_catalog.nextval('mailbox._outbox_row_seq'),
    -- the producer's top-level transaction: what the sequencer compares with snapshots
    _xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id()
    -- each partition: PRIMARY KEY (outbox_key, _id) and an index on (outbox_key, _xid, _id)
) PARTITION BY LIST (outbox_key);
COMMENT ON TABLE mailbox._outbox_log IS
'pg_mailbox outbox log; outbox N is partition mailbox.outbox_<N>';

CREATE TABLE mailbox._outbox_delta_rows (
    outbox_key int NOT NULL,
    row_key bigint NOT NULL,
    row_num int NOT NULL,
    op char(1) NOT NULL CHECK (op IN ('I', 'D')),
    payload jsonb NOT NULL
    -- each partition: PRIMARY KEY (outbox_key, row_key, row_num)
) PARTITION BY LIST (outbox_key);
COMMENT ON TABLE mailbox._outbox_delta_rows IS
'pg_mailbox claim-check rows; outbox N keeps them in partition mailbox.outbox_delta_rows_<N>, '
'whose foreign key to mailbox.outbox_<N> deletes them with their row';

-- Offsets: the sequencer numbers rows in chunks. Chunk (base_offset, ids) gives offsets
-- base_offset + 1 .. base_offset + cardinality(ids) to the rows whose keys are ids, in order.
-- Numbering writes one small row per chunk instead of rewriting every outbox row.
CREATE TABLE mailbox._outbox_chunk (
    outbox_key int NOT NULL REFERENCES mailbox._outbox (outbox_key) ON DELETE CASCADE,
    base_offset bigint NOT NULL,
    row_count int NOT NULL CHECK (row_count > 0),
    ids bigint[] NOT NULL,
    -- ids are first_id, first_id + 1, ... in order: read with one index range scan
    dense boolean NOT NULL,
    first_id bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (outbox_key, base_offset)
);
COMMENT ON TABLE mailbox._outbox_chunk IS 'pg_mailbox: offsets of outbox rows, one row per numbered chunk';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_chunk', '');

-- Retention state lives apart from mailbox._outbox so that maintenance never holds the row
-- the sequencer locks.
CREATE TABLE mailbox._outbox_retention (
    outbox_key int PRIMARY KEY REFERENCES mailbox._outbox (outbox_key) ON DELETE CASCADE,
    -- every offset at or below low_offset has been drained
    low_offset bigint NOT NULL DEFAULT 0,
    last_drained_at timestamptz,
    last_drained_count bigint,
    storage_alerted boolean NOT NULL DEFAULT FALSE
);
COMMENT ON TABLE mailbox._outbox_retention IS 'pg_mailbox: retention progress per outbox';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_retention', '');

-- Which groups finished reading a claim-check row (group '' = every group), so retention
-- keeps its delta rows until they have been read.
CREATE TABLE mailbox._claim_check_consumed (
    outbox_key int NOT NULL,
    row_key bigint NOT NULL,
    group_name text NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- no foreign key to the log: it would forbid TRUNCATE of a drained outbox; retention
    -- and drop_outbox delete these rows with theirs
    PRIMARY KEY (outbox_key, row_key, group_name)
);
COMMENT ON TABLE mailbox._claim_check_consumed IS
'pg_mailbox: claim-check rows that a consumer group (or every group, '''') has read';
SELECT pg_catalog.pg_extension_config_dump('mailbox._claim_check_consumed', '');
