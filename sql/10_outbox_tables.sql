-- Part 10: the outbox catalog and the log every outbox lives in.
--
-- All outboxes share one LIST-partitioned parent, mailbox._outbox_log; outbox N is its
-- partition mailbox.outbox_<N>. Producers and capture triggers therefore insert with static
-- SQL (cached plans, no per-call dynamic SQL on the hot path) and tuple routing puts the row
-- in outbox_<N>. See docs/design.md for the offset (sequencer) design.

CREATE TABLE mailbox._outbox (
    outbox_key int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    outbox_name text NOT NULL UNIQUE,
    source_rel oid,
    source_name text,
    retention_hours int NOT NULL CHECK (retention_hours >= 0),
    inline_threshold_rows int CHECK (inline_threshold_rows >= 0),
    -- highest offset handed out so far; advanced only by the sequencer under this row's lock
    head_offset bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_drained_at timestamptz,
    last_drained_count bigint
) WITH (fillfactor = 50);
CREATE UNIQUE INDEX _outbox_source_rel_idx ON mailbox._outbox (source_rel) WHERE source_rel IS NOT NULL;
COMMENT ON TABLE mailbox._outbox IS 'pg_mailbox catalog: one row per outbox';
SELECT pg_catalog.pg_extension_config_dump('mailbox._outbox', '');

-- Row keys are global so a claim-check row and its delta rows can be joined without the offset,
-- which a row only gets once it is visible (sequenced).
CREATE SEQUENCE mailbox._outbox_row_seq AS bigint;

CREATE TABLE mailbox._outbox_log (
    outbox_id bigint,
    event_id uuid NOT NULL DEFAULT pg_catalog.gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    source text,
    event_type text,
    key text,
    headers jsonb NOT NULL DEFAULT '{}',
    payload jsonb NOT NULL,
    inserted_count int NOT NULL DEFAULT 0,
    deleted_count int NOT NULL DEFAULT 0,
    is_claim_check boolean NOT NULL DEFAULT false,
    full_refresh boolean NOT NULL DEFAULT false,
    outbox_key int NOT NULL,
    _id bigint NOT NULL DEFAULT pg_catalog.nextval('mailbox._outbox_row_seq'),
    PRIMARY KEY (outbox_key, _id)
) PARTITION BY LIST (outbox_key);
-- offsets: unique per outbox, so even a misused sequencer can never hand out one twice
CREATE UNIQUE INDEX _outbox_log_offset_idx ON mailbox._outbox_log (outbox_key, outbox_id)
    WHERE outbox_id IS NOT NULL;
-- committed rows still waiting for an offset; tiny, since rows leave it once sequenced
CREATE INDEX _outbox_log_unsequenced_idx ON mailbox._outbox_log (outbox_key, _id)
    WHERE outbox_id IS NULL;
COMMENT ON TABLE mailbox._outbox_log IS
'pg_mailbox outbox log; outbox N is partition mailbox.outbox_<N>';

CREATE TABLE mailbox._outbox_delta_rows (
    outbox_key int NOT NULL,
    row_key bigint NOT NULL,
    row_num int NOT NULL,
    op char(1) NOT NULL CHECK (op IN ('I', 'D')),
    payload jsonb NOT NULL,
    PRIMARY KEY (outbox_key, row_key, row_num)
) PARTITION BY LIST (outbox_key);
COMMENT ON TABLE mailbox._outbox_delta_rows IS
'pg_mailbox claim-check rows; outbox N keeps them in partition mailbox.outbox_delta_rows_<N>, '
'whose foreign key to mailbox.outbox_<N> deletes them with their row';

-- Which groups finished reading a claim-check row (group '' = every group), so retention
-- keeps its delta rows until they have been read.
CREATE TABLE mailbox._claim_check_consumed (
    outbox_key int NOT NULL,
    row_key bigint NOT NULL,
    group_name text NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    PRIMARY KEY (outbox_key, row_key, group_name),
    FOREIGN KEY (outbox_key, row_key)
        REFERENCES mailbox._outbox_log (outbox_key, _id) ON DELETE CASCADE
);
COMMENT ON TABLE mailbox._claim_check_consumed IS
'pg_mailbox: claim-check rows that a consumer group (or every group, '''') has read';

-- An outbox by name, or 42704. Used by every function that takes an outbox name.
CREATE FUNCTION mailbox._outbox_key(p_outbox text)
RETURNS int
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
BEGIN
    IF p_outbox IS NULL THEN
        RAISE EXCEPTION 'outbox name must not be null'
            USING ERRCODE = '22004', HINT = 'Pass the name of an outbox (see mailbox.outboxes).';
    END IF;
    SELECT o.outbox_key INTO v_key FROM mailbox._outbox AS o WHERE o.outbox_name = p_outbox;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox not found: %', p_outbox
            USING ERRCODE = '42704',
                  HINT = 'Create it with mailbox.create_outbox() or mailbox.enable_outbox(); mailbox.outboxes lists them.';
    END IF;
    RETURN v_key;
END
$$;
