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

from . import inbox_catalog

MAX_SECONDS = 31536000


def classify(oldest_age, dead, blocked, degraded_age, critical_age, critical_dlq):
    oldest_age = oldest_age or 0.0
    if oldest_age >= critical_age or dead >= critical_dlq:
        return "critical"
    if oldest_age >= degraded_age or dead > 0 or blocked > 0:
        return "degraded"
    return "healthy"


def _counts(plpy, inbox):
    proc, retry, recv = (
        inbox.col("processed_at"),
        inbox.col("retry_count"),
        inbox.col("received_at"),
    )
    unprocessed = plpy.execute(
        plpy.prepare(
            f"""
        SELECT pg_catalog.count(*) FILTER (WHERE {retry} < $1) AS pending,
               pg_catalog.count(*) FILTER (WHERE {retry} >= $1) AS dead,
               pg_catalog.date_part('epoch', pg_catalog.now()
                   - pg_catalog.min({recv}::timestamptz) FILTER (WHERE {retry} < $1)) AS oldest_age
          FROM {inbox.table} AS t WHERE {proc} IS NULL""",
            ["int"],
        ),
        [inbox.max_retries],
    )[0]
    processed = plpy.execute(f"""
        SELECT pg_catalog.count(*) AS n FROM {inbox.table} AS t WHERE {proc} IS NOT NULL""")[0]
    recent = plpy.execute(f"""
        SELECT pg_catalog.avg(pg_catalog.date_part('epoch',
                                                    {proc}::timestamptz - {recv}::timestamptz))
                   AS avg_sec,
               pg_catalog.count(*) FILTER (WHERE {proc} >= pg_catalog.now() - interval '1 minute')
                   AS last_minute
          FROM {inbox.table} AS t WHERE {proc} >= pg_catalog.now() - interval '1 hour'""")[0]
    in_flight = plpy.execute(
        plpy.prepare(
            f"""
        SELECT pg_catalog.count(*) AS n FROM mailbox._inbox_lease AS l
         WHERE l.inbox_key = $1 AND l.lease_until > pg_catalog.clock_timestamp()
           AND EXISTS (SELECT 1 FROM {inbox.table} AS t
                        WHERE {inbox.col("event_id")} = {inbox.id_param("l.event_id")}
                          AND {proc} IS NULL AND {retry} < $2)""",
            ["int", "int"],
        ),
        [inbox.key, inbox.max_retries],
    )[0]
    return unprocessed, processed["n"], recent, in_flight["n"]


def _ordering(plpy, inbox):
    proc, retry = inbox.col("processed_at"), inbox.col("retry_count")
    agg, seq = inbox.col("aggregate_id"), inbox.col("sequence_num")
    # a dead letter at or before an aggregate's next position blocks that aggregate
    blocked = plpy.execute(
        plpy.prepare(
            f"""
        SELECT pg_catalog.count(DISTINCT {agg}) AS n
          FROM {inbox.table} AS t
          LEFT JOIN mailbox._inbox_aggregate AS s
                 ON s.inbox_key = $1 AND s.aggregate_id = {agg}::text
         WHERE {proc} IS NULL AND {retry} >= $2 AND {agg} IS NOT NULL
           AND {seq} <= coalesce(s.last_seq, $3 - 1) + 1""",
            ["int", "int", "bigint"],
        ),
        [inbox.key, inbox.max_retries, inbox.first_sequence],
    )[0]["n"]
    gaps = plpy.execute(f"""
        SELECT pg_catalog.count(*) AS n FROM {inbox.view("gaps_")} AS g""")[0]
    return blocked, gaps["n"]


def inbox_health(plpy, name):
    inbox = inbox_catalog.get(plpy, name)
    unprocessed, processed, recent, in_flight = _counts(plpy, inbox)
    pending, dead = unprocessed["pending"], unprocessed["dead"]
    oldest_age = unprocessed["oldest_age"]
    degraded_age = inbox_catalog.setting_int(plpy, "inbox_degraded_age_seconds", 60, 1, MAX_SECONDS)
    critical_age = inbox_catalog.setting_int(
        plpy, "inbox_critical_age_seconds", 300, 1, MAX_SECONDS
    )
    critical_dlq = inbox_catalog.setting_int(plpy, "inbox_critical_dlq_count", 100, 1, 2**31 - 1)
    blocked, gap_count = (0, 0)
    if inbox.ordered:
        blocked, gap_count = _ordering(plpy, inbox)
    status = classify(oldest_age, dead, blocked, degraded_age, critical_age, critical_dlq)
    if inbox.renamed:
        status = "critical"
    result = {
        "inbox_name": inbox.name,
        "inbox_schema": inbox.schema,
        "health_status": status,
        "pending_count": pending,
        "in_flight_count": in_flight,
        "dead_letter_count": dead,
        "processed_count": processed,
        "total_messages": pending + dead + processed,
        "oldest_pending_age_sec": None if oldest_age is None else max(float(oldest_age), 0.0),
        "avg_processing_time_sec": (
            None if recent["avg_sec"] is None else float(recent["avg_sec"])
        ),
        "throughput_per_sec": recent["last_minute"] / 60.0,
        "max_retries": inbox.max_retries,
        "retention_hours": inbox_catalog.retention_hours(plpy, inbox),
    }
    if inbox.ordered:
        result["blocked_aggregates"] = blocked
        result["gap_count"] = gap_count
    return result
