"""Inbox maintenance steps (SPEC §4): retention drains, lease expiry, DLQ and gap alerts.

Called by maintenance.run() under its advisory lock; returns counts keyed ``inbox_*``.
Every drain is bounded: at most mailbox.inbox_drain_batch_size rows per inbox and kind per
pass (the next pass continues), so one pass never holds locks on a huge delete. Every
statement is a named private SQL function (sql/43_inbox_maintenance_steps.sql).
"""

import json

from . import alerts, inbox_catalog, settings, spi


def drain(plpy, inbox, batch, dlq_hours):
    """Up to ``batch`` processed rows past retention, and as many dead letters when
    ``dlq_hours`` > 0; deleted with the table owner's rights (mailbox._inbox_drain)."""
    sql, types = (
        "SELECT mailbox._drain_inbox($1, $2, $3, $4) AS n",
        ["int", "boolean", "int", "int"],
    )
    hours = inbox_catalog.retention_hours(plpy, inbox)
    processed = spi.execute(plpy, sql, types, [inbox.key, False, hours, batch])[0]["n"]
    dead = 0
    if dlq_hours > 0:
        dead = spi.execute(plpy, sql, types, [inbox.key, True, dlq_hours, batch])[0]["n"]
    return processed, dead


def dlq_alerts(plpy, max_per_run):
    """One inbox_dlq_message per new dead letter up to the cap, then one inbox_dlq_batch."""
    sent, rest = 0, {}
    for row in spi.execute(plpy, "SELECT * FROM mailbox._take_inbox_dlq_events()"):
        if sent < max_per_run:
            alerts.emit(
                plpy,
                "inbox_dlq_message",
                {
                    "inbox": row["inbox_name"],
                    "event_id": row["event_id"],
                    "error": row["error"],
                    "retry_count": row["retry_count"],
                    "dead_at": row["dead_at"],
                },
            )
            sent += 1
        else:
            rest[row["inbox_name"]] = rest.get(row["inbox_name"], 0) + 1
    if rest:
        alerts.emit(
            plpy,
            "inbox_dlq_batch",
            {
                "count": sum(rest.values()),
                "inboxes": rest,
                "detail": f"{sum(rest.values())} more dead letters beyond "
                f"mailbox.inbox_dlq_alert_max_per_run ({max_per_run})",
            },
        )
    return sent, 1 if rest else 0


def gap_alerts(plpy, inbox, threshold):
    """inbox_ordering_gap once per gap older than the threshold; forget gaps that closed."""
    gaps = json.loads(
        spi.execute(plpy, "SELECT mailbox._inbox_gaps($1)::text AS gaps", ["int"], [inbox.key])[0][
            "gaps"
        ]
    )
    current = {(g["aggregate_id"], g["expected_seq"]): g for g in gaps}
    alerted = {
        (r["aggregate_id"], r["expected_seq"])
        for r in spi.execute(
            plpy, "SELECT * FROM mailbox._inbox_gaps_alerted($1)", ["int"], [inbox.key]
        )
    }
    gap_types = ["int", "text", "bigint"]
    sent = 0
    for key in sorted(current.keys() - alerted):
        gap = current[key]
        if gap["gap_age_sec"] < threshold:
            continue
        alerts.emit(
            plpy,
            "inbox_ordering_gap",
            {
                "inbox": inbox.name,
                "aggregate_id": gap["aggregate_id"],
                "expected_seq": gap["expected_seq"],
                "found_seq": gap["found_seq"],
                "gap_age_sec": gap["gap_age_sec"],
            },
        )
        spi.execute(
            plpy, "SELECT mailbox._record_inbox_gap_alert($1, $2, $3)", gap_types, [inbox.key, *key]
        )
        sent += 1
    for key in sorted(alerted - current.keys()):
        spi.execute(
            plpy, "SELECT mailbox._forget_inbox_gap_alert($1, $2, $3)", gap_types, [inbox.key, *key]
        )
    return sent


def run(plpy):
    batch = settings.get_int(plpy, "inbox_drain_batch_size")
    dlq_hours = settings.get_int(plpy, "inbox_dlq_retention_hours")
    max_alerts = settings.get_int(plpy, "inbox_dlq_alert_max_per_run")
    gap_threshold = settings.get_int(plpy, "inbox_gap_alert_seconds")
    result = {
        "inbox_processed_drained": 0,
        "inbox_dlq_drained": 0,
        "inbox_gap_alerts": 0,
        "inbox_failed": 0,
    }
    for inbox in inbox_catalog.all_inboxes(plpy):
        if not inbox.exists:
            continue  # its table was dropped by hand: nothing to drain, never another table
        # an inbox table runs its owner's code (a trigger that raises, say) and its owner may
        # drop or alter the inbox's generated functions: that inbox's failure is reported and
        # rolled back alone, and every other inbox is still maintained
        try:
            with plpy.subtransaction():
                processed, dead = drain(plpy, inbox, batch, dlq_hours)
                # a renamed inbox is refused by its functions (and health is critical); its
                # gaps view may have moved with a renamed schema, so its gap alerts wait
                gaps = 0
                if inbox.ordered and not inbox.renamed:
                    gaps = gap_alerts(plpy, inbox, gap_threshold)
        except plpy.SPIError as exc:
            result["inbox_failed"] += 1
            plpy.warning(
                f"maintenance of inbox {inbox.name} failed: {exc}",
                detail=f"SQLSTATE {getattr(exc, 'sqlstate', None)}; other inboxes were maintained.",
                hint="See the inbox's table (triggers, constraints) and mailbox.inbox_health().",
            )
            continue
        result["inbox_processed_drained"] += processed
        result["inbox_dlq_drained"] += dead
        result["inbox_gap_alerts"] += gaps
    result["inbox_leases_expired"] = spi.execute(
        plpy, "SELECT mailbox._expire_inbox_leases() AS n"
    )[0]["n"]
    result["inbox_waits_expired"] = spi.execute(
        plpy, "SELECT mailbox._forget_expired_inbox_waiters() AS n"
    )[0]["n"]
    result["inbox_claims_forgotten"] = spi.execute(
        plpy, "SELECT mailbox._forget_unsettled_inbox_claims() AS n"
    )[0]["n"]
    # a restored database has the extension script's routers (every inbox call dynamic)
    result["inbox_routes_rebuilt"] = spi.execute(
        plpy, "SELECT mailbox._inbox_refresh_routes() AS n"
    )[0]["n"]
    sent, batches = dlq_alerts(plpy, max_alerts)
    result["inbox_dlq_alerts"] = sent
    result["inbox_dlq_batch_alerts"] = batches
    return result
