-- make installcheck: the installed extension loads and reports the control file's version.
CREATE EXTENSION pg_mailbox CASCADE;
SELECT nspname FROM pg_namespace WHERE nspname = 'mailbox';
-- Compared with the installed control file, so the expected output survives version bumps.
SELECT e.extversion = a.default_version AS is_default_version
FROM pg_extension AS e JOIN pg_available_extensions AS a ON a.name = e.extname
WHERE e.extname = 'pg_mailbox';
SELECT count(*) > 0 AS has_functions FROM pg_proc WHERE pronamespace = 'mailbox'::regnamespace;
DROP EXTENSION pg_mailbox;
