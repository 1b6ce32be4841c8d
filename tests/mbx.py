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


GATED = """
CREATE SCHEMA gated AUTHORIZATION "{owner}";
SET ROLE "{owner}";
CREATE FUNCTION gated.gate(id text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF ({gated}) AND current_setting('application_name') = 'gated' THEN
        PERFORM pg_advisory_lock_shared(4242);
        PERFORM pg_advisory_unlock_shared(4242);
    END IF;
    RETURN true;
END $$;
CREATE TABLE gated.inbox (
    event_id text PRIMARY KEY, payload jsonb, event_type text,{columns}
    received_at timestamptz DEFAULT now(), processed_at timestamptz, error text,
    retry_count int DEFAULT 0
);
ALTER TABLE gated.inbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE gated.inbox FORCE ROW LEVEL SECURITY;
CREATE POLICY gate ON gated.inbox USING (gated.gate(event_id)) WITH CHECK (true);
RESET ROLE;
"""


def make_gated_table(db, gated, columns=""):
    """gated.inbox, an inbox table (to adopt) owned by a throwaway role whose row-level
    security policy (FORCE) stops a statement of a session named 'gated' at each row whose
    id satisfies the SQL condition `gated` (on `id`) while advisory lock 4242 is taken: a
    test takes 4242, starts that statement, waits until it blocks (past its snapshot),
    acts, and releases 4242. Returns the owner; drop_gated_table(db, owner) cleans up."""
    owner = make_role(db)
    db.execute(GATED.format(owner=owner, gated=gated, columns=columns))
    return owner


def drop_gated_table(db, owner):
    """Drops what make_gated_table made. Ends the database's other connections first: after
    a failed assertion, one may still hold a lock on gated.inbox (or wait at the gate)."""
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    db.execute(f'DROP OWNED BY "{owner}" CASCADE')
    db.execute(f'DROP ROLE "{owner}"')
