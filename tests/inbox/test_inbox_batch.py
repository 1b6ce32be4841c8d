"""Batch forms (issue 11): inbox_receive_batch, inbox_mark_processed(text[]) and
inbox_mark_failed(text[]) keep the semantics and errors of the per-message forms."""

import json
import threading
import uuid

import pytest
from mbx import drop_role, make_role, raises, rows, scalar


def receive_batch(db, messages, inbox="q"):
    return rows(
        db, "SELECT * FROM mailbox.inbox_receive_batch(%s, %s)", [inbox, json.dumps(messages)]
    )


@pytest.fixture
def q(db):
    db.execute("SELECT mailbox.create_inbox('q', p_max_retries => 2)")
    return db


def test_receive_batch_stores_each_id_once_and_reports_per_message(q, connect):
    db = q
    listener = connect()
    listener.execute("LISTEN mailbox_inbox_new")
    # a worker whose claim came back empty waits: batches wake it (part 33, wake-ups)
    assert rows(listener, "SELECT * FROM mailbox.inbox_claim('q', 'w')") == []
    got = receive_batch(
        db,
        [
            {"p_event_id": "a", "p_payload": {"x": 1}, "p_event_type": "t", "p_headers": {"h": 1}},
            {"p_event_id": "b", "p_payload": None, "p_source": "s", "p_trace_id": "tr"},
            {"p_event_id": "a", "p_payload": {"x": 2}},
        ],
    )
    assert got == [("a", True), ("b", True), ("a", False)]
    assert receive_batch(db, [{"p_event_id": "b"}, {"p_event_id": "c", "p_priority": 7}]) == [
        ("b", False),
        ("c", True),
    ]
    assert receive_batch(db, []) == []
    assert scalar(db, "SELECT mailbox.inbox_receive('q', 'a', '{}')") is False
    stored = rows(
        db,
        "SELECT event_id, payload, event_type, source, trace_id, headers, priority, retry_count,"
        " received_at IS NOT NULL FROM mailbox.q ORDER BY 1",
    )
    assert stored == [
        ("a", {"x": 1}, "t", None, None, {"h": 1}, None, 0, True),
        ("b", None, None, "s", "tr", None, None, 0, True),
        ("c", None, None, None, None, None, 7, 0, True),
    ]
    # one notification per batch that stored something
    notes = list(listener.notifies(timeout=1, stop_after=5))
    assert [n.payload for n in notes] == ["q", "q"]


def test_receive_batch_errors_match_inbox_receive(q):
    db = q
    for bad, state in [
        (None, "22004"),
        ({"p_event_id": "x"}, "22023"),  # not an array
        ([1], "22023"),  # element not an object
        ([{"p_event_id": "x", "event_id": "y"}], "22023"),  # unknown key
        ([{"p_event_id": "x", "p_inbox": "q"}], "22023"),  # not a message parameter
        ([{"p_payload": {}}], "22004"),  # no id
        ([{"p_event_id": None}], "22004"),
        ([{"p_event_id": "x" * 1001}], "22023"),
        ([{"p_event_id": "x", "p_priority": 40000}], "22023"),  # smallint column
        ([{"p_event_id": "x", "p_sequence_num": "seven"}], "22P02"),
    ]:
        with raises(state):
            db.execute(
                "SELECT * FROM mailbox.inbox_receive_batch('q', %s)",
                [None if bad is None else json.dumps(bad)],
            )
    with raises("42704"):
        db.execute("SELECT * FROM mailbox.inbox_receive_batch('nope', '[]')")
    with raises("22004"):
        db.execute("SELECT * FROM mailbox.inbox_receive_batch(NULL, '[]')")
    # an error anywhere stores nothing of the batch
    with raises("22023"):
        receive_batch(db, [{"p_event_id": "ok"}, {"p_event_id": "x", "p_priority": 40000}])
    assert scalar(db, "SELECT count(*) FROM mailbox.q") == 0


def test_receive_batch_on_an_ordered_inbox_needs_aggregate_and_sequence(db):
    db.execute("SELECT mailbox.create_inbox('ev')")
    db.execute("SELECT mailbox.enable_inbox_ordering('ev')")
    with raises("22004"):
        receive_batch(db, [{"p_event_id": "1", "p_aggregate_id": "a"}], inbox="ev")
    assert receive_batch(
        db,
        [
            {"p_event_id": "1", "p_aggregate_id": "a", "p_sequence_num": 1},
            {"p_event_id": "2", "p_aggregate_id": "a", "p_sequence_num": "2"},
        ],
        inbox="ev",
    ) == [("1", True), ("2", True)]


