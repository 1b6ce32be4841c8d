"""inbox_health(): one inbox's counts and health as a dict (returned to SQL as jsonb).

Thresholds (docs/inbox.md): the oldest pending message at least
mailbox.inbox_critical_age_seconds old (300), or at least mailbox.inbox_critical_dlq_count
(100) dead letters, is ``critical``; otherwise the oldest pending message at least
mailbox.inbox_degraded_age_seconds old (60), any dead letter or a blocked aggregate is
``degraded``; otherwise ``healthy``. (An ordering gap is as old as the pending message waiting
behind it, so an old gap already counts through the pending age.) An inbox whose table was
renamed is ``critical``: its per-message functions refuse (55000) until that is resolved; the
counts are those of the inbox's own table (by oid), never of a table that took the old name.
"""

import json

from . import inbox_catalog, settings


def classify(oldest_age, dead, blocked, degraded_age, critical_age, critical_dlq):
    oldest_age = oldest_age or 0.0
    if oldest_age >= critical_age or dead >= critical_dlq:
        return "critical"
    if oldest_age >= degraded_age or dead > 0 or blocked > 0:
        return "degraded"
    return "healthy"


_COUNTS = """
SELECT mailbox._inbox_counts(i, TRUE)::text AS counts
  FROM mailbox._inbox AS i WHERE i.inbox_key = $1
"""


def _counts(plpy, inbox):
    """The inbox's counts (mailbox._inbox_counts: read with the table owner's rights)."""
    row = plpy.execute(plpy.prepare(_COUNTS, ["int"]), [inbox.key])[0]
    return json.loads(row["counts"])


def inbox_health(plpy, name):
    inbox = inbox_catalog.get(plpy, name)
    _ = inbox.table  # raises 55000 when the table was dropped by hand
    counts = _counts(plpy, inbox)
    pending, dead, processed = counts["pending"], counts["dead"], counts["processed"]
    oldest_age = counts["oldest_age"]
    degraded_age = settings.get_int(plpy, "inbox_degraded_age_seconds")
    critical_age = settings.get_int(plpy, "inbox_critical_age_seconds")
    critical_dlq = settings.get_int(plpy, "inbox_critical_dlq_count")
    blocked, gap_count = counts.get("blocked", 0), counts.get("gaps", 0)
    status = classify(oldest_age, dead, blocked, degraded_age, critical_age, critical_dlq)
    if inbox.renamed:
        status = "critical"
    result = {
        "inbox_name": inbox.name,
        "inbox_schema": inbox.schema,
        "health_status": status,
        "pending_count": pending,
        "in_flight_count": counts["in_flight"],
        "dead_letter_count": dead,
        "processed_count": processed,
        "total_messages": pending + dead + processed,
        "oldest_pending_age_sec": None if oldest_age is None else max(float(oldest_age), 0.0),
        "avg_processing_time_sec": (
            None if counts["avg_sec"] is None else float(counts["avg_sec"])
        ),
        "throughput_per_sec": counts["last_minute"] / 60.0,
        "max_retries": inbox.max_retries,
        "retention_hours": inbox_catalog.retention_hours(plpy, inbox),
    }
    if inbox.ordered:
        result["blocked_aggregates"] = blocked
        result["gap_count"] = gap_count
    return result
