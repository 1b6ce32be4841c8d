"""A deterministic text description of everything the pg_mailbox extension owns.

Used twice: a fresh install must equal every upgraded install (tests/upgrade/test_upgrade_paths.py,
``bodies=True``, so a migration that forgot to replace a function body is caught), and a
fresh install must equal the committed tests/expected/api_surface.txt (``bodies=False``:
signatures, attributes, columns, grants and comments, not implementation text).

Independent of the installing superuser's name (owners are left out, and so are the
owner's own privileges) and of the session's search_path (everything is rendered with
search_path = pg_catalog). Column order is kept: a migration must add a column where a
fresh install has it, or `SELECT *` differs between the two.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

EXTENSION = "pg_mailbox"

_MEMBERS = """
    SELECT d.objid FROM pg_depend AS d
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = %(ext)s
       AND d.deptype = 'e' AND d.classid = %(catalog)s::regclass
"""


def _acl(kind: str, acl_col: str, owner_col: str) -> str:
    """SQL for the privileges an object's ACL grants to roles other than its owner."""
    return f"""ARRAY(
        SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
               || ' ' || a.privilege_type
               || CASE WHEN a.is_grantable THEN ' (grantable)' ELSE '' END
          FROM aclexplode(coalesce({acl_col}, acldefault('{kind}', {owner_col}))) AS a
         WHERE a.grantee <> {owner_col})"""


def _grants(acl: list[str]) -> list[str]:
    return [f"grant {g}" for g in sorted(acl)] or ["grant (none)"]


def _comment(text: str | None) -> str:
    return "comment: (none)" if text is None else f"comment: {text}"


def _block(header: str, lines: list[str]) -> str:
    return "\n".join([header, *(f"    {line}" for line in lines)])


def _functions(cur: psycopg.Cursor, ext: int, bodies: bool) -> list[str]:
    rows = cur.execute(
        f"""
        SELECT p.oid::regprocedure::text AS ident, p.prokind, l.lanname, p.provolatile,
               p.proisstrict, p.proparallel, p.prosecdef, p.proleakproof, p.proconfig,
               pg_get_function_arguments(p.oid) AS args, pg_get_function_result(p.oid) AS result,
               md5(p.prosrc) AS src_md5, {_acl("f", "p.proacl", "p.proowner")} AS acl,
               obj_description(p.oid, 'pg_proc') AS comment
          FROM pg_proc AS p JOIN pg_language AS l ON l.oid = p.prolang
         WHERE p.oid IN ({_MEMBERS})
        """,
        {"ext": ext, "catalog": "pg_proc"},
    ).fetchall()
    kinds = {"f": "function", "p": "procedure", "a": "aggregate", "w": "window function"}
    volatility = {"i": "immutable", "s": "stable", "v": "volatile"}
    parallel = {"s": "parallel safe", "r": "parallel restricted", "u": "parallel unsafe"}
    blocks = []
    for p in rows:
        attrs = [
            p["lanname"],
            volatility[p["provolatile"]],
            "strict" if p["proisstrict"] else "called on null input",
            parallel[p["proparallel"]],
            "security definer" if p["prosecdef"] else "security invoker",
        ]
        if p["proleakproof"]:
            attrs.append("leakproof")
        lines = [f"arguments: {p['args']}", f"returns: {p['result']}"]
        lines.append("attributes: " + ", ".join(attrs))
        lines += [f"set {c}" for c in p["proconfig"] or []]
        lines += _grants(p["acl"])
        lines.append(_comment(p["comment"]))
        if bodies:
            lines.append(f"body md5: {p['src_md5']}")
        blocks.append(_block(f"{kinds[p['prokind']]} {p['ident']}", lines))
    return blocks


