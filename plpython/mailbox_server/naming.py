"""Outbox and inbox naming rules (SPEC §0, §1.1).

A name becomes part of identifiers such as ``outbox_<N>`` and ``pending_<I>_<tier>``, so it
is a lowercase identifier of bounded length; deriving one from a table name must always give
a valid, unused name.
"""

import hashlib
import re

from .errors import MailboxError

NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
MAX_NAME_BYTES = 40
HASHED_PREFIX_BYTES = 32


def is_valid_name(name, max_bytes=MAX_NAME_BYTES):
    return (
        name is not None
        and NAME_RE.match(name) is not None
        and len(name.encode("utf-8")) <= max_bytes
    )


def sanitize(table_name):
    """Turn any table name into a candidate outbox name: lowercase, [a-z0-9_] only."""
    candidate = re.sub(r"[^a-z0-9_]", "_", table_name.lower())
    if not candidate or candidate[0].isdigit():
        candidate = "_" + candidate
    return candidate


def hashed_name(base, schema, table):
    """First 32 bytes of the base + '_' + 7 hex digits of md5('schema.table')."""
    digest = hashlib.md5(f"{schema}.{table}".encode()).hexdigest()[:7]
    return f"{base[:HASHED_PREFIX_BYTES]}_{digest}"


def derive_outbox_name(schema, table, is_taken):
    """The outbox name enable_outbox gives a table when the caller names none.

    The table's name (lowercased, other characters as '_') when that is a valid name that is
    free; otherwise the hashed form, which is unique per schema-qualified table.
    """
    base = sanitize(table)
    if is_valid_name(base) and not is_taken(base):
        return base
    return hashed_name(base, schema, table)


def derive_outbox_name_sql(plpy, schema, table):
    """derive_outbox_name with the catalog as the judge of what is taken."""
    plan = plpy.prepare(
        "SELECT EXISTS (SELECT 1 FROM mailbox._outbox WHERE outbox_name = $1) AS taken",
        ["text"],
    )

    def is_taken(name):
        return plpy.execute(plan, [name])[0]["taken"]

    name = derive_outbox_name(schema, table, is_taken)
    if is_taken(name):
        raise MailboxError(
            "42710",
            "outbox already exists: " + name,
            detail=f"The name derived for table {schema}.{table} is in use.",
            hint="Pass p_outbox_name to choose another name.",
        )
    return name
