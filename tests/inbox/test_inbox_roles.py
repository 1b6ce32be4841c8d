"""The inbox's role -> column model has one home, mailbox._inbox_roles() (part 30): what is
still written out by hand (the message types, inbox_claim's and inbox_receive's signatures,
the managed table) must match it, and adoption judges every column by it (SPEC §3.1)."""

import pytest
from mbx import raises, rows, scalar

ROLES = "SELECT role FROM mailbox._inbox_roles() WHERE {} ORDER BY {}"


def attributes(db, type_name):
    return [
        r[0]
        for r in rows(
            db,
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
            " ORDER BY attnum",
            [type_name],
        )
    ]


def roles(db, where, order="table_position"):
    return [r[0] for r in rows(db, ROLES.format(where, order))]


def test_the_message_type_and_inbox_claim_carry_the_registry_roles(db):
    carried = roles(db, "message_position IS NOT NULL", "message_position")
    assert attributes(db, "mailbox._inbox_message") == carried
    claim_columns = scalar(
        db,
        "SELECT proargnames[array_position(proargmodes, 't'):] FROM pg_proc"
        " WHERE oid = 'mailbox.inbox_claim'::regproc",
    )
    assert claim_columns == [*carried, "lease_until"]


def test_inbox_receive_takes_the_registry_roles_with_their_types(db):
    got = rows(
        db,
        "SELECT a.name, format_type(a.type, NULL) FROM pg_proc AS p,"
        " unnest(p.proargnames, p.proargtypes::oid[]) AS a(name, type)"
        " WHERE p.oid = 'mailbox.inbox_receive'::regproc",
    )
    expected = rows(
        db,
        "SELECT 'p_' || role, format_type(('pg_catalog.' || receive_type)::regtype, NULL)"
        " FROM mailbox._inbox_roles() WHERE receive_position IS NOT NULL"
        " ORDER BY receive_position",
    )
    assert got == [("p_inbox", "text"), *expected]


def test_a_managed_inbox_table_has_a_column_per_role(db):
    db.execute("SELECT mailbox.create_inbox('m')")
    assert attributes(db, "mailbox.m") == roles(db, "true")
    assert scalar(db, "SELECT columns FROM mailbox._inbox") == {r: r for r in roles(db, "true")}


@pytest.fixture
def table(db):
    db.execute(
        "CREATE TABLE public.t (id uuid PRIMARY KEY, done timestamptz, tries smallint NOT NULL"
        " DEFAULT 0, received_at timestamp NOT NULL DEFAULT now(), payload json, note text)"
    )
    return db


def adopt(db, **columns):
    args = {"p_processed_at_column": "done", "p_retry_count_column": "tries", **columns}
    named = ", ".join(f"{k} => %s" for k in args)
    db.execute(
        f"SELECT mailbox.enable_inbox_tracking('t', 'public.t', 'id', {named})", list(args.values())
    )


def test_adoption_maps_the_columns_present_and_casts_a_non_text_id(table):
    adopt(table)
    assert scalar(table, "SELECT columns FROM mailbox._inbox") == {
        "event_id": "id",
        "processed_at": "done",
        "retry_count": "tries",
        "received_at": "received_at",
        "payload": "payload",
    }
    assert scalar(table, "SELECT casts FROM mailbox._inbox") == {"event_id": "uuid"}


@pytest.mark.parametrize(
    "columns, sqlstate",
    [
        ({"p_processed_at_column": "nope"}, "42703"),  # required, missing
        ({"p_error_column": "nope"}, "42703"),  # optional, but named explicitly
        ({"p_retry_count_column": "note"}, "42804"),  # wrong type
        ({"p_payload_column": "note"}, "42804"),
        ({"p_processed_at_column": None}, "22004"),  # a required role unmapped
        ({"p_event_type_column": "note", "p_error_column": "note"}, "22023"),  # two roles
    ],
)
def test_adoption_errors_by_role(table, columns, sqlstate):
    with raises(sqlstate) as info:
        adopt(table, **columns)
    assert info.value.diag.message_hint
    assert scalar(table, "SELECT count(*) FROM mailbox._inbox") == 0


def test_only_a_permanent_table_of_ones_own_is_adopted(db):
    db.execute("CREATE TABLE public.base (event_id text PRIMARY KEY)")
    db.execute("CREATE MATERIALIZED VIEW public.mv AS SELECT * FROM public.base")
    with raises("42809") as info:
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'public.mv')")
    assert "materialized view" in info.value.diag.message_detail
    assert "inbox tables" in info.value.diag.message_hint
    db.execute(
        "CREATE TEMP TABLE tmp (event_id text PRIMARY KEY, processed_at timestamptz,"
        " retry_count int, received_at timestamptz)"
    )
    with raises("22023") as info:
        db.execute("SELECT mailbox.enable_inbox_tracking('x', 'pg_temp.tmp')")
    assert "cannot adopt a temporary table" in str(info.value)


def test_ordering_and_priority_columns_follow_the_same_rule(table):
    table.execute("ALTER TABLE public.t ADD COLUMN agg uuid, ADD COLUMN seq text, ADD COLUMN n int")
    adopt(table)
    with raises("42804") as info:
        table.execute("SELECT mailbox.enable_inbox_ordering('t', 'agg', 'seq')")
    assert "cannot hold sequence_num" in str(info.value)
    with raises("42703"):
        table.execute("SELECT mailbox.enable_inbox_priority('t', 'nope')")
    with raises("22023"):  # already the retry count
        table.execute("SELECT mailbox.enable_inbox_priority('t', 'tries')")
    table.execute("SELECT mailbox.enable_inbox_ordering('t', 'agg', 'n')")
    assert scalar(table, "SELECT columns ->> 'sequence_num' FROM mailbox._inbox") == "n"
