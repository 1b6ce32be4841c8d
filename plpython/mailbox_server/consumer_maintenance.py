"""Consumer-group maintenance steps (SPEC §2.2 item 8).

- health: one ``consumer_unhealthy`` alert per healthy -> unhealthy transition;
- reaping: consumers silent past the dead threshold lose their leases (alert
  ``consumer_reaped``);
- forgetting: consumers without commits past the stale threshold are removed;
- counts of expired leases and of expired wake-up waiters.
"""

from . import alerts, settings, spi


def run(plpy):
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
