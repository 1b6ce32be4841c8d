"""run_maintenance(), inbox side (SPEC §4): drains, lease expiry, DLQ and gap alerts."""

import psycopg
import pytest
from mbx import rows, scalar


def maintain(db):
    return scalar(db, "SELECT mailbox.run_maintenance()")


def alerts(db, event):
    return [
        r[0]
        for r in rows(
            db, "SELECT payload FROM mailbox.alert_log WHERE event = %s ORDER BY alert_id", [event]
        )
    ]


@pytest.fixture
def r(db):
    db.execute("SELECT mailbox.create_inbox('r', p_max_retries => 1, p_retention_hours => 1)")
    return db


def test_processed_rows_older_than_retention_are_drained_in_bounded_batches(r):
    db = r
    db.execute(
        "INSERT INTO mailbox.r (event_id, payload, processed_at)"
        " SELECT 'old' || i, '{}', now() - interval '2 hours' FROM generate_series(1, 5) i"
    )
    db.execute(
        "INSERT INTO mailbox.r (event_id, payload, processed_at)"
        " VALUES ('fresh', '{}', now()), ('pending', '{}', NULL)"
    )
    db.execute("SET mailbox.inbox_drain_batch_size = 2")
    assert maintain(db)["inbox_processed_drained"] == 2
    assert maintain(db)["inbox_processed_drained"] == 2
    assert maintain(db)["inbox_processed_drained"] == 1
    assert maintain(db)["inbox_processed_drained"] == 0
    assert sorted(x[0] for x in rows(db, "SELECT event_id FROM mailbox.r")) == ["fresh", "pending"]


def test_adopted_inboxes_use_the_retention_setting(db):
    db.execute(
        "CREATE TABLE public.t (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int NOT NULL DEFAULT 0, received_at timestamptz DEFAULT now())"
    )
    db.execute("SELECT mailbox.enable_inbox_tracking('t', 'public.t')")
    db.execute(
        "INSERT INTO public.t (event_id, processed_at)"
        " VALUES ('a', now() - interval '5 hours'), ('b', now() - interval '100 hours')"
    )
    assert maintain(db)["inbox_processed_drained"] == 1  # default 72 hours
    db.execute("SET mailbox.inbox_processed_retention_hours = 4")
    assert maintain(db)["inbox_processed_drained"] == 1
    assert scalar(db, "SELECT count(*) FROM public.t") == 0


def test_dead_letters_are_kept_unless_dlq_retention_is_set(r):
    db = r
    db.execute("SELECT mailbox.inbox_receive('r', 'd', '{}')")
    db.execute("SELECT mailbox.inbox_mark_failed('r', 'd', 'x')")
    db.execute("UPDATE mailbox.r SET received_at = now() - interval '3 hours'")
    assert maintain(db)["inbox_dlq_drained"] == 0
    db.execute("SET mailbox.inbox_dlq_retention_hours = 2")
    assert maintain(db)["inbox_dlq_drained"] == 1
    assert scalar(db, "SELECT count(*) FROM mailbox.r") == 0


def test_expired_leases_are_removed_but_retry_delays_kept(r):
    db = r
    for event_id in ("a", "b"):
        db.execute("SELECT mailbox.inbox_receive('r', %s, '{}')", [event_id])
    db.execute("SELECT * FROM mailbox.inbox_claim('r', 'w', 2)")
    db.execute(
        "UPDATE mailbox._inbox_lease SET lease_until = now() - interval '1 second'"
        " WHERE event_id = 'a'"
    )
    assert maintain(db)["inbox_leases_expired"] == 1
    assert [x[0] for x in rows(db, "SELECT event_id FROM mailbox._inbox_lease")] == ["b"]


def test_dlq_alerts_are_capped_per_run_with_one_batch_summary(r):
    db = r
    db.execute("SET mailbox.inbox_dlq_alert_max_per_run = 2")
    for i in range(5):
        db.execute("SELECT mailbox.inbox_receive('r', %s, '{}')", [f"d{i}"])
        db.execute("SELECT mailbox.inbox_mark_failed('r', %s, 'broken')", [f"d{i}"])
    got = maintain(db)
    assert got["inbox_dlq_alerts"] == 2 and got["inbox_dlq_batch_alerts"] == 1
    messages = alerts(db, "inbox_dlq_message")
    assert [m["event_id"] for m in messages] == ["d0", "d1"]
    assert messages[0]["inbox"] == "r" and messages[0]["error"] == "broken"
    (batch,) = alerts(db, "inbox_dlq_batch")
    assert batch["count"] == 3 and batch["inboxes"] == {"r": 3}
    got = maintain(db)  # announced once
    assert got["inbox_dlq_alerts"] == 0 and got["inbox_dlq_batch_alerts"] == 0
    assert len(alerts(db, "inbox_dlq_message")) == 2


