"""A worker's plans made on an empty queue still read by index after a burst (issue 11,
docs/inbox.md "Plans made on an empty queue").

A session keeps the plan of each statement of a PL/pgSQL function until a table it reads
changes in the catalog (VACUUM, ANALYZE, DDL). A drained inbox that autovacuum has just
cleaned has no pages, and the lease and open-claim tables are often as empty: a worker that
polls then plans every lookup as a scan of an empty table, and kept scanning the whole table
through the burst that followed (200,000 pending: 1,400 instead of 12,000 messages a second;
beside 50,000 lease rows of another inbox, a third of its rate). The claim, the marks (single
and batch, in the claiming transaction and after it), the failure reports, the commit's
settle and replay now run with sequential scans off, so their plans are index reads whatever
the tables' size when they were made.

The scenario: every table the worker touches is vacuumed nearly empty (autovacuum off, so
nothing replans behind the test), the worker goes through each path a few times (plans made
then), a burst arrives (messages, and leases of another inbox), and auto_explain (loaded in
the worker's session, nested statements, NOTICE level) shows the plans the worker runs. The
control takes the setting away from the same functions (each test has a database of its own)
and shows the same scenario ending in sequential scans: the test can fail.
"""

import re

import pytest
from mbx import scalar

# the tables of the worker's paths (the catalog row lookups are by index too, but an inbox
# catalog of a few rows is small whatever happens)
WATCHED = (
    "q",
    "o",
    "p",
    "_inbox_lease",
    "_inbox_open_claim",
    "_inbox_aggregate",
)
FUNCTIONS = (
    "mailbox.inbox_claim(text, text, int, int)",
    "mailbox._inbox_mark_processed_full(text, text)",
    "mailbox.inbox_mark_processed(text, text[])",
    "mailbox.inbox_mark_failed(text, text, text, int)",
    "mailbox.inbox_mark_failed(text, text[], text, int)",
    "mailbox.replay_inbox_messages(text, text[])",
    "mailbox._inbox_settle_claim()",
)


@pytest.fixture
def idle(db):
    """Three inboxes (plain, ordered, priority) and another one whose leases arrive with the
    burst; every table vacuumed with a row or none, and never again by autovacuum."""
    for name in ("q", "o", "p", "other"):
        db.execute("SELECT mailbox.create_inbox(%s)", [name])
    db.execute("SELECT mailbox.enable_inbox_ordering('o')")
    db.execute("SELECT mailbox.enable_inbox_priority('p')")
    for table in ("q", "o", "p", "other", "_inbox_lease", "_inbox_open_claim", "_inbox_aggregate"):
        db.execute(f"ALTER TABLE mailbox.{table} SET (autovacuum_enabled = false)")
        db.execute(f"VACUUM ANALYZE mailbox.{table}")
    return db


def watch(conn):
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_level = notice")
    conn.execute("SET auto_explain.log_analyze = on")


def whole_reads(plans):
    """Where a plan reads a watched table whole: a sequential scan of it, or any node that
    passed over more than 500 rows (an index read in the wrong order or by the wrong key,
    with the burst's 5,000 rows behind it), with the plan's first line."""
    out = set()
    for plan in plans:
        text = plan.split("Query Text:", 1)[-1].strip().splitlines()[0][:90]
        for table in re.findall(r"Seq Scan on (\w+)", plan):
            if table in WATCHED:
                out.add((table, text))
        for table, removed in re.findall(
            r"Scan (?:\w+ )*on (\w+).*?\n(?:(?!\n\s*->).)*?Rows Removed by Filter: (\d+)",
            plan,
            re.S,
        ):
            if int(removed) > 500:
                out.add((table, text))
    return sorted(out)