def _columns(cur: psycopg.Cursor, relid: int) -> list[str]:
    lines = []
    for c in cur.execute(
        """
        SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
               pg_get_expr(ad.adbin, ad.adrelid) AS default, a.attidentity, a.attgenerated,
               col_description(a.attrelid, a.attnum) AS comment, a.attacl::text[] AS acl
          FROM pg_attribute AS a
          LEFT JOIN pg_attrdef AS ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
         WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
         ORDER BY a.attnum
        """,
        [relid],
    ).fetchall():
        line = f"column {c['name']} {c['type']}"
        if c["attnotnull"]:
            line += " NOT NULL"
        if c["attidentity"]:
            when = "ALWAYS" if c["attidentity"] == "a" else "BY DEFAULT"
            line += f" GENERATED {when} AS IDENTITY"
        elif c["attgenerated"]:
            line += f" GENERATED ALWAYS AS ({c['default']}) STORED"
        elif c["default"] is not None:
            line += f" DEFAULT {c['default']}"
        lines.append(line)
        if c["comment"] is not None:
            lines.append(f"column {c['name']} comment: {c['comment']}")
        if c["acl"]:
            lines.append(f"column {c['name']} acl: {sorted(c['acl'])}")
    return lines


def _relations(cur: psycopg.Cursor, ext: int, bodies: bool) -> list[str]:
    kinds = {
        "r": "table",
        "p": "partitioned table",
        "v": "view",
        "m": "materialized view",
        "S": "sequence",
        "f": "foreign table",
    }
    rows = cur.execute(
        f"""
        SELECT c.oid, c.oid::regclass::text AS ident, c.relkind, c.relpersistence, c.reloptions,
               c.relrowsecurity, c.relforcerowsecurity,
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END AS partkey,
               CASE WHEN c.relispartition THEN
                   (SELECT i.inhparent::regclass::text FROM pg_inherits AS i
                     WHERE i.inhrelid = c.oid)
                   || ' ' || pg_get_expr(c.relpartbound, c.oid) END AS partof,
               CASE WHEN c.relkind IN ('v', 'm') THEN md5(pg_get_viewdef(c.oid)) END AS view_md5,
               {_acl("r", "c.relacl", "c.relowner")} AS acl,
               obj_description(c.oid, 'pg_class') AS comment
          FROM pg_class AS c
         WHERE c.oid IN ({_MEMBERS})
        """,
        {"ext": ext, "catalog": "pg_class"},
    ).fetchall()
    blocks = []
    for rel in rows:
        oid = rel["oid"]
        columns = [] if rel["relkind"] == "S" else _columns(cur, oid)
        lines = []
        if rel["relpersistence"] == "u":
            lines.append("unlogged")
        if rel["reloptions"]:
            lines.append(f"options: {sorted(rel['reloptions'])}")
        if rel["relrowsecurity"]:
            lines.append("row level security" + (" (forced)" if rel["relforcerowsecurity"] else ""))
        if rel["partkey"]:
            lines.append(f"partition by {rel['partkey']}")
        if rel["partof"]:
            lines.append(f"partition of {rel['partof']}")
        if rel["relkind"] == "S":
            seq = cur.execute(
                "SELECT format_type(seqtypid, NULL) AS as, seqstart AS start,"
                " seqincrement AS increment, seqmin AS min, seqmax AS max, seqcache AS cache,"
                " seqcycle::text AS cycle FROM pg_sequence WHERE seqrelid = %s",
                [oid],
            ).fetchone()
            lines.append("sequence " + " ".join(f"{k} {v}" for k, v in seq.items()))
        for con in cur.execute(
            "SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint"
            " WHERE conrelid = %s",
            [oid],
        ):
            lines.append(f"constraint {con['conname']} {con['def']}")
        for idx in cur.execute(
            "SELECT pg_get_indexdef(indexrelid) AS def FROM pg_index WHERE indrelid = %s", [oid]
        ):
            lines.append(f"index {idx['def']}")
        for trg in cur.execute(
            "SELECT pg_get_triggerdef(oid) AS def, tgenabled FROM pg_trigger"
            " WHERE tgrelid = %s AND NOT tgisinternal",
            [oid],
        ):
            lines.append(f"trigger {trg['def']} (enabled: {trg['tgenabled']})")
        for pol in cur.execute(
            "SELECT polname, polpermissive::text AS permissive, polcmd AS cmd,"
            " polroles::regrole[]::text[] AS roles,"
            " pg_get_expr(polqual, polrelid) AS using, pg_get_expr(polwithcheck, polrelid) AS check"
            " FROM pg_policy WHERE polrelid = %s",
            [oid],
        ):
            lines.append("policy " + " ".join(f"{k}={v}" for k, v in pol.items()))
        lines += _grants(rel["acl"])
        lines.append(_comment(rel["comment"]))
        if bodies and rel["view_md5"]:
            lines.append(f"definition md5: {rel['view_md5']}")
        # Columns keep their order; everything else is a set.
        kind = kinds.get(rel["relkind"], rel["relkind"])
        blocks.append(_block(f"{kind} {rel['ident']}", columns + sorted(lines)))
    return blocks


