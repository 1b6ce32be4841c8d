"""enable_inbox_tracking: adopting an existing table through a column mapping (SPEC §3.1)."""

import json
import uuid

import psycopg
import pytest
from mbx import raises, rows, scalar

LEGACY = """
CREATE SCHEMA legacy;
CREATE TABLE legacy.incoming_messages (
    msg_id uuid PRIMARY KEY,
    kind varchar(100),
    body json,
    arrived timestamp NOT NULL DEFAULT now(),
    handled_at timestamptz,
    attempts smallint NOT NULL DEFAULT 0,
    last_error text,
    stream text,
    position int,
    note text
);
"""


def adopt(db, name="legacy_in"):
    db.execute(
        """SELECT mailbox.enable_inbox_tracking(%s, 'legacy.incoming_messages',
                      p_id_column => 'msg_id', p_processed_at_column => 'handled_at',
                      p_retry_count_column => 'attempts', p_error_column => 'last_error',
                      p_received_at_column => 'arrived', p_event_type_column => 'kind',
                      p_max_retries => 2, p_payload_column => 'body')""",
        [name],
    )


@pytest.fixture
def legacy(db):
    db.execute(LEGACY)
    adopt(db)
    return db


def test_adoption_keeps_the_table_and_makes_views_beside_it(legacy):
    db = legacy
    cols = [
        r[0]
        for r in rows(
            db,
            "SELECT attname FROM pg_attribute WHERE attrelid ="
            " 'legacy.incoming_messages'::regclass AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum",
        )
    ]
    assert cols == [
        "msg_id",
        "kind",
        "body",
        "arrived",
        "handled_at",
        "attempts",
        "last_error",
        "stream",
        "position",
        "note",
    ]
    assert sorted(
        r[0] for r in rows(db, "SELECT viewname FROM pg_views WHERE schemaname = 'legacy'")
    ) == ["dlq_legacy_in", "pending_legacy_in", "stats_legacy_in"]
    mapping = scalar(db, "SELECT columns FROM mailbox._inbox WHERE inbox_name = 'legacy_in'")
    assert mapping == {
        "event_id": "msg_id",
        "processed_at": "handled_at",
        "retry_count": "attempts",
        "received_at": "arrived",
        "error": "last_error",
        "event_type": "kind",
        "payload": "body",
    }
    (status,) = rows(
        db,
        "SELECT inbox_name, inbox_schema, table_name, max_retries, is_managed"
        " FROM mailbox.inbox_status('legacy_in')",
    )
    assert tuple(status) == ("legacy_in", "legacy", "incoming_messages", 2, False)


def test_every_inbox_function_works_through_the_mapping(legacy):
    db = legacy
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    assert scalar(db, "SELECT mailbox.inbox_receive('legacy_in', %s, '{\"x\": 1}', 'k1')", [a])
    assert not scalar(db, "SELECT mailbox.inbox_receive('legacy_in', %s, '{}')", [a])
    assert scalar(db, "SELECT mailbox.inbox_receive('legacy_in', %s, '{\"x\": 2}', 'k2')", [b])
    # a value for a role the table has no column for is refused, not dropped silently
    with raises("22023"):
        db.execute("SELECT mailbox.inbox_receive('legacy_in', 'c', '{}', p_trace_id => 't')")
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    got = cur.execute("SELECT * FROM mailbox.inbox_claim('legacy_in', 'w', 10)").fetchall()
    assert [m["event_id"] for m in got] == [a, b]
    assert got[0]["payload"] == {"x": 1} and got[0]["event_type"] == "k1"
    assert got[0]["source"] is None and got[0]["trace_id"] is None and got[0]["priority"] is None
    # the claim's lease (keyed by the uuid's canonical text) ends with the mark, also when the
    # id is passed in another spelling
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease WHERE event_id = %s", [a]) == 1
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('legacy_in', %s)", [a.upper()]) is True
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease WHERE event_id = %s", [a]) == 0
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('legacy_in', %s, 'e1')", [b]) == "retry"
    assert (
        scalar(db, "SELECT mailbox.inbox_mark_failed('legacy_in', %s, 'e2')", [b]) == "dead_letter"
    )
    assert (
        scalar(db, "SELECT last_error FROM legacy.incoming_messages WHERE msg_id = %s", [b]) == "e2"
    )
    assert [str(r[0]) for r in rows(db, "SELECT msg_id FROM legacy.dlq_legacy_in")] == [b]
    stats = rows(
        db,
        "SELECT event_type, pending_count, processed_count, dead_letter_count"
        " FROM legacy.stats_legacy_in ORDER BY 1",
    )
    assert [tuple(s) for s in stats] == [("k1", 0, 1, 0), ("k2", 0, 0, 1)]
    health = scalar(db, "SELECT mailbox.inbox_health('legacy_in')")
    assert health["dead_letter_count"] == 1 and health["processed_count"] == 1
    assert health["inbox_schema"] == "legacy" and health["retention_hours"] == 72
    assert (
        scalar(db, "SELECT mailbox.replay_inbox_messages('legacy_in', ARRAY[%s, %s])", [a, b]) == 2
    )
    assert scalar(db, "SELECT count(*) FROM legacy.pending_legacy_in") == 2
    db.execute("SELECT mailbox.run_maintenance()")