def work(db, w, n):
    """One round of every path a worker takes: receive, claim and mark per message and per
    batch in one transaction, claim then mark and fail in the next, replay."""
    ids = [f"m{n}-{i}" for i in range(12)]
    for i in ids:
        db.execute("SELECT mailbox.inbox_receive('q', %s, '{}')", [i])
    db.execute(
        "SELECT mailbox.inbox_receive('o', %s, '{}', NULL, NULL, %s, 1)", [f"o{n}", f"agg{n}"]
    )
    db.execute(
        "SELECT mailbox.inbox_receive('p', %s, '{}', NULL, NULL, NULL, NULL, NULL, NULL, 3)",
        [f"p{n}"],
    )
    for inbox in ("q", "o", "p"):
        got = [
            r[0] for r in w.execute("SELECT event_id FROM mailbox.inbox_claim(%s, 'w', 2)", [inbox])
        ]
        for m in got:
            w.execute("SELECT mailbox.inbox_mark_processed(%s, %s)", [inbox, m])
        w.commit()
    got = [r[0] for r in w.execute("SELECT event_id FROM mailbox.inbox_claim('q', 'w', 3)")]
    w.execute("SELECT mailbox.inbox_mark_processed('q', %s::text[])", [got])
    w.commit()
    # claimed in one transaction, settled in the next (the leases)
    got = [r[0] for r in w.execute("SELECT event_id FROM mailbox.inbox_claim('q', 'w', 7)")]
    w.commit()
    w.execute("SELECT mailbox.inbox_mark_processed('q', %s)", [got[0]])
    w.execute("SELECT mailbox.inbox_mark_processed('q', %s::text[])", [got[1:3]])
    w.execute("SELECT mailbox.inbox_mark_failed('q', %s, 'x', 0)", [got[3]])
    w.execute("SELECT count(*) FROM mailbox.inbox_mark_failed('q', %s::text[], 'x', 0)", [got[4:]])
    w.commit()
    w.execute("SELECT mailbox.replay_inbox_messages('q', %s::text[])", [got[:1]])
    w.commit()


def scenario(db, connect):
    w = connect(autocommit=False)
    for n in range(7):  # past the 5 custom plans of a statement with parameters
        work(db, w, n)
    # the burst: messages in each inbox and 3,000 leases of another inbox, no VACUUM
    db.execute(
        "INSERT INTO mailbox.q (event_id, payload)"
        " SELECT 'b' || g, '{}' FROM generate_series(1, 5000) g"
    )
    db.execute(
        "INSERT INTO mailbox.o (event_id, payload, aggregate_id, sequence_num)"
        " SELECT 'b' || g, '{}', 'a' || (g % 500), g / 500 + 1 FROM generate_series(1, 5000) g"
    )
    db.execute(
        "INSERT INTO mailbox.p (event_id, payload, priority)"
        " SELECT 'b' || g, '{}', g % 9 + 1 FROM generate_series(1, 5000) g"
    )
    db.execute(
        "INSERT INTO mailbox.other (event_id, payload)"
        " SELECT 'x' || g, '{}' FROM generate_series(1, 3000) g"
    )
    assert scalar(db, "SELECT count(*) FROM mailbox.inbox_claim('other', 'x', 3000, 600)") == 3000
    watch(w)
    w.commit()
    plans = []
    w.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    work(db, w, 99)
    assert len(plans) > 50, len(plans)  # the worker's statements were all explained
    return whole_reads(plans)


def test_a_worker_that_planned_on_an_empty_queue_reads_by_index_after_a_burst(idle, connect):
    # (the ordered claim too: its head tests read the ordering index in its order, and it
    # takes its heads by primary key; planned on the nearly empty table it read the pending
    # index whole in a per-aggregate subquery, 15 ms a claim at 5,000 pending)
    assert scenario(idle, connect) == []


def test_without_the_setting_the_same_worker_scans_whole_tables(idle, connect):
    # the control: the same functions without the setting (this test's database only),
    # and the named mark without it too
    for fn in FUNCTIONS:
        idle.execute(f"ALTER FUNCTION {fn} RESET enable_seqscan")
    key = scalar(idle, "SELECT inbox_key FROM mailbox._inbox WHERE inbox_name = 'q'")
    idle.execute(
        f"ALTER FUNCTION mailbox._inbox_{key}_processed_named(mailbox._inbox, text)"
        " RESET enable_seqscan"
    )
    scans = scenario(idle, connect)
    tables = {t for t, _ in scans}
    # the lease and open-claim lookups, and the claims' and marks' reads of the inbox tables
    assert {"_inbox_lease", "_inbox_open_claim", "q", "o", "p"} <= tables, scans
