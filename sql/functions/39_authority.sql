-- Part 39: per-object authority (SPEC §0). The role-level grants (mailbox_producer,
-- mailbox_consumer) say which functions a role may call; these grants say which outboxes and
-- inboxes it may use them on. An object with no grant at all stays open to the role-level
-- grants, so outboxes and inboxes made before their first grant keep working unchanged.

-- 42501 unless the caller may use the object this way. Called by the public SECURITY DEFINER
-- functions right after they looked the object up; the common case (an object without
-- grants) costs one index probe.
CREATE FUNCTION mailbox._authorize(p_kind text, p_key int, p_privilege text)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_caller name;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailbox._object_grant AS g
                    WHERE g.object_kind = p_kind AND g.object_key = p_key) THEN
        RETURN;
    END IF;
    v_caller := mailbox._caller();
    IF pg_catalog.pg_has_role(v_caller, 'mailbox_admin', 'MEMBER') THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM mailbox._object_grant AS g
                WHERE g.object_kind = p_kind AND g.object_key = p_key AND g.privilege = p_privilege
                  AND pg_catalog.pg_has_role(v_caller, g.grantee::oid, 'MEMBER')) THEN
        RETURN;
    END IF;
    RAISE EXCEPTION 'permission denied to % % %: %', p_privilege, p_kind,
                    mailbox._object_name(p_kind, p_key), v_caller
        USING ERRCODE = '42501',
              DETAIL = pg_catalog.format('This %s has per-object grants, and role %s holds no %s grant on it.',
                                         p_kind, v_caller, p_privilege),
              HINT = pg_catalog.format('A member of mailbox_admin can run mailbox.grant_%s(%s, %s, %s).',
                                       p_kind, pg_catalog.quote_literal(mailbox._object_name(p_kind, p_key)),
                                       pg_catalog.quote_literal(v_caller), pg_catalog.quote_literal(p_privilege));
END
$$;

CREATE FUNCTION mailbox._object_name(p_kind text, p_key int)
RETURNS text
LANGUAGE sql STABLE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT CASE p_kind
        WHEN 'outbox' THEN (SELECT o.outbox_name FROM mailbox._outbox AS o WHERE o.outbox_key = p_key)
        ELSE (SELECT i.inbox_name FROM mailbox._inbox AS i WHERE i.inbox_key = p_key)
    END;
$$;

-- Dropping an outbox or inbox forgets its grants, so a new object of the same name starts open.
CREATE FUNCTION mailbox._forget_grants(p_kind text, p_key int)
RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    DELETE FROM mailbox._object_grant AS g WHERE g.object_kind = p_kind AND g.object_key = p_key;
$$;

-- grant_* and revoke_*: one place that checks the arguments and writes the catalog.
CREATE FUNCTION mailbox._set_grant(p_kind text, p_name text, p_role regrole, p_privilege text, p_grant boolean)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
DECLARE
    v_allowed text[] := CASE p_kind WHEN 'outbox' THEN ARRAY['publish', 'consume']
                                    ELSE ARRAY['receive', 'process'] END;
    v_key int;
    v_inbox mailbox._inbox;
