"""Claim -> mark lifecycle: leases, crashes, retries, dead letters, replay (SPEC §3.1)."""

import json
import threading

import psycopg
import pytest
from mbx import raises, rows, scalar


def claim(conn, inbox="jobs", worker="w1", batch=10, visibility=30):
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute(
        "SELECT * FROM mailbox.inbox_claim(%s, %s, %s, %s)", [inbox, worker, batch, visibility]
    ).fetchall()


def ids(messages):
    return [m["event_id"] for m in messages]


@pytest.fixture
def jobs(db):
    db.execute("SELECT mailbox.create_inbox('jobs', p_max_retries => 3)")
    for i in range(3):
        db.execute(
            "SELECT mailbox.inbox_receive('jobs', %s, %s, 'job')", [f"j{i}", f'{{"i": {i}}}']
        )
    return db


def test_claim_then_mark_processed(jobs):
    db = jobs
    got = claim(db, batch=2)
    assert ids(got) == ["j0", "j1"]  # arrival order
    assert got[0]["payload"] == {"i": 0} and got[0]["event_type"] == "job"
    assert got[0]["retry_count"] == 0 and got[0]["lease_until"] > got[0]["received_at"]
    assert ids(claim(db, worker="w2")) == ["j2"]  # leased ones are not handed out twice
    assert claim(db, worker="w3") == []
    assert scalar(db, "SELECT leased_by FROM mailbox._inbox_lease WHERE event_id = 'j0'") == "w1"
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('jobs', 'j0')") is True
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('jobs', 'j0')") is False
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('jobs', 'nope')") is False
    assert scalar(db, "SELECT processed_at IS NOT NULL FROM mailbox.jobs WHERE event_id = 'j0'")
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease WHERE event_id = 'j0'") == 0
    # claiming first is not required
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('jobs', 'j1')") is True
    assert [r[0] for r in rows(db, "SELECT event_id FROM mailbox.pending_jobs")] == ["j2"]


def test_claim_argument_errors(jobs):
    db = jobs
    with raises("22023"):
        claim(db, batch=0)
    with raises("22023"):
        claim(db, visibility=0)
    with raises("22004"):
        claim(db, worker=None)
    with raises("22023"):
        claim(db, worker="")
    with raises("22023"):
        claim(db, worker="w" * 201)
    with raises("22023") as info:
        claim(db, batch=10001)
    assert "invalid batch size: 10001" in str(info.value)
    with raises("22004") as info:
        claim(db, batch=None)
    assert "p_batch_size" in str(info.value)
    with raises("22004") as info:
        claim(db, visibility=None)
    assert "p_visibility_seconds" in str(info.value)
    # several bad arguments: the first one's error (worker, batch size, visibility)
    with raises("22004") as info:
        claim(db, worker=None, batch=0, visibility=0)
    assert "worker must not be null" in str(info.value)
    with raises("22023") as info:
        claim(db, batch=0, visibility=0)
    assert "invalid batch size" in str(info.value)
    with raises("42704"):
        claim(db, inbox="nope")
    with raises("22004"):
        db.execute("SELECT mailbox.inbox_mark_processed('jobs', NULL)")


def test_claim_business_logic_and_mark_in_one_transaction_is_exactly_once(jobs, connect):
    worker, other = connect(autocommit=False), connect()
    assert ids(claim(worker, batch=1)) == ["j0"]
    worker.execute("CREATE TABLE IF NOT EXISTS public.effects (event_id text)")
    worker.execute("INSERT INTO public.effects VALUES ('j0')")
    # while the transaction is open the message is locked: nobody else gets it
    assert "j0" not in ids(claim(other, worker="w2", batch=10))
    assert scalar(worker, "SELECT mailbox.inbox_mark_processed('jobs', 'j0')") is True
    worker.commit()
    assert scalar(jobs, "SELECT count(*) FROM public.effects") == 1
    assert "j0" not in ids(claim(other, worker="w3", batch=10))