def test_ordering_on_an_adopted_table_with_other_column_names(legacy):
    db = legacy
    db.execute("SELECT mailbox.enable_inbox_ordering('legacy_in', 'stream', 'position')")
    for pos in (2, 1, 4):
        db.execute(
            """INSERT INTO legacy.incoming_messages (msg_id, body, stream, position)
                      VALUES (gen_random_uuid(), '{}', 's1', %s)""",
            [pos],
        )
    assert [r[0] for r in rows(db, "SELECT position FROM legacy.next_legacy_in")] == [1]
    assert [
        tuple(r[:3]) for r in rows(db, "SELECT * FROM mailbox.inbox_ordering_gaps('legacy_in')")
    ] == [("s1", 3, 4)]
    (m,) = rows(
        db,
        "SELECT event_id, aggregate_id, sequence_num"
        " FROM mailbox.inbox_claim('legacy_in', 'w', 10)",
    )
    assert m[1:] == ("s1", 1)
    db.execute("SELECT mailbox.inbox_mark_processed('legacy_in', %s)", [m[0]])
    assert [r[0] for r in rows(db, "SELECT position FROM legacy.next_legacy_in")] == [2]
    assert scalar(db, "SELECT mailbox.inbox_health('legacy_in')")["gap_count"] == 1


def test_enabling_ordering_holds_a_stream_with_a_message_in_flight(legacy):
    """docs/inbox-ordering.md (enabling on a live inbox): position 3 of stream s1 was claimed
    before ordering; once ordering is on, position 1 is s1's head but waits while 3 is in
    flight. Through the column mapping and the uuid id (leases key it by its text)."""
    db = legacy
    for pos in (3, 1):
        db.execute(
            """INSERT INTO legacy.incoming_messages (msg_id, body, stream, position)
                      VALUES (gen_random_uuid(), '{}', 's1', %s)""",
            [pos],
        )
    claim = (
        "SELECT event_id, aggregate_id, sequence_num FROM mailbox.inbox_claim('legacy_in', 'w', %s)"
    )
    ((m_id, *m),) = rows(db, claim, [1])
    assert m == [None, None]  # not mapped before ordering
    db.execute("SELECT mailbox.enable_inbox_ordering('legacy_in', 'stream', 'position')")
    assert [r[0] for r in rows(db, "SELECT position FROM legacy.next_legacy_in")] == [1]
    assert rows(db, claim, [10]) == []
    held = "SELECT event_id, aggregate_id FROM mailbox._inbox_lease WHERE aggregate_id IS NOT NULL"
    assert rows(db, held) == [(m_id, "s1")]  # the in-flight message's lease carries s1
    assert scalar(db, "SELECT mailbox.inbox_health('legacy_in') -> 'in_flight_count'") == 1
    db.execute("SELECT mailbox.inbox_mark_processed('legacy_in', %s)", [m_id])
    assert [r[2] for r in rows(db, claim, [10])] == [1]


def test_adoption_errors(db):
    db.execute(LEGACY)
    base = (
        "SELECT mailbox.enable_inbox_tracking('x', 'legacy.incoming_messages', 'msg_id',"
        " 'handled_at', 'attempts', 'last_error', 'arrived'"
    )
    with raises("42703") as info:  # a named column that does not exist
        db.execute(base.replace("'handled_at'", "'done_at'") + ")")
    assert "column not found: done_at" in str(info.value)
    with raises("42703"):  # a required role left at its default name, which does not exist
        db.execute(
            "SELECT mailbox.enable_inbox_tracking('x', 'legacy.incoming_messages', 'msg_id')"
        )
    with raises("42804") as info:  # wrong type
        db.execute(base.replace("'attempts'", "'note'") + ")")
    assert "cannot hold retry_count" in str(info.value)
    with raises("42804"):
        db.execute(base + ", p_payload_column => 'note')")
    with raises("22023"):  # one column for two roles
        db.execute(base + ", p_event_type_column => 'last_error')")
    with raises("42704"):
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'legacy.nope')")
    with raises("42704"):  # resolved with the pinned search_path: schema-qualify
        db.execute("SET search_path = legacy, public")
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'incoming_messages')")
    db.execute("RESET search_path")
    db.execute(
        "CREATE TABLE legacy.no_key (event_id text, processed_at timestamptz,"
        " retry_count int, received_at timestamptz)"
    )
    with raises("55000") as info:
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'legacy.no_key')")
    assert "not a primary key or unique" in str(info.value) and info.value.diag.message_hint
    db.execute("CREATE VIEW legacy.v AS SELECT * FROM legacy.no_key")
    with raises("42809"):
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'legacy.v')")
    with raises("22023"):
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'mailbox.alert_log')")
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox") == 0
    assert scalar(db, "SELECT count(*) FROM pg_views WHERE schemaname = 'legacy'") == 1
    # a UNIQUE constraint is enough, and optional columns may be missing
    db.execute("ALTER TABLE legacy.no_key ADD UNIQUE (event_id)")
    db.execute("SELECT mailbox.enable_inbox_tracking('x', 'legacy.no_key')")
    assert scalar(db, "SELECT columns FROM mailbox._inbox") == {
        "event_id": "event_id",
        "processed_at": "processed_at",
        "retry_count": "retry_count",
        "received_at": "received_at",
    }
    with raises("42710"):
        db.execute("SELECT mailbox.enable_inbox_tracking('y', 'legacy.no_key')")
    with raises("42710"):
        db.execute(
            "SELECT mailbox.enable_inbox_tracking('x', 'legacy.incoming_messages',"
            " 'msg_id', 'handled_at', 'attempts', 'last_error', 'arrived')"
        )


