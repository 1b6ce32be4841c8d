"""Claims pass over messages in flight with one read of the leases, not one per message
(issue 11, docs/inbox.md "Messages in flight").

Claims take the oldest pending messages, so in the two-transaction pattern (claim and
commit, process, mark later) the messages in flight sit at the head of the queue and every
other claim passes over them. The generated claim of an unordered inbox excludes them with a
NOT IN over the inbox's live leases, read once per claim and hashed; before, it looked each
passed message up in the lease table's primary key (one index scan each, about twice what a
plain SKIP LOCKED queue pays to pass a locked row). PostgreSQL counts this
transaction's scans of mailbox._inbox_lease's indexes
(pg_stat_get_xact_numscans), so the tests read how many lookups a
claim made without timing anything; each runs a control (the lookup per row restored inside
a transaction that rolls back), which shows that the count can fail.
"""

import psycopg
import pytest
from mbx import scalar

IN_FLIGHT = 2_000


@pytest.fixture
def held(db, connect):
    """An inbox whose 2,000 oldest messages are leased by another worker (a claim committed
    with a 600 s lease), and 200 more behind them."""
    db.execute("SELECT mailbox.create_inbox('fl')")
    db.execute(
        "INSERT INTO mailbox.fl (event_id, payload, received_at)"
        " SELECT 'm-' || g, '{}', now() - interval '1 hour' + g * interval '1 ms'"
        " FROM generate_series(1, %s) g",
        [IN_FLIGHT + 200],
    )
    holder = connect()
    got = scalar(
        holder, "SELECT count(*) FROM mailbox.inbox_claim('fl', 'holder', %s, 600)", [IN_FLIGHT]
    )
    assert got == IN_FLIGHT
    assert scalar(db, "SELECT count(*) FROM mailbox._inbox_lease") == IN_FLIGHT
    return db


def lease_scans(conn):
    """(index scans, index entries read) of mailbox._inbox_lease's indexes in this transaction."""
    return conn.execute(
        "SELECT coalesce(sum(pg_catalog.pg_stat_get_xact_numscans(i.indexrelid)), 0),"
        " coalesce(sum(pg_catalog.pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)"
        " FROM pg_catalog.pg_index AS i WHERE i.indrelid = 'mailbox._inbox_lease'::regclass"
    ).fetchone()


def claim_ten(conn):
    before = lease_scans(conn)
    ids = [r[0] for r in conn.execute("SELECT event_id FROM mailbox.inbox_claim('fl', 'w', 10)")]
    after = lease_scans(conn)
    return ids, after[0] - before[0], after[1] - before[1]


def test_a_claim_reads_the_leases_once_not_once_per_message_in_flight(held, connect):
    w = connect(autocommit=False)
    ids, scans, read = claim_ten(w)
    # the ten messages behind the ones in flight, oldest first
    assert ids == [f"m-{IN_FLIGHT + k}" for k in range(1, 11)]
    # one read of the live leases, then one lookup per claimed message (inbox_claim's re-read
    # after the locks) and the EXISTS probes: far fewer than one per message passed over
    assert scans < 50, scans
    # and each lease row read about once (the set), not once more by the re-read
    assert read < IN_FLIGHT + 100, read
    w.rollback()


def test_control_a_lookup_per_message_shows_in_the_count(held, connect):
    # the claim query's former exclusion, one primary-key lookup per row passed over, written
    # into this inbox's generated claim inside a transaction that rolls back
    w = connect(autocommit=False)
    key = scalar(w, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = 'fl'")
    fn = f"mailbox._inbox_{key}_claim(mailbox._inbox, int, timestamptz, boolean)"
    body = scalar(w, "SELECT prosrc FROM pg_catalog.pg_proc WHERE oid = %s::regprocedure", [fn])
    start = body.index("NOT IN (")
    end = body.index("ORDER BY")
    lookup = (
        f"NOT EXISTS (SELECT 1 FROM mailbox._inbox_{key}_lease AS l"
        " WHERE l.event_id = t.event_id::pg_catalog.text"
        " AND (l.lease_until > $3 OR l.next_attempt_at > $3) OFFSET 0))\n"
    )
    before = body[:start].rsplit("t.event_id::pg_catalog.text", 1)[0]
    changed = before + lookup + body[end:]
    w.execute(
        psycopg.sql.SQL(
            "CREATE OR REPLACE FUNCTION {}(mailbox._inbox, int, timestamptz, boolean)"
            " RETURNS mailbox._inbox_message[] LANGUAGE plpgsql AS {}"
        ).format(psycopg.sql.SQL(fn.split("(")[0]), psycopg.sql.Literal(changed))
    )
    ids, scans, _ = claim_ten(w)
    assert ids == [f"m-{IN_FLIGHT + k}" for k in range(1, 11)]
    assert scans >= IN_FLIGHT, scans
    w.rollback()


def test_an_expired_lease_in_the_set_does_not_hide_its_message(held, connect):
    # the set holds live leases only: once the holder's lease runs out, its messages are the
    # oldest claimable again
    held.execute("UPDATE mailbox._inbox_lease SET lease_until = now() - interval '1 second'")
    w = connect(autocommit=False)
    ids, _, _ = claim_ten(w)
    assert ids == [f"m-{k}" for k in range(1, 11)]
    w.rollback()
