"""Hostile tenants against the outbox side (issue 7, SPEC §0).

A tenant role ("attacker", a LOGIN role) owns a table and hides its own code on it: in row and
statement triggers, column defaults, check constraints, index expressions and generated
columns, a domain CHECK, a user-defined cast to json on an enum (reached by to_jsonb directly,
through a composite, an array and a domain), RLS policies, and functions and operators that
shadow built-ins and pg_mailbox's own names earlier on the search_path (public and pg_temp).
That code (the "hook") tries to escalate -- ALTER ROLE ... SUPERUSER, GRANT
pg_read_server_files, GRANT mailbox_admin, CREATE TABLE in a schema it may not write, take
ownership of or rights on an object it does not own -- each attempt swallowed so only success
is observable, and records who ran it (current_user) in a log table the attacker owns and in a
WARNING (which reaches the client even when the call rolls back).

The table is captured (enable_outbox) and the whole outbox API is called on it -- by the
attacker when its mailbox role allows the call (admin, producer, consumer or none), otherwise
by a victim role that has it, and by the extension owner for run_maintenance as pg_cron runs
it. After every call: no role gained a flag, a membership, an ownership or a right; no table
appeared in the guarded schema; no hook ran as a superuser; no shadow ran at all.

Capturing a table gives its owner a few scoped rights by design (CAPTURE_RIGHTS); those are
left out of the comparison and probed on their own. Also here: the owner's casts never run
with the rights of an admin who snapshots the table, each privilege check with each single
privilege missing, and per-object authority (grant_outbox / revoke_outbox).
"""

import re
import time
import uuid

import psycopg
import pytest
from mbx import raises, rows, scalar, sequence

THRESHOLD = 2  # per-outbox inline threshold: 1 row (or 1 updated row) inline, 3 claim-check

# ---------------------------------------------------------------------------------------------
# The hook and the places it hides


def hook_sql(attacker):
    """The attacker's hook: log who runs it, then try every escalation, each one swallowed."""
    attempts = [
        f'ALTER ROLE "{attacker}" SUPERUSER',
        "pg_catalog.format('ALTER ROLE %I SUPERUSER', session_user)",
        f'GRANT pg_read_server_files TO "{attacker}"',
        "pg_catalog.format('GRANT pg_read_server_files TO %I', session_user)",
        f'GRANT mailbox_admin TO "{attacker}"',
        "pg_catalog.format('CREATE TABLE guard.%I ()', 'pwned_' || p_site)",
        f'ALTER TABLE guard.crown OWNER TO "{attacker}"',
        f'GRANT ALL ON guard.crown TO "{attacker}"',
        f'ALTER FUNCTION mailbox._caller() OWNER TO "{attacker}"',
    ]
    body = "\n".join(
        "    BEGIN EXECUTE "
        + (a if a.startswith("pg_catalog.") else "'" + a.replace("'", "''") + "'")
        + "; EXCEPTION WHEN OTHERS THEN NULL; END;"
        for a in attempts
    )
    return f"""
CREATE FUNCTION atk.hook(p_site text) RETURNS void
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS $f$
DECLARE
    v_super boolean := (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r
                         WHERE r.rolname OPERATOR(pg_catalog.=) current_user);
BEGIN
    INSERT INTO atk.hook_log (site, who, super) VALUES (p_site, current_user, v_super);
    RAISE WARNING 'mbx-hook site=% user=% super=%', p_site, current_user, v_super;
{body}
END
$f$;
"""


def _fn(name, args, returns, site, result, volatility="VOLATILE"):
    """A function that runs the hook, then returns a harmless result."""
    return (
        f"CREATE FUNCTION {name}({args}) RETURNS {returns} LANGUAGE plpgsql {volatility}"
        f" AS $f$ BEGIN PERFORM atk.hook('{site}'); RETURN {result}; END $f$;\n"
    )


ROW_TRIGGER = (
    _fn("atk.row_trg", "", "trigger", "row_trigger", "coalesce(NEW, OLD)")
    + "CREATE TRIGGER a_row BEFORE INSERT OR UPDATE OR DELETE ON atk.t"
    " FOR EACH ROW EXECUTE FUNCTION atk.row_trg();\n"
    "CREATE TRIGGER z_row AFTER INSERT OR UPDATE OR DELETE ON atk.t"
    " FOR EACH ROW EXECUTE FUNCTION atk.row_trg();\n"
)

# named to fire before and after the mailbox_capture_* triggers (alphabetical order)
STATEMENT_TRIGGER = (
    _fn("atk.stmt_trg", "", "trigger", "statement_trigger", "NULL")
    + "CREATE TRIGGER a_stmt BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON atk.t"
    " FOR EACH STATEMENT EXECUTE FUNCTION atk.stmt_trg();\n"
    "CREATE TRIGGER z_stmt AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON atk.t"
    " FOR EACH STATEMENT EXECUTE FUNCTION atk.stmt_trg();\n"
    "CREATE TRIGGER z_stmt_new AFTER INSERT ON atk.t REFERENCING NEW TABLE AS nt"
    " FOR EACH STATEMENT EXECUTE FUNCTION atk.stmt_trg();\n"
)

DEFAULT = _fn("atk.def_fn", "", "int", "default", "7") + (
    "ALTER TABLE atk.t ADD COLUMN d int DEFAULT atk.def_fn();\n"
)

CHECK = _fn("atk.chk_fn", "int", "boolean", "check", "true") + (
    "ALTER TABLE atk.t ADD COLUMN c int NOT NULL DEFAULT 0 CHECK (atk.chk_fn(c));\n"
    "ALTER TABLE atk.t ADD CONSTRAINT t_row_check CHECK (atk.chk_fn(n));\n"
)

# index expressions and generated columns need IMMUTABLE functions; an immutable function may
# call a volatile one, which writes as it likes
EXPRESSION = (
    _fn("atk.idx_fn", "int", "int", "index_expression", "$1", "IMMUTABLE")
    + _fn("atk.gen_fn", "int", "int", "generated_column", "$1", "IMMUTABLE")
    + "CREATE INDEX t_expr_idx ON atk.t (atk.idx_fn(n));\n"
    "CREATE INDEX t_partial_idx ON atk.t (id) WHERE atk.idx_fn(n) IS NOT NULL;\n"
    "ALTER TABLE atk.t ADD COLUMN g int GENERATED ALWAYS AS (atk.gen_fn(n)) STORED;\n"
)

DOMAIN_CHECK = _fn("atk.dom_fn", "int", "boolean", "domain_check", "true") + (
    "CREATE DOMAIN atk.pos AS int CHECK (atk.dom_fn(VALUE));\n"
    "ALTER TABLE atk.t ADD COLUMN p atk.pos DEFAULT 1;\n"
)

# the known exploit: to_jsonb calls a user-defined cast to json of a column's type
MOOD = (
    "CREATE TYPE atk.mood AS ENUM ('ok', 'sad');\n"
    + _fn("atk.mood_json", "atk.mood", "json", "enum_cast", "pg_catalog.to_json($1::text)")
    + _fn("atk.mood_jsonb", "atk.mood", "jsonb", "enum_cast_jsonb", "pg_catalog.to_jsonb($1::text)")
    + "CREATE CAST (atk.mood AS json) WITH FUNCTION atk.mood_json(atk.mood);\n"
    "CREATE CAST (atk.mood AS jsonb) WITH FUNCTION atk.mood_jsonb(atk.mood);\n"
)
ENUM_CAST = MOOD + "ALTER TABLE atk.t ADD COLUMN m atk.mood NOT NULL DEFAULT 'ok';\n"

