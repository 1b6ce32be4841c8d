-- Part 20, schema: the tables and types of sql/functions/20_groups.sql (run once; see
-- docs/development.md, "Schema and functions").

CREATE TABLE mailbox._consumer_group (
    group_name text PRIMARY KEY,
    outbox_key int NOT NULL REFERENCES mailbox._outbox (outbox_key) ON DELETE CASCADE,
    auto_offset_reset text NOT NULL CHECK (auto_offset_reset IN ('earliest', 'latest')),
    group_offset bigint NOT NULL,
    delivered_offset bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CHECK (group_offset <= delivered_offset)
) WITH (fillfactor = 50);
CREATE INDEX _consumer_group_outbox_idx ON mailbox._consumer_group (outbox_key);
COMMENT ON TABLE mailbox._consumer_group IS 'pg_mailbox catalog: consumer groups and their offsets';
SELECT pg_catalog.pg_extension_config_dump('mailbox._consumer_group', '');

CREATE TABLE mailbox._consumer (
    group_name text NOT NULL REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    consumer_id text NOT NULL,
    committed_offset bigint NOT NULL DEFAULT 0,
    registered_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_commit_at timestamptz,
    -- set when maintenance reported this consumer unhealthy, cleared by its next heartbeat
    unhealthy_since timestamptz,
    -- set when maintenance reaped it (silent past the dead threshold; leases released)
    reaped_at timestamptz,
    PRIMARY KEY (group_name, consumer_id)
) WITH (fillfactor = 50);
COMMENT ON TABLE mailbox._consumer IS 'pg_mailbox: consumers of each group, registered by their first poll';
SELECT pg_catalog.pg_extension_config_dump('mailbox._consumer', '');

-- Offset ranges taken from a consumer after its lease expired: its next commit covering
-- one warns 'lease lost'; a range it takes back later is removed, so that commit does not.
-- A table of its own, so a takeover never locks the old holder's consumer row (which that
-- consumer's own poll may hold while it waits for the group: a deadlock).
CREATE TABLE mailbox._lost_lease (
    group_name text NOT NULL,
    consumer_id text NOT NULL,
    first_offset bigint NOT NULL,
    last_offset bigint NOT NULL,
    PRIMARY KEY (group_name, consumer_id, first_offset),
    CHECK (first_offset <= last_offset),
    FOREIGN KEY (group_name, consumer_id)
        REFERENCES mailbox._consumer (group_name, consumer_id) ON DELETE CASCADE
);
COMMENT ON TABLE mailbox._lost_lease IS
'pg_mailbox: offset ranges taken over from a consumer, for its lease-lost warning';
SELECT pg_catalog.pg_extension_config_dump('mailbox._lost_lease', '');

-- A lease row with consumer_id and lease_until NULL is a slot: offsets the background numberer
-- (part 24) handed to the group, not yet claimed by a poll. Polls claim slots and expired
-- leases with FOR UPDATE SKIP LOCKED, so a consumer whose poll transaction stays open holds
-- only the rows it claimed (SPEC §2.2.4; docs/design.md §5).
CREATE TABLE mailbox._lease (
    group_name text NOT NULL REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    first_offset bigint NOT NULL,
    last_offset bigint NOT NULL,
    consumer_id text,
    lease_until timestamptz,
    PRIMARY KEY (group_name, first_offset),
    CHECK (first_offset <= last_offset),
    CHECK ((consumer_id IS NULL) = (lease_until IS NULL))
) WITH (fillfactor = 70);
CREATE INDEX _lease_consumer_idx ON mailbox._lease (group_name, consumer_id);
COMMENT ON TABLE mailbox._lease IS 'pg_mailbox: offset ranges leased to consumers, deleted when acknowledged';
SELECT pg_catalog.pg_extension_config_dump('mailbox._lease', '');

-- Groups of a partitioned outbox (parts 26, 27) lease partitions, not offset ranges.
CREATE TABLE mailbox._partition_lease (
    group_name text NOT NULL REFERENCES mailbox._consumer_group (group_name) ON DELETE CASCADE,
    part int NOT NULL,
    consumer_id text,
    lease_until timestamptz,
    -- every row of the partition at or below acked_offset is acknowledged; rows in
    -- (acked_offset, delivered_offset] are in flight to consumer_id
    acked_offset bigint NOT NULL,
    delivered_offset bigint NOT NULL,
    PRIMARY KEY (group_name, part),
    CHECK (acked_offset <= delivered_offset)
) WITH (fillfactor = 50);
COMMENT ON TABLE mailbox._partition_lease IS
'pg_mailbox: which consumer of a group holds each partition, and its offsets';
SELECT pg_catalog.pg_extension_config_dump('mailbox._partition_lease', '');
