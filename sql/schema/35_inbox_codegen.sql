-- Part 35, schema: the tables and types of sql/functions/35_inbox_codegen.sql (run once; see
-- docs/development.md, "Schema and functions").

-- What the generated processed function returns: the id of the message it marked (NULL when
-- none) and, for ordering, its aggregate and sequence.
CREATE TYPE mailbox._inbox_done AS (event_id text, aggregate_id text, sequence_num bigint);

-- What the generated failed function returns: the id and new retry count of the message whose
-- failure it counted, or no id and why not ('missing', 'processed', 'dead').
CREATE TYPE mailbox._inbox_attempt AS (event_id text, retry_count int, state text);