# the same cast reached through a composite, an array and a domain with its own CHECK
NESTED_CAST = (
    MOOD
    + _fn("atk.dmood_fn", "atk.mood", "boolean", "domain_check", "true")
    + "CREATE TYPE atk.wrap AS (m atk.mood, x int);\n"
    "CREATE DOMAIN atk.dmood AS atk.mood CHECK (atk.dmood_fn(VALUE));\n"
    "ALTER TABLE atk.t ADD COLUMN w atk.wrap DEFAULT ROW('ok', 1)::atk.wrap,"
    " ADD COLUMN ms atk.mood[] DEFAULT '{ok,sad}', ADD COLUMN dm atk.dmood DEFAULT 'sad';\n"
)

RLS_POLICY = _fn("atk.pol_fn", "", "boolean", "rls_policy", "true") + (
    "ALTER TABLE atk.t ENABLE ROW LEVEL SECURITY;\n"
    "ALTER TABLE atk.t FORCE ROW LEVEL SECURITY;\n"
    "CREATE POLICY p_all ON atk.t USING (atk.pol_fn()) WITH CHECK (atk.pol_fn());\n"
    "CREATE POLICY p_sel ON atk.t AS RESTRICTIVE FOR SELECT USING (atk.pol_fn());\n"
)


def _op(symbol, left, right, result_op, kind="boolean"):
    fname = "atk.op_" + uuid.uuid4().hex[:8]
    return (
        f"CREATE FUNCTION {fname}({left}, {right}) RETURNS {kind} LANGUAGE plpgsql VOLATILE"
        f" SET search_path = pg_catalog AS $f$ BEGIN PERFORM atk.hook('shadow:{symbol}');"
        f" RETURN $1 OPERATOR(pg_catalog.{result_op}) $2; END $f$;\n"
        f"CREATE OPERATOR public.{symbol} (LEFTARG = {left}, RIGHTARG = {right},"
        f" FUNCTION = {fname});\n"
    )


def _shadow(name, args, returns, result):
    ret = "RETURN" if returns == "void" else f"RETURN {result}"
    return (
        f"CREATE FUNCTION {name}({args}) RETURNS {returns} LANGUAGE plpgsql VOLATILE"
        f" SET search_path = pg_catalog AS $f$ BEGIN PERFORM atk.hook('shadow:{name}');"
        f" {ret}; END $f$;\n"
    )


# Built-ins pg_mailbox calls and its own function names, shadowed in public (the hostile
# connections put public before pg_catalog and mailbox). pg_mailbox must never resolve to any
# of them: each one logs when it runs, and the only allowed run is the final sanity call.
SHADOW = (
    _shadow("public.now", "", "timestamptz", "pg_catalog.now()")
    + _shadow("public.clock_timestamp", "", "timestamptz", "pg_catalog.clock_timestamp()")
    + _shadow("public.pg_notify", "text, text", "void", "NULL")
    + _shadow("public.to_jsonb", "anyelement", "jsonb", "pg_catalog.to_jsonb($1)")
    + _shadow("public.to_json", "anyelement", "json", "pg_catalog.to_json($1)")
    + _shadow("public.row_to_json", "record", "json", "pg_catalog.row_to_json($1)")
    + _shadow(
        "public.format", "text, VARIADIC text[]", "text", "pg_catalog.format($1, VARIADIC $2)"
    )
    + _shadow(
        "public.current_setting", "text, boolean", "text", "pg_catalog.current_setting($1, $2)"
    )
    + _shadow(
        "public.has_table_privilege",
        "name, oid, text",
        "boolean",
        "pg_catalog.has_table_privilege($1, $2, $3)",
    )
    + _shadow("public.to_regclass", "text", "regclass", "pg_catalog.to_regclass($1)")
    + _shadow("public.lower", "text", "text", "pg_catalog.lower($1)")
    + _shadow("public.pg_advisory_xact_lock", "integer, integer", "void", "NULL")
    + _shadow("public.pg_current_snapshot", "", "pg_snapshot", "pg_catalog.pg_current_snapshot()")
    + _shadow("public._caller", "", "name", "session_user")
    + _shadow("public._check_table_privilege", "oid, text, text", "void", "NULL")
    + _shadow("public._authorize", "text, integer, text", "void", "NULL")
    + _shadow("public._outbox_key", "text", "integer", "0")
    + _shadow("public._write_snapshot", "integer", "bigint", "0")
    + _shadow("public._setting_bool", "text", "boolean", "true")
    + _shadow("public._setting_int", "text", "integer", "0")
    + _shadow("public._enable_outbox", "oid, integer, integer, text, boolean", "text", "NULL")
    + _shadow("atk.count_sfunc", "bigint", "bigint", "$1 OPERATOR(pg_catalog.+) 1")
    + "CREATE AGGREGATE public.count(*) (sfunc = atk.count_sfunc, stype = bigint,"
    " initcond = '0');\n"
    + _shadow(
        "atk.jagg_sfunc",
        "jsonb, anyelement",
        "jsonb",
        "coalesce($1, '[]') OPERATOR(pg_catalog.||) pg_catalog.to_jsonb($2)",
    )
    + "CREATE AGGREGATE public.jsonb_agg(anyelement) (sfunc = atk.jagg_sfunc, stype = jsonb);\n"
    + _op("=", "bigint", "bigint", "=")
    + _op("<", "bigint", "bigint", "<")
    + _op("<=", "bigint", "bigint", "<=")
    + _op(">", "bigint", "bigint", ">")
    + _op(">=", "bigint", "bigint", ">=")
    + _op("<>", "bigint", "bigint", "<>")
    + _op("+", "bigint", "bigint", "+", "bigint")
    + _op("-", "bigint", "bigint", "-", "bigint")
    + _op("=", "text", "text", "=")
    + _op("=", "integer", "bigint", "=")
    + _op("||", "jsonb", "jsonb", "||", "jsonb")
)

# Per session, in pg_temp: functions and operators there are never found unqualified, and
# temporary tables named like pg_mailbox's must never be written instead of its own.
TEMP_SHADOW = (
    _shadow("pg_temp.now", "", "timestamptz", "pg_catalog.now()")
    + _shadow("pg_temp.to_jsonb", "anyelement", "jsonb", "pg_catalog.to_jsonb($1)")
    + _shadow("pg_temp._caller", "", "name", "session_user")
    + _shadow("pg_temp.int8eq_shadow", "bigint, bigint", "boolean", "$1 OPERATOR(pg_catalog.=) $2")
    + "CREATE OPERATOR pg_temp.= (LEFTARG = bigint, RIGHTARG = bigint,"
    " FUNCTION = pg_temp.int8eq_shadow);\n"
    + "".join(
        f"CREATE TEMP TABLE {t} (x int);\n"
        f"CREATE TRIGGER shadow BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.{t}"
        " FOR EACH STATEMENT EXECUTE FUNCTION atk.temp_trg();\n"
        for t in (
            "_outbox",
            "_outbox_log",
            "_outbox_delta_rows",
            "_outbox_chunk",
            "_consumer_group",
            "_consumer",
            "_lease",
            "_claim_check_consumed",
            "alert_log",
        )
    )
)
TEMP_TRIGGER = _fn("atk.temp_trg", "", "trigger", "shadow:temp_table", "NULL")

