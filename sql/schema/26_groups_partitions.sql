-- Part 26, schema: the tables and types of sql/functions/26_groups_partitions.sql (run once; see
-- docs/development.md, "Schema and functions").

CREATE TABLE mailbox._outbox_partitioning (
    outbox_key int PRIMARY KEY REFERENCES mailbox._outbox (outbox_key) ON DELETE CASCADE,
    partitions int NOT NULL CHECK (partitions BETWEEN 2 AND 256)
);
COMMENT ON TABLE mailbox._outbox_partitioning IS
'pg_mailbox: partition count of the outboxes created with p_partitions > 1';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_partitioning', '');

-- mailbox._partition_lease (part 20): which consumer holds each partition of a group.

CREATE TABLE mailbox._outbox_parked (
    group_name text NOT NULL REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    outbox_id bigint NOT NULL,
    event_id uuid NOT NULL,
    part int NOT NULL,
    reason text,
    parked_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    parked_by text NOT NULL,
    -- a copy of the row: retention may drain the log once the group moved past it
    created_at timestamptz NOT NULL,
    source text,
    event_type text,
    key text,
    headers jsonb NOT NULL,
    inserted_count int NOT NULL,
    deleted_count int NOT NULL,
    is_claim_check boolean NOT NULL,
    full_refresh boolean NOT NULL,
    payload jsonb NOT NULL,
    -- set by outbox_unpark: the row is delivered again (to the holder of its partition)
    unparked_at timestamptz,
    consumer_id text,
    lease_until timestamptz,
    PRIMARY KEY (group_name, outbox_id)
);
COMMENT ON TABLE mailbox._outbox_parked IS
'pg_mailbox: rows a consumer parked (poison), kept until unparked and acknowledged';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox_parked', '');
