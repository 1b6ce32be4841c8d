-- The end of every upgrade script (scripts/build-upgrade.py), after the functions and the
-- privileges: the code the old version generated per object is rebuilt by the new functions,
-- so an upgraded database runs the new code everywhere (docs/upgrading.md):
--   * a captured table's capture functions and triggers (part 14: _remove_capture, then
--     _install_capture for the table's current owner, as mailbox.repair_outbox_capture());
--   * an inbox's views, indexes and generated functions (part 34, _inbox_reconfigure: what a
--     settings change rebuilds), and its lease view (part 31, _inbox_create_lease_view).
--     Only the views pg_mailbox made are dropped and re-made: a view of the user's that
--     reads one of them makes the update fail (2BP01) and change nothing; drop it before,
--     re-create it after.
--
-- These objects are not extension members (pg_dump dumps them with the tables they belong
-- to), but PostgreSQL makes everything an extension script creates a member, and refuses
-- CREATE OR REPLACE of a non-member in one. So the old objects are dropped, not replaced,
-- and every object that became a member here is released again (ALTER EXTENSION DROP).
DO $regenerate$
DECLARE
    v_ext oid := (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox');
    v_members text[];
    v_key int;
    v_inbox mailbox._inbox;
    v_object record;
BEGIN
    PERFORM mailbox._ddl_lock();
    v_members := ARRAY(
        SELECT d.classid::text || '/' || d.objid::text FROM pg_catalog.pg_depend AS d
         WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = v_ext AND d.deptype = 'e'
    );
    FOR v_key IN
        SELECT o.outbox_key FROM mailbox._outbox AS o
         WHERE o.source_rel IS NOT NULL
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c WHERE c.oid = o.source_rel)
         ORDER BY o.outbox_key
    LOOP
        PERFORM mailbox._remove_capture(v_key);
        PERFORM mailbox._install_capture(v_key);
    END LOOP;
    FOR v_inbox IN SELECT * FROM mailbox._inbox AS i ORDER BY i.inbox_key LOOP
        PERFORM mailbox._inbox_drop_functions(v_inbox);
        EXECUTE pg_catalog.format('DROP VIEW IF EXISTS mailbox.%I', '_inbox_' || v_inbox.inbox_key || '_lease');
        PERFORM mailbox._inbox_create_lease_view(v_inbox);
        PERFORM mailbox._inbox_reconfigure(v_inbox, v_inbox);
    END LOOP;
    FOR v_object IN
        SELECT o.type, o.identity
          FROM pg_catalog.pg_depend AS d,
               LATERAL pg_catalog.pg_identify_object(d.classid, d.objid, d.objsubid) AS o
         WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = v_ext AND d.deptype = 'e'
           AND NOT d.classid::text || '/' || d.objid::text = ANY (v_members)
         ORDER BY 1, 2
    LOOP
        -- identity is pg_identify_object's quoted, schema-qualified name of the object
        EXECUTE pg_catalog.format('ALTER EXTENSION pg_mailbox DROP %s %s', v_object.type, v_object.identity);
    END LOOP;
END
$regenerate$;

-- pg_init_privs: while an extension script runs, PostgreSQL records the whole ACL of every
-- object it GRANTs or REVOKEs on (members or not) as the extension's initial privileges, and
-- pg_dump dumps only the difference from those. The grants above (sql/90_privileges.sql, and
-- _install_capture's on the outbox partitions, the schema and the setting parsers for each
-- captured table's owner) would so record grants made at run time (to table owners and to
-- per-outbox and per-inbox roles) as the extension's own, and a dump would leave them out:
-- the restored capture functions could not run. So, as after a fresh install: the members'
-- and the schema's initial privileges keep only the extension owner's, PUBLIC's and the
-- mailbox_* roles' entries, and objects that are no extension's members have none.
DO $init_privs$
DECLARE
    v_ext oid := (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox');
    v_schema oid := (SELECT e.extnamespace FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox');
    v_own oid[] := ARRAY(
        SELECT r.oid FROM pg_catalog.pg_roles AS r
         WHERE r.rolname IN ('mailbox_admin', 'mailbox_producer', 'mailbox_consumer')
    ) || ARRAY[0::oid, (SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_mailbox')];
BEGIN
    UPDATE pg_catalog.pg_init_privs AS ip
       SET initprivs = ARRAY(
               SELECT a FROM pg_catalog.unnest(ip.initprivs) AS a
                WHERE (SELECT x.grantee FROM pg_catalog.aclexplode(ARRAY[a]) AS x LIMIT 1) = ANY (v_own)
           )
     WHERE ip.privtype = 'e'
       AND ((ip.classoid = 'pg_catalog.pg_namespace'::regclass AND ip.objoid = v_schema)
            OR EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                        WHERE d.classid = ip.classoid AND d.objid = ip.objoid AND d.deptype = 'e'
                          AND d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = v_ext));
    DELETE FROM pg_catalog.pg_init_privs AS ip
     WHERE ip.privtype = 'e'
       AND (ip.initprivs = '{}'::aclitem[]
            OR (NOT (ip.classoid = 'pg_catalog.pg_namespace'::regclass AND ip.objoid = v_schema)
                AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
                                 WHERE d.classid = ip.classoid AND d.objid = ip.objoid AND d.deptype = 'e'
                                   AND d.refclassid = 'pg_catalog.pg_extension'::regclass)));
END
$init_privs$;
