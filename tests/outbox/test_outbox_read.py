"""Offsets (sequencer), claim-check paging, outbox_rows_consumed, outbox_status (SPEC §1.3)."""

import psycopg
import pytest
from mbx import last_offset, make_role, outbox_rows, raises, rows, scalar, sequence


@pytest.fixture
def big(db):
    db.execute("CREATE TABLE t (id int, v text)")
    db.execute("SELECT mailbox.enable_outbox('t', p_inline_threshold_rows => 0)")
    db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 2500) g")
    sequence(db, "t")
    return db


def test_delta_rows_pages_by_keyset(big):
    db = big
    offset = last_offset(db, "t")
    seen, after = [], 0
    while True:
        page = rows(
            db, "SELECT * FROM mailbox.outbox_delta_rows('t', %s, %s, 1000)", [offset, after]
        )
        if not page:
            break
        assert len(page) <= 1000
        seen.extend(page)
        after = page[-1][0]
    assert [r[0] for r in seen] == list(range(1, 2501))
    assert sorted(r[2]["id"] for r in seen) == list(range(1, 2501))
    assert len(rows(db, "SELECT * FROM mailbox.outbox_delta_rows('t', %s)", [offset])) == 1000


def test_delta_rows_errors(big):
    db = big
    offset = last_offset(db, "t")
    with raises("42704"):
        db.execute("SELECT * FROM mailbox.outbox_delta_rows('nope', 1)")
    with raises("42704"):
        db.execute("SELECT * FROM mailbox.outbox_delta_rows('t', 999)")
    with raises("22023"):
        db.execute("SELECT * FROM mailbox.outbox_delta_rows('t', %s, 0, 0)", [offset])
    with raises("22004"):
        db.execute("SELECT * FROM mailbox.outbox_delta_rows('t', NULL)")
    with raises("22004"):
        db.execute("SELECT * FROM mailbox.outbox_delta_rows('t', %s, NULL)", [offset])
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.outbox_publish('e', '{}')")
    sequence(db, "e")
    with raises("22023"):
        db.execute("SELECT * FROM mailbox.outbox_delta_rows('e', 1)")


def test_rows_consumed_is_idempotent_and_counts_in_status(big):
    db = big
    offset = last_offset(db, "t")
    assert scalar(db, "SELECT mailbox.outbox_status('t')")["claim_check_pending_count"] == 1
    db.execute("SELECT mailbox.outbox_rows_consumed('t', %s)", [offset])
    db.execute("SELECT mailbox.outbox_rows_consumed('t', %s)", [offset])
    assert scalar(db, "SELECT count(*) FROM mailbox._claim_check_consumed") == 1
    assert scalar(db, "SELECT mailbox.outbox_status('t')")["claim_check_pending_count"] == 0
    with raises("42704"):
        db.execute("SELECT mailbox.outbox_rows_consumed('t', %s, 'no_such_group')", [offset])
    with raises("42704"):
        db.execute("SELECT mailbox.outbox_rows_consumed('t', 12345)")


def test_status_reports_every_documented_key(big):
    db = big
    status = scalar(db, "SELECT mailbox.outbox_status('t')")
    assert set(status) == {
        "enabled",
        "outbox",
        "source",
        "outbox_table",
        "row_count",
        "head_offset",
        "oldest_row",
        "newest_row",
        "total_bytes",
        "claim_check_pending_count",
        "storage_status",
        "retention_hours",
        "last_drained_at",
        "last_drained_count",
        "partitions",
        "consumer_groups",
    }
    assert status["partitions"] == 1
    assert status["enabled"] is True and status["outbox"] == "t" and status["source"] == "public.t"
    assert status["outbox_table"] == "mailbox.outbox_t"
    assert status["row_count"] == 1 and status["head_offset"] == 1
    assert status["total_bytes"] > 0 and status["storage_status"] == "ok"
    assert status["retention_hours"] == 24 and status["consumer_groups"] == []
    db.execute("INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g")
    db.execute("SET mailbox.outbox_storage_critical_mb = 1")
    assert scalar(db, "SELECT mailbox.outbox_status('t')")["storage_status"] == "critical"
    db.execute("SET mailbox.outbox_storage_critical_mb = 0")
    with raises("22023") as info:
        db.execute("SELECT mailbox.outbox_status('t')")
    assert str(info.value).startswith(
        "invalid value for setting mailbox.outbox_storage_critical_mb"
    )
    assert info.value.diag.message_hint
    db.execute("RESET mailbox.outbox_storage_critical_mb")
    with raises("42704"):
        db.execute("SELECT mailbox.outbox_status('nope')")
    db.execute("DROP TABLE t")
    assert scalar(db, "SELECT mailbox.outbox_status('t')")["enabled"] is False