# site -> (setup run by the attacker, hook sites that must have run by the end)
SITES = {
    "row_trigger": (ROW_TRIGGER, {"row_trigger"}),
    "statement_trigger": (STATEMENT_TRIGGER, {"statement_trigger"}),
    "default": (DEFAULT, {"default"}),
    "check": (CHECK, {"check"}),
    "expression": (EXPRESSION, {"index_expression", "generated_column"}),
    "domain_check": (DOMAIN_CHECK, {"domain_check"}),
    "enum_cast": (ENUM_CAST, {"enum_cast"}),
    "nested_cast": (NESTED_CAST, {"enum_cast", "domain_check"}),
    "rls_policy": (RLS_POLICY, {"rls_policy"}),
    "shadow": (TEMP_TRIGGER + SHADOW, {"shadow:public.now", "shadow:pg_temp.now"}),
}

# the attacker's mailbox role -> the calls it may make itself (mailbox_admin is a member of
# the other two), and what it is granted
MAILBOX_ROLES = {
    "admin": {"admin", "producer", "consumer"},
    "producer": {"producer"},
    "consumer": {"consumer"},
    "none": set(),
}
ROLE_GRANTS = {
    "admin": ["mailbox_admin"],
    "producer": ["mailbox_producer"],
    "consumer": ["mailbox_consumer"],
    "none": [],
}

# ---------------------------------------------------------------------------------------------
# Roles and the state that must not change


def _create_login_role(db, name, *grants):
    db.execute(f'CREATE ROLE "{name}" LOGIN')
    for grant in grants:
        db.execute(f'GRANT "{grant}" TO "{name}"')


def _drop_roles(db, names):
    for name in names:
        if scalar(db, "SELECT count(*) FROM pg_roles WHERE rolname = %s", [name]):
            db.execute(f'DROP OWNED BY "{name}" CASCADE')
            db.execute(f'DROP ROLE "{name}"')


STATE_SQL = """
SELECT r.rolname::text,
       jsonb_build_object('super', r.rolsuper, 'createrole', r.rolcreaterole,
                          'createdb', r.rolcreatedb, 'bypassrls', r.rolbypassrls,
                          'replication', r.rolreplication, 'inherit', r.rolinherit),
       ARRAY(SELECT g.rolname::text || CASE WHEN m.admin_option THEN ' (admin)' ELSE '' END
               FROM pg_auth_members AS m JOIN pg_roles AS g ON g.oid = m.roleid
              WHERE m.member = r.oid ORDER BY 1),
       ARRAY(SELECT d.deptype::text || ' '
                    || coalesce(pg_describe_object(d.classid, d.objid, d.objsubid),
                                d.classid::regclass::text || ' ' || d.objid)
               FROM pg_shdepend AS d
              WHERE d.refclassid = 'pg_authid'::regclass AND d.refobjid = r.oid
                AND d.dbid IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
              ORDER BY 1),
       ARRAY(SELECT g.object_kind || ' ' || g.object_key || ' ' || g.privilege
               FROM mailbox._object_grant AS g WHERE g.grantee::oid = r.oid ORDER BY 1)
  FROM pg_roles AS r WHERE r.rolname = ANY (%s) ORDER BY 1
"""


# What capturing a table gives the table's owner, by design (docs/security.md, "Whose rights
# run what"): its own capture function and snapshot row reader (SECURITY DEFINER, so the
# owner's casts run with the owner's rights) and what they need -- INSERT (and SELECT of _id)
# on the columns of its own outbox's two partitions, USAGE on the schema and the row sequence,
# EXECUTE on the setting parsers and registry, SELECT of two columns of the wake-up table.
# Only these may appear, only for the owner, and only for its own outbox ("cap");
# test_table_owner_capture_rights_reach_nothing_else probes what they allow.
CAPTURE_RIGHTS = re.compile(
    r"o function mailbox\._outbox_\d+_capture\(\)"
    r"|o function mailbox\._outbox_\d+_rows\(regclass\)"
    r"|a column (outbox_key|waiting_until) of table mailbox\._outbox_waiter"
    r"|a schema mailbox"
    r"|a sequence mailbox\._outbox_row_seq"
    r"|a function mailbox\._setting_bool\(text\)"
    r"|a function mailbox\._setting_int\(text\)"
    r"|a function mailbox\._settings\(\)"
    r"|a function mailbox\._setting_missing\(text,text\)"
    r"|a column \w+ of table mailbox\.(_outbox_log|outbox_delta_rows)_cap"
)


def role_state(db, names, table_owner=None):
    """Flags, memberships, ownerships/ACL entries (pg_shdepend) and per-object grants of each
    role, plus what the guarded schema holds. For table_owner, the capture rights above are
    left out."""
    state = {
        name: {
            "flags": flags,
            "member_of": member_of,
            "owns_or_granted": [
                d for d in deps if name != table_owner or not CAPTURE_RIGHTS.fullmatch(d)
            ],
            "object_grants": grants,
        }
        for name, flags, member_of, deps, grants in rows(db, STATE_SQL, [list(names)])
    }
    state["guard"] = [
        r[0]
        for r in rows(
            db,
            "SELECT relname::text FROM pg_class WHERE relnamespace = 'guard'::regnamespace"
            " ORDER BY 1",
        )
    ]
    state["mailbox._caller owner"] = scalar(
        db,
        "SELECT proowner::regrole::text FROM pg_proc WHERE oid = 'mailbox._caller()'::regprocedure",
    )
    return state


# ---------------------------------------------------------------------------------------------
# The arena: roles, connections, the attacker's table, and a runner that checks every call


