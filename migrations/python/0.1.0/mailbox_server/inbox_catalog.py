"""The inbox catalog as seen from Python: rows of mailbox._inbox.

Python never reads or writes an inbox table: the SQL helpers it calls (mailbox._inbox_counts,
_inbox_drain, _inbox_gap_list) do, with the table owner's rights (docs/inbox.md, "Whose
rights run what").

An inbox's table is its identity (``mailbox._inbox.table_rel``), not the name stored when it
was made: ``Inbox.table`` is the table's *current* name, read from pg_class by oid (the SQL
helpers find it the same way), so a table that merely took the old name after a rename is
never read or written. ``Inbox.renamed``
says the stored name no longer names the table (the per-message SQL functions then refuse
with 55000); ``Inbox.table`` raises 55000 when the table was dropped by hand.
"""

import json

from . import settings
from .errors import MailboxError

CATALOG_SQL = """
SELECT i.inbox_key, i.inbox_name, i.schema_name, i.table_name, i.is_managed,
       i.columns::text AS columns, i.casts::text AS casts, i.max_retries, i.retention_hours,
       i.ordering_first_sequence, i.priority_tiers::text AS priority_tiers, i.with_dead_letter,
       i.with_stats, n.nspname AS current_schema, c.relname AS current_table,
       pg_catalog.to_regclass(pg_catalog.format('%I.%I', i.schema_name, i.table_name))
           IS DISTINCT FROM i.table_rel AS renamed
  FROM mailbox._inbox AS i
  LEFT JOIN pg_catalog.pg_class AS c ON c.oid = i.table_rel
  LEFT JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
"""


class Inbox:
    def __init__(self, plpy, row):
        self.plpy = plpy
        self.key = row["inbox_key"]
        self.name = row["inbox_name"]
        self.schema = row["schema_name"]
        self.table_name = row["table_name"]
        self.is_managed = row["is_managed"]
        self.columns = json.loads(row["columns"])
        self.casts = json.loads(row["casts"])
        self.max_retries = row["max_retries"]
        self.retention_hours = row["retention_hours"]
        self.first_sequence = row["ordering_first_sequence"]
        self.tiers = None if row["priority_tiers"] is None else json.loads(row["priority_tiers"])
        # the table's current name (None when it was dropped); rows without these keys come
        # from callers that know the stored name is current
        if "current_table" in row:
            self.current = (
                None
                if row["current_table"] is None
                else (row["current_schema"], row["current_table"])
            )
            self.renamed = bool(row["renamed"])
        else:
            self.current, self.renamed = (self.schema, self.table_name), False

    @property
    def ordered(self):
        return self.first_sequence is not None

    @property
    def exists(self):
        return self.current is not None

    @property
    def table(self):
        """The inbox's own table under its current name (views stay in ``schema``)."""
        if self.current is None:
            raise MailboxError(
                "55000",
                f"inbox table of inbox {self.name} was dropped",
                hint="Drop the inbox with mailbox.drop_inbox().",
            )
        q = self.plpy.quote_ident
        return f"{q(self.current[0])}.{q(self.current[1])}"


def get(plpy, name):
    if name is None:
        raise MailboxError(
            "22004",
            "inbox name must not be null",
            hint="Pass the name of an inbox (see mailbox.inbox_status()).",
        )
    rows = plpy.execute(plpy.prepare(CATALOG_SQL + " WHERE i.inbox_name = $1", ["text"]), [name])
    if not rows:
        raise MailboxError(
            "42704",
            "inbox not found: " + name,
            hint="Create it with mailbox.create_inbox() or mailbox.enable_inbox_tracking(); "
            "mailbox.inbox_status() lists them.",
        )
    return Inbox(plpy, rows[0])


def all_inboxes(plpy):
    return [Inbox(plpy, r) for r in plpy.execute(CATALOG_SQL + " ORDER BY i.inbox_name")]


def retention_hours(plpy, inbox):
    """The inbox's own processed-row retention, or mailbox.inbox_processed_retention_hours."""
    if inbox.retention_hours is not None:
        return inbox.retention_hours
    return settings.get_int(plpy, "inbox_processed_retention_hours")
