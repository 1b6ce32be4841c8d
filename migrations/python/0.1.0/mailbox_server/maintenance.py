"""run_maintenance(): one pass of every maintenance step, at most one pass at a time.

Each domain module exposes ``run(plpy) -> dict`` of counts with keys prefixed by its
domain (``outbox_*``, ``consumer_*``, ``inbox_*``, ``alert_*``); the pass returns them merged.
A second concurrent call returns ``{"skipped": true}`` instead of waiting.
"""

from . import alerts, inbox_maintenance, outbox_maintenance

LOCK_SQL = "SELECT mailbox._try_maintenance_lock() AS ok"

OWNER_CODE_BEGIN_SQL = "SELECT mailbox._owner_code_begin()"
OWNER_CODE_END_SQL = "SELECT mailbox._owner_code_end()"

# truncate_drained runs last so its ACCESS EXCLUSIVE locks are held only until commit
STEPS = (
    outbox_maintenance.run,
    inbox_maintenance.run,
    alerts.run,
    outbox_maintenance.truncate_drained,
)


def run(plpy):
    if not plpy.execute(LOCK_SQL)[0]["ok"]:
        return {"skipped": True}
    result = {"skipped": False}
    # the inbox steps run table owners' code (as those owners) in the caller's session
    plpy.execute(OWNER_CODE_BEGIN_SQL)
    for step in STEPS:
        result.update(step(plpy))
    plpy.execute(OWNER_CODE_END_SQL)
    return result