class Arena:
    def __init__(self, db, connect, site, attacker_role):
        self.db = db
        self.site = site
        tag = uuid.uuid4().hex[:8]
        self.names = {k: f"h{tag}_{k}" for k in ("atk", "ops", "prod", "cons")}
        self.attacker_role = attacker_role
        self.attacker_roles = MAILBOX_ROLES[attacker_role]
        self.violations = []
        self.hooks_seen = set()
        self.notices = []
        self.conns = {}
        self.connect = connect

    # -- setup

    def setup(self):
        db, n = self.db, self.names
        _create_login_role(db, n["atk"], *ROLE_GRANTS[self.attacker_role])
        _create_login_role(db, n["ops"], "mailbox_admin")
        if self.site == "rls_policy":
            # a snapshot holds the whole table: a caller that row-level security restricts
            # is refused (test_outbox_snapshot_is_refused_to_a_caller_restricted_by_row_security),
            # so the victim admin who takes them here may see every row
            db.execute(f'ALTER ROLE "{n["ops"]}" BYPASSRLS')
        _create_login_role(db, n["prod"], "mailbox_producer")
        _create_login_role(db, n["cons"], "mailbox_consumer")
        db.execute("CREATE SCHEMA guard")
        db.execute("CREATE TABLE guard.crown (secret text)")
        db.execute(f'CREATE SCHEMA atk AUTHORIZATION "{n["atk"]}"')
        if self.site == "shadow":
            # as in databases created before PostgreSQL 15, or where public is opened up
            db.execute(f'GRANT CREATE ON SCHEMA public TO "{n["atk"]}"')
        path = "public,pg_catalog,mailbox" if self.site == "shadow" else None
        for kind, name in n.items():
            kw = {"options": f"-c search_path={path}"} if path else {}
            conn = self.connect(user=name, **kw)
            conn.add_notice_handler(self._notice)
            self.conns[kind] = conn
        db.add_notice_handler(self._notice)

        atk = self.conns["atk"]
        atk.execute(
            "CREATE TABLE atk.hook_log (site text, who name, super boolean,"
            " at timestamptz DEFAULT pg_catalog.clock_timestamp())"
        )
        atk.execute("GRANT USAGE ON SCHEMA atk TO PUBLIC")
        atk.execute("GRANT INSERT ON atk.hook_log TO PUBLIC")
        atk.execute(hook_sql(n["atk"]))
        atk.execute("CREATE TABLE atk.t (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)")
        atk.execute(SITES[self.site][0])
        # the victims' admin may capture and snapshot it; the owner grants just that
        atk.execute(f'GRANT SELECT, TRIGGER ON atk.t TO "{n["ops"]}"')
        if self.site == "shadow":
            for conn in self.conns.values():
                conn.execute(TEMP_SHADOW)
        self.baseline = self.state()

    def _notice(self, diag):
        msg = diag.message_primary or ""
        if msg.startswith("mbx-hook "):
            self.notices.append(msg)

    def state(self):
        return role_state(self.db, self.names.values(), table_owner=self.names["atk"])

    def close(self):
        pids = [conn.info.backend_pid for conn in self.conns.values() if not conn.closed]
        for conn in self.conns.values():
            conn.close()
        # a closed session drops its temporary objects (the shadow site's temp trigger) while
        # its backend exits; DROP OWNED in the teardown would race it into a deadlock
        deadline = time.monotonic() + 10
        while pids and time.monotonic() < deadline:
            if not scalar(
                self.db, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
            ):
                break
            time.sleep(0.02)

    # -- running calls

    def caller(self, needs):
        """Who makes a call: the attacker when its role allows it, else a victim that may."""
        if needs == "write" or needs in self.attacker_roles:
            return "atk"
        return {"admin": "ops", "producer": "prod", "consumer": "cons", "cron": "cron"}[needs]

    def call(self, label, needs, sql, params=None):
        """Run one call as the role that may make it; if the attacker may not, the attacker
        tries it first and must get 42501. Then check that nothing escalated."""
        who = self.caller(needs)
        if who != "atk" and needs != "cron":
            wrong = _not_refused(self.conns["atk"], sql, params)
            if wrong:
                self.violations.append(f"{label}: the attacker (not {needs}): {wrong}")
            self.check(f"{label} (tried by the attacker)")
        conn = self.db if who == "cron" else self.conns[who]
        try:
            cur = conn.execute(sql, params)
            result = cur.fetchall() if cur.description else None
        except psycopg.Error as exc:
            self.check(f"{label} (by {who}, failed)")
            raise AssertionError(
                f"{label} as {who} failed: {exc.sqlstate} {exc}\nviolations so far: "
                + "\n".join(self.violations)
            ) from exc
        self.check(f"{label} (by {who})")
        return result

    def check(self, label):
        """Compare with the baseline; record and repair whatever changed."""
        found = []
        now = self.state()
        for key, before in self.baseline.items():
            after = now.get(key)
            if after == before:
                continue
            if isinstance(before, dict):
                for field in before:
                    if after[field] != before[field]:
                        if isinstance(before[field], dict):
                            changed = {
                                k: v for k, v in after[field].items() if before[field][k] != v
                            }
                        else:
                            changed = {
                                "+": sorted(set(after[field]) - set(before[field])),
                                "-": sorted(set(before[field]) - set(after[field])),
                            }
                        found.append(f"{key} {field} changed: {changed}")
            else:
                found.append(f"{key}: {before} -> {after}")
        logged = rows(self.db, "SELECT site, who::text, super FROM atk.hook_log")
        self.hooks_seen |= {site for site, _, _ in logged}
        bad = set()
        for site, who, super_ in logged:
            if super_:
                bad.add(f"hook {site} ran as superuser {who}")
            elif who not in self.names.values():
                bad.add(f"hook {site} ran as {who}, not a tenant role")
            elif site.startswith("shadow:") and label != "sanity":
                bad.add(f"shadowing object {site[7:]} ran as {who}")
        found += sorted(bad)
        logged_super = {site for site, _, super_ in logged if super_}
        for msg in self.notices:
            fields = dict(f.split("=", 1) for f in msg.split()[1:])
            self.hooks_seen.add(fields["site"])
            if fields["super"] == "t" or fields["super"] == "true":
                if fields["site"] not in logged_super:
                    found.append(
                        f"hook {fields['site']} ran as superuser {fields['user']}"
                        " in a call that rolled back"
                    )
        self.notices.clear()
        if label != "sanity":
            self.db.execute("DELETE FROM atk.hook_log WHERE site LIKE 'shadow:%' OR super")
        else:
            self.db.execute("DELETE FROM atk.hook_log WHERE super")
        self.db.execute(
            "DELETE FROM atk.hook_log WHERE who <> ALL (%s)", [list(self.names.values())]
        )
        if found:
            self.violations.append(f"{label}: " + "; ".join(found))
            self.repair()

    def repair(self):
        """Undo what the hook achieved, so later calls are judged on their own."""
        db, super_user = self.db, scalar(self.db, "SELECT current_user")
        for name in self.names.values():
            flags = self.baseline[name]["flags"]
            db.execute(
                f'ALTER ROLE "{name}" '
                + " ".join(
                    ("" if flags[k] else "NO") + k.upper()
                    for k in ("super", "createrole", "createdb", "bypassrls", "replication")
                ).replace("SUPER", "SUPERUSER")
            )
            for extra in rows(
                db,
                "SELECT g.rolname::text FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid"
                " JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = %s",
                [name],
            ):
                if extra[0] not in [m.split(" ")[0] for m in self.baseline[name]["member_of"]]:
                    db.execute(f'REVOKE "{extra[0]}" FROM "{name}"')
            db.execute(f'REVOKE ALL ON guard.crown FROM "{name}"')
        db.execute(f'ALTER TABLE guard.crown OWNER TO "{super_user}"')
        db.execute(f'ALTER FUNCTION mailbox._caller() OWNER TO "{super_user}"')
        for table in self.state()["guard"]:
            if table not in self.baseline["guard"]:
                db.execute(f'DROP TABLE guard."{table}"')
        assert self.state() == self.baseline, "could not undo the escalation; stopping"


def _not_refused(conn, sql, params=None):
    """None when the call fails with 42501, else what happened instead."""
    try:
        conn.execute(sql, params)
    except psycopg.Error as exc:
        return None if exc.sqlstate == "42501" else f"{exc.sqlstate} instead of 42501: {exc}"
    return "allowed; expected 42501"


@pytest.fixture
def arena_factory(db, connect):
    made = []

    def make(site, attacker_role):
        arena = Arena(db, connect, site, attacker_role)
        made.append(arena)
        arena.setup()
        return arena

    yield make
    db.execute("RESET ROLE")
    for arena in made:
        arena.close()
        _drop_roles(db, arena.names.values())


def capture_log(db, outbox):
    return [
        (r[0], r[1])
        for r in rows(
            db,
            "SELECT l.event_type, l.is_claim_check FROM mailbox._outbox_log AS l"
            " JOIN mailbox._outbox AS o USING (outbox_key) WHERE o.outbox_name = %s ORDER BY l._id",
            [outbox],
        )
    ]


