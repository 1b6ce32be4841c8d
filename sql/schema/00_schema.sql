-- pg_mailbox install script, part 00: roles, schema privileges, shared helpers.
-- The Makefile joins sql/*.sql in lexical order into pg_mailbox--<version>.sql.
-- "SPEC §x" in comments here and in plpython/, client/ and tests/ is a section of
-- docs/spec.md, the product contract shipped with the code.

-- Roles are cluster-wide: a second database installing the extension reuses them, and
-- DROP EXTENSION leaves them in place (other databases may still use them).
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'mailbox_producer') THEN
        CREATE ROLE mailbox_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'mailbox_consumer') THEN
        CREATE ROLE mailbox_consumer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'mailbox_admin') THEN
        CREATE ROLE mailbox_admin NOLOGIN;
    END IF;
END
$roles$;

GRANT mailbox_producer TO mailbox_admin;
GRANT mailbox_consumer TO mailbox_admin;

REVOKE ALL ON SCHEMA mailbox FROM PUBLIC;
GRANT USAGE ON SCHEMA mailbox TO mailbox_admin, mailbox_producer, mailbox_consumer;

COMMENT ON SCHEMA mailbox IS 'pg_mailbox: transactional outbox and inbox';
