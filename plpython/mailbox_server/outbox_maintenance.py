"""Outbox maintenance steps (SPEC §2.2 item 8, §4).

- consumer health: one ``consumer_unhealthy`` alert per healthy -> unhealthy transition;
  reaping consumers silent past the dead threshold (their leases are released, alert
  ``consumer_reaped``); forgetting consumers without commits past the stale threshold.
- retention: rows older than the outbox's retention AND at or below every group's offset
  (claim-check rows only once read), in offset order, about the run's budget at most
  (``mailbox._drain_outbox_rows``, a few statements however many chunks).
- storage alerts: ``outbox_storage_critical`` once per transition into critical.
- ``truncate_drained`` (run last): an outbox whose rows are all drained is TRUNCATEd, so its
  table and indexes return to their empty size without VACUUM FULL.
"""

from . import alerts
from .status import storage_status

SETTING_SQL = "SELECT mailbox._setting_int($1, $2, $3, $4) AS v"


def setting_int(plpy, name, default, low, high):
    plan = plpy.prepare(SETTING_SQL, ["text", "int", "int", "int"])
    return plpy.execute(plan, [name, default, low, high])[0]["v"]


def setting_bool(plpy, name, default):
    plan = plpy.prepare("SELECT mailbox._setting_bool($1, $2) AS v", ["text", "bool"])
    return plpy.execute(plan, [name, default])[0]["v"]


# Consumer rows are locked in (group, consumer) order, the order seek_offset and
# drop_consumer_group use, so maintenance cannot deadlock with them.
UNHEALTHY_SQL = """
UPDATE mailbox._consumer AS c
   SET unhealthy_since = pg_catalog.now()
  FROM (SELECT x.group_name, x.consumer_id FROM mailbox._consumer AS x
         WHERE x.unhealthy_since IS NULL AND x.reaped_at IS NULL
           AND x.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(secs => $1)
         ORDER BY x.group_name, x.consumer_id
           FOR NO KEY UPDATE) AS t
 WHERE c.group_name = t.group_name AND c.consumer_id = t.consumer_id
RETURNING c.group_name, c.consumer_id, c.last_heartbeat_at::text AS last_heartbeat_at
"""

REAP_SQL = """
UPDATE mailbox._consumer AS c
   SET reaped_at = pg_catalog.now()
  FROM (SELECT x.group_name, x.consumer_id FROM mailbox._consumer AS x
         WHERE x.reaped_at IS NULL
           AND x.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(hours => $1)
         ORDER BY x.group_name, x.consumer_id
           FOR NO KEY UPDATE) AS t
 WHERE c.group_name = t.group_name AND c.consumer_id = t.consumer_id
RETURNING c.group_name, c.consumer_id, c.last_heartbeat_at::text AS last_heartbeat_at
"""

RELEASE_SQL = """
WITH released AS (
    UPDATE mailbox._lease AS l SET lease_until = pg_catalog.now()
     WHERE l.group_name = $1 AND l.consumer_id = $2 AND l.lease_until > pg_catalog.now()
    RETURNING l.last_offset - l.first_offset + 1 AS n
)
SELECT coalesce(pg_catalog.sum(n), 0)::bigint AS n FROM released
"""

FORGET_SQL = """
WITH gone AS (
    DELETE FROM mailbox._consumer AS c
     WHERE coalesce(c.last_commit_at, c.registered_at)
           <= pg_catalog.now() - pg_catalog.make_interval(days => $1)
       AND c.last_heartbeat_at <= pg_catalog.now() - pg_catalog.make_interval(days => $1)
       AND NOT EXISTS (SELECT 1 FROM mailbox._lease AS l
                        WHERE l.group_name = c.group_name AND l.consumer_id = c.consumer_id)
    RETURNING 1
)
SELECT pg_catalog.count(*) AS n FROM gone
"""

FORGET_WAITERS_SQL = "SELECT mailbox._forget_expired_waiters() AS n"

EXPIRED_LEASES_SQL = """
SELECT pg_catalog.count(*) AS n FROM mailbox._lease WHERE lease_until <= pg_catalog.now()
"""