def test_batch_forms_through_an_adopted_mapping_with_a_uuid_id(db):
    db.execute(
        """CREATE SCHEMA legacy;
           CREATE TABLE legacy.msgs (msg_id uuid PRIMARY KEY, body json, kind varchar(50),
                   arrived timestamp NOT NULL DEFAULT now(), handled_at timestamptz,
                                     attempts smallint NOT NULL DEFAULT 0, last_error text)"""
    )
    db.execute(
        """SELECT mailbox.enable_inbox_tracking('leg', 'legacy.msgs', p_id_column => 'msg_id',
                      p_processed_at_column => 'handled_at', p_retry_count_column => 'attempts',
                      p_error_column => 'last_error', p_received_at_column => 'arrived',
                      p_event_type_column => 'kind', p_payload_column => 'body')"""
    )
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    # the same uuid written in upper case is the same message
    got = receive_batch(
        db,
        [{"p_event_id": a, "p_payload": {"n": 1}}, {"p_event_id": b}, {"p_event_id": a.upper()}],
        inbox="leg",
    )
    assert got == [(a, True), (b, True), (a.upper(), False)]
    with raises("22023"):  # no column for source
        receive_batch(db, [{"p_event_id": str(uuid.uuid4()), "p_source": "s"}], inbox="leg")
    with raises("22P02"):
        receive_batch(db, [{"p_event_id": "not-a-uuid"}], inbox="leg")
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('leg', %s::text[])", [[a, a]]) == 1
    assert rows(db, "SELECT * FROM mailbox.inbox_mark_failed('leg', %s::text[], 'e')", [[b]]) == [
        (b, "retry")
    ]
    assert rows(
        db,
        "SELECT msg_id::text, handled_at IS NOT NULL, attempts, last_error"
        " FROM legacy.msgs ORDER BY 2 DESC",
    ) == [(a, True, 0, None), (b, False, 1, "e")]


def test_mark_processed_batch_marks_counts_and_ends_leases(q):
    db = q
    receive_batch(db, [{"p_event_id": f"m{i}"} for i in range(5)])
    assert len(rows(db, "SELECT * FROM mailbox.inbox_claim('q', 'w', 3)")) == 3
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease") == 3
    marked = scalar(
        db, "SELECT mailbox.inbox_mark_processed('q', ARRAY['m0', 'm1', 'm1', 'm4', 'nope'])"
    )
    assert marked == 3
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease") == 1  # m2's
    # already processed: not marked again, as the one-id form returns false
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('q', ARRAY['m0'])") == 0
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('q', ARRAY[]::text[])") == 0
    assert scalar(db, "SELECT count(*) FROM mailbox.q WHERE processed_at IS NOT NULL") == 3
    with raises("22004"):
        db.execute("SELECT mailbox.inbox_mark_processed('q', NULL::text[])")
    with raises("22004"):
        db.execute("SELECT mailbox.inbox_mark_processed('q', ARRAY['m2', NULL])")
    with raises("42704"):
        db.execute("SELECT mailbox.inbox_mark_processed('nope', ARRAY['m2'])")


def test_mark_processed_batch_keeps_the_ordering_state_like_the_single_form(db):
    db.execute("SELECT mailbox.create_inbox('ev')")
    db.execute("SELECT mailbox.enable_inbox_ordering('ev', p_first_sequence => 10)")
    receive_batch(
        db,
        [
            {"p_event_id": f"{a}-{s}", "p_aggregate_id": a, "p_sequence_num": s}
            for a in ("x", "y")
            for s in (10, 11, 12)
        ]
        + [{"p_event_id": "z-3", "p_aggregate_id": "z", "p_sequence_num": 3}],
        inbox="ev",
    )
    assert (
        scalar(
            db, "SELECT mailbox.inbox_mark_processed('ev', ARRAY['x-10', 'x-11', 'y-10', 'z-3'])"
        )
        == 4
    )
    state = dict(rows(db, "SELECT aggregate_id, last_seq FROM mailbox._inbox_aggregate"))
    # a stray lower sequence starts a new aggregate at first sequence - 1, never below
    assert state == {"x": 11, "y": 10, "z": 9}
    assert sorted(r[0] for r in rows(db, "SELECT event_id FROM mailbox.next_ev")) == [
        "x-12",
        "y-11",
    ]


