-- Part 28: parking poison rows (SPEC §2.3; docs/ordering.md#parking). A parked row is copied
-- into mailbox._outbox_parked (part 26), so retention may drain the log past it; polls skip
-- it; outbox_unpark hands it to a consumer again (the holder of its partition), and that
-- consumer's commit acknowledges it.

CREATE FUNCTION mailbox.outbox_park(p_group text, p_consumer text, p_outbox_id bigint, p_reason text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers record poison rows only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_key int := mailbox._group_outbox(p_group);
    v_part int;
    v_row bigint;
    v_held boolean;
BEGIN
    PERFORM mailbox._authorize('outbox', v_key, 'consume');
    PERFORM mailbox._touch_consumer(p_group, p_consumer);
    PERFORM mailbox._require(p_outbox_id, 'p_outbox_id');
    IF mailbox._group_partitions(p_group, v_key) > 1 THEN
        SELECT r.partition, r.row_id INTO v_part, v_row
          FROM mailbox._partition_rows(v_key, mailbox._group_partitions(p_group, v_key), p_outbox_id - 1, p_outbox_id) AS r;
        v_held := EXISTS (SELECT 1 FROM mailbox._partition_lease AS pl
                           WHERE pl.group_name = p_group AND pl.part = v_part AND pl.consumer_id = p_consumer
                             AND pl.acked_offset < p_outbox_id AND p_outbox_id <= pl.delivered_offset);
    ELSE
        v_part := 0;
        v_row := mailbox._row_at_offset(v_key, p_outbox_id);
        v_held := EXISTS (SELECT 1 FROM mailbox._lease AS l
                           WHERE l.group_name = p_group AND l.consumer_id = p_consumer
                             AND p_outbox_id BETWEEN l.first_offset AND l.last_offset);
    END IF;
    -- an unparked row delivered to this consumer again may be parked again
    v_held := v_held OR EXISTS (SELECT 1 FROM mailbox._outbox_parked AS k
                                 WHERE k.group_name = p_group AND k.outbox_id = p_outbox_id
                                   AND k.consumer_id = p_consumer AND k.unparked_at IS NOT NULL);
    IF NOT v_held THEN
        RAISE EXCEPTION 'row % of group % is not leased to consumer %', p_outbox_id, p_group, p_consumer
            USING ERRCODE = '55000',
                  HINT = 'Park a row this consumer received from mailbox.poll_outbox() and has not committed.';
    END IF;
    INSERT INTO mailbox._outbox_parked AS k (
        group_name, outbox_id, event_id, part, reason, parked_by, created_at, source, event_type, key,
        headers, inserted_count, deleted_count, is_claim_check, full_refresh, payload)
    SELECT p_group, p_outbox_id, l.event_id, v_part, p_reason, p_consumer, l.created_at, l.source,
           l.event_type, l.key, l.headers, l.inserted_count, l.deleted_count, l.is_claim_check,
           l.full_refresh, l.payload
      FROM mailbox._outbox_log AS l
     WHERE l.outbox_key = v_key AND l._id = v_row
    ON CONFLICT (group_name, outbox_id) DO UPDATE
       SET reason = excluded.reason, parked_by = excluded.parked_by, parked_at = pg_catalog.now(),
           unparked_at = NULL, consumer_id = NULL, lease_until = NULL;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_park(text, text, bigint, text) IS
'set aside a row this consumer cannot process: the rows after it in its partition flow again';

CREATE FUNCTION mailbox.outbox_unpark(p_group text, p_outbox_id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER -- consumers release parked rows only through this function
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
BEGIN
    PERFORM mailbox._authorize('outbox', mailbox._group_outbox(p_group), 'consume');
    PERFORM mailbox._require(p_outbox_id, 'p_outbox_id');
    UPDATE mailbox._outbox_parked AS k
       SET unparked_at = pg_catalog.now(), consumer_id = NULL, lease_until = NULL
     WHERE k.group_name = p_group AND k.outbox_id = p_outbox_id AND k.unparked_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'row % of group % is not parked', p_outbox_id, p_group
            USING ERRCODE = '42704', HINT = 'mailbox.outbox_parked lists the parked rows.';
    END IF;
END
$$;
COMMENT ON FUNCTION mailbox.outbox_unpark(text, bigint) IS
'deliver a parked row again (to the consumer holding its partition); acknowledged by that consumer''s commit';
