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

from . import alerts, settings, spi
from .outbox_status import storage_status


def consumer_health(plpy):
    timeout = settings.get_int(plpy, "consumer_heartbeat_timeout_seconds")
    dead_hours = settings.get_int(plpy, "consumer_dead_threshold_hours")
    stale_days = settings.get_int(plpy, "consumer_stale_offset_threshold_days")
    unhealthy = spi.execute(
        plpy, "SELECT * FROM mailbox._mark_unhealthy_consumers($1)", ["int"], [timeout]
    )
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
    reaped = spi.execute(
        plpy, "SELECT * FROM mailbox._reap_dead_consumers($1)", ["int"], [dead_hours]
    )
    released = 0
    for row in reaped:
        n = spi.execute(
            plpy,
            "SELECT mailbox._release_consumer_leases($1, $2) AS n",
            ["text", "text"],
            [row["group_name"], row["consumer_id"]],
        )[0]["n"]
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
    forgotten = spi.execute(
        plpy, "SELECT mailbox._forget_stale_consumers($1) AS n", ["int"], [stale_days]
    )[0]["n"]
    return {
        "consumers_unhealthy": len(unhealthy),
        "consumers_reaped": len(reaped),
        "consumer_rows_released": released,
        "consumers_forgotten": forgotten,
        "consumer_leases_expired": spi.execute(plpy, "SELECT mailbox._count_expired_leases() AS n")[
            0
        ]["n"],
        "consumer_waits_expired": spi.execute(
            plpy, "SELECT mailbox._forget_expired_waiters() AS n"
        )[0]["n"],
    }


def drain_outbox(plpy, outbox, force, budget):
    """Drain one outbox; returns (rows drained, rows still allowed in this run)."""
    key = outbox["outbox_key"]
    # Seeks and 'earliest' groups take this lock too: the offsets read after it hold until
    # this pass commits, so no row a group was just pointed back at is drained.
    spi.execute(plpy, "SELECT mailbox._retention_lock($1)", ["int"], [key])
    min_offset = spi.execute(
        plpy, "SELECT mailbox._outbox_min_group_offset($1) AS m", ["int"], [key]
    )[0]["m"]
    if force or min_offset is None:
        # nobody else numbers an outbox without groups; forced retention ignores groups
        limit = spi.execute(plpy, "SELECT mailbox._sequence_all($1) AS head", ["int"], [key])[0][
            "head"
        ]
    else:
        limit = min_offset
    # set-based, a few statements however many chunks (sql part 41)
    drained = spi.execute(
        plpy,
        "SELECT mailbox._drain_outbox_rows($1, $2, $3, $4, $5) AS n",
        ["int", "bigint", "int", "bool", "bigint"],
        [key, limit, outbox["retention_hours"], force, budget],
    )[0]["n"]
    budget -= drained
    if force:
        spi.execute(plpy, "SELECT mailbox._catch_up_groups($1)", ["int"], [key])
    if drained:
        spi.execute(plpy, "SELECT mailbox._record_drain($1, $2)", ["int", "bigint"], [key, drained])
    return drained, budget


def storage(plpy, outbox, critical_mb):
    """Alert once when an outbox becomes critical; re-arm when it is back below."""
    key = outbox["outbox_key"]
    row = spi.execute(plpy, "SELECT * FROM mailbox._outbox_storage_state($1)", ["int"], [key])[0]
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
    if critical != row["alerted"]:
        spi.execute(
            plpy, "SELECT mailbox._set_storage_alerted($1, $2)", ["int", "bool"], [key, critical]
        )
    return 1 if critical and not row["alerted"] else 0


def run(plpy):
    result = consumer_health(plpy)
    force = settings.get_bool(plpy, "outbox_force_retention")
    batch = settings.get_int(plpy, "outbox_drain_batch_size")
    max_batches = settings.get_int(plpy, "maintenance_max_batches")
    critical_mb = settings.get_int(plpy, "outbox_storage_critical_mb")
    drained = storage_alerts = 0
    for outbox in spi.execute(plpy, "SELECT * FROM mailbox._outboxes_to_maintain()"):
        n, _ = drain_outbox(plpy, outbox, force, batch * max_batches)
        drained += n
        storage_alerts += storage(plpy, outbox, critical_mb)
    result.update({"outbox_rows_drained": drained, "outbox_storage_alerts": storage_alerts})
    return result


def truncate_drained(plpy):
    """TRUNCATE outboxes left with no rows (after draining), if their lock is free right now.

    Runs last: the ACCESS EXCLUSIVE lock is then held only until maintenance commits.
    """
    truncated = 0
    empty = spi.execute(
        plpy, "SELECT * FROM mailbox._outboxes_to_truncate($1)", ["bigint"], [8192 * 4]
    )
    for row in empty:
        try:
            with plpy.subtransaction():
                spi.execute(
                    plpy,
                    "SELECT mailbox._truncate_outbox_if_empty($1)",
                    ["int"],
                    [row["outbox_key"]],
                )
                truncated += 1
        except plpy.SPIError:
            pass  # a producer or reader holds the table: try again next run
    return {"outbox_tables_truncated": truncated}
