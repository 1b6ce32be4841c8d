"""Alert helpers and the alert_log drain (SPEC §4)."""

import json

ALERT_SQL = "SELECT mailbox._alert($1, $2::jsonb)"


def emit(plpy, event, detail):
    """Write an alert row and NOTIFY mailbox_alert (see mailbox._alert)."""
    plpy.execute(plpy.prepare(ALERT_SQL, ["text", "text"]), [event, json.dumps(detail)])


def run(plpy):
    # the drain is a named SQL function (sql/43_inbox_maintenance_steps.sql)
    return {"alerts_drained": plpy.execute("SELECT mailbox._drain_alert_log() AS n")[0]["n"]}
