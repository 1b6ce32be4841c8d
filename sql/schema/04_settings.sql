-- Part 04, schema: the tables and types of sql/functions/04_settings.sql (run once; see
-- docs/development.md, "Schema and functions").

-- The registry is a VALUES list in an IMMUTABLE SQL function rather than a table: it is part
-- of the code of a version (an upgrade replaces it with the functions), it needs no grant to
-- be read by code that runs as a table owner (capture), and the planner inlines it. It has
-- no SET search_path because that would stop the inlining; it references nothing by name.
CREATE TYPE mailbox._setting AS (
    name text, kind text, default_value text, min_value bigint, max_value bigint,
    area text, description text
);