def run_every_call(arena):
    """The whole outbox API over the attacker's captured table, in a realistic order."""
    a = arena
    ins = "INSERT INTO atk.t (id) SELECT g FROM pg_catalog.generate_series(%s::int, %s::int) AS g"
    a.call("insert 3 rows before capture", "write", ins, [1, 3])
    a.call(
        "enable_outbox with an initial (claim-check) snapshot",
        "admin",
        "SELECT mailbox.enable_outbox('atk.t', p_retention_hours => 0,"
        f" p_inline_threshold_rows => {THRESHOLD}, p_outbox_name => 'cap',"
        " p_initial_snapshot => true)",
    )
    a.call("insert 1 row (inline capture)", "write", ins, [4, 4])
    a.call("insert 3 rows (claim-check capture)", "write", ins, [5, 7])
    a.call("update 1 row (inline capture)", "write", "UPDATE atk.t SET n = n + 1 WHERE id = 1")
    a.call("update 7 rows (claim-check capture)", "write", "UPDATE atk.t SET n = n + 1")
    a.call("delete 1 row (inline capture)", "write", "DELETE FROM atk.t WHERE id = 7")
    a.call("delete 4 rows (claim-check capture)", "write", "DELETE FROM atk.t WHERE id >= 3")
    a.call("outbox_snapshot of 2 rows (inline)", "admin", "SELECT mailbox.outbox_snapshot('cap')")
    a.call("truncate (captured)", "write", "TRUNCATE atk.t")
    a.call("insert 3 rows after truncate (claim-check capture)", "write", ins, [11, 13])
    a.call(
        "outbox_snapshot of 3 rows (claim-check)", "admin", "SELECT mailbox.outbox_snapshot('cap')"
    )
    # capture fired for every write, whoever the attacker is, and kept inline vs claim-check
    I, C = False, True  # noqa: E741 - inline / claim-check
    assert capture_log(a.db, "cap") == [
        ("SNAPSHOT", C),
        ("INSERT", I),
        ("INSERT", C),
        ("UPDATE", I),
        ("UPDATE", C),
        ("DELETE", I),
        ("DELETE", C),
        ("SNAPSHOT", I),
        ("TRUNCATE", I),
        ("INSERT", C),
        ("SNAPSHOT", C),
    ], "violations: " + "\n".join(a.violations)

    a.call("create_outbox", "admin", "SELECT mailbox.create_outbox('ev', 0)")
    a.call("outbox_publish", "producer", "SELECT mailbox.outbox_publish('ev', '{\"a\": 1}')")
    # 40 rows of 1 kB: more than the 32 kB above which maintenance truncates a drained outbox
    a.call(
        "outbox_publish_batch",
        "producer",
        "SELECT mailbox.outbox_publish_batch('ev', ARRAY("
        "SELECT pg_catalog.jsonb_build_object('n', g, 'pad', pg_catalog.repeat('x', 1000))"
        "  FROM pg_catalog.generate_series(1, 40) AS g))",
    )
    a.call(
        "create_consumer_group on the captured outbox",
        "admin",
        "SELECT mailbox.create_consumer_group('g', 'cap', 'earliest')",
    )
    a.call(
        "create_consumer_group on the published outbox",
        "admin",
        "SELECT mailbox.create_consumer_group('gev', 'ev', 'earliest')",
    )
    polled = a.call(
        "poll_outbox",
        "consumer",
        "SELECT outbox_id, is_claim_check FROM mailbox.poll_outbox('g', 'c1', 1000, 30)",
    )
    assert len(polled) == 11, polled
    claim_check = next(off for off, is_cc in polled if is_cc)
    last = max(off for off, _ in polled)
    a.call(
        "outbox_delta_rows",
        "consumer",
        "SELECT row_num, payload FROM mailbox.outbox_delta_rows('cap', %s)",
        [claim_check],
    )
    # every claim-check row read by the only group, so retention 0 drains them all
    a.call(
        "outbox_rows_consumed",
        "consumer",
        "SELECT mailbox.outbox_rows_consumed('cap', o, 'g') FROM unnest(%s::bigint[]) AS o",
        [[off for off, is_cc in polled if is_cc]],
    )
    a.call("extend_lease", "consumer", "SELECT mailbox.extend_lease('g', 'c1', 60)")
    a.call("consumer_heartbeat", "consumer", "SELECT mailbox.consumer_heartbeat('g', 'c1')")
    a.call("commit_offset", "consumer", "SELECT mailbox.commit_offset('g', 'c1', %s)", [last])
    a.call(
        "poll_outbox of the published outbox",
        "consumer",
        "SELECT outbox_id FROM mailbox.poll_outbox('gev', 'c1', 1000, 30)",
    )
    a.call(
        "commit_offset of the published outbox",
        "consumer",
        "SELECT mailbox.commit_offset('gev', 'c1', 41)",
    )
    a.call("consumer_lag", "consumer", "SELECT lag FROM mailbox.consumer_lag('g')")
    a.call("consumer_lag of every group", "consumer", "SELECT lag FROM mailbox.consumer_lag()")
    a.call("outbox_status", "admin", "SELECT mailbox.outbox_status('cap')")
    a.call("outbox_status of the published outbox", "admin", "SELECT mailbox.outbox_status('ev')")
    (done,) = a.call("run_maintenance (retention 0)", "admin", "SELECT mailbox.run_maintenance()")
    a.call("run_maintenance as pg_cron runs it", "cron", "SELECT mailbox.run_maintenance()")
    left = scalar(a.db, "SELECT count(*) FROM mailbox._outbox_log")
    assert left == 0, f"run_maintenance with retention 0 left {left} rows"
    assert done[0]["outbox_rows_drained"] == 52, done[0]
    assert done[0]["outbox_tables_truncated"] >= 1, done[0]
    a.call("seek_offset", "consumer", "SELECT mailbox.seek_offset('g', 'c1', 0)")
    a.call("insert 1 row after the drain", "write", ins, [21, 21])
    a.call("drop_consumer_group", "admin", "SELECT mailbox.drop_consumer_group('g')")
    a.call("disable_outbox", "admin", "SELECT mailbox.disable_outbox('cap')")
    a.call("drop_outbox", "admin", "SELECT mailbox.drop_outbox('ev')")
    a.call("insert 1 row after disable_outbox", "write", ins, [22, 22])


@pytest.mark.parametrize("attacker_role", list(MAILBOX_ROLES))
@pytest.mark.parametrize("site", list(SITES))
def test_hostile_table_owner_gains_nothing_through_any_outbox_call(
    arena_factory, site, attacker_role
):
    arena = arena_factory(site, attacker_role)
    run_every_call(arena)
    if site == "shadow":
        # the shadows are live: an unqualified call from the attacker's session finds them
        arena.conns["atk"].execute("SELECT now(), pg_temp.now()")
        arena.check("sanity")
    assert arena.violations == [], "escalations:\n" + "\n".join(arena.violations)
    missing = SITES[site][1] - arena.hooks_seen
    assert not missing, f"hook sites never reached, the test proves nothing for them: {missing}"


def _capture_function(db, table):
    return scalar(
        db,
        "SELECT tgfoid::regprocedure::text FROM pg_trigger"
        " WHERE tgrelid = %s::regclass AND tgname = 'mailbox_capture_insert'",
        [table],
    )