def consumer_health(plpy):
    timeout = setting_int(plpy, "consumer_heartbeat_timeout_seconds", 60, 1, 86400000)
    dead_hours = setting_int(plpy, "consumer_dead_threshold_hours", 24, 1, 87600)
    stale_days = setting_int(plpy, "consumer_stale_offset_threshold_days", 7, 1, 36500)
    unhealthy = plpy.execute(plpy.prepare(UNHEALTHY_SQL, ["int"]), [timeout])
    for row in unhealthy:
        alerts.emit(
            plpy,
            "consumer_unhealthy",
            {
                "group": row["group_name"],
                "consumer": row["consumer_id"],
                "last_heartbeat_at": row["last_heartbeat_at"],
                "timeout_seconds": timeout,
            },
        )
    reaped = plpy.execute(plpy.prepare(REAP_SQL, ["int"]), [dead_hours])
    release = plpy.prepare(RELEASE_SQL, ["text", "text"])
    released = 0
    for row in reaped:
        n = plpy.execute(release, [row["group_name"], row["consumer_id"]])[0]["n"]
        released += n
        alerts.emit(
            plpy,
            "consumer_reaped",
            {
                "group": row["group_name"],
                "consumer": row["consumer_id"],
                "last_heartbeat_at": row["last_heartbeat_at"],
                "released_rows": n,
            },
        )
    forgotten = plpy.execute(plpy.prepare(FORGET_SQL, ["int"]), [stale_days])[0]["n"]
    return {
        "consumers_unhealthy": len(unhealthy),
        "consumers_reaped": len(reaped),
        "consumer_rows_released": released,
        "consumers_forgotten": forgotten,
        "consumer_leases_expired": plpy.execute(EXPIRED_LEASES_SQL)[0]["n"],
        "consumer_waits_expired": plpy.execute(FORGET_WAITERS_SQL)[0]["n"],
    }


OUTBOXES_SQL = """
SELECT o.outbox_key, o.outbox_name, o.retention_hours
  FROM mailbox._outbox AS o ORDER BY o.outbox_key
"""

# Drains one outbox up to an offset (set-based, a few statements per run: sql part 41).
DRAIN_SQL = "SELECT mailbox._drain_outbox_rows($1, $2, $3, $4, $5) AS n"

RECORD_SQL = """
UPDATE mailbox._outbox_retention
   SET last_drained_at = pg_catalog.now(), last_drained_count = $2
 WHERE outbox_key = $1
"""

# force_retention moved the low mark past a group: it continues after the drained rows.
CATCH_UP_GROUPS_SQL = """
WITH low AS (SELECT low_offset FROM mailbox._outbox_retention WHERE outbox_key = $1),
trimmed AS (
    DELETE FROM mailbox._lease AS l USING mailbox._consumer_group AS g, low
     WHERE g.outbox_key = $1 AND l.group_name = g.group_name AND l.last_offset <= low.low_offset
)
UPDATE mailbox._consumer_group AS g
   SET delivered_offset = greatest(g.delivered_offset, low.low_offset),
       group_offset = greatest(g.group_offset, low.low_offset)
  FROM low
 WHERE g.outbox_key = $1 AND g.group_offset < low.low_offset
"""

SEQUENCE_ALL_SQL = "SELECT mailbox._sequence_all($1) AS head"


RETENTION_LOCK_SQL = "SELECT mailbox._retention_lock($1)"

# A partitioned group stores its offset only now and then (part 27): compute it.
MIN_GROUP_OFFSET_SQL = """
SELECT pg_catalog.min(CASE WHEN mailbox._outbox_partitions(g.outbox_key) > 1
                           THEN mailbox._partitioned_group_offset(g.group_name, g.outbox_key)
                           ELSE g.group_offset END) AS m
  FROM mailbox._consumer_group AS g WHERE g.outbox_key = $1
"""


