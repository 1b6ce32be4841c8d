"""Helpers for the consumer-group tests."""

import psycopg


def poll(conn, group, consumer, batch=100, visibility=30):
    """Offsets (and payloads) leased by one poll_outbox call."""
    return conn.execute(
        "SELECT outbox_id, payload FROM mailbox.poll_outbox(%s, %s, %s, %s)",
        [group, consumer, batch, visibility],
    ).fetchall()


def commit(conn, group, consumer, offset):
    return conn.execute(
        "SELECT mailbox.commit_offset(%s, %s, %s)", [group, consumer, offset]
    ).fetchone()[0]


def publish(conn, outbox, n, tag="x"):
    conn.execute(
        "SELECT count(*) FROM mailbox.outbox_publish_batch(%s,"
        " ARRAY(SELECT jsonb_build_object('tag', %s::text, 'n', g) FROM generate_series(1, %s) g))",
        [outbox, tag, n],
    )


class Notices:
    """Collects WARNING/NOTICE messages of a connection."""

    def __init__(self, conn: psycopg.Connection):
        self.items = []
        conn.add_notice_handler(
            lambda d: self.items.append((d.severity_nonlocalized, d.message_primary))
        )

    def warnings(self):
        return [m for s, m in self.items if s == "WARNING"]
