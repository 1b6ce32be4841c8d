-- Schema delta 0.1.0 -> 0.2.0, run first by pg_mailbox--0.1.0--0.2.0.sql (`make migration`;
-- docs/development.md, "Schema and functions"). Everything sql/functions/ re-creates is
-- re-created after this; what goes here is what CREATE OR REPLACE cannot do:
--   * new tables, columns (at the end, as in sql/schema/), types, indexes, sequences, their
--     pg_extension_config_dump() calls and comments, new roles;
--   * DROP FUNCTION / DROP VIEW of objects 0.2.0 removes, renames, or whose result type,
--     parameter names or defaults change (re-created afterwards from sql/functions/);
--   * moving data between changed tables.
-- Released upgrade scripts never change; this one may until 0.2.0 is released.

-- 0.2.0 changes no table, type or role of 0.1.0.

-- Functions 0.2.0 no longer has (issue 12: the inbox role registry, _check_user_table): the
-- re-created parts would leave them behind.
DROP FUNCTION mailbox._check_capturable(oid);
DROP FUNCTION mailbox._inbox_map_column(mailbox._inbox, text, text, text[]);
DROP FUNCTION mailbox._inbox_tracking_py(oid, jsonb, jsonb);
