"""Running SQL from server-side Python: each statement is prepared once per session.

The statements themselves are calls of named private SQL functions (sql/4x parts), so the
SQL lives where sqlfluff and the API snapshot see it; Python decides order and budgets.
"""

_plans = {}


def execute(plpy, sql, types=(), args=()):
    """plpy.execute of ``sql`` with parameters of ``types``, prepared on first use."""
    key = (sql, tuple(types))
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = plpy.prepare(sql, list(types))
    return plpy.execute(plan, list(args))
