"""Outbox maintenance steps (SPEC §2.2 item 8, §4).

- retention: rows older than the outbox's retention AND at or below every group's offset
  (claim-check rows only once read), in offset order, about the run's budget at most
  (``mailbox._drain_outbox_rows``, a few statements however many chunks).
- storage alerts: ``outbox_storage_critical`` once per transition into critical.
- ``truncate_drained`` (run last): an outbox whose rows are all drained is TRUNCATEd, so its
  table and indexes return to their empty size without VACUUM FULL.
"""

from . import alerts, settings, spi
from .outbox_status import storage_status


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
    result = {}
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
