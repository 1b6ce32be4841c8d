"""Alert helpers and the alert_log drain (SPEC §4)."""

import json

DRAIN_SQL = """
WITH gone AS (
    DELETE FROM mailbox.alert_log
     WHERE created_at < pg_catalog.now() - pg_catalog.make_interval(
               hours => mailbox._setting_int('alert_retention_hours', 168, 1, 876000))
    RETURNING 1
)
SELECT pg_catalog.count(*) AS n FROM gone
"""

ALERT_SQL = "SELECT mailbox._alert($1, $2::jsonb)"


def emit(plpy, event, detail):
    """Write an alert row and NOTIFY mailbox_alert (see mailbox._alert)."""
    plpy.execute(plpy.prepare(ALERT_SQL, ["text", "text"]), [event, json.dumps(detail)])


def run(plpy):
    return {"alerts_drained": plpy.execute(DRAIN_SQL)[0]["n"]}
