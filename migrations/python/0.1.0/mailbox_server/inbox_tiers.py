"""Priority tiers of an inbox (SPEC §3.2): defaults and validation.

A tier is ``{"name": ..., "min": ..., "max": ...}``; an inbox's tiers cover one contiguous
range of priority values without overlap, each tier gets a view ``pending_<inbox>_<name>``.
"""

import json
import re

from .errors import MailboxError

DEFAULT_TIERS = [
    {"name": "critical", "min": 1, "max": 2},
    {"name": "normal", "min": 3, "max": 6},
    {"name": "background", "min": 7, "max": 9},
]
# a tier name becomes part of a view name (pending_<inbox>_<tier>): a lowercase identifier
NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
MAX_TIER_NAME_BYTES = 14
MAX_TIERS = 32
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
HINT = (
    'Pass a jsonb array such as [{"name": "critical", "min": 1, "max": 2}, '
    '{"name": "normal", "min": 3, "max": 9}]: lowercase names of at most 14 bytes, '
    "integer bounds with min <= max, contiguous and without overlap."
)


def _bad(message, detail=None):
    return MailboxError("22023", message, detail=detail, hint=HINT)


def _bound(tier, key):
    value = tier.get(key)
    # bool is an int in Python; true/false are not priorities
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(
            f"invalid priority tier bound: {key} of {tier.get('name')!r}",
            detail=f"{key} must be an integer, got {json.dumps(value)}.",
        )
    if not INT_MIN <= value <= INT_MAX:
        raise _bad(
            f"invalid priority tier bound: {key} of {tier.get('name')!r}",
            detail=f"{key} must fit in an integer, got {value}.",
        )
    return value


def validate(tiers):
    """The tiers sorted by min, or MailboxError 22023 saying what is wrong."""
    if tiers is None:
        return [dict(t) for t in DEFAULT_TIERS]
    if not isinstance(tiers, list) or not tiers:
        raise _bad("invalid priority tiers: expected a non-empty array")
    if len(tiers) > MAX_TIERS:
        raise _bad(f"invalid priority tiers: at most {MAX_TIERS} tiers")
    seen, result = set(), []
    for tier in tiers:
        if not isinstance(tier, dict):
            raise _bad(
                "invalid priority tier: expected an object", detail=f"Got {json.dumps(tier)}."
            )
        unknown = sorted(set(tier) - {"name", "min", "max"})
        if unknown:
            raise _bad("invalid priority tier key: " + unknown[0])
        name = tier.get("name")
        if (
            not isinstance(name, str)
            or not NAME_RE.match(name)
            or len(name.encode("utf-8")) > MAX_TIER_NAME_BYTES
        ):
            raise _bad(f"invalid priority tier name: {json.dumps(name)}")
        if name in seen:
            raise _bad("duplicate priority tier name: " + name)
        seen.add(name)
        low, high = _bound(tier, "min"), _bound(tier, "max")
        if low > high:
            raise _bad(f"invalid priority tier: {name} has min {low} > max {high}")
        result.append({"name": name, "min": low, "max": high})
    result.sort(key=lambda t: t["min"])
    for before, after in zip(result, result[1:], strict=False):
        if after["min"] <= before["max"]:
            raise _bad(
                f"priority tiers overlap: {before['name']} and {after['name']}",
                detail=f"{before['name']} ends at {before['max']}, "
                f"{after['name']} starts at {after['min']}.",
            )
        if after["min"] > before["max"] + 1:
            raise _bad(
                f"priority tiers leave a gap: {before['name']} and {after['name']}",
                detail=f"No tier holds priorities {before['max'] + 1} to {after['min'] - 1}.",
            )
    return result


def validate_sql(plpy, tiers_json):
    return validate(None if tiers_json is None else json.loads(tiers_json))
