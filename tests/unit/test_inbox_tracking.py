import pytest

from mailbox_server import inbox_tracking
from mailbox_server.errors import MailboxError

DEFAULTS = {role: role for role in inbox_tracking.REQUIRED + inbox_tracking.OPTIONAL}

COLUMNS = {
    "id": (1, "uuid", "uuid"),
    "done": (2, "timestamptz", "timestamp with time zone"),
    "tries": (3, "int2", "smallint"),
    "received_at": (4, "timestamp", "timestamp without time zone"),
    "payload": (5, "json", "json"),
    "note": (6, "text", "text"),
}


def requested(**overrides):
    base = dict(DEFAULTS, event_id="id", processed_at="done", retry_count="tries")
    base.update(overrides)
    return base


def test_resolve_maps_existing_columns_and_skips_missing_optional_ones():
    mapping, casts = inbox_tracking.resolve(requested(), DEFAULTS, COLUMNS, "s.t")
    assert mapping == {
        "event_id": "id",
        "processed_at": "done",
        "retry_count": "tries",
        "received_at": "received_at",
        "payload": "payload",
    }
    assert casts == {"event_id": "uuid"}


@pytest.mark.parametrize(
    "overrides, sqlstate",
    [
        ({"processed_at": "nope"}, "42703"),  # required, missing
        ({"error": "nope"}, "42703"),  # optional but explicitly named
        ({"retry_count": "note"}, "42804"),  # wrong type
        ({"payload": "note"}, "42804"),
        ({"event_id": None}, "22004"),
        ({"event_type": "note", "error": "note"}, "22023"),  # one column, two roles
    ],
)
def test_resolve_errors(overrides, sqlstate):
    with pytest.raises(MailboxError) as info:
        inbox_tracking.resolve(requested(**overrides), DEFAULTS, COLUMNS, "s.t")
    assert info.value.sqlstate == sqlstate


@pytest.mark.parametrize(
    "kind, schema, sqlstate",
    [
        ("v", "public", "42809"),
        ("m", "public", "42809"),
        ("r", "mailbox", "22023"),
        ("r", "pg_temp_3", "22023"),
    ],
)
def test_check_table(kind, schema, sqlstate):
    with pytest.raises(MailboxError) as info:
        inbox_tracking.check_table(kind, schema, "t")
    assert info.value.sqlstate == sqlstate


def test_validate_requires_a_unique_id(plpy):
    plpy.answer("FROM pg_catalog.pg_class AS c", [{"relkind": "r", "nspname": "s", "relname": "t"}])
    plpy.answer(
        "FROM pg_catalog.pg_attribute",
        [
            {"attname": name, "attnum": num, "base_type": base, "full_type": full}
            for name, (num, base, full) in COLUMNS.items()
        ],
    )
    plpy.answer("pg_catalog.pg_index", [{"ok": False}])
    with pytest.raises(MailboxError) as info:
        inbox_tracking.validate(plpy, 1, requested(), DEFAULTS)
    assert info.value.sqlstate == "55000" and "ADD PRIMARY KEY (id)" in info.value.hint
    plpy.rules[-1] = ("pg_catalog.pg_index", [{"ok": True}])
    got = inbox_tracking.validate(plpy, 1, requested(), DEFAULTS)
    assert got["schema"] == "s" and got["table"] == "t" and got["casts"] == {"event_id": "uuid"}
