"""Unit tests of the server-side package: no server, a fake plpy."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "plpython"))


class FakeSPIError(Exception):
    def __init__(self, message, sqlstate="22023", detail=None, hint=None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.spidata = (0, detail, hint)


class FakePlpy:
    """Answers plpy.execute/prepare from a list of (substring, rows) rules."""

    SPIError = FakeSPIError

    def __init__(self):
        self.rules = []
        self.calls = []

    def answer(self, fragment, result):
        self.rules.append((fragment, result))

    def prepare(self, query, types=None):
        return query

    def execute(self, query, args=None):
        self.calls.append((query, args))
        for fragment, result in self.rules:
            if fragment in query:
                return result(args) if callable(result) else result
        raise AssertionError(f"unexpected query: {query}")


@pytest.fixture
def plpy():
    return FakePlpy()
