import pytest

from mailbox_server import inbox_health


@pytest.mark.parametrize(
    "age, dead, blocked, expected",
    [
        (None, 0, 0, "healthy"),
        (59.9, 0, 0, "healthy"),
        (60, 0, 0, "degraded"),
        (0, 1, 0, "degraded"),
        (0, 0, 1, "degraded"),
        (299, 99, 5, "degraded"),
        (300, 0, 0, "critical"),
        (0, 100, 0, "critical"),
    ],
)
def test_classify_thresholds(age, dead, blocked, expected):
    assert inbox_health.classify(age, dead, blocked, 60, 300, 100) == expected
