-- The end of every upgrade script (scripts/build-upgrade.py), after the functions and the
-- privileges: the code the old version generated per object is rebuilt by the new functions,
-- so an upgraded database runs the new code everywhere (docs/upgrading.md).
--   * a captured table's capture function and triggers (part 14, _install_capture: CREATE OR
--     REPLACE, owned by the table's current owner, as mailbox.repair_outbox_capture() does);
--   * an inbox's views, indexes and generated functions (part 34, _inbox_reconfigure: what
--     a settings change rebuilds). Only the views pg_mailbox made are dropped and re-made: a
--     view of the user's that reads one of them makes the upgrade fail (DROP VIEW, 2BP01),
--     and nothing is changed.
DO $regenerate$
DECLARE
    v_key int;
    v_inbox mailbox._inbox;
BEGIN
    PERFORM mailbox._ddl_lock();
    FOR v_key IN
        SELECT o.outbox_key FROM mailbox._outbox AS o
         WHERE o.source_rel IS NOT NULL
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = o.source_rel)
         ORDER BY o.outbox_key
    LOOP
        PERFORM mailbox._install_capture(v_key);
    END LOOP;
    FOR v_inbox IN SELECT * FROM mailbox._inbox AS i ORDER BY i.inbox_key LOOP
        PERFORM mailbox._inbox_reconfigure(v_inbox, v_inbox);
    END LOOP;
END
$regenerate$;