def test_outboxes_view_and_latest_view(db):
    db.execute("SELECT mailbox.create_outbox('e', 48, 7)")
    db.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 1}')")
    db.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 2}')")
    assert scalar(db, "SELECT payload FROM mailbox.outbox_latest_e") == {"n": 2}
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    (view,) = cur.execute("SELECT * FROM mailbox.outboxes").fetchall()
    assert view["outbox_name"] == "e" and view["source"] is None and view["enabled"]
    assert (view["retention_hours"], view["inline_threshold_rows"]) == (48, 7)


def test_offsets_follow_commit_visibility_not_insert_order(db, connect):
    """A row whose transaction commits late gets a later offset instead of being skipped."""
    db.execute("SELECT mailbox.create_outbox('e')")
    late = connect(autocommit=False)
    late.execute("SELECT mailbox.outbox_publish('e', '{\"who\": \"late\"}')")  # lower row key
    db.execute("SELECT mailbox.outbox_publish('e', '{\"who\": \"early\"}')")
    assert sequence(db, "e") == 1
    late.commit()
    assert sequence(db, "e") == 1
    got = {r["payload"]["who"]: r["outbox_id"] for r in outbox_rows(db, "e")}
    assert got == {"early": 1, "late": 2}


def test_sequencer_numbers_in_chunks_across_calls(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.outbox_publish_batch('e', array_fill('{}'::jsonb, ARRAY[2500]))")
    db.execute("SET mailbox.outbox_chunk_rows = 1000")
    key = scalar(db, "SELECT outbox_key FROM mailbox._outbox WHERE outbox_name = 'e'")
    assert scalar(db, "SELECT mailbox._sequence_outbox(%s, 1500)", [key]) == 1500
    db.execute("SELECT mailbox.outbox_publish('e', '{\"late\": true}')")
    assert scalar(db, "SELECT mailbox._sequence_outbox(%s)", [key]) == 1001
    assert scalar(db, "SELECT mailbox._sequence_outbox(%s)", [key]) == 0
    got = outbox_rows(db, "e")
    assert [r["outbox_id"] for r in got] == list(range(1, 2502))
    assert rows(db, "SELECT base_offset, row_count FROM mailbox._outbox_chunk ORDER BY 1") == [
        (0, 1000),
        (1000, 500),
        (1500, 1000),
        (2500, 1),
    ]


def test_unrelated_long_transaction_does_not_hold_back_numbering(db, connect):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("CREATE TABLE other (id int)")
    unrelated = connect(autocommit=False)
    unrelated.execute("INSERT INTO other VALUES (1)")  # holds an xid, stays open
    idle = connect(autocommit=False)
    idle.execute("SELECT 1")  # idle in transaction, no xid
    db.execute("SELECT mailbox.outbox_publish('e', '{}')")
    assert sequence(db, "e") == 1
    db.execute("SELECT mailbox.outbox_publish('e', '{}')")
    assert sequence(db, "e") == 1
    unrelated.rollback()
    idle.rollback()


def test_repeatable_read_caller_numbers_what_its_snapshot_sees(db, connect):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 1}')")
    key = scalar(db, "SELECT outbox_key FROM mailbox._outbox WHERE outbox_name = 'e'")
    rr = connect(autocommit=False)
    rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    rr.execute("SELECT 1")  # the transaction's snapshot is taken here
    db.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 2}')")
    assert scalar(rr, "SELECT mailbox._sequence_outbox(%s)", [key]) == 1  # only n = 1
    rr.commit()
    assert sequence(db, "e") == 1
    assert sorted((r["outbox_id"], r["payload"]["n"]) for r in outbox_rows(db, "e")) == [
        (1, 1),
        (2, 2),
    ]
    # a sequencer that committed after a REPEATABLE READ snapshot: that caller must retry
    rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    rr.execute("SELECT 1")
    db.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 3}')")
    assert sequence(db, "e") == 1
    db.execute("SELECT mailbox.outbox_publish('e', '{\"n\": 4}')")
    with raises("40001"):
        rr.execute("SELECT mailbox._sequence_outbox(%s)", [key])
    rr.rollback()
    assert sequence(db, "e") == 1


