"""Errors raised by the control plane and how they reach SQL.

Any exception that escapes a PL/Python function is reported with a Python prefix
(``plpy.Error: ...``, ``spiexceptions.X: ...``). pg_mailbox promises plain messages, so Python
code raises MailboxError, the PL/Python body returns an envelope ``{"result": ...}`` or
``{"error": {...}}`` through ``envelope()``, and the SQL wrapper mailbox._unwrap() raises the
error with its SQLSTATE, DETAIL and HINT, or returns the result.
"""

import json


class MailboxError(Exception):
    def __init__(self, sqlstate, message, detail=None, hint=None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail
        self.hint = hint

    def as_dict(self):
        return {
            "sqlstate": self.sqlstate,
            "message": self.message,
            "detail": self.detail,
            "hint": self.hint,
        }


def envelope(plpy, fn, *args):
    """Run fn(plpy, *args) and return its result, or the error it raised, as JSON text."""
    try:
        return json.dumps({"result": fn(plpy, *args)})
    except MailboxError as exc:
        return json.dumps({"error": exc.as_dict()})
    except plpy.SPIError as exc:
        # a SQL error inside the control plane (a bad setting, say) keeps its own fields;
        # PL/Python keeps them in spidata: (sqlerrcode, detail, hint, ...)
        spidata = getattr(exc, "spidata", None) or (None, None, None)
        return json.dumps(
            {
                "error": {
                    "sqlstate": getattr(exc, "sqlstate", None) or "XX000",
                    "message": exc.args[0] if exc.args else str(exc),
                    "detail": spidata[1],
                    "hint": spidata[2],
                }
            }
        )