def test_gap_alert_fires_once_per_gap_older_than_the_threshold(db):
    db.execute("SELECT mailbox.create_inbox('o')")
    db.execute("SELECT mailbox.enable_inbox_ordering('o')")
    db.execute("SELECT mailbox.inbox_receive('o', 'a1', '{}', NULL, NULL, 'A', 1)")
    db.execute("SELECT mailbox.inbox_mark_processed('o', 'a1')")
    db.execute("SELECT mailbox.inbox_receive('o', 'a3', '{}', NULL, NULL, 'A', 3)")
    assert maintain(db)["inbox_gap_alerts"] == 0  # younger than 60 s
    db.execute(
        "UPDATE mailbox.o SET received_at = now() - interval '61 seconds' WHERE event_id = 'a3'"
    )
    assert maintain(db)["inbox_gap_alerts"] == 1
    assert maintain(db)["inbox_gap_alerts"] == 0
    (alert,) = alerts(db, "inbox_ordering_gap")
    assert (alert["inbox"], alert["aggregate_id"], alert["expected_seq"], alert["found_seq"]) == (
        "o",
        "A",
        2,
        3,
    )
    assert alert["gap_age_sec"] >= 61
    # a second, new gap is announced on its own; a closed gap is forgotten
    db.execute("SET mailbox.inbox_gap_alert_seconds = 0")
    db.execute("SELECT mailbox.inbox_receive('o', 'b5', '{}', NULL, NULL, 'B', 5)")
    assert maintain(db)["inbox_gap_alerts"] == 1
    db.execute("SELECT mailbox.inbox_receive('o', 'a2', '{}', NULL, NULL, 'A', 2)")
    maintain(db)
    assert [
        tuple(x)
        for x in rows(db, "SELECT aggregate_id, expected_seq FROM mailbox._inbox_gap_alert")
    ] == [("B", 1)]
    assert len(alerts(db, "inbox_ordering_gap")) == 2


def test_one_failing_inbox_table_does_not_stop_the_others(r):
    # a table owner's trigger that raises (or a generated function it dropped) fails only
    # its own inbox's maintenance: reported, rolled back alone, the others are drained
    db = r
    db.execute(
        "CREATE TABLE public.stuck (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int, received_at timestamptz)"
    )
    db.execute(
        "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'no deletes here'; END $$"
    )
    db.execute(
        "CREATE TRIGGER refuse BEFORE DELETE ON public.stuck"
        " FOR EACH ROW EXECUTE FUNCTION public.refuse()"
    )
    db.execute("SELECT mailbox.enable_inbox_tracking('a_stuck', 'public.stuck')")
    db.execute("INSERT INTO public.stuck VALUES ('s', now() - interval '100 hours', 0, now())")
    db.execute(
        "INSERT INTO mailbox.r (event_id, payload, processed_at)"
        " VALUES ('old', '{}', now() - interval '2 hours')"
    )
    warnings = []
    db.add_notice_handler(lambda d: warnings.append(d.message_primary))
    result = maintain(db)
    assert result["inbox_failed"] == 1 and result["inbox_processed_drained"] == 1
    assert any("maintenance of inbox a_stuck failed" in w for w in warnings), warnings
    assert scalar(db, "SELECT count(*) FROM public.stuck") == 1
    assert scalar(db, "SELECT count(*) FROM mailbox.r") == 0


def test_inbox_status_lists_every_inbox_when_one_table_fails(r):
    db = r
    db.execute(
        "CREATE TABLE public.odd (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int, received_at timestamptz)"
    )
    db.execute("SELECT mailbox.enable_inbox_tracking('odd', 'public.odd')")
    key = scalar(db, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = 'odd'")
    # its owner dropped the function pg_mailbox reads the table with
    db.execute(f"DROP FUNCTION mailbox._inbox_{key}_query")
    warnings = []
    db.add_notice_handler(lambda d: warnings.append(d.message_primary))
    got = rows(db, "SELECT inbox_name, pending_count FROM mailbox.inbox_status()")
    assert got == [("odd", None), ("r", 0)]
    assert any("counting messages of inbox odd failed" in w for w in warnings), warnings
    with pytest.raises(psycopg.errors.UndefinedFunction):
        db.execute("SELECT * FROM mailbox.inbox_status('odd')")