def test_concurrent_sequencers_never_hand_out_an_offset_twice(db, connect):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.outbox_publish_batch('e', array_fill('{}'::jsonb, ARRAY[500]))")
    key = scalar(db, "SELECT outbox_key FROM mailbox._outbox WHERE outbox_name = 'e'")
    first, second = connect(autocommit=False), connect(autocommit=False)
    assert scalar(first, "SELECT mailbox._sequence_outbox(%s, 100)", [key]) == 100
    # the first has not committed: the second finds the sequencer busy and returns at once
    assert scalar(second, "SELECT mailbox._sequence_outbox(%s, 100)", [key]) == 0
    first.commit()
    assert scalar(second, "SELECT mailbox._sequence_outbox(%s, 1000)", [key]) == 400
    second.commit()
    offsets = sorted(r["outbox_id"] for r in outbox_rows(db, "e"))
    assert offsets == list(range(1, 501))
    assert scalar(db, "SELECT head_offset FROM mailbox.outboxes WHERE outbox_name = 'e'") == 500


def test_window_over_late_and_new_transactions_in_small_chunks(db, connect):
    """A transaction in progress at the last window (xip part) and newer ones (range part),
    numbered two rows at a time: every row once, late rows first, in (xid, key) order."""
    db.execute("SELECT mailbox.create_outbox('e')")
    key = scalar(db, "SELECT outbox_key FROM mailbox._outbox WHERE outbox_name = 'e'")
    late = connect(autocommit=False)
    late.execute(
        "SELECT mailbox.outbox_publish_batch('e', array_fill('{\"t\": \"late\"}'::jsonb, ARRAY[5]))"
    )
    db.execute("SELECT mailbox.outbox_publish('e', '{\"t\": \"early\"}')")
    assert sequence(db, "e") == 1  # the window's snapshot sees 'late' in progress
    late.commit()
    db.execute(
        "SELECT mailbox.outbox_publish_batch('e', array_fill('{\"t\": \"new\"}'::jsonb, ARRAY[3]))"
    )
    db.execute("SET mailbox.outbox_chunk_rows = 2")
    counts = []
    while n := scalar(db, "SELECT mailbox._sequence_outbox(%s, 2)", [key]):
        counts.append(n)
    assert counts == [2, 2, 2, 2]
    got = [
        (r["outbox_id"], r["payload"]["t"])
        for r in sorted(outbox_rows(db, "e"), key=lambda r: r["outbox_id"])
    ]
    assert got == [(1, "early")] + [(i, "late") for i in range(2, 7)] + [
        (i, "new") for i in range(7, 10)
    ]


def test_polls_read_dense_and_sparse_chunks_alike(db, connect):
    """Chunks whose keys are one ascending run are read by range, others by key: same rows."""
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'e', 'earliest')")
    late = connect(autocommit=False)
    late.execute(
        "SELECT mailbox.outbox_publish_batch('e', array_fill('{\"t\": \"late\"}'::jsonb, ARRAY[5]))"
    )
    db.execute("SELECT mailbox.outbox_publish('e', '{\"t\": \"early\"}')")
    sequence(db, "e")
    late.commit()
    db.execute(
        "SELECT mailbox.outbox_publish_batch('e', array_fill('{\"t\": \"new\"}'::jsonb, ARRAY[3]))"
    )
    db.execute("SET mailbox.outbox_chunk_rows = 2")
    sequence(db, "e")
    dense = [r[0] for r in rows(db, "SELECT dense FROM mailbox._outbox_chunk ORDER BY base_offset")]
    assert dense == [True, True, True, False, True]  # [6] [1,2] [3,4] [5,7] [8,9]
    for first, batch in ((0, 9), (2, 3), (4, 4)):
        db.execute("SELECT mailbox.seek_offset('g', 'c', %s)", [first])
        got = rows(
            db, "SELECT outbox_id, payload->>'t' FROM mailbox.poll_outbox('g', 'c', %s)", [batch]
        )
        expected = [(i, t) for i, t in enumerate(["early"] + ["late"] * 5 + ["new"] * 3, start=1)]
        assert got == expected[first : first + batch]


def test_disabled_capture_triggers_show_as_not_enabled(db):
    db.execute("CREATE TABLE t (id int)")
    db.execute("SELECT mailbox.enable_outbox('t')")
    assert scalar(db, "SELECT enabled FROM mailbox.outboxes") is True
    db.execute("ALTER TABLE t DISABLE TRIGGER mailbox_capture_insert")
    assert scalar(db, "SELECT enabled FROM mailbox.outboxes") is False
    assert scalar(db, "SELECT mailbox.outbox_status('t')")["enabled"] is False


