"""The inbox catalog as seen from Python: rows of mailbox._inbox and SQL fragments for them.

Inbox tables are reached only through their column mapping: ``Inbox.col(role)`` quotes the
mapped column with ``plpy.quote_ident`` (never string formatting of raw names), values are
always bind parameters of ``plpy.prepare``.
"""

import json

from .errors import MailboxError

CATALOG_SQL = """
SELECT inbox_key, inbox_name, schema_name, table_name, is_managed, columns::text AS columns,
       casts::text AS casts, max_retries, retention_hours, ordering_first_sequence,
       priority_tiers::text AS priority_tiers, with_dead_letter, with_stats
  FROM mailbox._inbox
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

    @property
    def ordered(self):
        return self.first_sequence is not None

    @property
    def table(self):
        q = self.plpy.quote_ident
        return f"{q(self.schema)}.{q(self.table_name)}"

    def view(self, prefix):
        q = self.plpy.quote_ident
        return f"{q(self.schema)}.{q(prefix + self.name)}"

    def col(self, role, alias="t"):
        return f"{alias}.{self.plpy.quote_ident(self.columns[role])}"

    def id_param(self, expr):
        """``expr`` (text) converted to the id column's type, for index-friendly lookups."""
        cast = self.casts.get("event_id")
        return f"CAST({expr} AS {cast})" if cast else expr


def get(plpy, name):
    if name is None:
        raise MailboxError(
            "22004",
            "inbox name must not be null",
            hint="Pass the name of an inbox (see mailbox.inbox_status()).",
        )
    rows = plpy.execute(plpy.prepare(CATALOG_SQL + " WHERE inbox_name = $1", ["text"]), [name])
    if not rows:
        raise MailboxError(
            "42704",
            "inbox not found: " + name,
            hint="Create it with mailbox.create_inbox() or mailbox.enable_inbox_tracking(); "
            "mailbox.inbox_status() lists them.",
        )
    return Inbox(plpy, rows[0])


def all_inboxes(plpy):
    return [Inbox(plpy, r) for r in plpy.execute(CATALOG_SQL + " ORDER BY inbox_name")]


def setting_int(plpy, name, default, low, high):
    plan = plpy.prepare(
        "SELECT mailbox._setting_int($1, $2, $3, $4) AS v", ["text", "int", "int", "int"]
    )
    return plpy.execute(plan, [name, default, low, high])[0]["v"]


def retention_hours(plpy, inbox):
    """The inbox's own processed-row retention, or mailbox.inbox_processed_retention_hours."""
    if inbox.retention_hours is not None:
        return inbox.retention_hours
    return setting_int(plpy, "inbox_processed_retention_hours", 72, 0, 876000)
