-- Part 33 (wake-ups), schema: the table of sql/functions/33_inbox_wakeup.sql (run once; see
-- docs/development.md, "Schema and functions").

-- Workers waiting for a wake-up: their last inbox_claim returned nothing (part 33, wake-ups).
-- Soft state of running sessions, like _outbox_waiter: UNLOGGED, not dumped.
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

-- A bound on every wait above, in whole seconds since the epoch: each wait raises it to 70 s
-- past the moment it was recorded (part 33, wake-ups), and no wait lasts more than 60 s. A
-- named receive (part 35) reads this sequence, which costs no executor start-up, and looks in
-- _inbox_waiter only while the bound is in the future. setval is not transactional and the
-- value only grows: a bound may outlast the waits it covers, never fall short of one.
-- Unlogged where the server has unlogged sequences (PostgreSQL 15): soft state like the
-- waits (a crash empties both), and a raise then adds no WAL flush to an empty claim's commit.
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
