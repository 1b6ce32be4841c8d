-- Part 33, schema: the tables and types of sql/functions/33_inbox_messages.sql (run once; see
-- docs/development.md, "Schema and functions").

-- One claimed message, as inbox_claim returns it (without the lease).
CREATE TYPE mailbox._inbox_message AS (
    event_id text, event_type text, source text, aggregate_id text, sequence_num bigint, priority int,
    payload jsonb, headers jsonb, trace_id text, retry_count int, received_at timestamptz
);
