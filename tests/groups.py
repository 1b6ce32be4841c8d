"""Helpers for the consumer-group tests."""

import threading
import time

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


class Bg:
    """Runs a callable in a thread; result() joins and re-raises its exception."""

    def __init__(self, fn):
        self.value = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn):
        try:
            self.value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.error = exc

    def done(self):
        return not self.thread.is_alive()

    def result(self, timeout=15):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background statement still running"
        if self.error is not None:
            raise self.error
        return self.value


def wait_blocked(db, conn, bg=None, timeout=10):
    """Wait until conn's backend waits on a heavyweight lock (or bg finished)."""
    pid = conn.info.backend_pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bg is not None and bg.done():
            return False
        if db.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()[0]:
            return True
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never blocked")