def test_mark_failed_batch_is_the_single_form_per_id(q):
    db = q
    receive_batch(db, [{"p_event_id": i} for i in ("a", "b", "c")])
    db.execute("SELECT mailbox.inbox_mark_processed('q', 'c')")
    got = rows(db, "SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY['a', 'b', 'a'], 'boom')")
    assert got == [("a", "retry"), ("b", "retry"), ("a", "dead_letter")]
    assert rows(db, "SELECT event_id, retry_count, error FROM mailbox.q ORDER BY 1") == [
        ("a", 2, "boom"),
        ("b", 1, "boom"),
        ("c", 0, None),
    ]
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_dlq_event") == 1
    # a delay keeps the message from being claimed, as with the one-id form
    got = rows(db, "SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY['b'], 'later', 3600)")
    assert got == [("b", "dead_letter")]  # max_retries 2 reached
    with raises("55000"):  # already processed, the whole call fails
        db.execute("SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY['c'], 'e')")
    with raises("42704"):
        db.execute("SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY['nope'], 'e')")
    with raises("22004"):
        db.execute("SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY[NULL]::text[], 'e')")
    with raises("22023"):
        db.execute("SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY['a'], 'e', -1)")
    assert rows(db, "SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY[]::text[], 'e')") == []


def test_mark_failed_batch_with_a_delay_defers_the_retry(q):
    db = q
    receive_batch(db, [{"p_event_id": "a"}, {"p_event_id": "b"}])
    claimed = rows(db, "SELECT event_id FROM mailbox.inbox_claim('q', 'w', 10)")
    assert len(claimed) == 2
    assert rows(db, "SELECT * FROM mailbox.inbox_mark_failed('q', ARRAY['a', 'b'], 'e', 3600)") == [
        ("a", "retry"),
        ("b", "retry"),
    ]
    assert rows(db, "SELECT * FROM mailbox.inbox_claim('q', 'w', 10)") == []


def test_batch_forms_follow_per_inbox_grants(q, connect):
    db = q
    consumer = make_role(db, "mailbox_consumer", "mailbox_producer")
    db.execute("SELECT mailbox.create_inbox('other')")
    db.execute(f"SELECT mailbox.grant_inbox('other', '{consumer}', 'receive')")
    try:
        conn = connect()
        conn.execute(f'SET ROLE "{consumer}"')
        assert rows(
            conn, "SELECT * FROM mailbox.inbox_receive_batch('other', '[{\"p_event_id\": \"x\"}]')"
        ) == [("x", True)]
        with raises("42501"):
            conn.execute("SELECT mailbox.inbox_mark_processed('other', ARRAY['x'])")
        with raises("42501"):
            conn.execute("SELECT * FROM mailbox.inbox_mark_failed('other', ARRAY['x'], 'e')")
        conn.execute("RESET ROLE")
        conn.close()
    finally:
        drop_role(db, consumer)


def test_four_workers_claim_and_batch_mark_every_message_exactly_once(q, connect):
    db = q
    for start in range(0, 2000, 500):
        receive_batch(db, [{"p_event_id": f"m{i}"} for i in range(start, start + 500)])
    db.execute("CREATE TABLE public.done (event_id text)")
    conns = [connect(autocommit=False) for _ in range(4)]
    errors = []

    def worker(conn, n):
        try:
            while True:
                got = [
                    r[0]
                    for r in rows(
                        conn, "SELECT event_id FROM mailbox.inbox_claim('q', %s, 50)", [f"w{n}"]
                    )
                ]
                if not got:
                    conn.commit()
                    return
                conn.execute("INSERT INTO public.done SELECT unnest(%s::text[])", [got])
                assert scalar(
                    conn, "SELECT mailbox.inbox_mark_processed('q', %s::text[])", [got]
                ) == len(got)
                conn.commit()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(c, n)) for n, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert scalar(db, "SELECT count(*) FROM public.done") == 2000
    assert scalar(db, "SELECT count(DISTINCT event_id) FROM public.done") == 2000
    assert scalar(db, "SELECT count(*) FROM mailbox.q WHERE processed_at IS NULL") == 0
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease") == 0


def test_one_id_calls_still_pick_the_one_id_forms(q):
    db = q
    db.execute("SELECT mailbox.inbox_receive('q', 'a', '{}')")
    db.execute("SELECT mailbox.inbox_receive('q', 'b', '{}')")
    # untyped literals resolve to the text forms (boolean / text results)
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('q', 'a')") is True
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('q', 'b', 'e')") == "retry"
    with raises("42704"):
        db.execute("SELECT mailbox.inbox_mark_failed('q', 'zz', 'e')")
