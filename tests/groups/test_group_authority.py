"""Per-outbox authority (SPEC §0, issue 7): 'consume' covers every group of an outbox (poll,
commit, extend, seek, heartbeat, lag, claim-check reads), 'publish' covers publishing.

An outbox with a grant is usable that way only by members of a grantee and of mailbox_admin;
an outbox without any grant stays open to the role-level grants (mailbox_consumer,
mailbox_producer). Every call runs under SET ROLE of a role that holds the role-level grants,
so a 42501 here can only come from the per-object check.
"""

import pytest
from mbx import drop_role, make_role, raises, rows, scalar

CONSUME = {
    "poll_outbox": "SELECT * FROM mailbox.poll_outbox('billing', 'c1', 1)",
    "commit_offset": "SELECT mailbox.commit_offset('billing', 'c1', 1)",
    "extend_lease": "SELECT mailbox.extend_lease('billing', 'c1', 30)",
    "seek_offset": "SELECT mailbox.seek_offset('billing', 'c1', 0)",
    "consumer_heartbeat": "SELECT mailbox.consumer_heartbeat('billing', 'c1')",
    "consumer_lag": "SELECT * FROM mailbox.consumer_lag('billing')",
    "outbox_delta_rows": "SELECT * FROM mailbox.outbox_delta_rows('orders', 1)",
    "outbox_rows_consumed": "SELECT mailbox.outbox_rows_consumed('orders', 1, 'billing')",
    "outbox_rows_consumed_all": "SELECT mailbox.outbox_rows_consumed('orders', 1)",
}
PUBLISH = {
    "outbox_publish": "SELECT mailbox.outbox_publish('orders', '{}')",
    "outbox_publish_batch": (
        "SELECT * FROM mailbox.outbox_publish_batch('orders', ARRAY['{}'::jsonb, '{}'])"
    ),
}
EVERY = {**CONSUME, **PUBLISH}


@pytest.fixture
def roles(db):
    """team: the grantee (a group role); member: a role acting through membership in team;
    stranger: the same role-level grants, no per-object grant; admin: mailbox_admin."""
    team = make_role(db)
    member = make_role(db, "mailbox_consumer", "mailbox_producer", team)
    stranger = make_role(db, "mailbox_consumer", "mailbox_producer")
    admin = make_role(db, "mailbox_admin")
    yield {"team": team, "member": member, "stranger": stranger, "admin": admin}
    for role in (member, stranger, admin, team):
        drop_role(db, role)


@pytest.fixture
def outboxes(db, roles):
    """'orders' (captured, its first row a claim-check row) with group 'billing', granted to
    team; 'open' with group 'open_g', no grant at all."""
    db.execute("CREATE TABLE orders (id int)")
    db.execute("SELECT mailbox.enable_outbox('orders', p_inline_threshold_rows => 0)")
    db.execute("SELECT mailbox.create_consumer_group('billing', 'orders', 'earliest')")
    db.execute("INSERT INTO orders VALUES (1), (2)")
    db.execute("SELECT mailbox.create_outbox('open')")
    db.execute("SELECT mailbox.create_consumer_group('open_g', 'open', 'earliest')")
    db.execute("SELECT mailbox.outbox_publish('open', '{}')")
    for privilege in ("consume", "publish"):
        db.execute("SELECT mailbox.grant_outbox('orders', %s, %s)", [roles["team"], privilege])
    db.execute("SELECT * FROM mailbox.poll_outbox('billing', 'c1', 1)")  # registers c1
    return db


def as_role(connect, role):
    conn = connect()
    conn.execute(f'SET ROLE "{role}"')
    return conn


@pytest.mark.parametrize("call", EVERY)
def test_a_non_grantee_gets_42501(outboxes, connect, roles, call):
    conn = as_role(connect, roles["stranger"])
    with raises("42501"):
        conn.execute(EVERY[call])


@pytest.mark.parametrize("who", ["member", "admin"])
@pytest.mark.parametrize("call", EVERY)
def test_a_grantees_member_and_an_admin_may_call(outboxes, connect, roles, who, call):
    conn = as_role(connect, roles[who])
    conn.execute(EVERY[call])


def test_an_outbox_without_grants_is_open_to_role_level_grants(outboxes, connect, roles):
    conn = as_role(connect, roles["stranger"])
    assert len(rows(conn, "SELECT * FROM mailbox.poll_outbox('open_g', 's', 10)")) == 1
    assert scalar(conn, "SELECT mailbox.commit_offset('open_g', 's', 1)") == 1
    conn.execute("SELECT mailbox.extend_lease('open_g', 's')")
    conn.execute("SELECT mailbox.consumer_heartbeat('open_g', 's')")
    conn.execute("SELECT mailbox.seek_offset('open_g', 's', 0)")
    conn.execute("SELECT * FROM mailbox.consumer_lag('open_g')")
    conn.execute("SELECT mailbox.outbox_publish('open', '{}')")
    conn.execute("SELECT * FROM mailbox.outbox_publish_batch('open', ARRAY['{}'::jsonb])")


def test_consume_and_publish_are_separate_privileges(outboxes, connect, roles):
    db = outboxes
    db.execute("SELECT mailbox.revoke_outbox('orders', %s, 'publish')", [roles["team"]])
    conn = as_role(connect, roles["member"])
    conn.execute(CONSUME["poll_outbox"])
    with raises("42501"):
        conn.execute(PUBLISH["outbox_publish"])


def test_revoke_takes_effect_at_once(outboxes, connect, roles):
    db = outboxes
    conn = as_role(connect, roles["member"])
    conn.execute(CONSUME["poll_outbox"])
    db.execute("SELECT mailbox.revoke_outbox('orders', %s, 'consume')", [roles["team"]])
    for call in CONSUME.values():
        with raises("42501"):
            conn.execute(call)
    conn.execute(PUBLISH["outbox_publish"])  # the other privilege stays
    db.execute("SELECT mailbox.revoke_outbox('orders', %s, 'publish')", [roles["team"]])
    # no grant left at all: the outbox is open to the role-level grants again
    conn.execute(CONSUME["poll_outbox"])
    conn.execute(PUBLISH["outbox_publish"])


def test_consumer_lag_without_a_group_lists_only_consumable_groups(outboxes, connect, roles):
    def groups(role):
        conn = as_role(connect, roles[role])
        return sorted({r[0] for r in rows(conn, "SELECT group_name FROM mailbox.consumer_lag()")})

    assert groups("stranger") == ["open_g"]
    assert groups("member") == ["billing", "open_g"]
    assert groups("admin") == ["billing", "open_g"]


def test_a_stranger_cannot_move_another_teams_group(outboxes, connect, roles):
    """The finding: any mailbox_consumer could seek another team's group to the head so its
    consumers skip rows. Denied, and the group is where it was."""
    db = outboxes
    before = rows(db, "SELECT group_offset, delivered_offset FROM mailbox._consumer_group")
    conn = as_role(connect, roles["stranger"])
    with raises("42501"):
        conn.execute("SELECT mailbox.seek_offset('billing', 'x', NULL)")
    with raises("42501"):
        conn.execute("SELECT * FROM mailbox.poll_outbox('billing', 'x', 10)")
    assert rows(db, "SELECT group_offset, delivered_offset FROM mailbox._consumer_group") == before
    assert scalar(db, "SELECT count(*) FROM mailbox._consumer WHERE consumer_id = 'x'") == 0
