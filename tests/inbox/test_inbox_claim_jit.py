"""A claim is never JIT-compiled (issue 11, docs/inbox.md "Claims and JIT").

inbox_claim runs its generated query with a generic plan, which the planner costs for a share
of the pending rows. Above some 120,000 pending rows that cost passed jit_above_cost (100,000
by default), so with PostgreSQL's default jit = on every claim compiled its query again: about
8 ms, eight times a whole claim of 100. inbox_claim now runs with jit = off. Since the claim
excludes leased messages with a hashed set instead of a lookup per row (2026-11-28, seventh
session; tests/inbox/test_inbox_claim_in_flight.py) the same plan is costed far lower and
would pass the default threshold only at some millions of pending messages, so these tests set
jit_above_cost = 0: any plan is past it, and only the SET clause keeps the claim from being
compiled.

auto_explain (loaded in the session, nested statements, NOTICE level) shows each statement's
plan, with a "JIT:" section when the statement was compiled. The control step takes the SET
clause away inside a transaction that rolls back, so the test shows that it can fail.
"""

import pytest
from mbx import scalar

BACKLOG = 20_000


@pytest.fixture
def big(db):
    if not scalar(db, "SELECT pg_catalog.pg_jit_available()"):
        pytest.skip("this server has no JIT provider (llvmjit): nothing to compile")
    db.execute("SELECT mailbox.create_inbox('big')")
    db.execute(
        "INSERT INTO mailbox.big (event_id, payload, event_type)"
        " SELECT 'c-' || g, '{}', 't' FROM generate_series(1, %s) g",
        [BACKLOG],
    )
    db.execute("ANALYZE mailbox.big")
    return db


def explained(conn, sql, params=()):
    """The plans auto_explain reported for the statements that sql ran, nested ones too."""
    plans = []
    handler = lambda d: plans.append(d.message_primary or "")  # noqa: E731
    conn.add_notice_handler(handler)
    try:
        conn.execute(sql, params)
    finally:
        conn.remove_notice_handler(handler)
    return plans


def watch(conn):
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_level = notice")
    # PostgreSQL's default jit, whatever the test cluster was started with, and every plan
    # past the cost threshold (see the module's docstring)
    conn.execute("SET jit = on")
    conn.execute("SET jit_above_cost = 0")


def claim_plans(conn):
    plans = explained(conn, "SELECT count(*) FROM mailbox.inbox_claim('big', 'w', 10)")
    claims = [p for p in plans if "SKIP LOCKED" in p and "mailbox.big" in p]
    assert claims, plans  # the generated claim's query was among them
    return claims


def test_a_claim_is_not_jit_compiled(big, connect):
    w = connect(autocommit=False)
    watch(w)
    claims = claim_plans(w)
    assert not [p for p in claims if "JIT:" in p], claims
    w.rollback()


def test_without_the_set_clause_the_same_claim_is_jit_compiled(big, connect):
    # the control: the plan is past jit_above_cost, so only the SET clause stands between
    # every claim and a compilation (the ALTER rolls back with the transaction)
    w = connect(autocommit=False)
    watch(w)
    w.execute("ALTER FUNCTION mailbox.inbox_claim(text, text, int, int) RESET jit")
    claims = claim_plans(w)
    assert [p for p in claims if "JIT:" in p], claims
    w.rollback()
    assert "jit=off" in scalar(
        big,
        "SELECT array_to_string(proconfig, ' ') FROM pg_proc"
        " WHERE oid = 'mailbox.inbox_claim(text, text, int, int)'::regprocedure",
    )