def test_a_worker_killed_mid_transaction_leaves_the_message_claimable(jobs, connect):
    worker, other = connect(autocommit=False), connect()
    pid = scalar(worker, "SELECT pg_backend_pid()")
    assert ids(claim(worker, batch=1, visibility=3600)) == ["j0"]
    assert scalar(worker, "SELECT mailbox.inbox_mark_processed('jobs', 'j0')") is True
    assert ids(claim(other, worker="w2", batch=3)) == ["j1", "j2"]  # j0 is locked
    assert scalar(jobs, "SELECT pg_terminate_backend(%s)", [pid]) is True
    with pytest.raises(psycopg.OperationalError):
        worker.execute("SELECT 1")
    # the crash rolled back the mark and the one-hour lease with it
    for _ in range(50):
        if not scalar(jobs, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]):
            break
        threading.Event().wait(0.05)
    assert ids(claim(other, worker="w3")) == ["j0"]
    assert scalar(jobs, "SELECT processed_at FROM mailbox.jobs WHERE event_id = 'j0'") is None


def test_an_expired_lease_is_reclaimed(jobs):
    db = jobs
    assert ids(claim(db, batch=1, visibility=1)) == ["j0"]
    assert ids(claim(db, worker="w2", batch=1)) == ["j1"]
    threading.Event().wait(1.2)
    got = claim(db, worker="w3", batch=1)
    assert ids(got) == ["j0"]
    assert scalar(db, "SELECT leased_by FROM mailbox._inbox_lease WHERE event_id = 'j0'") == "w3"
    # the first worker may still finish it: marking does not require holding the lease
    assert scalar(db, "SELECT mailbox.inbox_mark_processed('jobs', 'j0')") is True


def test_retry_after_delays_the_next_claim(jobs):
    db = jobs
    assert ids(claim(db, batch=1)) == ["j0"]
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('jobs', 'j0', 'boom', 3600)") == "retry"
    assert (
        scalar(db, "SELECT retry_count || ' ' || error FROM mailbox.jobs WHERE event_id = 'j0'")
        == "1 boom"
    )
    assert "j0" not in ids(claim(db, worker="w2"))
    # move the retry time into the past instead of sleeping an hour
    db.execute(
        "UPDATE mailbox._inbox_lease SET next_attempt_at = now() - interval '1 second'"
        " WHERE event_id = 'j0'"
    )
    got = claim(db, worker="w3")
    assert ids(got) == ["j0"] and got[0]["retry_count"] == 1


def test_retry_without_delay_is_claimable_at_once_and_the_default_comes_from_the_setting(jobs):
    db = jobs
    claim(db, batch=3)
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('jobs', 'j0', 'e')") == "retry"
    assert ids(claim(db, worker="w2")) == ["j0"]
    db.execute("SET mailbox.inbox_retry_delay_seconds = 600")
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('jobs', 'j1', 'e')") == "retry"
    assert claim(db, worker="w3") == []
    assert scalar(
        db,
        "SELECT next_attempt_at > now() + interval '590 seconds'"
        " FROM mailbox._inbox_lease WHERE event_id = 'j1'",
    )
    db.execute("SET mailbox.inbox_retry_delay_seconds = 'soon'")
    with raises("22023") as info:
        db.execute("SELECT mailbox.inbox_mark_failed('jobs', 'j2', 'e')")
    assert "mailbox.inbox_retry_delay_seconds" in str(info.value)
    db.execute("RESET mailbox.inbox_retry_delay_seconds")
    with raises("22023"):
        db.execute("SELECT mailbox.inbox_mark_failed('jobs', 'j2', 'e', -1)")


def test_the_max_retries_th_failure_moves_the_message_to_the_dlq(jobs):
    db = jobs
    assert (
        json.loads(json.dumps(scalar(db, "SELECT mailbox.inbox_health('jobs')")))["health_status"]
        == "healthy"
    )
    for expected in ("retry", "retry", "dead_letter"):
        assert ids(claim(db, batch=1)) == ["j0"]
        assert scalar(db, "SELECT mailbox.inbox_mark_failed('jobs', 'j0', 'bad input')") == expected
    assert [r[0] for r in rows(db, "SELECT event_id FROM mailbox.dlq_jobs")] == ["j0"]
    assert "j0" not in [r[0] for r in rows(db, "SELECT event_id FROM mailbox.pending_jobs")]
    assert "j0" not in ids(claim(db, batch=10))
    health = scalar(db, "SELECT mailbox.inbox_health('jobs')")
    assert health["health_status"] == "degraded" and health["dead_letter_count"] == 1
    # failing a dead letter again changes nothing
    assert scalar(db, "SELECT mailbox.inbox_mark_failed('jobs', 'j0', 'x')") == "dead_letter"
    assert scalar(db, "SELECT retry_count FROM mailbox.jobs WHERE event_id = 'j0'") == 3
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_dlq_event") == 1