BEGIN
    PERFORM mailbox._require(p_role, 'p_role');
    IF p_role = 0 THEN
        RAISE EXCEPTION 'invalid role for a grant: %', pg_catalog.quote_literal(p_role::text)
            USING ERRCODE = '22023', HINT = 'p_role names an existing role (''-'' and 0 name none).';
    END IF;
    PERFORM mailbox._require(p_privilege, 'p_privilege');
    IF NOT p_privilege = ANY (v_allowed) THEN
        RAISE EXCEPTION 'invalid % privilege: %', p_kind, pg_catalog.quote_literal(p_privilege)
            USING ERRCODE = '22023',
                  HINT = pg_catalog.format('p_privilege is one of %s.', pg_catalog.array_to_string(v_allowed, ', '));
    END IF;
    IF p_kind = 'outbox' THEN
        v_key := mailbox._outbox_key(p_name);
    ELSE
        -- the DDL lock first, as every inbox DDL takes it: a first grant or a last revoke
        -- rebuilds the named routers below (part 35, named receive)
        PERFORM mailbox._ddl_lock();
        v_key := (mailbox._inbox_get(p_name)).inbox_key;
        -- the inbox's has_grants flag says whether it has grants (the data plane checks
        -- grants only then). Its row is locked first, so the grant changes of one inbox run
        -- one after another and the recount below, a later statement, sees every change
        -- committed before it (under REPEATABLE READ a concurrent change fails this lock
        -- with 40001 instead). A stale TRUE would only cost a probe; FALSE never is stale.
        SELECT i.* INTO v_inbox FROM mailbox._inbox AS i WHERE i.inbox_key = v_key FOR NO KEY UPDATE;
        -- a first grant of a managed inbox takes its named receive away: a transaction that
        -- already wrote the table (and so takes no new lock, which would make it read the
        -- new routers) ends first, and a later one waits for this one's commit
        IF p_grant AND NOT v_inbox.has_grants THEN
            PERFORM mailbox._inbox_quiesce(v_inbox);
        END IF;
    END IF;
    IF p_grant THEN
        INSERT INTO mailbox._object_grant (object_kind, object_key, grantee, privilege)
        VALUES (p_kind, v_key, p_role, p_privilege)
        ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM mailbox._object_grant AS g
         WHERE g.object_kind = p_kind AND g.object_key = v_key AND g.grantee = p_role AND g.privilege = p_privilege;
    END IF;
    IF p_kind = 'inbox' THEN
        UPDATE mailbox._inbox AS i
           SET has_grants = EXISTS (SELECT 1 FROM mailbox._object_grant AS g
                                     WHERE g.object_kind = 'inbox' AND g.object_key = v_key)
         WHERE i.inbox_key = v_key;
        PERFORM mailbox._inbox_build_routes(); -- only a changed router is replaced
    END IF;
END
$$;

CREATE FUNCTION mailbox.grant_outbox(p_outbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('outbox', p_outbox, p_role, p_privilege, TRUE);
$$;
COMMENT ON FUNCTION mailbox.grant_outbox(text, regrole, text) IS
'let a role publish to (publish) or read through every group of (consume) one outbox; '
'once an outbox has a grant, only grantees and mailbox_admin may use it that way';

CREATE FUNCTION mailbox.revoke_outbox(p_outbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('outbox', p_outbox, p_role, p_privilege, FALSE);
$$;
COMMENT ON FUNCTION mailbox.revoke_outbox(text, regrole, text) IS
'take back a grant_outbox; an outbox left without any grant is open to the role-level grants again';

CREATE FUNCTION mailbox.grant_inbox(p_inbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('inbox', p_inbox, p_role, p_privilege, TRUE);
$$;
COMMENT ON FUNCTION mailbox.grant_inbox(text, regrole, text) IS
'let a role write (receive) or claim and mark (process) one inbox; '
'once an inbox has a grant, only grantees and mailbox_admin may use it that way';

CREATE FUNCTION mailbox.revoke_inbox(p_inbox text, p_role regrole, p_privilege text)
RETURNS void
LANGUAGE sql VOLATILE
SECURITY DEFINER -- writes the extension's grant catalog for mailbox_admin
SET search_path = pg_catalog, mailbox, pg_temp
AS $$
    SELECT mailbox._set_grant('inbox', p_inbox, p_role, p_privilege, FALSE);
$$;
COMMENT ON FUNCTION mailbox.revoke_inbox(text, regrole, text) IS
'take back a grant_inbox; an inbox left without any grant is open to the role-level grants again';

-- The grants as a view for mailbox_admin.
CREATE VIEW mailbox.object_grants AS
SELECT
    g.object_kind,
    coalesce(o.outbox_name, i.inbox_name) AS object_name,
    g.grantee,
    g.privilege,
    g.granted_at
FROM mailbox._object_grant AS g
LEFT JOIN mailbox._outbox AS o ON g.object_kind = 'outbox' AND o.outbox_key = g.object_key
LEFT JOIN mailbox._inbox AS i ON g.object_kind = 'inbox' AND i.inbox_key = g.object_key;
COMMENT ON VIEW mailbox.object_grants IS 'pg_mailbox: per-outbox and per-inbox grants';
