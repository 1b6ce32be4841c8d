"""enable_inbox_tracking(): validating an existing table and its column mapping (SPEC §3.1).

The inbox functions reach an adopted table only through the mapping returned here: role ->
column name, plus the roles whose text argument must be CAST to the column's type (a uuid or
integer id, say). Nothing about the table is changed.
"""

import json

from .errors import MailboxError

# Roles every inbox needs, and the roles used when the table has a column for them.
REQUIRED = ("event_id", "processed_at", "retry_count", "received_at")
OPTIONAL = (
    "error",
    "payload",
    "event_type",
    "source",
    "aggregate_id",
    "sequence_num",
    "priority",
    "headers",
    "trace_id",
)

TEXT = {"text", "varchar"}
INTEGER = {"int2", "int4", "int8"}
JSON = {"json", "jsonb"}
TIMESTAMP = {"timestamptz", "timestamp"}

# The base types (pg_type.typname) each role accepts: those its values convert to by
# assignment, or (CAST_ROLES) by an explicit cast from the text the API passes.
ACCEPTED = {
    "event_id": TEXT | {"uuid", "int4", "int8"},
    "processed_at": TIMESTAMP,
    "retry_count": INTEGER,
    "received_at": TIMESTAMP,
    "error": TEXT,
    "payload": JSON,
    "event_type": TEXT,
    "source": TEXT,
    "aggregate_id": TEXT | {"uuid", "int4", "int8"},
    "sequence_num": INTEGER,
    "priority": INTEGER,
    "headers": JSON,
    "trace_id": TEXT,
}
CAST_ROLES = ("event_id", "aggregate_id")

_TABLE = """
SELECT c.relkind, n.nspname, c.relname
  FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
 WHERE c.oid = $1
"""

_COLUMNS = """
SELECT a.attname, a.attnum, b.typname AS base_type,
       pg_catalog.format_type(a.atttypid, a.atttypmod) AS full_type
  FROM pg_catalog.pg_attribute AS a
  JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
  JOIN pg_catalog.pg_type AS b
    ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
"""

# A unique index ON CONFLICT (column) can use: one plain key column, no predicate, immediate.
_UNIQUE = """
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_index AS i
     WHERE i.indrelid = $1 AND i.indisunique AND i.indimmediate AND i.indisvalid
       AND i.indnkeyatts = 1 AND i.indkey[0] = $2
       AND i.indpred IS NULL AND i.indexprs IS NULL
) AS ok
"""

KIND_NAMES = {
    "v": "view",
    "m": "materialized view",
    "S": "sequence",
    "f": "foreign table",
    "i": "index",
    "c": "composite type",
}


def check_table(kind, schema, name):
    label = f"{schema}.{name}"
    if kind not in ("r", "p"):
        raise MailboxError(
            "42809",
            "not a table: " + label,
            detail=f"{label} is a {KIND_NAMES.get(kind, 'relation of kind ' + kind)}.",
            hint="Only ordinary and partitioned tables can be inbox tables.",
        )
    if schema == "mailbox":
        raise MailboxError(
            "22023",
            "cannot adopt a pg_mailbox table: " + label,
            hint="Adopt your own tables, or use mailbox.create_inbox().",
        )
    if schema.startswith("pg_temp"):
        raise MailboxError(
            "22023",
            "cannot adopt a temporary table: " + label,
            hint="Inbox rows outlive the session; adopt a permanent table.",
        )


def resolve(requested, defaults, columns, label):
    """The mapping {role: column} and the casts {role: type} for a table's columns.

    ``requested`` maps roles to the column names the caller passed (None = do not use);
    ``defaults`` the names a parameter has when not passed; ``columns`` maps each column name
    of the table to (attnum, base type, full type). A required role must resolve; an optional
    one whose column is missing is left out, unless the caller named a non-default column.
    """
    mapping, casts = {}, {}
    for role in REQUIRED + OPTIONAL:
        name = requested.get(role)
        if name is None:
            if role in REQUIRED:
                raise MailboxError(
                    "22004",
                    f"column for {role} must not be null",
                    hint=f"Name the column of {label} that holds {role}.",
                )
            continue
        if name not in columns:
            if role in REQUIRED or name != defaults.get(role):
                raise MailboxError(
                    "42703",
                    f"column not found: {name}",
                    detail=f"Table {label} has no column {name} (mapped to {role}).",
                    hint="Pass the name of an existing column for this role.",
                )
            continue
        _, base, full = columns[name]
        if base not in ACCEPTED[role]:
            raise MailboxError(
                "42804",
                f"column {name} has type {full}, which cannot hold {role}",
                detail=f"{role} accepts {', '.join(sorted(ACCEPTED[role]))}.",
                hint="Map another column, or change the column's type.",
            )
        mapping[role] = name
        if role in CAST_ROLES and base not in TEXT:
            casts[role] = full
    used = list(mapping.values())
    duplicates = sorted({c for c in used if used.count(c) > 1})
    if duplicates:
        raise MailboxError(
            "22023",
            "column mapped to more than one role: " + duplicates[0],
            hint="Each inbox role needs its own column.",
        )
    return mapping, casts


def validate(plpy, rel, requested, defaults):
    """Checks table ``rel`` (an oid) and returns schema, table, columns and casts."""
    found = plpy.execute(plpy.prepare(_TABLE, ["oid"]), [rel])
    if not found:
        raise MailboxError("42704", f"table not found: {rel}")
    kind, schema, name = found[0]["relkind"], found[0]["nspname"], found[0]["relname"]
    check_table(kind, schema, name)
    label = f"{schema}.{name}"
    columns = {
        r["attname"]: (r["attnum"], r["base_type"], r["full_type"])
        for r in plpy.execute(plpy.prepare(_COLUMNS, ["oid"]), [rel])
    }
    mapping, casts = resolve(requested, defaults, columns, label)
    id_column = mapping["event_id"]
    unique = plpy.execute(plpy.prepare(_UNIQUE, ["oid", "int2"]), [rel, columns[id_column][0]])
    if not unique[0]["ok"]:
        raise MailboxError(
            "55000",
            f"id column {id_column} of {label} is not a primary key or unique",
            detail="Deduplication (ON CONFLICT) needs a unique index on exactly this column.",
            hint=f"ALTER TABLE {label} ADD PRIMARY KEY ({id_column}), or add a UNIQUE constraint.",
        )
    return {"schema": schema, "table": name, "columns": mapping, "casts": casts}


def validate_sql(plpy, rel, requested_json, defaults_json):
    return validate(plpy, rel, json.loads(requested_json), json.loads(defaults_json))
