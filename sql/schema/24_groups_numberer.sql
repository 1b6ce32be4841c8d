-- Part 24, schema: the tables and types of sql/functions/24_groups_numberer.sql (run once; see
-- docs/development.md, "Schema and functions").

-- Written only by mailbox._numberer_beat() (a definer), one row; UNLOGGED: it means nothing
-- after a crash, and its updates cost no WAL.
CREATE UNLOGGED TABLE mailbox._numberer_heartbeat (
    singleton boolean PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    pid int NOT NULL,
    beat_at timestamptz
);
-- dumped like every extension table (tests/upgrade/test_dump_restore.py); a restored beat is older
-- than 2 s, so it means nothing
SELECT pg_catalog.pg_extension_config_dump('mailbox._numberer_heartbeat', '');
