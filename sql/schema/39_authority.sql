-- Part 39, schema: the tables and types of sql/functions/39_authority.sql (run once; see
-- docs/development.md, "Schema and functions").

CREATE TABLE mailbox._object_grant (
    object_kind text NOT NULL CHECK (object_kind IN ('outbox', 'inbox')),
    object_key int NOT NULL,
    -- regrole: dumped and restored by name, follows a rename, fails closed once dropped
    grantee regrole NOT NULL,
    privilege text NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (object_kind, object_key, privilege, grantee),
    CHECK (
        (object_kind = 'outbox' AND privilege IN ('publish', 'consume'))
        OR (object_kind = 'inbox' AND privilege IN ('receive', 'process'))
    )
);
COMMENT ON TABLE mailbox._object_grant IS
'pg_mailbox: per-outbox and per-inbox grants (grant_outbox, grant_inbox); an object without rows is open';
SELECT pg_catalog.pg_extension_config_dump('mailbox._object_grant', '');