def test_table_owner_capture_rights_reach_nothing_else(arena_factory):
    """Capturing a table gives its owner INSERT on its own outbox's partitions and its own
    capture function (see CAPTURE_RIGHTS). With those, an owner holding no mailbox role reads
    nothing, changes nothing it did not write, reaches no other outbox, forges no defaulted
    column, and cannot rewrite, rename or give away the function."""
    a = arena_factory("default", "none")
    db, atk, ops = a.db, a.conns["atk"], a.conns["ops"]
    ops.execute(
        "SELECT mailbox.enable_outbox('atk.t', p_inline_threshold_rows => 0,"
        " p_outbox_name => 'cap')"
    )
    ops.execute("SELECT mailbox.create_outbox('ev')")
    ops.execute("SELECT mailbox.outbox_publish('ev', '{\"salary\": 1}')")
    atk.execute("INSERT INTO atk.t (id) VALUES (1), (2)")
    assert capture_log(db, "cap") == [("INSERT", True)]
    fn = _capture_function(db, "atk.t")
    assert (
        scalar(db, "SELECT proowner::regrole::text FROM pg_proc WHERE oid = %s::regprocedure", [fn])
        == a.names["atk"]
    )
    keys = dict(rows(db, "SELECT outbox_name, outbox_key FROM mailbox._outbox"))
    cols = "(outbox_key, source, event_type, payload)"
    cap = keys["cap"]
    refused = [
        "SELECT payload FROM mailbox.outbox_cap",
        "SELECT payload FROM mailbox._outbox_log_cap",
        "SELECT payload FROM mailbox.outbox_delta_rows_cap",
        "SELECT count(*) FROM mailbox._outbox_log",
        "SELECT payload FROM mailbox.outbox_ev",
        "SELECT * FROM mailbox._outbox",
        "SELECT * FROM mailbox.alert_log",
        "UPDATE mailbox._outbox_log_cap SET payload = '{}'",
        "DELETE FROM mailbox._outbox_log_cap",
        "DELETE FROM mailbox.outbox_delta_rows_cap",
        "TRUNCATE mailbox._outbox_log_cap",
        f"INSERT INTO mailbox._outbox_log_ev {cols} VALUES ({keys['ev']}, 'x', 'x', '{{}}')",
        f"INSERT INTO mailbox._outbox_log {cols} VALUES ({keys['cap']}, 'x', 'x', '{{}}')",
        f"INSERT INTO mailbox._outbox_log_cap (outbox_key, payload, _xid)"
        f" VALUES ({cap}, '{{}}', '1')",
        f"INSERT INTO mailbox._outbox_log_cap (outbox_key, payload, _id) VALUES ({cap}, '{{}}', 1)",
        f"INSERT INTO mailbox._outbox_log_cap (outbox_key, payload, event_id)"
        f" VALUES ({keys['cap']}, '{{}}', gen_random_uuid())",
        f"INSERT INTO mailbox._outbox_log_cap {cols} VALUES ({cap}, 'x', 'x', '{{}}')"
        " RETURNING payload",
        "SELECT setval('mailbox._outbox_row_seq', 1)",
        f"CREATE OR REPLACE FUNCTION {fn[:-2]}() RETURNS trigger LANGUAGE plpgsql"
        " AS $f$ BEGIN RETURN NULL; END $f$",
        f"ALTER FUNCTION {fn} RENAME TO mine",
        f'ALTER FUNCTION {fn} OWNER TO "{a.names["ops"]}"',
        "CREATE TABLE mailbox.mine ()",
        "CREATE FUNCTION mailbox.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "SELECT mailbox._caller()",
        "SELECT mailbox.outbox_publish('cap', '{}')",
        "SELECT mailbox._capture_function_sql(1, 'cap', 0)",
    ]
    for sql in refused:
        with raises("42501"):
            atk.execute(sql)
    # the partition holds only its own outbox's rows
    with raises("23514"):
        atk.execute(
            f"INSERT INTO mailbox._outbox_log_cap {cols} VALUES ({keys['ev']}, 'x', 'x', '{{}}')"
        )
    # nothing above left a trace
    assert capture_log(db, "cap") == [("INSERT", True)]
    assert scalar(db, "SELECT count(*) FROM mailbox.outbox_ev") == 1
    assert a.state() == a.baseline
    ops.execute("SELECT mailbox.disable_outbox('cap')")
    assert scalar(db, "SELECT to_regprocedure(%s)", [fn]) is None
    with raises("42P01"):
        atk.execute("INSERT INTO mailbox._outbox_log_cap (payload) VALUES ('{}')")


def test_capture_function_on_a_table_its_owner_does_not_own_captures_nothing(arena_factory):
    """The owner of a capture function may attach it to another table it has TRIGGER on; run
    there it would serialise someone else's rows with the function owner's rights into the
    owner's outbox. It refuses instead, and nothing reaches the outbox."""
    a = arena_factory("default", "none")
    db, atk, ops = a.db, a.conns["atk"], a.conns["ops"]
    ops.execute("SELECT mailbox.enable_outbox('atk.t', p_outbox_name => 'cap')")
    fn = _capture_function(db, "atk.t")
    db.execute("CREATE TABLE public.payroll (id int, salary int)")
    db.execute(f'GRANT TRIGGER ON public.payroll TO "{a.names["atk"]}"')
    atk.execute(
        "CREATE TRIGGER steal AFTER INSERT ON public.payroll REFERENCING NEW TABLE AS"
        f" mailbox_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {fn}"
    )
    with pytest.raises(psycopg.Error):
        db.execute("INSERT INTO public.payroll VALUES (1, 123456)")
    assert capture_log(db, "cap") == []
    assert (
        scalar(db, "SELECT count(*) FROM mailbox._outbox_log WHERE payload::text LIKE '%123456%'")
        == 0
    )


def test_admin_snapshot_never_runs_the_table_owners_cast_with_the_admins_rights(arena_factory):
    """outbox_snapshot (and enable_outbox's initial snapshot) turn rows into JSON; to_jsonb calls
    the cast to json of a column's type, which the table's owner wrote. Run with the rights of
    the mailbox_admin who takes the snapshot, that cast is the admin: here it grants its owner
    (a mailbox_consumer) consume on another team's locked outbox and copies that outbox's rows
    into a table of its own. A snapshot must not run the owner's casts with the caller's rights
    (RLS policies are a different matter: reading a table as yourself evaluates them as
    yourself, as any SELECT does)."""
    a = arena_factory("default", "consumer")
    db, atk, ops = a.db, a.conns["atk"], a.conns["ops"]
    name = a.names["atk"]
    db.execute("SELECT mailbox.create_outbox('payroll')")
    db.execute("SELECT mailbox.create_consumer_group('gpay', 'payroll', 'earliest')")
    db.execute("SELECT mailbox.outbox_publish('payroll', '{\"salary\": 123456}')")
    db.execute("SELECT mailbox.grant_outbox('payroll', %s, 'consume')", [a.names["cons"]])
    atk.execute("CREATE TABLE atk.loot (data text)")
    atk.execute("GRANT INSERT ON atk.loot TO PUBLIC")
    atk.execute(
        MOOD.replace("atk.hook('enum_cast')", "atk.deputy()").replace(
            "atk.hook('enum_cast_jsonb')", "atk.deputy()"
        )
    )
    atk.execute(
        f"""
CREATE FUNCTION atk.deputy() RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO atk.hook_log (site, who, super) VALUES ('deputy', current_user, false);
    BEGIN PERFORM mailbox.grant_outbox('payroll', '{name}', 'consume');
    EXCEPTION WHEN OTHERS THEN NULL; END;
    BEGIN INSERT INTO atk.loot SELECT payload::text FROM mailbox.outbox_payroll;
    EXCEPTION WHEN OTHERS THEN NULL; END;
END $f$"""
    )
    atk.execute("ALTER TABLE atk.t ADD COLUMN m atk.mood NOT NULL DEFAULT 'ok'")
    atk.execute("INSERT INTO atk.t (id) VALUES (1)")
    ops.execute(
        "SELECT mailbox.enable_outbox('atk.t', p_outbox_name => 'cap', p_initial_snapshot => true)"
    )
    ops.execute("SELECT mailbox.outbox_snapshot('cap')")
    runs = rows(db, "SELECT DISTINCT who::text FROM atk.hook_log WHERE site = 'deputy'")
    assert rows(db, "SELECT data FROM atk.loot") == [], "another outbox's rows leaked"
    assert (
        rows(db, "SELECT privilege FROM mailbox.object_grants WHERE grantee = %s::regrole", [name])
        == []
    ), "the table owner granted itself consume on another team's outbox"
    assert all(who == name for (who,) in runs), f"the owner's cast ran as {runs}"


