"""Helpers for the consumer-group tests."""

import random
import threading
import time

import psycopg
from mbx import rows

from pg_mailbox import api


def poll(conn, group, consumer, batch=100, visibility=30):
    """Offsets (and payloads) leased by one poll_outbox call (through the client API)."""
    return [
        (r.outbox_id, r.payload) for r in api.poll_outbox(conn, group, consumer, batch, visibility)
    ]


def ppoll(conn, group, consumer, batch=100, visibility=30):
    """(offset, key, partition) of one poll (through the client API)."""
    return [
        (r.outbox_id, r.key, r.partition)
        for r in api.poll_outbox(conn, group, consumer, batch, visibility)
    ]


def commit(conn, group, consumer, offset):
    return api.commit_offset(conn, group, consumer, offset)


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


class Numberer:
    """CALL mailbox.run_numberer() on a connection of its own, in a thread."""

    def __init__(self, connect, seconds=120, slot_rows=4):
        # small slots, so the tests' small batches claim whole slots (docs/design.md §5)
        self.conn = connect(autocommit=True, options=f"-c mailbox.consumer_slot_rows={slot_rows}")
        self.notices = Notices(self.conn)
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(seconds,), daemon=True)
        self.thread.start()

    def _run(self, seconds):
        try:
            self.conn.execute("CALL mailbox.run_numberer(%s)", [seconds])
        except psycopg.errors.QueryCanceled:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self):
        self.conn.cancel()
        self.thread.join(10)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def wait_for(predicate, timeout=10, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def produce_keyed(connect, i, keys, n, errors):
    """n rows with keys from keys, committed in transactions of 1-20 rows after random delays."""
    conn = connect(autocommit=False)
    rnd = random.Random(i)
    try:
        done = 0
        while done < n:
            k = min(n - done, rnd.randint(1, 20))
            batch = [rnd.choice(keys) for _ in range(k)]
            conn.execute(
                "SELECT count(mailbox.outbox_publish('e', jsonb_build_object('k', k), '{}', k))"
                " FROM unnest(%s::text[]) WITH ORDINALITY AS u (k, n)",
                [batch],
            )
            time.sleep(rnd.random() * 0.005)
            conn.commit()
            done += k
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)


def holders(db, group="g"):
    """partition -> consumer holding it with a live lease."""
    return dict(
        rows(
            db,
            "SELECT partition, consumer_id FROM mailbox.consumer_partition_lag"
            " WHERE group_name = %s AND leased",
            [group],
        )
    )
