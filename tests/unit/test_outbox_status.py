import pytest

from mailbox_server import outbox_status
from mailbox_server.errors import MailboxError


@pytest.mark.parametrize(
    "size_mb, expected",
    [(0, "ok"), (79, "ok"), (80, "warning"), (99, "warning"), (100, "critical"), (500, "critical")],
)
def test_storage_status_thresholds(size_mb, expected):
    assert outbox_status.storage_status(size_mb * 1024 * 1024, 100) == expected


def test_unknown_outbox_is_42704(plpy):
    plpy.answer("FROM mailbox._outbox AS o", [])
    with pytest.raises(MailboxError) as info:
        outbox_status.outbox_status(plpy, "nope")
    assert info.value.sqlstate == "42704" and info.value.message == "outbox not found: nope"


def test_null_name_is_22004(plpy):
    with pytest.raises(MailboxError) as info:
        outbox_status.outbox_status(plpy, None)
    assert info.value.sqlstate == "22004"


def test_status_assembles_every_key(plpy):
    plpy.answer(
        "FROM mailbox._outbox AS o",
        [
            {
                "outbox_key": 1,
                "outbox_name": "o",
                "captured": True,
                "retention_hours": 24,
                "head_offset": 10,
                "last_drained_at": None,
                "last_drained_count": None,
                "source": "public.t",
                "enabled": True,
                "outbox_table": "mailbox.outbox_o",
                "partitions": 4,
            }
        ],
    )
    plpy.answer(
        "pg_catalog.count(*) AS row_count",
        [{"row_count": 4, "oldest_row": "2026-01-01", "newest_row": "2026-01-02"}],
    )
    plpy.answer("total_bytes", [{"total_bytes": 90 * 1024 * 1024}])
    plpy.answer("AS pending", [{"pending": 2}])
    plpy.answer(
        "g.group_name, g.group_offset",
        [{"group_name": "g1", "group_offset": 7, "partitions": 2, "partition_change_boundary": 9}],
    )
    plpy.answer("outbox_storage_critical_mb", [{"mb": 100}])
    got = outbox_status.outbox_status(plpy, "o")
    assert got["storage_status"] == "warning"
    assert got["consumer_groups"] == [
        {"name": "g1", "group_offset": 7, "lag": 3, "partitions": 2, "partition_change_boundary": 9}
    ]
    assert got["partitions"] == 4
    assert got["claim_check_pending_count"] == 2 and got["row_count"] == 4
    assert got["oldest_row"] == "2026-01-01" and got["last_drained_at"] is None