# ---------------------------------------------------------------------------------------------
# Privilege checks: every listed privilege is required


@pytest.fixture
def owner_and_admin(db):
    """A table owner (mailbox_admin, so it can capture its own table) with a table, and another
    mailbox_admin that has no right on it unless a test grants one."""
    tag = uuid.uuid4().hex[:8]
    owner, admin = f"p{tag}_owner", f"p{tag}_admin"
    _create_login_role(db, owner, "mailbox_admin")
    _create_login_role(db, admin, "mailbox_admin")
    db.execute(f'CREATE SCHEMA v AUTHORIZATION "{owner}"')
    db.execute(f'GRANT USAGE ON SCHEMA v TO "{admin}"')
    db.execute(f'SET ROLE "{owner}"')
    db.execute("CREATE TABLE v.secret (id int PRIMARY KEY, who text, note text)")
    db.execute("INSERT INTO v.secret VALUES (1, 'owner', 'old secret')")
    db.execute("RESET ROLE")
    yield owner, admin
    db.execute("RESET ROLE")
    _drop_roles(db, [owner, admin])


def _as(db, role, sql, params=None):
    db.execute(f'SET ROLE "{role}"')
    try:
        cur = db.execute(sql, params)
        return cur.fetchall() if cur.description else None
    finally:
        db.execute("RESET ROLE")


def _error_text(exc):
    d = exc.diag
    return " ".join(x or "" for x in (d.message_primary, d.message_detail, d.message_hint))