def test_rows_consumed_rejects_a_group_of_another_outbox(big):
    db = big
    db.execute("SELECT mailbox.create_outbox('other')")
    db.execute("SELECT mailbox.create_consumer_group('g_other', 'other')")
    with raises("22023") as info:
        db.execute(
            "SELECT mailbox.outbox_rows_consumed('t', %s, 'g_other')", [last_offset(db, "t")]
        )
    assert "consumer group g_other does not read outbox t" in str(info.value)


def test_numbering_reads_each_row_a_bounded_number_of_times(db):
    """Numbering is linear in the backlog, whatever plan PL/pgSQL caches: a generic plan once
    filtered `_xid = ANY (in-progress xids)` over every row of the outbox for every chunk."""
    db.execute("SELECT mailbox.create_outbox('lin')")
    db.execute("SELECT mailbox.create_consumer_group('lin_g', 'lin', 'earliest')")
    for start in range(0, 30000, 1000):
        db.execute(
            "SELECT count(*) FROM mailbox.outbox_publish_batch('lin',"
            " ARRAY(SELECT jsonb_build_object('i', g) FROM generate_series(%s::int, %s::int) g))",
            [start, start + 999],
        )
    db.execute("SELECT pg_stat_force_next_flush()")

    def tuples_read():
        db.execute("SELECT pg_stat_force_next_flush()")
        return scalar(
            db,
            "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes"
            " WHERE schemaname = 'mailbox' AND relname = 'outbox_lin'",
        )

    before = tuples_read()
    assert scalar(db, "SELECT lag FROM mailbox.consumer_lag('lin_g')") == 30000  # 30 chunks
    read = tuples_read() - before
    assert read <= 3 * 30000, f"numbering 30000 rows read {read} index tuples"


SPEC_COLUMNS = [
    "outbox_id",
    "event_id",
    "created_at",
    "source",
    "event_type",
    "key",
    "headers",
    "payload",
    "inserted_count",
    "deleted_count",
    "is_claim_check",
    "full_refresh",
]


def test_outbox_view_shows_each_rows_offset_to_an_admin(db, connect):
    """SPEC §1.3: SELECT * FROM mailbox.outbox_<N> ORDER BY outbox_id, as mailbox_admin,
    shows every row with its offset; a committed row not numbered yet has outbox_id NULL."""
    db.execute("SELECT mailbox.create_outbox('v')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'v', 'earliest')")
    for i in range(1, 4):
        db.execute(
            "SELECT mailbox.outbox_publish('v', %s::jsonb, p_key => %s)", [f'{{"n": {i}}}', f"k{i}"]
        )
    admin = make_role(db, "mailbox_admin")
    db.execute(f'GRANT "{admin}" TO CURRENT_USER')
    try:
        conn = connect()
        conn.execute(f'SET ROLE "{admin}"')
        cur = conn.execute("SELECT * FROM mailbox.outbox_v ORDER BY outbox_id")
        assert [c.name for c in cur.description] == SPEC_COLUMNS
        assert [r[0] for r in cur.fetchall()] == [None, None, None]  # committed, not numbered
        polled = rows(db, "SELECT outbox_id, event_id FROM mailbox.poll_outbox('g', 'c', 2)")
        db.execute("SELECT mailbox.outbox_publish('v', '{\"n\": 4}')")
        seen = rows(
            conn, "SELECT outbox_id, event_id, key FROM mailbox.outbox_v ORDER BY outbox_id"
        )
        # the rows the poll numbered carry the offsets it returned; the rest are NULL for now
        assert [(o, e) for o, e, _ in seen if o is not None][: len(polled)] == polled
        assert [k for _, _, k in seen] == ["k1", "k2", "k3", None]
        assert all(o is not None for o, _, _ in seen[:3]) and seen[3][0] is None
        # a role without mailbox_admin sees nothing
        conn.execute("RESET ROLE")
        other = make_role(db, "mailbox_consumer")
        conn.execute(f'SET ROLE "{other}"')
        with raises("42501"):
            conn.execute("SELECT * FROM mailbox.outbox_v")
        conn.execute("RESET ROLE")
    finally:
        db.execute(f'REVOKE "{admin}" FROM CURRENT_USER')


def test_dropping_an_outbox_drops_its_view(db):
    db.execute("SELECT mailbox.create_outbox('gone')")
    assert scalar(db, "SELECT to_regclass('mailbox.outbox_gone')::text") == "mailbox.outbox_gone"
    db.execute("SELECT mailbox.drop_outbox('gone')")
    assert scalar(db, "SELECT to_regclass('mailbox.outbox_gone')") is None
    assert scalar(db, "SELECT to_regclass('mailbox._outbox_log_gone')") is None
