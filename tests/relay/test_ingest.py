"""`pg-mailbox ingest` from each source into an inbox (SPEC §5.3), on the real brokers:
the relay publishes, ingest receives, the inbox holds each event once with its metadata."""

import redis
from relayhelp import (
    AMQP,
    REDIS,
    amqp_declare,
    amqp_drain,
    arun,
    cli,
    publish,
    receive_calls,
    relay_once,
    setup_outbox,
    track_receives,
    uid,
)


def ingest_once(dsn, source):
    got = cli(
        "ingest",
        "--dsn",
        dsn,
        "--inbox",
        "ib",
        "--source",
        source,
        "--once",
        "--poll-interval",
        "0.5",
    )
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stderr


def inbox(db):
    return db.execute(
        "SELECT event_id, event_type, source, aggregate_id, payload FROM mailbox.ib"
        " ORDER BY event_id"
    ).fetchall()


def test_redis_stream_into_the_inbox_twice_is_once(db, dsn):
    setup_outbox(db)
    db.execute("SELECT mailbox.create_inbox('ib')")
    stream = uid("ing")
    ids = publish(db, "e", 7, key="k9")
    r = redis.Redis.from_url(REDIS)
    try:
        relay_once(dsn, f"{REDIS}?stream={stream}")
        ingest_once(dsn, f"{REDIS}?stream={stream}&group=g1")
        # a second consumer group of the stream reads the same entries: the inbox drops them
        ingest_once(dsn, f"{REDIS}?stream={stream}&group=g2")
        got = inbox(db)
        assert sorted(x[0] for x in got) == sorted(ids)
        assert {(x[1], x[3]) for x in got} == {("thing.created", "k9")}
        assert r.xpending(stream, "g1")["pending"] == 0  # acknowledged after the commit
    finally:
        r.delete(stream, *[f"{stream}:dedup:{i}" for i in ids])


def test_amqp_queue_into_the_inbox(db, dsn):
    setup_outbox(db)
    db.execute("SELECT mailbox.create_inbox('ib')")
    track_receives(db)
    queue = uid("ingq")
    arun(amqp_declare(queue))
    ids = publish(db, "e", 6, key="k1")
    relay_once(dsn, f"{AMQP}?routing_key={queue}")
    ingest_once(dsn, f"{AMQP}?queue={queue}")
    got = inbox(db)
    assert sorted(x[0] for x in got) == sorted(ids)
    assert got[0][4]["tag"] == "x"
    # the queue is empty: every message was acknowledged after the inbox commit
    ingest_once(dsn, f"{AMQP}?queue={queue}")
    assert len(inbox(db)) == 6
    assert arun(amqp_drain(queue)) == []  # and the queue is removed
    # one inbox_receive_batch per broker batch, never a call per message (issue 11)
    calls = receive_calls(db)
    assert calls["inbox_receive_batch"] >= 1 and calls["inbox_receive"] == 0, calls