@pytest.mark.parametrize(
    "held, missing",
    [("SELECT", "TRIGGER"), ("TRIGGER", "SELECT"), (None, "SELECT")],
    ids=["select_only", "trigger_only", "neither"],
)
def test_enable_outbox_requires_select_and_trigger(db, owner_and_admin, held, missing):
    owner, admin = owner_and_admin
    if held:
        db.execute(f'GRANT {held} ON v.secret TO "{admin}"')
    with raises("42501") as info:
        _as(db, admin, "SELECT mailbox.enable_outbox('v.secret')")
    assert missing in _error_text(info.value), _error_text(info.value)
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox") == 0
    assert scalar(db, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'v.secret'::regclass") == 0


def test_admin_with_only_trigger_cannot_read_rows_through_the_outbox(db, owner_and_admin):
    owner, admin = owner_and_admin
    db.execute(f'GRANT TRIGGER ON v.secret TO "{admin}"')
    with raises("42501"):
        _as(db, admin, "SELECT mailbox.enable_outbox('v.secret', p_outbox_name => 'spy')")
    with raises("42501"):
        _as(db, admin, "SELECT * FROM v.secret")
    # the owner keeps writing; nothing it writes reaches any outbox the admin can read
    _as(db, owner, "INSERT INTO v.secret VALUES (2, 'owner', 'new secret')")
    _as(db, owner, "UPDATE v.secret SET note = 'changed secret' WHERE id = 1")
    seen = _as(
        db,
        admin,
        "SELECT count(*) FROM mailbox.outboxes WHERE source = 'v.secret'",
    )
    assert seen == [(0,)]
    leaked = scalar(
        db,
        "SELECT count(*) FROM mailbox._outbox_log WHERE payload::text LIKE '%secret%'"
        " OR EXISTS (SELECT 1 FROM mailbox._outbox_delta_rows AS d"
        "             WHERE d.payload::text LIKE '%secret%')",
    )
    assert leaked == 0


@pytest.mark.parametrize("held", ["TRIGGER", None], ids=["trigger_only", "nothing"])
def test_outbox_snapshot_requires_select(db, owner_and_admin, held):
    owner, admin = owner_and_admin
    _as(db, owner, "SELECT mailbox.enable_outbox('v.secret', p_outbox_name => 'sec')")
    if held:
        db.execute(f'GRANT {held} ON v.secret TO "{admin}"')
    with raises("42501") as info:
        _as(db, admin, "SELECT mailbox.outbox_snapshot('sec')")
    assert "SELECT" in _error_text(info.value), _error_text(info.value)
    assert capture_log(db, "sec") == []
    # SELECT taken away from the owner itself: no snapshot either
    db.execute(f'REVOKE SELECT ON v.secret FROM "{owner}"')
    with raises("42501"):
        _as(db, owner, "SELECT mailbox.outbox_snapshot('sec')")
    assert capture_log(db, "sec") == []


def test_outbox_snapshot_is_refused_to_a_caller_restricted_by_row_security(db, owner_and_admin):
    """A snapshot holds the whole table (it is read by the table owner's function, so the
    owner's casts never run with the caller's rights): an admin with SELECT on a table whose
    policy hides rows from it gets 42501, whether through enable_outbox or outbox_snapshot,
    and no row of the table reaches an outbox."""
    owner, admin = owner_and_admin
    _as(db, owner, "INSERT INTO v.secret VALUES (2, %s, 'visible to the admin')", [admin])
    _as(db, owner, "ALTER TABLE v.secret ENABLE ROW LEVEL SECURITY")
    _as(db, owner, "CREATE POLICY own_rows ON v.secret USING (who = current_user)")
    db.execute(f'GRANT SELECT, TRIGGER ON v.secret TO "{admin}"')
    assert _as(db, admin, "SELECT id FROM v.secret") == [(2,)]
    with raises("42501") as info:
        _as(
            db,
            admin,
            "SELECT mailbox.enable_outbox('v.secret', p_outbox_name => 'sec',"
            " p_initial_snapshot => true)",
        )
    assert "row-level security" in _error_text(info.value)
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox") == 0
    _as(db, admin, "SELECT mailbox.enable_outbox('v.secret', p_outbox_name => 'sec')")
    with raises("42501"):
        _as(db, admin, "SELECT mailbox.outbox_snapshot('sec')")
    assert scalar(db, "SELECT count(*) FROM mailbox._outbox_log") == 0
    # the owner takes the whole table
    assert _as(db, owner, "SELECT mailbox.outbox_snapshot('sec')") == [(2,)]


# ---------------------------------------------------------------------------------------------
# Per-object authority (SPEC §0): grant_outbox / revoke_outbox


@pytest.fixture
def teams(db):
    """Outboxes o1 (to be granted) and o2 (never granted), each with a group and rows, and
    LOGIN-less roles: consumers a (grantee), b (not), c (second grantee), m (member of a
    granted team role), producers a (grantee) and b (not), and an admin with no grant."""
    tag = uuid.uuid4().hex[:8]
    r = {
        k: f"g{tag}_{k}"
        for k in ("cons_a", "cons_b", "cons_c", "cons_m", "team", "prod_a", "prod_b", "adm")
    }
    for k in ("cons_a", "cons_b", "cons_c", "cons_m"):
        _create_login_role(db, r[k], "mailbox_consumer")
    _create_login_role(db, r["team"])
    db.execute(f'GRANT "{r["team"]}" TO "{r["cons_m"]}"')
    _create_login_role(db, r["prod_a"], "mailbox_producer")
    _create_login_role(db, r["prod_b"], "mailbox_producer")
    _create_login_role(db, r["adm"], "mailbox_admin")
    # o1 captures a table with threshold 0, so its rows are claim-check rows (offsets 1..3)
    db.execute("CREATE TABLE src (id int)")
    db.execute(
        "SELECT mailbox.enable_outbox('src', p_inline_threshold_rows => 0, p_outbox_name => 'o1')"
    )
    db.execute("SELECT mailbox.create_outbox('o2')")
    for o in ("o1", "o2"):
        db.execute("SELECT mailbox.create_consumer_group(%s, %s, 'earliest')", ["g" + o, o])
    for i in range(3):
        db.execute("INSERT INTO src VALUES (%s)", [i])
    db.execute("SELECT mailbox.outbox_publish_batch('o2', ARRAY['{}', '{}', '{}']::jsonb[])")
    sequence(db, "o1")
    yield r
    db.execute("RESET ROLE")
    _drop_roles(db, r.values())


def _consume_calls(group, consumer):
    """Every call of the consume privilege, for one consumer of one group."""
    return [
        ("poll_outbox", f"SELECT count(*) FROM mailbox.poll_outbox('{group}', '{consumer}', 1)"),
        ("extend_lease", f"SELECT mailbox.extend_lease('{group}', '{consumer}', 60)"),
        ("commit_offset", f"SELECT mailbox.commit_offset('{group}', '{consumer}', 1)"),
        ("seek_offset", f"SELECT mailbox.seek_offset('{group}', '{consumer}', 0)"),
    ]


PUBLISH_CALLS = [
    ("outbox_publish", "SELECT mailbox.outbox_publish('{o}', '{{}}')"),
    ("outbox_publish_batch", "SELECT mailbox.outbox_publish_batch('{o}', ARRAY['{{}}']::jsonb[])"),
]


def _works(db, role, calls):
    for name, sql in calls:
        try:
            _as(db, role, sql)
        except psycopg.Error as exc:
            raise AssertionError(f"{name} as {role}: {exc.sqlstate} {exc}") from exc


def _refused(db, role, calls):
    for name, sql in calls:
        db.execute(f'SET ROLE "{role}"')
        try:
            wrong = _not_refused(db, sql)
        finally:
            db.execute("RESET ROLE")
        assert wrong is None, f"{name} as {role}: {wrong}"


def test_outboxes_without_grants_stay_open_to_role_level_grants(db, teams):
    _works(db, teams["cons_b"], _consume_calls("go1", "b"))
    _works(db, teams["prod_b"], [(n, s.format(o="o1")) for n, s in PUBLISH_CALLS])


def test_grant_outbox_consume_closes_the_outbox_to_other_consumers(db, teams):
    t = teams
    db.execute("SELECT mailbox.grant_outbox('o1', %s, 'consume')", [t["cons_a"]])
    _refused(db, t["cons_b"], _consume_calls("go1", "b"))
    _works(db, t["cons_a"], _consume_calls("go1", "a"))
    # reading claim-check rows and marking them consumed is consuming that outbox too
    claim_check_calls = [
        ("outbox_delta_rows", "SELECT count(*) FROM mailbox.outbox_delta_rows('o1', 1)"),
        ("outbox_rows_consumed", "SELECT mailbox.outbox_rows_consumed('o1', 1, 'go1')"),
    ]
    _refused(db, t["cons_b"], claim_check_calls)
    _works(db, t["cons_a"], claim_check_calls)
    # a member of a granted role holds the grant
    db.execute("SELECT mailbox.grant_outbox('o1', %s, 'consume')", [t["team"]])
    _works(db, t["cons_m"], _consume_calls("go1", "m"))
    # an outbox that has a grant is closed to non-grantees for publishing as well
    _refused(db, t["prod_b"], [(n, s.format(o="o1")) for n, s in PUBLISH_CALLS])
    # the other outbox is untouched: still open
    _works(db, t["cons_b"], _consume_calls("go2", "b"))
    _works(db, t["prod_b"], [(n, s.format(o="o2")) for n, s in PUBLISH_CALLS])
    # mailbox_admin keeps everything without a grant
    _works(db, t["adm"], _consume_calls("go1", "adm"))
    _works(db, t["adm"], [(n, s.format(o="o1")) for n, s in PUBLISH_CALLS])


def test_grant_outbox_publish_closes_the_outbox_to_other_producers(db, teams):
    t = teams
    db.execute("SELECT mailbox.grant_outbox('o1', %s, 'publish')", [t["prod_a"]])
    _refused(db, t["prod_b"], [(n, s.format(o="o1")) for n, s in PUBLISH_CALLS])
    _works(db, t["prod_a"], [(n, s.format(o="o1")) for n, s in PUBLISH_CALLS])
    # publish is not consume
    _refused(db, t["prod_a"], _consume_calls("go1", "pa"))
    _works(db, t["prod_b"], [(n, s.format(o="o2")) for n, s in PUBLISH_CALLS])
    _works(db, t["adm"], [(n, s.format(o="o1")) for n, s in PUBLISH_CALLS])


def test_revoke_outbox_takes_effect(db, teams):
    t = teams
    db.execute("SELECT mailbox.grant_outbox('o1', %s, 'consume')", [t["cons_a"]])
    db.execute("SELECT mailbox.grant_outbox('o1', %s, 'consume')", [t["cons_c"]])
    _works(db, t["cons_a"], _consume_calls("go1", "a"))
    db.execute("SELECT mailbox.revoke_outbox('o1', %s, 'consume')", [t["cons_a"]])
    _refused(db, t["cons_a"], _consume_calls("go1", "a"))
    _works(db, t["cons_c"], _consume_calls("go1", "c"))


def test_grant_and_revoke_outbox_are_for_admins_only(db, teams):
    t = teams
    db.execute("SELECT mailbox.grant_outbox('o1', %s, 'consume')", [t["cons_a"]])
    for role in (t["cons_b"], t["prod_b"]):
        for sql in (
            f"SELECT mailbox.grant_outbox('o1', '{role}', 'consume')",
            f"SELECT mailbox.grant_outbox('o1', '{role}', 'publish')",
            f"SELECT mailbox.revoke_outbox('o1', '{t['cons_a']}', 'consume')",
        ):
            with raises("42501"):
                _as(db, role, sql)
    _refused(db, t["cons_b"], _consume_calls("go1", "b"))
    _works(db, t["cons_a"], _consume_calls("go1", "a"))
    # an admin may grant
    _as(db, t["adm"], f"SELECT mailbox.grant_outbox('o1', '{t['cons_b']}', 'consume')")
    _works(db, t["cons_b"], _consume_calls("go1", "b"))


def test_grant_outbox_bad_arguments(db, teams):
    t = teams
    for bad in ("read", "receive", "PUBLISH", ""):
        with raises("22023"):
            db.execute("SELECT mailbox.grant_outbox('o1', %s, %s)", [t["cons_a"], bad])
        with raises("22023"):
            db.execute("SELECT mailbox.revoke_outbox('o1', %s, %s)", [t["cons_a"], bad])
    with raises("42704"):
        db.execute("SELECT mailbox.grant_outbox('nope', %s, 'consume')", [t["cons_a"]])
    with raises("42704"):
        db.execute("SELECT mailbox.revoke_outbox('nope', %s, 'consume')", [t["cons_a"]])
    # nothing was granted by the failed calls: o1 is still open
    _works(db, t["cons_b"], _consume_calls("go1", "b"))


def test_dropping_an_outbox_forgets_its_grants(db, teams):
    t = teams
    db.execute("SELECT mailbox.grant_outbox('o1', %s, 'consume')", [t["cons_a"]])
    db.execute("SELECT mailbox.drop_outbox('o1')")
    db.execute("SELECT mailbox.create_outbox('o1')")
    db.execute("SELECT mailbox.create_consumer_group('go1', 'o1', 'earliest')")
    db.execute("SELECT mailbox.outbox_publish('o1', '{}')")
    _works(db, t["cons_b"], _consume_calls("go1", "b"))
    _works(db, t["prod_b"], [(n, s.format(o="o1")) for n, s in PUBLISH_CALLS])
