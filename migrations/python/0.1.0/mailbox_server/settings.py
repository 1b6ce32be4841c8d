"""Reading mailbox.* settings from server-side Python.

The names, defaults and bounds live in one place, the registry ``mailbox._settings()``
(sql/04_settings.sql); these helpers go through the same SQL parsers as the SQL code, so a
bad value is the same 22023 error naming the setting wherever it is read.
"""

_INT_SQL = "SELECT mailbox._setting_int($1) AS v"
_BOOL_SQL = "SELECT mailbox._setting_bool($1) AS v"


def _plan(plpy, sql):
    # plpy.prepare per call is cheap next to maintenance work; SD is per function, and
    # these helpers serve several functions, so plans are not cached across calls
    return plpy.prepare(sql, ["text"])


def get_int(plpy, name):
    """The value of integer setting mailbox.<name> (its registry default when unset)."""
    return plpy.execute(_plan(plpy, _INT_SQL), [name])[0]["v"]


def get_bool(plpy, name):
    """The value of boolean setting mailbox.<name> (its registry default when unset)."""
    return plpy.execute(_plan(plpy, _BOOL_SQL), [name])[0]["v"]
