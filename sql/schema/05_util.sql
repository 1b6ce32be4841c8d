-- Part 05, schema: the tables and types of sql/functions/05_util.sql (run once; see
-- docs/development.md, "Schema and functions").

-- Alerts: a durable row for dashboards and a NOTIFY for whoever listens right now.
CREATE TABLE mailbox.alert_log (
    alert_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);
CREATE INDEX alert_log_created_at_idx ON mailbox.alert_log (created_at);
COMMENT ON TABLE mailbox.alert_log IS
'pg_mailbox alerts, also sent as NOTIFY mailbox_alert; drained after mailbox.alert_retention_hours';
SELECT pg_catalog.pg_extension_config_dump('mailbox.alert_log', '');
SELECT pg_catalog.pg_extension_config_dump('mailbox.alert_log_alert_id_seq', '');

-- Table owners' code that pg_mailbox itself runs on the owner's behalf while serving someone
-- else (a snapshot's row reader, maintenance's inbox drains) runs as the owner, but in the
-- session of whoever called pg_mailbox. While it runs, this transaction holds a row here, and
-- mailbox._caller() refuses to name the session's role: that code must not borrow it for
-- pg_mailbox's own checks (per-object grants, table privileges). Soft state: a row lives only
-- as long as its transaction.
CREATE UNLOGGED TABLE mailbox._owner_code_running (
    backend_pid int NOT NULL,
    xact_start timestamptz NOT NULL,
    PRIMARY KEY (backend_pid, xact_start)
);
COMMENT ON TABLE mailbox._owner_code_running IS
'pg_mailbox: transactions in which pg_mailbox runs a table owner''s code for another role';
