"""outbox_status(): one outbox's health and size as a dict (returned to SQL as jsonb)."""

from .errors import MailboxError

WARNING_FRACTION = 0.8

_CATALOG = """
SELECT o.outbox_key, o.outbox_name, o.source_rel IS NOT NULL AS captured, o.retention_hours,
       o.head_offset, r.last_drained_at, r.last_drained_count, e.source, e.enabled, e.outbox_table,
       mailbox._outbox_partitions(o.outbox_key) AS partitions
  FROM mailbox._outbox AS o
  JOIN mailbox.outboxes AS e ON e.outbox_name = o.outbox_name
  LEFT JOIN mailbox._outbox_retention AS r ON r.outbox_key = o.outbox_key
 WHERE o.outbox_name = $1
"""

_ROWS = """
SELECT pg_catalog.count(*) AS row_count,
       pg_catalog.min(created_at) AS oldest_row, pg_catalog.max(created_at) AS newest_row
  FROM mailbox._outbox_log WHERE outbox_key = $1
"""

_BYTES = "SELECT mailbox._outbox_bytes($1) AS total_bytes"

# A claim-check row is pending until every group of the outbox (or '' = all of them) has
# recorded reading it; with no groups, until someone records it for all groups.
_CLAIM_CHECK_PENDING = """
SELECT pg_catalog.count(*) AS pending
  FROM mailbox._outbox_log AS l
 WHERE l.outbox_key = $1 AND l.is_claim_check
   AND NOT EXISTS (SELECT 1 FROM mailbox._claim_check_consumed AS c
                    WHERE c.outbox_key = l.outbox_key AND c.row_key = l._id AND c.group_name = '')
   AND (NOT EXISTS (SELECT 1 FROM mailbox._consumer_group AS g WHERE g.outbox_key = $1)
        OR EXISTS (SELECT 1 FROM mailbox._consumer_group AS g
                    WHERE g.outbox_key = $1
                      AND NOT EXISTS (SELECT 1 FROM mailbox._claim_check_consumed AS c
                                       WHERE c.outbox_key = l.outbox_key AND c.row_key = l._id
                                         AND c.group_name = g.group_name)))
"""

_GROUPS = """
SELECT g.group_name, g.group_offset,
       mailbox._group_partitions(g.group_name, g.outbox_key) AS partitions,
       x.boundary AS partition_change_boundary
  FROM mailbox._consumer_group AS g
  LEFT JOIN mailbox._partition_change AS x ON x.group_name = g.group_name
 WHERE g.outbox_key = $1 ORDER BY g.group_name
"""

_CRITICAL_MB = """
SELECT mailbox._setting_int('outbox_storage_critical_mb') AS mb
"""


def storage_status(total_bytes, critical_mb):
    """'critical' at or above the limit, 'warning' from 80% of it, else 'ok'."""
    limit = critical_mb * 1024 * 1024
    if total_bytes >= limit:
        return "critical"
    if total_bytes >= WARNING_FRACTION * limit:
        return "warning"
    return "ok"


def _iso(value):
    # PL/Python hands timestamptz over as text; keep None as JSON null
    return None if value is None else str(value)


def outbox_status(plpy, name):
    if name is None:
        raise MailboxError(
            "22004",
            "outbox name must not be null",
            hint="Pass the name of an outbox (see mailbox.outboxes).",
        )
    catalog = plpy.execute(plpy.prepare(_CATALOG, ["text"]), [name])
    if not catalog:
        raise MailboxError(
            "42704",
            "outbox not found: " + name,
            hint="mailbox.outboxes lists the outboxes of this database.",
        )
    outbox = catalog[0]
    key = outbox["outbox_key"]
    rows = plpy.execute(plpy.prepare(_ROWS, ["int"]), [key])[0]
    total_bytes = plpy.execute(plpy.prepare(_BYTES, ["text"]), [name])[0]["total_bytes"]
    pending = plpy.execute(plpy.prepare(_CLAIM_CHECK_PENDING, ["int"]), [key])[0]["pending"]
    groups = plpy.execute(plpy.prepare(_GROUPS, ["int"]), [key])
    critical_mb = plpy.execute(_CRITICAL_MB)[0]["mb"]
    head = outbox["head_offset"]
    result = {
        "enabled": outbox["enabled"],
        "outbox": name,
        "source": outbox["source"],
        "outbox_table": outbox["outbox_table"],
        "row_count": rows["row_count"],
        "head_offset": head,
        "oldest_row": _iso(rows["oldest_row"]),
        "newest_row": _iso(rows["newest_row"]),
        "total_bytes": total_bytes,
        "claim_check_pending_count": pending,
        "storage_status": storage_status(total_bytes, critical_mb),
        "retention_hours": outbox["retention_hours"],
        "partitions": outbox["partitions"],
        "last_drained_at": _iso(outbox["last_drained_at"]),
        "last_drained_count": outbox["last_drained_count"],
        "consumer_groups": [
            {
                "name": g["group_name"],
                "group_offset": g["group_offset"],
                "lag": head - g["group_offset"],
                # the count the group uses: the old one until it drained a change
                # (alter_outbox_partitions), with that change's boundary offset
                "partitions": g["partitions"],
                "partition_change_boundary": g["partition_change_boundary"],
            }
            for g in groups
        ],
    }
    return result
