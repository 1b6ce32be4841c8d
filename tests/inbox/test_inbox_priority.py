"""Priority tiers, claim order and the ordering/priority conflict (SPEC §3.2)."""

import json

import psycopg
import pytest
from mbx import raises, rows, scalar


def claim_ids(conn, inbox="tasks", batch=10):
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    got = cur.execute("SELECT * FROM mailbox.inbox_claim(%s, 'w', %s)", [inbox, batch]).fetchall()
    return [m["event_id"] for m in got]


def views(db, schema="mailbox"):
    # only this test's inbox: the extension has views of its own in mailbox
    return sorted(
        r[0]
        for r in rows(
            db,
            "SELECT viewname FROM pg_views WHERE schemaname = %s AND viewname LIKE '%%tasks%%'",
            [schema],
        )
    )


@pytest.fixture
def tasks(db):
    db.execute("SELECT mailbox.create_inbox('tasks')")
    # arrival order is the reverse of priority order
    for event_id, priority in (("bg", 8), ("norm", 4), ("crit", 1), ("crit2", 2), ("none", None)):
        db.execute(
            "SELECT mailbox.inbox_receive('tasks', %s, '{}', p_priority => %s)",
            [event_id, priority],
        )
    return db


def test_default_tiers_make_one_view_each_and_claim_takes_critical_first(tasks):
    db = tasks
    assert claim_ids(db, batch=1) == ["bg"]  # without priority: arrival order
    db.execute("SELECT mailbox.replay_inbox_messages('tasks', ARRAY['bg'])")
    db.execute("DELETE FROM mailbox._inbox_lease")
    db.execute("SELECT mailbox.enable_inbox_priority('tasks')")
    assert views(db) == [
        "dlq_tasks",
        "pending_tasks",
        "pending_tasks_background",
        "pending_tasks_critical",
        "pending_tasks_normal",
        "stats_tasks",
    ]
    tiers = scalar(db, "SELECT priority_tiers FROM mailbox._inbox WHERE inbox_name = 'tasks'")
    assert tiers == [
        {"name": "critical", "min": 1, "max": 2},
        {"name": "normal", "min": 3, "max": 6},
        {"name": "background", "min": 7, "max": 9},
    ]
    assert [
        r[0] for r in rows(db, "SELECT event_id FROM mailbox.pending_tasks_critical ORDER BY 1")
    ] == ["crit", "crit2"]
    assert [r[0] for r in rows(db, "SELECT event_id FROM mailbox.pending_tasks_normal")] == ["norm"]
    assert [r[0] for r in rows(db, "SELECT event_id FROM mailbox.pending_tasks_background")] == [
        "bg"
    ]
    # pending_<inbox> keeps every pending message, including one without a priority
    assert scalar(db, "SELECT count(*) FROM mailbox.pending_tasks") == 5
    assert claim_ids(db, batch=2) == ["crit", "crit2"]
    assert claim_ids(db, batch=10) == ["norm", "bg", "none"]


def test_custom_tiers(tasks):
    db = tasks
    db.execute(
        "SELECT mailbox.enable_inbox_priority('tasks', 'priority', %s)",
        [json.dumps([{"name": "low", "min": 5, "max": 9}, {"name": "high", "min": 0, "max": 4}])],
    )
    assert "pending_tasks_high" in views(db) and "pending_tasks_low" in views(db)
    assert [
        r[0] for r in rows(db, "SELECT event_id FROM mailbox.pending_tasks_high ORDER BY 1")
    ] == ["crit", "crit2", "norm"]
    # changing the tiers replaces the tier views
    db.execute(
        "SELECT mailbox.enable_inbox_priority('tasks', 'priority', %s)",
        [json.dumps([{"name": "all", "min": 0, "max": 9}])],
    )
    assert [v for v in views(db) if v.startswith("pending_tasks_")] == ["pending_tasks_all"]


