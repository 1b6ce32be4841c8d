-- Part 20: consumer groups over an outbox (SPEC §2).

CREATE TABLE mailbox._consumer_group (
    group_name text PRIMARY KEY,
    outbox_key int NOT NULL REFERENCES mailbox._outbox (outbox_key) ON DELETE CASCADE,
    auto_offset_reset text NOT NULL CHECK (auto_offset_reset IN ('earliest', 'latest')),
    -- every row with an offset at or below this one is acknowledged by the group
    group_offset bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX _consumer_group_outbox_idx ON mailbox._consumer_group (outbox_key);
COMMENT ON TABLE mailbox._consumer_group IS 'pg_mailbox catalog: consumer groups and their offsets';
SELECT pg_catalog.pg_extension_config_dump('mailbox._consumer_group', '');