def test_mark_failed_errors(jobs):
    db = jobs
    with raises("42704") as info:
        db.execute("SELECT mailbox.inbox_mark_failed('jobs', 'nope', 'e')")
    assert "inbox message not found: nope" in str(info.value)
    db.execute("SELECT mailbox.inbox_mark_processed('jobs', 'j0')")
    with raises("55000") as info:
        db.execute("SELECT mailbox.inbox_mark_failed('jobs', 'j0', 'e')")
    assert info.value.diag.message_hint


def test_replay_resets_only_processed_or_dead_letters_and_alerts(jobs, connect):
    db = jobs
    db.execute("SELECT mailbox.inbox_mark_processed('jobs', 'j0')")
    for _ in range(3):
        db.execute("SELECT mailbox.inbox_mark_failed('jobs', 'j1', 'bad')")
    db.execute("SELECT mailbox.inbox_mark_failed('jobs', 'j2', 'once')")  # pending, 1 retry
    listener = connect()
    listener.execute("LISTEN mailbox_alert")
    n = scalar(db, "SELECT mailbox.replay_inbox_messages('jobs', ARRAY['j0', 'j1', 'j2', 'zz'])")
    assert n == 2
    got = {
        r[0]: tuple(r[1:])
        for r in rows(
            db, "SELECT event_id, processed_at IS NULL, retry_count, error FROM mailbox.jobs"
        )
    }
    assert got == {"j0": (True, 0, None), "j1": (True, 0, None), "j2": (True, 1, "once")}
    assert sorted(ids(claim(db))) == ["j0", "j1", "j2"]
    (alert,) = [json.loads(x.payload) for x in listener.notifies(timeout=1.0, stop_after=1)]
    assert alert["event"] == "inbox_replay" and alert["inbox"] == "jobs"
    assert alert["count"] == 2 and alert["event_ids"] == ["j0", "j1"]
    assert scalar(db, "SELECT count(*) FROM mailbox.alert_log WHERE event = 'inbox_replay'") == 1
    # nothing to replay: no alert
    assert scalar(db, "SELECT mailbox.replay_inbox_messages('jobs', ARRAY['j2'])") == 0
    assert scalar(db, "SELECT mailbox.replay_inbox_messages('jobs', '{}')") == 0
    assert scalar(db, "SELECT count(*) FROM mailbox.alert_log WHERE event = 'inbox_replay'") == 1
    with raises("22004"):
        db.execute("SELECT mailbox.replay_inbox_messages('jobs', NULL)")
    # ids are bound as a parameter: SQL in an id is just an id that does not exist
    assert scalar(db, "SELECT mailbox.replay_inbox_messages('jobs', ARRAY[$$' OR true --$$])") == 0


def test_concurrent_claimers_never_get_the_same_message(db, connect):
    db.execute("SELECT mailbox.create_inbox('bulk')")
    db.execute(
        "INSERT INTO mailbox.bulk (event_id, payload)"
        " SELECT 'b' || i, '{}' FROM generate_series(1, 400) AS i"
    )
    # each claim its own transaction; every worker holds its first batch (row locks) until
    # all four have one, so the first claims race and the work is shared whatever the
    # scheduler does (a worker that started early could otherwise drain all 400 alone)
    conns = [connect(autocommit=False) for _ in range(4)]
    start, first_held = threading.Barrier(4), threading.Barrier(4)
    claimed = [[] for _ in range(4)]
    errors = []

    def worker(n):
        try:
            start.wait(timeout=10)
            first = True
            while True:
                got = claim(conns[n], inbox="bulk", worker=f"w{n}", batch=7)
                if first:
                    first_held.wait(timeout=30)
                    first = False
                conns[n].commit()
                if not got:
                    return
                claimed[n].extend(ids(got))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    everything = [i for c in claimed for i in c]
    assert len(everything) == 400 and len(set(everything)) == 400
    assert all(claimed)  # the work was actually shared
