"""Each sink delivers a batch with its idempotency key (SPEC §5.2), against the real
brokers on this machine; replaying the same rows (seek_offset back) leaves one copy each
in NATS JetStream, Redis and an inbox."""

import json

import redis
from relayhelp import (
    AMQP,
    NATS,
    REDIS,
    Recorder,
    amqp_declare,
    amqp_drain,
    arun,
    cli,
    nats_delete_stream,
    nats_stream_ids,
    pg_url,
    publish,
    receive_calls,
    relay_once,
    setup_outbox,
    track_receives,
    uid,
)


def replay(db):
    db.execute("SELECT mailbox.seek_offset('g', 'c1', 0)")


def test_stdout_sink_writes_the_envelope(db, dsn):
    setup_outbox(db)
    ids = publish(db, "e", 3, key="k1")
    lines = [json.loads(x) for x in relay_once(dsn, "stdout:").stdout.splitlines()]
    assert [x["event_id"] for x in lines] == ids
    first = lines[0]
    assert set(first) >= {
        "event_id",
        "outbox",
        "offset",
        "event_type",
        "key",
        "source",
        "created_at",
        "headers",
        "payload",
    }
    assert first["outbox"] == "e" and first["key"] == "k1"
    assert first["event_type"] == "thing.created" and first["payload"] == {"tag": "x", "n": 1}
    assert [x["offset"] for x in lines] == sorted(x["offset"] for x in lines)
    lag = db.execute("SELECT lag FROM mailbox.consumer_lag('g')").fetchone()[0]
    assert lag == 0


def test_nats_jetstream_dedups_a_replay(db, dsn):
    setup_outbox(db)
    stream = uid("S").upper()
    subject = f"{stream.lower()}.{{outbox}}"
    sink = f"{NATS}?stream={stream}&subject={subject}"
    try:
        ids = publish(db, "e", 5, key="k")
        relay_once(dsn, sink)
        assert arun(nats_stream_ids(stream)) == ids
        replay(db)
        got = relay_once(dsn, sink)
        assert arun(nats_stream_ids(stream)) == ids, got.stderr  # one copy each
    finally:
        arun(nats_delete_stream(stream))


def test_amqp_publisher_confirms_and_message_id(db, dsn):
    setup_outbox(db)
    queue = uid("q")
    arun(amqp_declare(queue))
    ids = publish(db, "e", 5, key="k")
    relay_once(dsn, f"{AMQP}?routing_key={queue}")
    msgs = arun(amqp_drain(queue))
    assert [m.message_id for m in msgs] == ids
    assert msgs[0].delivery_mode.value == 2  # persistent
    assert json.loads(msgs[0].body) == {"tag": "x", "n": 1}
    assert msgs[0].headers["outbox"] == "e" and msgs[0].type == "thing.created"


def test_amqp_unroutable_is_not_committed(db, dsn):
    """mandatory publish: a message no queue takes is a failure, never acknowledged."""
    setup_outbox(db)
    publish(db, "e", 1)
    got = cli(
        "relay",
        "--dsn",
        dsn,
        "--group",
        "g",
        "--consumer",
        "c1",
        "--once",
        "--sink",
        f"{AMQP}?routing_key={uid('nowhere')}",
        "--max-attempts",
        "2",
    )
    assert got.returncode == 4, got.stderr
    assert "poison" in got.stderr and "Traceback" not in got.stderr
    assert db.execute("SELECT group_offset FROM mailbox.consumer_group_lag").fetchone()[0] == 0


def test_redis_xadd_dedups_a_replay(db, dsn):
    setup_outbox(db)
    stream = uid("rs")
    r = redis.Redis.from_url(REDIS)
    try:
        ids = publish(db, "e", 5, key="k")
        relay_once(dsn, f"{REDIS}?stream={stream}")
        entries = r.xrange(stream)
        assert [e[1][b"event_id"].decode() for e in entries] == ids
        assert json.loads(entries[0][1][b"payload"]) == {"tag": "x", "n": 1}
        replay(db)
        relay_once(dsn, f"{REDIS}?stream={stream}")
        assert r.xlen(stream) == 5
    finally:
        r.delete(stream, *[f"{stream}:dedup:{i}" for i in ids])


def test_http_post_with_idempotency_key(db, dsn):
    setup_outbox(db)
    rec = Recorder()
    try:
        ids = publish(db, "e", 4, key="k")
        relay_once(dsn, rec.url)
        assert rec.delivered() == ids
        body = rec.got[0][1]
        assert body["event_id"] == ids[0] and body["payload"] == {"tag": "x", "n": 1}
    finally:
        rec.close()


def test_postgresql_inbox_sink_dedups_a_replay(db, dsn):
    setup_outbox(db)
    db.execute("SELECT mailbox.create_inbox('ib')")
    track_receives(db)
    ids = publish(db, "e", 5, key="k")
    sink = pg_url(dsn, inbox="ib")
    relay_once(dsn, sink)
    replay(db)
    relay_once(dsn, sink)
    got = db.execute(
        "SELECT event_id, event_type, aggregate_id FROM mailbox.ib ORDER BY event_id"
    ).fetchall()
    assert sorted(r[0] for r in got) == sorted(ids)
    assert {(r[1], r[2]) for r in got} == {("thing.created", "k")}
    # one inbox_receive_batch per relay batch, never a call per message (issue 11)
    calls = receive_calls(db)
    assert calls["inbox_receive_batch"] >= 2 and calls["inbox_receive"] == 0, calls
