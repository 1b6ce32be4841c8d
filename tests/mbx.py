"""Small helpers shared by the behaviour tests (fixtures live in conftest.py)."""

import contextlib
import uuid

import psycopg
import pytest


@contextlib.contextmanager
def raises(sqlstate):
    """Expect a database error with this SQLSTATE; yields the pytest ExceptionInfo."""
    with pytest.raises(psycopg.Error) as info:
        yield info
    assert info.value.sqlstate == sqlstate, (
        f"expected SQLSTATE {sqlstate}, got {info.value.sqlstate}: {info.value}"
    )


def scalar(conn, sql, params=None):
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def rows(conn, sql, params=None):
    return conn.execute(sql, params).fetchall()


def sequence(conn, outbox):
    """Number every committed, unnumbered row of an outbox (what a poll does first)."""
    key = scalar(conn, "SELECT outbox_key FROM mailbox._outbox WHERE outbox_name = %s", [outbox])
    total = 0
    while True:
        n = scalar(conn, "SELECT mailbox._sequence_outbox(%s)", [key])
        total += n
        if n == 0:
            return total


def outbox_rows(conn, outbox):
    """Every row of an outbox as dicts, in row-key (insertion) order, with its offset
    (outbox_id, None until the sequencer numbered it)."""
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute(
        "SELECT l.*, (SELECT c.base_offset + u.n FROM mailbox._outbox_chunk AS c,"
        "             unnest(c.ids) WITH ORDINALITY AS u (id, n)"
        "       WHERE c.outbox_key = l.outbox_key AND u.id = l._id) AS outbox_id"
        " FROM mailbox._outbox_log AS l JOIN mailbox._outbox AS o USING (outbox_key)"
        " WHERE o.outbox_name = %s ORDER BY l._id",
        [outbox],
    ).fetchall()


def last_offset(conn, outbox, claim_check_only=False):
    """The offset of the newest numbered row (of the newest claim-check row)."""
    got = [
        r["outbox_id"]
        for r in outbox_rows(conn, outbox)
        if r["outbox_id"] is not None and (r["is_claim_check"] or not claim_check_only)
    ]
    return max(got)


def make_role(db, *grants):
    """A throwaway NOLOGIN role (cluster-wide, so uniquely named) with the given roles granted."""
    name = "t_" + uuid.uuid4().hex[:12]
    db.execute(f'CREATE ROLE "{name}" NOLOGIN')
    for grant in grants:
        db.execute(f'GRANT "{grant}" TO "{name}"')
    return name


def drop_role(db, name):
    db.execute(f'DROP OWNED BY "{name}"')
    db.execute(f'DROP ROLE "{name}"')
