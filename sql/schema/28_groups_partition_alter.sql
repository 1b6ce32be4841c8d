-- Part 28, schema: the tables and types of sql/functions/28_groups_partition_alter.sql (run once; see
-- docs/development.md, "Schema and functions").

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
