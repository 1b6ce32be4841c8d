-- Part 90: who may call what (SPEC §0), every grant of the extension's own objects in one
-- place (the per-object grants that inboxes and captured tables get at run time are made by
-- the functions that create them). Runs last so it covers every function above; below the
-- role sections, the grants of each part under its name.

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA mailbox FROM PUBLIC;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA mailbox FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA mailbox FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA mailbox FROM PUBLIC;

-- mailbox_admin: lifecycle, status and maintenance (it is also a producer and a consumer)
GRANT EXECUTE ON FUNCTION
    mailbox.create_outbox(text, int, int, int),
    mailbox.alter_outbox_partitions(text, int),
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

-- 24_groups_numberer.sql: mailbox_admin runs the numberer (the relay and
-- "pg-mailbox numberer" connect as it)
GRANT EXECUTE ON PROCEDURE mailbox.run_numberer(int) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION
    mailbox._numberer_start(int),
    mailbox._numberer_beat(boolean),
    mailbox._numberer_pass(),
    mailbox._numberer_has_waiters()
TO mailbox_admin;

-- 27_groups_partition_commit.sql
GRANT SELECT ON mailbox.consumer_partition_lag, mailbox.outbox_parked TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox._readable_group_outboxes() TO mailbox_consumer;
-- the views of parts 23 and 27 compute partitioned groups' state with these
GRANT EXECUTE ON FUNCTION mailbox._partition_counts(text), mailbox._partitioned_group_offset(text, int)
    TO mailbox_consumer;

-- 28_groups_park.sql
GRANT EXECUTE ON FUNCTION
    mailbox.outbox_park(text, text, bigint, text),
    mailbox.outbox_unpark(text, bigint)
TO mailbox_consumer;

-- 32_inbox_api.sql
GRANT EXECUTE ON FUNCTION mailbox.create_inbox(text, text, int, text, boolean, boolean, int) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.enable_inbox_tracking(text, text, text, text, text, text, text, text, int, text, text)
TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.drop_inbox(text, boolean, boolean) TO mailbox_admin;

-- 33_inbox_messages.sql, 33_inbox_marks.sql
GRANT EXECUTE ON FUNCTION mailbox.inbox_receive(text, text, jsonb, text, text, text, bigint, jsonb, text, int)
TO mailbox_producer;
-- inbox_receive is inlined into its caller, who so calls these with its own rights (part 35,
-- named receive; the named receives themselves are granted with their router's arms)
GRANT EXECUTE ON FUNCTION mailbox._inbox_receive_full(text, text, jsonb, text, text, text, bigint, jsonb, text, int),
    mailbox._inbox_route_receive_named(text, text, jsonb, text, text, text, bigint, jsonb, text, int)
TO mailbox_producer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_claim(text, text, int, int) TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_processed(text, text) TO mailbox_consumer;
-- and inbox_mark_processed(text, text) is inlined the same way (the named marks: likewise)
GRANT EXECUTE ON FUNCTION mailbox._inbox_mark_processed_full(text, text),
    mailbox._inbox_route_processed_named(text, text)
TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_failed(text, text, text, int) TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.replay_inbox_messages(text, text[]) TO mailbox_admin;

-- 34_inbox_ordering.sql
GRANT EXECUTE ON FUNCTION mailbox.enable_inbox_ordering(text, text, text, bigint) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.disable_inbox_ordering(text, boolean) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.inbox_ordering_gaps(text) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.enable_inbox_priority(text, text, jsonb) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.disable_inbox_priority(text, boolean) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.inbox_is_my_partition(text, int, int) TO mailbox_consumer;

-- 37_inbox_batch_api.sql
GRANT EXECUTE ON FUNCTION mailbox.inbox_receive_batch(text, jsonb) TO mailbox_producer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_processed(text, text[]) TO mailbox_consumer;
GRANT EXECUTE ON FUNCTION mailbox.inbox_mark_failed(text, text[], text, int) TO mailbox_consumer;

-- 38_inbox_status.sql
GRANT EXECUTE ON FUNCTION mailbox.inbox_health(text) TO mailbox_admin;
GRANT EXECUTE ON FUNCTION mailbox.inbox_status(text) TO mailbox_admin;

-- 40_maintenance.sql
GRANT EXECUTE ON FUNCTION mailbox.run_maintenance() TO mailbox_admin;
-- 44_schedules.sql
GRANT EXECUTE ON FUNCTION
    mailbox.schedule_maintenance(text),
    mailbox.unschedule_maintenance(),
    mailbox.schedule_numberer(),
    mailbox.unschedule_numberer()
TO mailbox_admin;