def test_drop_inbox_keeps_an_adopted_table_and_drops_a_managed_one_with_cascade(legacy):
    db = legacy
    db.execute("INSERT INTO legacy.incoming_messages (msg_id) VALUES (gen_random_uuid())")
    db.execute("SELECT mailbox.create_inbox('managed')")
    db.execute("SELECT mailbox.create_inbox('kept')")
    db.execute("SELECT mailbox.drop_inbox('legacy_in', p_cascade => true)")
    assert scalar(db, "SELECT count(*) FROM legacy.incoming_messages") == 1
    assert scalar(db, "SELECT count(*) FROM pg_views WHERE schemaname = 'legacy'") == 0
    db.execute("SELECT mailbox.drop_inbox('managed', p_cascade => true)")
    assert scalar(db, "SELECT to_regclass('mailbox.managed')") is None
    db.execute("SELECT mailbox.drop_inbox('kept')")  # no cascade: the table stays
    assert scalar(db, "SELECT to_regclass('mailbox.kept')") is not None
    assert scalar(db, "SELECT to_regclass('mailbox.pending_kept')") is None
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox") == 0
    with raises("42704"):
        db.execute("SELECT mailbox.drop_inbox('managed')")
    db.execute("SELECT mailbox.drop_inbox('managed', true)")
    # the name is free again; adopting the same table again works
    adopt(db)
    assert scalar(db, "SELECT json_agg(inbox_name) FROM mailbox.inbox_status()") == ["legacy_in"]
    assert (
        json.dumps(scalar(db, "SELECT mailbox.inbox_health('legacy_in')")["pending_count"]) == "1"
    )


@pytest.mark.parametrize("fmt", ["plain", "custom"])
def test_an_adopted_table_of_another_role_survives_dump_and_restore(
    db, dsn, pg_cluster, fmt, tmp_path
):
    # its generated functions and views are owned by the table's owner, who also holds
    # SELECT on the inbox's state views and USAGE on schema mailbox: all of it must restore
    from dumps import _new_database, dump_and_restore
    from mbx import drop_role, make_role

    owner = make_role(db)
    db.execute(f'CREATE SCHEMA app AUTHORIZATION "{owner}"')
    db.execute(
        "CREATE TABLE app.inbox (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int NOT NULL DEFAULT 0, received_at timestamptz, aggregate_id text,"
        " sequence_num bigint)"
    )
    db.execute(f'ALTER TABLE app.inbox OWNER TO "{owner}"')
    db.execute("SELECT mailbox.enable_inbox_tracking('app_in', 'app.inbox')")
    db.execute("SELECT mailbox.enable_inbox_ordering('app_in')")
    for event_id, seq in (("a1", 1), ("a2", 2), ("a4", 4)):
        db.execute(
            "SELECT mailbox.inbox_receive('app_in', %s, NULL, p_aggregate_id => 'A',"
            " p_sequence_num => %s)",
            [event_id, seq],
        )
    try:
        with _new_database(pg_cluster.dsn()) as target:
            dump_and_restore(dsn, target, fmt, tmp_path)
            with psycopg.connect(target, autocommit=True) as restored:
                owners = rows(
                    restored,
                    "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc"
                    " WHERE proname LIKE '\\_inbox\\_%%\\_query'",
                )
                assert owners == [(owner,)]
                claimed = rows(restored, "SELECT event_id FROM mailbox.inbox_claim('app_in', 'w')")
                assert claimed == [("a1",)]
                assert scalar(restored, "SELECT mailbox.inbox_mark_processed('app_in', 'a1')")
                gaps = rows(
                    restored, "SELECT expected_seq FROM mailbox.inbox_ordering_gaps('app_in')"
                )
                assert gaps == [(3,)]
                assert (
                    scalar(restored, "SELECT mailbox.inbox_health('app_in')")["pending_count"] == 2
                )
                assert scalar(restored, "SELECT count(*) FROM app.pending_app_in") == 2
                restored.execute("SELECT mailbox.drop_inbox('app_in')")
    finally:
        db.execute("SELECT mailbox.drop_inbox('app_in')")
        db.execute("DROP SCHEMA app CASCADE")
        drop_role(db, owner)
