-- Part 17, schema: the tables and types of sql/functions/17_outbox_wakeup.sql (run once; see
-- docs/development.md, "Schema and functions").

CREATE UNLOGGED TABLE mailbox._outbox_waiter (
    outbox_key int NOT NULL,
    group_name text NOT NULL,
    consumer_id text NOT NULL,
    waiting_until timestamptz NOT NULL,
    PRIMARY KEY (outbox_key, group_name, consumer_id)
);
COMMENT ON TABLE mailbox._outbox_waiter IS
'pg_mailbox: consumers waiting for a wake-up (their last poll was empty); producers notify only while one is';
