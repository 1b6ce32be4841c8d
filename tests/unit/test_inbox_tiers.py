import pytest

from mailbox_server import inbox_tiers
from mailbox_server.errors import MailboxError


def test_null_means_the_default_tiers():
    assert inbox_tiers.validate(None) == inbox_tiers.DEFAULT_TIERS
    assert inbox_tiers.validate(None) is not inbox_tiers.DEFAULT_TIERS
    assert inbox_tiers.validate_sql(None, None) == inbox_tiers.DEFAULT_TIERS


def test_tiers_are_sorted_by_min():
    got = inbox_tiers.validate_sql(
        None, '[{"name": "low", "min": 5, "max": 9}, {"name": "high", "min": -3, "max": 4}]'
    )
    assert [t["name"] for t in got] == ["high", "low"]


@pytest.mark.parametrize(
    "tiers, words",
    [
        ([{"name": "a", "min": 1, "max": 5}, {"name": "b", "min": 5, "max": 9}], "overlap"),
        ([{"name": "a", "min": 1, "max": 2}, {"name": "b", "min": 4, "max": 9}], "gap"),
        ([{"name": "a", "min": 3, "max": 1}], "min 3 > max 1"),
        ([{"name": "a", "min": 1, "max": 1}, {"name": "a", "min": 2, "max": 2}], "duplicate"),
        ([{"name": "A", "min": 1, "max": 1}], "name"),
        ([{"name": "fifteen_bytes__", "min": 1, "max": 1}], "name"),
        ([{"name": "a", "min": True, "max": 1}], "bound"),
        ([{"name": "a", "min": 1.5, "max": 2}], "bound"),
        ([{"name": "a", "min": 1, "max": 2**31}], "bound"),
        ([{"name": "a", "min": 1, "max": 2, "colour": "red"}], "key"),
        (["a"], "object"),
        ([], "non-empty"),
        ({"name": "a"}, "non-empty"),
    ],
)
def test_bad_tiers_are_22023_with_a_hint(tiers, words):
    with pytest.raises(MailboxError) as info:
        inbox_tiers.validate(tiers)
    assert info.value.sqlstate == "22023" and words in info.value.message
    assert info.value.hint


def test_fourteen_byte_names_are_fine():
    assert inbox_tiers.validate([{"name": "fourteen_bytes", "min": 0, "max": 0}])
