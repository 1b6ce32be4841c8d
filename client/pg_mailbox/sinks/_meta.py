"""Envelope metadata as broker headers (string values), and back (for ingest)."""

from __future__ import annotations

import json

from pg_mailbox.api import dumps

#: envelope fields carried as headers, besides the broker's own message id
META_FIELDS = (
    "event_id",
    "outbox",
    "offset",
    "event_type",
    "key",
    "source",
    "created_at",
    "headers",
    "full_refresh",
    "page",
    "pages",
)


def to_headers(meta: dict) -> dict[str, str]:
    out = {}
    for name in META_FIELDS:
        value = meta.get(name)
        if value is None:
            continue
        if name == "headers":
            out["headers"] = dumps(value)
        elif isinstance(value, bool):
            out[name] = "true" if value else "false"
        else:
            out[name] = str(value)
    return out


def from_headers(headers: dict | None) -> dict:
    """What ingest reads back: event_type, source, key, sequence_num, headers."""
    headers = {
        str(k): (v.decode() if isinstance(v, bytes) else v) for k, v in (headers or {}).items()
    }
    extra = headers.get("headers")
    try:
        inner = json.loads(extra) if isinstance(extra, str) else (extra or {})
    except ValueError:
        inner = {"headers": extra}
    seq = headers.get("sequence_num") or (
        inner.get("sequence_num") if isinstance(inner, dict) else None
    )
    try:
        seq = int(seq) if seq not in (None, "") else None
    except (TypeError, ValueError):
        seq = None
    meta = {k: v for k, v in headers.items() if k in META_FIELDS and k != "headers"}
    if isinstance(inner, dict) and inner:
        meta["headers"] = inner
    return {
        "event_type": headers.get("event_type"),
        "source": headers.get("source"),
        "aggregate_id": headers.get("key"),
        "sequence_num": seq,
        "headers": meta or None,
    }
