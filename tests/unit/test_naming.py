import hashlib

import pytest

from mailbox_server import naming
from mailbox_server.errors import MailboxError


@pytest.mark.parametrize(
    "name, ok",
    [
        ("orders", True),
        ("_x1", True),
        ("x" * 40, True),
        ("x" * 41, False),
        ("Orders", False),
        ("1x", False),
        ("", False),
        (None, False),
        ("a-b", False),
        ("é", False),
        ("a b", False),
    ],
)
def test_is_valid_name(name, ok):
    assert naming.is_valid_name(name) is ok


def test_sanitize():
    assert naming.sanitize("Order Items") == "order_items"
    assert naming.sanitize("2024_sales") == "_2024_sales"
    assert naming.sanitize("ünïcode") == "_n_code"


def md7(text):
    return hashlib.md5(text.encode()).hexdigest()[:7]


def test_table_name_when_free_and_valid():
    assert naming.derive_outbox_name("public", "orders", lambda n: False) == "orders"


def test_taken_name_gets_hashed():
    got = naming.derive_outbox_name("sales", "orders", lambda n: n == "orders")
    assert got == "orders_" + md7("sales.orders")


def test_long_name_is_32_bytes_plus_hash():
    table = "a" * 50
    got = naming.derive_outbox_name("public", table, lambda n: False)
    assert got == "a" * 32 + "_" + md7("public." + table)
    assert naming.is_valid_name(got)


def test_derive_sql_raises_42710_when_even_the_hashed_name_is_taken(plpy):
    plpy.answer("EXISTS", [{"taken": True}])
    with pytest.raises(MailboxError) as info:
        naming.derive_outbox_name_sql(plpy, "public", "orders")
    assert info.value.sqlstate == "42710"
    assert info.value.message == "outbox already exists: orders_" + md7("public.orders")
    assert info.value.hint
