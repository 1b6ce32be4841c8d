import json

from mailbox_server import inbox_catalog, inbox_maintenance


def catalog_row(**overrides):
    row = {
        "inbox_key": 1,
        "inbox_name": "o",
        "schema_name": "s",
        "table_name": "t",
        "is_managed": True,
        "columns": json.dumps({"event_id": "event_id"}),
        "casts": "{}",
        "max_retries": 3,
        "retention_hours": None,
        "ordering_first_sequence": 1,
        "priority_tiers": None,
        "with_dead_letter": True,
        "with_stats": True,
    }
    row.update(overrides)
    return row


def test_dlq_alerts_cap_and_summarise(plpy):
    events = [
        {
            "event_no": i,
            "inbox_name": "a" if i % 2 else "b",
            "event_id": f"e{i}",
            "error": "x",
            "retry_count": 3,
            "dead_at": "now",
        }
        for i in range(5)
    ]
    plpy.answer("mailbox._take_inbox_dlq_events()", events)
    plpy.answer("mailbox._alert", [])
    assert inbox_maintenance.dlq_alerts(plpy, 2) == (2, 1)
    sent = [
        (args[0], json.loads(args[1])) for query, args in plpy.calls if "mailbox._alert(" in query
    ]
    assert [s[0] for s in sent] == ["inbox_dlq_message", "inbox_dlq_message", "inbox_dlq_batch"]
    assert [s[1]["event_id"] for s in sent[:2]] == ["e0", "e1"]
    assert sent[2][1]["count"] == 3 and sent[2][1]["inboxes"] == {"a": 1, "b": 2}


def test_no_dead_letters_no_alerts(plpy):
    plpy.answer("mailbox._take_inbox_dlq_events()", [])
    assert inbox_maintenance.dlq_alerts(plpy, 10) == (0, 0)


def test_gap_alerts_once_per_gap_past_the_threshold(plpy):
    inbox = inbox_catalog.Inbox(plpy, catalog_row())
    gaps = [
        {"aggregate_id": "A", "expected_seq": 2, "found_seq": 3, "gap_age_sec": 120.0},
        {"aggregate_id": "B", "expected_seq": 1, "found_seq": 4, "gap_age_sec": 5.0},
        {"aggregate_id": "C", "expected_seq": 7, "found_seq": 9, "gap_age_sec": 500.0},
    ]
    plpy.answer("mailbox._inbox_gaps($1)", [{"gaps": json.dumps(gaps)}])
    plpy.answer(
        "mailbox._inbox_gaps_alerted(",
        [{"aggregate_id": "C", "expected_seq": 7}, {"aggregate_id": "Z", "expected_seq": 1}],
    )
    plpy.answer("mailbox._alert", [])
    plpy.answer("mailbox._record_inbox_gap_alert(", [])
    plpy.answer("mailbox._forget_inbox_gap_alert(", [])
    assert inbox_maintenance.gap_alerts(plpy, inbox, 60) == 1
    alerts = [json.loads(args[1]) for query, args in plpy.calls if "mailbox._alert(" in query]
    assert [(a["aggregate_id"], a["expected_seq"]) for a in alerts] == [("A", 2)]
    recorded = [args for query, args in plpy.calls if "_record_inbox_gap_alert(" in query]
    forgotten = [args for query, args in plpy.calls if "_forget_inbox_gap_alert(" in query]
    assert recorded == [[1, "A", 2]] and forgotten == [[1, "Z", 1]]
