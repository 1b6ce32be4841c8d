-- Part 16: publishing events. Runs in the caller's transaction, so the event exists if and
-- only if the caller's business writes commit.

CREATE FUNCTION mailbox._check_headers(p_headers jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_headers IS NULL THEN
        RETURN '{}';
    END IF;
    IF pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION 'invalid headers: expected a JSON object, got %', pg_catalog.jsonb_typeof(p_headers)
            USING ERRCODE = '22023', HINT = 'Pass headers as a JSON object, for example ''{"trace_id": "abc"}''.';
    END IF;
    RETURN p_headers;
END
$$;

CREATE FUNCTION mailbox.outbox_publish(
    p_outbox text,
    p_payload jsonb,
    p_headers jsonb DEFAULT '{}',
    p_key text DEFAULT NULL,
    p_event_type text DEFAULT NULL
)
RETURNS uuid
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- producers write the outbox only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int;
    v_granted boolean;
    v_event uuid;
    v_waiting boolean;
BEGIN
    -- The producer's hot path: two statements (every statement costs an executor start-up,
    -- most of what a publish costs) and no nested helper calls (each one with its own SET
    -- clause costs more than the insert); the helpers run only to raise their errors.
    -- An outbox without grants is open to mailbox_producer.
    SELECT o.outbox_key,
           EXISTS (SELECT 1 FROM mailbox._object_grant AS x
                    WHERE x.object_kind = 'outbox' AND x.object_key = o.outbox_key)
      INTO v_key, v_granted
      FROM mailbox._outbox AS o WHERE o.outbox_name = p_outbox;
    IF NOT FOUND THEN
        v_key := mailbox._outbox_key(p_outbox);
    END IF;
    IF v_granted THEN
        PERFORM mailbox._authorize('outbox', v_key, 'publish');
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'payload must not be null (outbox %)', p_outbox
            USING ERRCODE = '22004', HINT = 'Pass a JSON value; use ''{}'' for an event without data.';
    END IF;
    IF p_headers IS NULL OR pg_catalog.jsonb_typeof(p_headers) <> 'object' THEN
        p_headers := mailbox._check_headers(p_headers);
    END IF;
    INSERT INTO mailbox._outbox_log (outbox_key, event_type, key, headers, payload)
    VALUES (v_key, p_event_type, p_key, p_headers, p_payload)
    RETURNING event_id,
              EXISTS (SELECT 1 FROM mailbox._outbox_waiter AS w
                       WHERE w.outbox_key = v_key AND w.waiting_until > pg_catalog.now())
      INTO v_event, v_waiting;
    -- wake a waiting consumer (part 17); the setting is read only then (a bad value raises)
    IF v_waiting AND mailbox._setting_bool('outbox_notify') THEN
        PERFORM pg_catalog.pg_notify('mailbox_outbox_new', p_outbox);
    END IF;
    RETURN v_event;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_publish(text, jsonb, jsonb, text, text) IS
'publish one event to an outbox in the caller''s transaction; returns its event_id';

CREATE FUNCTION mailbox.outbox_publish_batch(
    p_outbox text,
    p_payloads jsonb[],
    p_headers jsonb DEFAULT '{}',
    p_key text DEFAULT NULL,
    p_event_type text DEFAULT NULL
)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- producers write the outbox only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := mailbox._outbox_key(p_outbox);
    v_headers jsonb := mailbox._check_headers(p_headers);
    v_null_at int;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'publish');
    PERFORM mailbox._require(p_payloads, 'p_payloads');
    SELECT pg_catalog.min(u.i) INTO v_null_at
      FROM pg_catalog.unnest(p_payloads) WITH ORDINALITY AS u (payload, i) WHERE u.payload IS NULL;
    IF v_null_at IS NOT NULL THEN
        RAISE EXCEPTION 'payload must not be null (outbox %, element %)', p_outbox, v_null_at
            USING ERRCODE = '22004', HINT = 'Every element of p_payloads must be a JSON value.';
    END IF;
    IF pg_catalog.cardinality(p_payloads) = 0 THEN
        RETURN;
    END IF;
    -- event ids come back in array order: _id follows the ORDER BY of the inserting SELECT
    RETURN QUERY
    WITH ins AS (
        INSERT INTO mailbox._outbox_log (outbox_key, event_type, key, headers, payload)
        SELECT v_key, p_event_type, p_key, v_headers, u.payload
          FROM pg_catalog.unnest(p_payloads) WITH ORDINALITY AS u (payload, i)
         ORDER BY u.i
        RETURNING _id, event_id
    )
    SELECT ins.event_id FROM ins ORDER BY ins._id;
    PERFORM mailbox._notify_outbox(p_outbox);
END
$$;
COMMENT ON FUNCTION mailbox.outbox_publish_batch(text, jsonb[], jsonb, text, text) IS
'publish several events to an outbox in one statement; returns their event_ids in array order';
