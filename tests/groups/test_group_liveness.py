"""Heartbeats, health, reaping, crashes (SPEC §2.2 item 8) and maintenance concurrency."""

import threading
import time

import psycopg
import pytest
from groups import commit, poll, publish
from mbx import raises, rows, scalar


@pytest.fixture
def group(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    publish(db, "e", 10)
    return db


def alerts(db, event):
    return [
        r[0]
        for r in rows(
            db, "SELECT payload FROM mailbox.alert_log WHERE event = %s ORDER BY alert_id", [event]
        )
    ]


def test_healthy_flips_after_the_timeout_and_maintenance_alerts_once(group, connect):
    db = group
    a = connect()
    poll(a, "g", "a", batch=1)
    db.execute("SET mailbox.consumer_heartbeat_timeout_seconds = 1")
    assert scalar(db, "SELECT healthy FROM mailbox.consumer_lag('g')") is True
    time.sleep(1.2)
    assert scalar(db, "SELECT healthy FROM mailbox.consumer_lag('g')") is False
    db.execute("SELECT mailbox.run_maintenance()")
    db.execute("SELECT mailbox.run_maintenance()")
    got = alerts(db, "consumer_unhealthy")
    assert len(got) == 1 and got[0]["consumer"] == "a" and got[0]["group"] == "g"
    a.execute("SELECT mailbox.consumer_heartbeat('g', 'a')")  # healthy again, re-armed
    assert scalar(db, "SELECT healthy FROM mailbox.consumer_status") is True
    time.sleep(1.2)
    db.execute("SELECT mailbox.run_maintenance()")
    assert len(alerts(db, "consumer_unhealthy")) == 2


def test_reaping_releases_leases_and_forgetting_removes_the_consumer(group, connect):
    db = group
    a, b = connect(), connect()
    poll(a, "g", "a", batch=4)
    # a consumer silent for longer than the dead threshold (24 h by default)
    db.execute(
        "UPDATE mailbox._consumer SET last_heartbeat_at = now() - interval '25 hours'"
        " WHERE consumer_id = 'a'"
    )
    assert [r[0] for r in poll(b, "g", "b", batch=4)] == [5, 6, 7, 8]  # a's lease still live
    result = scalar(db, "SELECT mailbox.run_maintenance()")
    assert result["consumers_reaped"] == 1 and result["consumer_rows_released"] == 4
    (reaped,) = alerts(db, "consumer_reaped")
    assert reaped["consumer"] == "a" and reaped["released_rows"] == 4
    assert [r[0] for r in poll(b, "g", "b", batch=10)] == [1, 2, 3, 4]
    commit(b, "g", "b", 8)
    db.execute(
        "UPDATE mailbox._consumer SET registered_at = now() - interval '8 days',"
        " last_heartbeat_at = now() - interval '8 days' WHERE consumer_id = 'a'"
    )
    assert scalar(db, "SELECT mailbox.run_maintenance()")["consumers_forgotten"] == 1
    assert [r[0] for r in rows(db, "SELECT consumer_id FROM mailbox.consumer_status")] == ["b"]


def test_a_terminated_consumer_loses_nothing(group, connect):
    db = group
    victim = connect()
    pid = scalar(victim, "SELECT pg_backend_pid()")
    assert len(poll(victim, "g", "victim", batch=5, visibility=1)) == 5
    db.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(psycopg.OperationalError):
        victim.execute("SELECT 1")
    time.sleep(1.2)
    survivor = connect()
    got = [r[0] for r in poll(survivor, "g", "s", batch=100)]
    assert got == [1, 2, 3, 4, 5]
    commit(survivor, "g", "s", 5)
    assert [r[0] for r in poll(survivor, "g", "s", batch=100)] == [6, 7, 8, 9, 10]


def test_consumer_terminated_mid_poll_transaction_leaves_no_lease(group, connect):
    db = group
    victim = connect(autocommit=False)
    pid = scalar(victim, "SELECT pg_backend_pid()")
    poll(victim, "g", "victim", batch=5)  # transaction still open
    db.execute("SELECT pg_terminate_backend(%s)", [pid])
    survivor = connect()
    assert [r[0] for r in poll(survivor, "g", "s", batch=100)] == list(range(1, 11))


def test_concurrent_maintenance_runs_one_and_skips_the_other(group, connect):
    first = connect(autocommit=False)
    assert scalar(first, "SELECT mailbox.run_maintenance()")["skipped"] is False
    second = connect()
    assert scalar(second, "SELECT mailbox.run_maintenance()") == {"skipped": True}
    first.commit()
    assert scalar(second, "SELECT mailbox.run_maintenance()")["skipped"] is False


def test_views_show_consumers_groups_and_leases(group, connect):
    db = group
    a = connect()
    poll(a, "g", "a", batch=4)
    status = db.execute(
        "SELECT group_name, consumer_id, outbox_name, in_flight, healthy"
        " FROM mailbox.consumer_status"
    ).fetchall()
    assert status == [("g", "a", "e", 4, True)]
    lag = db.execute(
        "SELECT group_name, group_offset, delivered_offset, head_offset, lag, consumers,"
        " in_flight FROM mailbox.consumer_group_lag"
    ).fetchone()
    assert lag == ("g", 0, 4, 10, 10, 1, 4)
    assert rows(
        db,
        "SELECT consumer_id, first_offset, last_offset, row_count"
        " FROM mailbox.consumer_active_leases",
    ) == [("a", 1, 4, 4)]


def test_lag_lists_a_group_without_consumers(group):
    got = group.execute(
        "SELECT group_name, consumer_id, lag FROM mailbox.consumer_lag()"
    ).fetchall()
    assert got == [("g", None, 10)]


def test_consumer_role_can_consume_but_not_manage(group, connect):
    from mbx import drop_role, make_role

    role = make_role(group, "mailbox_consumer")
    try:
        conn = connect()
        conn.execute(f'SET ROLE "{role}"')
        assert len(poll(conn, "g", "r", batch=3)) == 3
        assert commit(conn, "g", "r", 3) == 3
        conn.execute("SELECT * FROM mailbox.consumer_lag()")
        conn.execute("SELECT * FROM mailbox.consumer_group_lag")
        with raises("42501"):
            conn.execute("SELECT mailbox.create_consumer_group('x', 'e')")
        with raises("42501"):
            conn.execute("SELECT mailbox.run_maintenance()")
        conn.execute("RESET ROLE")
    finally:
        drop_role(group, role)


def test_parallel_polls_in_one_group_do_not_deadlock(group, connect):
    publish(group, "e", 2000)
    errors = []

    def work(name):
        try:
            conn = connect()
            for _ in range(30):
                got = poll(conn, "g", name, batch=20)
                if got:
                    commit(conn, "g", name, got[-1][0])
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