@pytest.mark.parametrize(
    "tiers",
    [
        [{"name": "a", "min": 1, "max": 5}, {"name": "b", "min": 5, "max": 9}],  # overlap
        [{"name": "a", "min": 1, "max": 2}, {"name": "b", "min": 4, "max": 9}],  # gap
        [{"name": "a", "min": 3, "max": 1}],  # min > max
        [{"name": "a", "min": 1, "max": 2}, {"name": "a", "min": 3, "max": 4}],  # duplicate
        [{"name": "Bad", "min": 1, "max": 2}],  # name
        [{"name": "waytoolongtiername", "min": 1, "max": 2}],  # > 14 bytes
        [{"name": "a", "min": "1", "max": 2}],  # not integer
        [{"name": "a", "max": 2}],  # missing min
        [],
        {"name": "a", "min": 1, "max": 2},
    ],
)
def test_invalid_tiers_are_22023_and_change_nothing(tasks, tiers):
    db = tasks
    with raises("22023") as info:
        db.execute(
            "SELECT mailbox.enable_inbox_priority('tasks', 'priority', %s)", [json.dumps(tiers)]
        )
    assert info.value.diag.message_hint
    assert scalar(db, "SELECT priority_tiers FROM mailbox._inbox") is None
    assert views(db) == ["dlq_tasks", "pending_tasks", "stats_tasks"]


def test_priority_column_errors(tasks):
    with raises("42703"):
        tasks.execute("SELECT mailbox.enable_inbox_priority('tasks', 'nope')")
    with raises("42804"):
        tasks.execute("SELECT mailbox.enable_inbox_priority('tasks', 'payload')")


def test_ordering_and_priority_conflict_in_either_order(db):
    db.execute("SELECT mailbox.create_inbox('a')")
    db.execute("SELECT mailbox.create_inbox('b')")
    db.execute("SELECT mailbox.enable_inbox_ordering('a')")
    with raises("55000") as info:
        db.execute("SELECT mailbox.enable_inbox_priority('a')")
    assert str(info.value).startswith("inbox ordering and priority conflict for inbox: a")
    assert "separate inboxes" in info.value.diag.message_hint
    db.execute("SELECT mailbox.enable_inbox_priority('b')")
    with raises("55000") as info:
        db.execute("SELECT mailbox.enable_inbox_ordering('b')")
    assert str(info.value).startswith("inbox ordering and priority conflict for inbox: b")
    assert info.value.diag.message_hint
    assert scalar(db, "SELECT priority_tiers IS NULL FROM mailbox._inbox WHERE inbox_name = 'a'")
    assert scalar(
        db, "SELECT ordering_first_sequence IS NULL FROM mailbox._inbox WHERE inbox_name = 'b'"
    )


def test_disabling_restores_the_plain_views_and_arrival_order(tasks):
    db = tasks
    plain = views(db)
    db.execute("SELECT mailbox.enable_inbox_priority('tasks')")
    db.execute("SELECT mailbox.disable_inbox_priority('tasks')")
    assert views(db) == plain
    assert scalar(db, "SELECT to_regclass('mailbox.tasks_priority_idx')") is None
    assert claim_ids(db, batch=2) == ["bg", "norm"]
    with raises("55000"):
        db.execute("SELECT mailbox.disable_inbox_priority('tasks')")
    db.execute("SELECT mailbox.disable_inbox_priority('tasks', true)")
    # and ordering can be enabled now, once no pending message lacks aggregate and sequence
    # (docs/inbox-ordering.md: such a message would never be claimed while ordered)
    with raises("55000"):
        db.execute("SELECT mailbox.enable_inbox_ordering('tasks')")
    db.execute("UPDATE mailbox.tasks SET processed_at = now()")
    db.execute("SELECT mailbox.enable_inbox_ordering('tasks')")
    db.execute("SELECT mailbox.disable_inbox_ordering('tasks')")
    assert views(db) == plain