def _types(cur: psycopg.Cursor, ext: int) -> list[str]:
    rows = cur.execute(
        f"""
        SELECT t.oid, format_type(t.oid, NULL) AS ident, t.typtype, t.typrelid,
               format_type(t.typbasetype, t.typtypmod) AS base, t.typnotnull, t.typdefault,
               {_acl("T", "t.typacl", "t.typowner")} AS acl,
               obj_description(t.oid, 'pg_type') AS comment
          FROM pg_type AS t WHERE t.oid IN ({_MEMBERS})
        """,
        {"ext": ext, "catalog": "pg_type"},
    ).fetchall()
    blocks = []
    for t in rows:
        lines = []
        if t["typtype"] == "c":
            lines += _columns(cur, t["typrelid"])
        elif t["typtype"] == "e":
            labels = cur.execute(
                "SELECT enumlabel FROM pg_enum WHERE enumtypid = %s ORDER BY enumsortorder",
                [t["oid"]],
            ).fetchall()
            lines.append("labels: " + ", ".join(r["enumlabel"] for r in labels))
        elif t["typtype"] == "d":
            lines.append(f"domain over {t['base']}" + (" NOT NULL" if t["typnotnull"] else ""))
            if t["typdefault"] is not None:
                lines.append(f"default {t['typdefault']}")
            for con in cur.execute(
                "SELECT pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE contypid = %s"
                " ORDER BY 1",
                [t["oid"]],
            ):
                lines.append(f"constraint {con['def']}")
        lines += _grants(t["acl"])
        lines.append(_comment(t["comment"]))
        blocks.append(_block(f"type ({t['typtype']}) {t['ident']}", lines))
    return blocks


def _schemas(cur: psycopg.Cursor, ext: int) -> list[str]:
    rows = cur.execute(
        f"""
        SELECT n.nspname, {_acl("n", "n.nspacl", "n.nspowner")} AS acl,
               obj_description(n.oid, 'pg_namespace') AS comment
          FROM pg_namespace AS n
         WHERE n.oid IN ({_MEMBERS})
            OR n.oid = (SELECT extnamespace FROM pg_extension WHERE oid = %(ext)s)
        """,
        {"ext": ext, "catalog": "pg_namespace"},
    ).fetchall()
    return [
        _block(f"schema {n['nspname']}", [*_grants(n["acl"]), _comment(n["comment"])]) for n in rows
    ]