def drain_outbox(plpy, outbox, force, budget):
    """Drain one outbox; returns (rows drained, rows still allowed in this run)."""
    key = outbox["outbox_key"]
    # Seeks and 'earliest' groups take this lock too: the offsets read after it hold until
    # this pass commits, so no row a group was just pointed back at is drained.
    plpy.execute(plpy.prepare(RETENTION_LOCK_SQL, ["int"]), [key])
    min_offset = plpy.execute(plpy.prepare(MIN_GROUP_OFFSET_SQL, ["int"]), [key])[0]["m"]
    if force or min_offset is None:
        # nobody else numbers an outbox without groups; forced retention ignores groups
        limit = plpy.execute(plpy.prepare(SEQUENCE_ALL_SQL, ["int"]), [key])[0]["head"]
    else:
        limit = min_offset
    drained = plpy.execute(
        plpy.prepare(DRAIN_SQL, ["int", "bigint", "int", "bool", "bigint"]),
        [key, limit, outbox["retention_hours"], force, budget],
    )[0]["n"]
    budget -= drained
    if force:
        plpy.execute(plpy.prepare(CATCH_UP_GROUPS_SQL, ["int"]), [key])
    if drained:
        plpy.execute(plpy.prepare(RECORD_SQL, ["int", "bigint"]), [key, drained])
    return drained, budget


SIZE_SQL = """
SELECT mailbox._outbox_bytes($1) AS total_bytes,
       (SELECT r.storage_alerted FROM mailbox._outbox_retention AS r
         WHERE r.outbox_key = $2) AS alerted
"""

STORAGE_FLAG_SQL = "UPDATE mailbox._outbox_retention SET storage_alerted = $2 WHERE outbox_key = $1"


def storage(plpy, outbox, critical_mb):
    """Alert once when an outbox becomes critical; re-arm when it is back below."""
    row = plpy.execute(
        plpy.prepare(SIZE_SQL, ["text", "int"]), [outbox["outbox_name"], outbox["outbox_key"]]
    )[0]
    critical = storage_status(row["total_bytes"], critical_mb) == "critical"
    if critical and not row["alerted"]:
        alerts.emit(
            plpy,
            "outbox_storage_critical",
            {
                "outbox": outbox["outbox_name"],
                "total_bytes": row["total_bytes"],
                "critical_mb": critical_mb,
            },
        )
    if critical != bool(row["alerted"]):
        plpy.execute(
            plpy.prepare(STORAGE_FLAG_SQL, ["int", "bool"]), [outbox["outbox_key"], critical]
        )
    return 1 if critical and not row["alerted"] else 0


def run(plpy):
    result = consumer_health(plpy)
    force = setting_bool(plpy, "outbox_force_retention", False)
    batch = setting_int(plpy, "outbox_drain_batch_size", 10000, 1, 10000000)
    max_batches = setting_int(plpy, "maintenance_max_batches", 100, 1, 100000)
    critical_mb = setting_int(plpy, "outbox_storage_critical_mb", 1024, 1, 2147483647)
    drained = storage_alerts = 0
    for outbox in plpy.execute(OUTBOXES_SQL):
        n, _ = drain_outbox(plpy, outbox, force, batch * max_batches)
        drained += n
        storage_alerts += storage(plpy, outbox, critical_mb)
    result.update({"outbox_rows_drained": drained, "outbox_storage_alerts": storage_alerts})
    return result


EMPTY_OUTBOXES_SQL = """
SELECT o.outbox_name, o.outbox_key FROM mailbox._outbox AS o
 WHERE NOT EXISTS (SELECT 1 FROM mailbox._outbox_log AS l WHERE l.outbox_key = o.outbox_key)
   AND pg_catalog.pg_relation_size(pg_catalog.format(
           'mailbox.%I', mailbox._outbox_relname(o.outbox_name, 'log'))::regclass) > $1
"""

TRUNCATE_SQL = """
SELECT mailbox._truncate_outbox_if_empty($1)
"""


def truncate_drained(plpy):
    """TRUNCATE outboxes left with no rows (after draining), if their lock is free right now.

    Runs last: the ACCESS EXCLUSIVE lock is then held only until maintenance commits.
    """
    truncated = 0
    for row in plpy.execute(plpy.prepare(EMPTY_OUTBOXES_SQL, ["bigint"]), [8192 * 4]):
        try:
            with plpy.subtransaction():
                plpy.execute(plpy.prepare(TRUNCATE_SQL, ["int"]), [row["outbox_key"]])
                truncated += 1
        except plpy.SPIError:
            pass  # a producer or reader holds the table: try again next run
    return {"outbox_tables_truncated": truncated}
