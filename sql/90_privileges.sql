-- Part 90: who may call what (SPEC §0). Runs last so it covers every function above.

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA mailbox FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA mailbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA mailbox FROM PUBLIC;

-- mailbox_admin: lifecycle, status and maintenance (it is also a producer and a consumer)
GRANT EXECUTE ON FUNCTION
    mailbox.create_outbox(text, int, int, int),
    mailbox.enable_outbox(text, int, int, text, boolean, int),
    mailbox._check_partitions(int),
    mailbox._set_outbox_partitions(text, int),
    mailbox._enable_outbox(oid, int, int, text),
    mailbox.disable_outbox(text, boolean),
    mailbox.drop_outbox(text, boolean),
    mailbox.outbox_snapshot(text),
    mailbox.repair_outbox_capture(text),
    mailbox.grant_outbox(text, regrole, text),
    mailbox.revoke_outbox(text, regrole, text),
    mailbox.grant_inbox(text, regrole, text),
    mailbox.revoke_inbox(text, regrole, text),
    mailbox.outbox_status(text),
    mailbox.create_consumer_group(text, text, text),
    mailbox.drop_consumer_group(text, boolean)
TO mailbox_admin;
GRANT SELECT ON mailbox.outboxes, mailbox.alert_log, mailbox.object_grants TO mailbox_admin;

-- mailbox_producer: publishing
GRANT EXECUTE ON FUNCTION
    mailbox.outbox_publish(text, jsonb, jsonb, text, text),
    mailbox.outbox_publish_batch(text, jsonb[], jsonb, text, text)
TO mailbox_producer;

-- mailbox_consumer: reading
GRANT EXECUTE ON FUNCTION
    mailbox.outbox_delta_rows(text, bigint, int, int),
    mailbox.outbox_rows_consumed(text, bigint, text),
    mailbox.poll_outbox(text, text, int, int),
    mailbox.commit_offset(text, text, bigint),
    mailbox.extend_lease(text, text, int),
    mailbox.seek_offset(text, text, bigint),
    mailbox.consumer_heartbeat(text, text),
    mailbox.consumer_lag(text)
TO mailbox_consumer;
GRANT SELECT ON mailbox.consumer_status, mailbox.consumer_group_lag, mailbox.consumer_active_leases
TO mailbox_consumer;
