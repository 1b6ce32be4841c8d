"""inbox_health thresholds, inbox_status and the stats view (SPEC §3.1)."""

import pytest
from mbx import raises, rows, scalar


def health(db, name="h"):
    return scalar(db, "SELECT mailbox.inbox_health(%s)", [name])


@pytest.fixture
def h(db):
    db.execute("SELECT mailbox.create_inbox('h', p_max_retries => 1)")
    return db


def age(db, event_id, seconds):
    db.execute(
        "UPDATE mailbox.h SET received_at = now() - make_interval(secs => %s) WHERE event_id = %s",
        [seconds, event_id],
    )


def test_empty_inbox_is_healthy_with_every_key(h):
    got = health(h)
    assert got == {
        "inbox_name": "h",
        "inbox_schema": "mailbox",
        "health_status": "healthy",
        "pending_count": 0,
        "in_flight_count": 0,
        "dead_letter_count": 0,
        "processed_count": 0,
        "total_messages": 0,
        "oldest_pending_age_sec": None,
        "avg_processing_time_sec": None,
        "throughput_per_sec": 0.0,
        "max_retries": 1,
        "retention_hours": 72,
    }
    with raises("42704"):
        health(h, "nope")
    with raises("22004"):
        health(h, None)


def test_pending_age_thresholds(h):
    db = h
    db.execute("SELECT mailbox.inbox_receive('h', 'a', '{}')")
    assert health(db)["health_status"] == "healthy"
    age(db, "a", 61)
    got = health(db)
    assert got["health_status"] == "degraded" and 61 <= got["oldest_pending_age_sec"] < 90
    age(db, "a", 301)
    assert health(db)["health_status"] == "critical"
    # in flight still counts as pending, and the thresholds are settings
    db.execute("SELECT * FROM mailbox.inbox_claim('h', 'w')")
    got = health(db)
    assert got["pending_count"] == 1 and got["in_flight_count"] == 1
    db.execute("SET mailbox.inbox_critical_age_seconds = 1000")
    assert health(db)["health_status"] == "degraded"
    db.execute("SET mailbox.inbox_degraded_age_seconds = 500")
    assert health(db)["health_status"] == "healthy"
    db.execute("SET mailbox.inbox_degraded_age_seconds = -5")
    with raises("22023") as info:
        health(db)
    assert "mailbox.inbox_degraded_age_seconds" in str(info.value)


def test_dead_letters_degrade_then_make_it_critical(h):
    db = h
    db.execute("SET mailbox.inbox_critical_dlq_count = 3")
    for i in range(3):
        db.execute("SELECT mailbox.inbox_receive('h', %s, '{}')", [f"d{i}"])
    db.execute("SELECT mailbox.inbox_mark_failed('h', 'd0', 'x')")
    got = health(db)
    assert got["health_status"] == "degraded" and got["dead_letter_count"] == 1
    assert got["pending_count"] == 2 and got["total_messages"] == 3
    db.execute("SELECT mailbox.inbox_mark_failed('h', 'd1', 'x')")
    assert health(db)["health_status"] == "degraded"
    db.execute("SELECT mailbox.inbox_mark_failed('h', 'd2', 'x')")
    assert health(db)["health_status"] == "critical"
    db.execute("RESET mailbox.inbox_critical_dlq_count")
    assert health(db)["health_status"] == "degraded"  # default threshold is 100


def test_processing_time_throughput_and_stats_view(h):
    db = h
    for event_id, event_type in (("p1", "a"), ("p2", "a"), ("p3", "b"), ("q", "b")):
        db.execute("SELECT mailbox.inbox_receive('h', %s, '{}', %s)", [event_id, event_type])
    for event_id in ("p1", "p2", "p3"):
        db.execute("SELECT mailbox.inbox_mark_processed('h', %s)", [event_id])
    # 2, 4 and 6 seconds from arrival to processing
    for event_id, secs in (("p1", 2), ("p2", 4), ("p3", 6)):
        db.execute(
            "UPDATE mailbox.h SET received_at = processed_at - make_interval(secs => %s)"
            " WHERE event_id = %s",
            [secs, event_id],
        )
    db.execute("SELECT mailbox.inbox_mark_failed('h', 'q', 'x')")
    got = health(db)
    assert got["processed_count"] == 3 and got["dead_letter_count"] == 1
    assert got["avg_processing_time_sec"] == pytest.approx(4.0, abs=0.01)
    assert got["throughput_per_sec"] == pytest.approx(3 / 60)
    stats = rows(db, "SELECT * FROM mailbox.stats_h ORDER BY event_type")
    assert [tuple(s[:4]) for s in stats] == [("a", 0, 2, 0), ("b", 0, 1, 1)]
    assert stats[0][4] == pytest.approx(3.0, abs=0.01) and stats[1][4] == pytest.approx(
        6.0, abs=0.01
    )


def test_inbox_status_lists_every_inbox(h):
    db = h
    db.execute("SELECT mailbox.create_inbox('o')")
    db.execute("SELECT mailbox.enable_inbox_ordering('o')")
    db.execute("SELECT mailbox.inbox_receive('h', 'x', '{}')")
    got = rows(
        db,
        "SELECT inbox_name, inbox_schema, table_name, max_retries, pending_count,"
        " dead_letter_count, processed_count, is_managed, ordering, priority"
        " FROM mailbox.inbox_status()",
    )
    assert [tuple(r) for r in got] == [
        ("h", "mailbox", "h", 1, 1, 0, 0, True, False, False),
        ("o", "mailbox", "o", 3, 0, 0, 0, True, True, False),
    ]
    assert len(rows(db, "SELECT * FROM mailbox.inbox_status('o')")) == 1
    with raises("42704"):
        db.execute("SELECT * FROM mailbox.inbox_status('nope')")


def test_ordering_health_counts_gaps_and_blocked_aggregates(db):
    db.execute("SELECT mailbox.create_inbox('o', p_max_retries => 1)")
    db.execute("SELECT mailbox.enable_inbox_ordering('o')")
    db.execute("SELECT mailbox.inbox_receive('o', 'g2', '{}', NULL, NULL, 'G', 2)")
    db.execute("SELECT mailbox.inbox_receive('o', 'b1', '{}', NULL, NULL, 'B', 1)")
    got = health(db, "o")
    assert (got["gap_count"], got["blocked_aggregates"], got["health_status"]) == (1, 0, "healthy")
    db.execute("SELECT mailbox.inbox_mark_failed('o', 'b1', 'x')")
    got = health(db, "o")
    assert (got["gap_count"], got["blocked_aggregates"], got["health_status"]) == (1, 1, "degraded")
    db.execute("SELECT mailbox.create_inbox('plain')")
    assert "gap_count" not in health(db, "plain")
    assert "blocked_aggregates" not in health(db, "plain")