def _roles(cur: psycopg.Cursor) -> list[str]:
    # Roles are cluster-wide, not extension members: describe the ones the extension
    # documents (mailbox_*) and the memberships among them only, so throwaway test roles
    # granted these roles never show up.
    rows = cur.execute(
        r"""
        SELECT r.rolname, r.rolcanlogin AS login, r.rolinherit AS inherit,
               r.rolsuper AS superuser, r.rolcreatedb AS createdb,
               r.rolcreaterole AS createrole, r.rolbypassrls AS bypassrls,
               ARRAY(SELECT g.rolname
                       FROM pg_auth_members AS m JOIN pg_roles AS g ON g.oid = m.roleid
                      WHERE m.member = r.oid AND g.rolname LIKE 'mailbox\_%') AS member_of
          FROM pg_roles AS r WHERE r.rolname LIKE 'mailbox\_%'
        """
    ).fetchall()
    blocks = []
    for r in rows:
        flags = ["login" if r["login"] else "nologin", "inherit" if r["inherit"] else "noinherit"]
        flags += [f for f in ("superuser", "createdb", "createrole", "bypassrls") if r[f]]
        lines = ["attributes: " + ", ".join(flags)]
        lines += [f"member of {g}" for g in sorted(r["member_of"])]
        blocks.append(_block(f"role {r['rolname']}", lines))
    return blocks


def _other_members(cur: psycopg.Cursor, ext: int) -> list[str]:
    # Anything else the extension owns (casts, operators, event triggers, ...): at least
    # its identity, so adding or losing one shows up.
    detailed = ["pg_proc", "pg_class", "pg_type", "pg_namespace"]
    rows = cur.execute(
        """
        SELECT o.type, o.identity
          FROM pg_depend AS d, LATERAL pg_identify_object(d.classid, d.objid, d.objsubid) AS o
         WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = %(ext)s
           AND d.deptype = 'e' AND d.classid::regclass::text <> ALL (%(detailed)s)
        """,
        {"ext": ext, "detailed": detailed},
    ).fetchall()
    return [f"{r['type']} {r['identity']}" for r in rows]


def schema_snapshot(conn: psycopg.Connection, *, bodies: bool = True) -> str:
    """Describe the installed pg_mailbox in the database ``conn`` is connected to."""
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        # Render every name schema-qualified, whatever the caller's search_path.
        cur.execute("SET LOCAL search_path = pg_catalog")
        e = cur.execute(
            "SELECT e.oid, e.extnamespace::regnamespace::text AS schema,"
            " e.extrelocatable::text AS relocatable,"
            " ARRAY(SELECT c::regclass::text FROM unnest(e.extconfig) AS c) AS config,"
            " e.extcondition FROM pg_extension AS e WHERE e.extname = %s",
            [EXTENSION],
        ).fetchone()
        if e is None:
            raise LookupError(f"extension {EXTENSION} is not installed in this database")
        ext = e["oid"]
        header = [f"extension {EXTENSION} schema {e['schema']} relocatable {e['relocatable']}"]
        # Tables marked with pg_extension_config_dump() and their dump filters.
        conditions = e["extcondition"] or [""] * len(e["config"])
        header += [
            f"    dumped config table {table} {cond!r}"
            for table, cond in sorted(zip(e["config"], conditions, strict=True))
        ]
        sections = [
            ["\n".join(header)],
            sorted(_schemas(cur, ext)),
            sorted(_roles(cur)),
            sorted(_types(cur, ext)),
            sorted(_relations(cur, ext, bodies)),
            sorted(_functions(cur, ext, bodies)),
            sorted(_other_members(cur, ext)),
        ]
    return "\n\n".join("\n".join(s) for s in sections if s) + "\n"


def upgrade_sources(repo: Path | None = None) -> list[str]:
    """Versions with an upgrade script into the default version in migrations/ (0.1.0 for
    0.2.0): the old versions the upgrade tests install."""
    repo = repo or Path(__file__).resolve().parents[1]
    control = (repo / f"{EXTENSION}.control").read_text()
    version = re.search(r"^\s*default_version\s*=\s*'([^']+)'", control, re.MULTILINE).group(1)
    return sorted(
        p.name.removeprefix(f"{EXTENSION}--").removesuffix(f"--{version}.sql")
        for p in (repo / "migrations").glob(f"{EXTENSION}--*--{version}.sql")
    )
