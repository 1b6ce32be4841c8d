"""The settings registry (sql/04_settings.sql, docs/configuration.md).

Every mailbox.* setting is one row of mailbox._settings(); the SQL and server-side Python
code read settings only through it, so no call site repeats a default or a bound, and the
configuration page lists exactly its rows.
"""

import re
from pathlib import Path

import psycopg
import pytest
from mbx import raises, rows, scalar

ROOT = Path(__file__).resolve().parents[2]
DOC_ROW = re.compile(r"^\| `mailbox\.(\w+)` \| ([^|]+) \| ([^|]+) \|")


def registry(db):
    return {
        r[0]: r[1:]
        for r in rows(
            db,
            "SELECT name, kind, default_value, min_value, max_value, area"
            " FROM mailbox._settings() ORDER BY name",
        )
    }


def documented():
    """(name -> (default, range, section)) from docs/configuration.md's tables."""
    found, section = {}, None
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        m = DOC_ROW.match(line)
        if m:
            assert m.group(1) not in found, f"mailbox.{m.group(1)} is listed twice"
            found[m.group(1)] = (m.group(2).strip(), m.group(3).strip(), section)
    return found


AREA_SECTION = {
    "outbox": "Outbox",
    "groups": "Consumer groups",
    "alerts": "Alerts",
    "inbox": "Inbox",
}


def test_the_configuration_page_lists_exactly_the_registry(db):
    reg, doc = registry(db), documented()
    assert sorted(doc) == sorted(reg), "docs/configuration.md and mailbox._settings() differ"
    for name, (kind, default, low, high, area) in reg.items():
        doc_default, doc_range, section = doc[name]
        assert doc_default == default, name
        if kind == "int":
            assert doc_range == f"{low} … {high}", name
        else:
            assert doc_range == "on/off", name
        assert section == AREA_SECTION[area], name


def call_sites():
    """(kind, name, where) of every setting read in sql/ and plpython/."""
    pats = [
        re.compile(r"_setting_(int|bool)\('(\w+)'"),
        re.compile(r"settings\.get_(int|bool)\(plpy, \"(\w+)\""),
        re.compile(r"_setting_default\('(\w+)'\)"),
    ]
    sites = []
    files = sorted((ROOT / "sql").glob("**/*.sql")) + sorted(
        (ROOT / "plpython" / "mailbox_server").glob("*.py")
    )
    for f in files:
        text = f.read_text()
        for i, pat in enumerate(pats):
            for m in pat.finditer(text):
                kind, name = (None, m.group(1)) if i == 2 else (m.group(1), m.group(2))
                sites.append((kind, name, f.name))
    return sites


def test_every_setting_read_in_the_code_is_in_the_registry_with_its_kind(db):
    reg = registry(db)
    sites = call_sites()
    assert len(sites) >= 20, sites  # the patterns still find the call sites
    for kind, name, where in sites:
        assert name in reg, f"{where} reads mailbox.{name}, which is not in the registry"
        assert kind in (None, reg[name][0]), f"{where} reads mailbox.{name} as {kind}"
    unused = set(reg) - {name for _, name, _ in sites}
    assert not unused, f"registry rows nothing reads: {sorted(unused)}"


def test_no_call_site_repeats_a_default_or_a_bound():
    for f in sorted((ROOT / "sql").glob("**/*.sql")) + sorted(
        (ROOT / "plpython" / "mailbox_server").glob("*.py")
    ):
        text = f.read_text()
        assert not re.search(r"_setting_(int|bool)\('\w+',", text), f.name
        for m in re.finditer(r"current_setting\('mailbox\.(\w*)", text):
            # 04 is the registry's own parser; numberer_verified is a session marker, not a
            # setting; 13 generates capture code that reads the GUC only when it is set, with
            # the registry's default written in where it is not (_setting_default)
            allowed = f.name in ("04_settings.sql", "13_outbox_capture_code.sql")
            allowed = allowed or m.group(1) == "numberer_verified"
            assert allowed, f"{f.name} reads mailbox.{m.group(1)} around the registry"


def test_every_default_is_valid_and_unset_means_the_default(db):
    for name, (kind, default, low, high, _area) in registry(db).items():
        if kind == "int":
            assert low <= int(default) <= high, name
            assert scalar(db, "SELECT mailbox._setting_int(%s)", [name]) == int(default)
        else:
            assert default in ("on", "off"), name
            assert scalar(db, "SELECT mailbox._setting_bool(%s)", [name]) == (default == "on")


@pytest.mark.parametrize("edge", ["min", "max"])
def test_bounds_are_inclusive_and_one_past_is_22023_naming_the_setting(db, edge):
    for name, (kind, default, low, high, _area) in registry(db).items():
        if kind != "int":
            continue
        ok, bad = (low, low - 1) if edge == "min" else (high, high + 1)
        db.execute(f"SET mailbox.{name} = '{ok}'")
        assert scalar(db, "SELECT mailbox._setting_int(%s)", [name]) == ok
        db.execute(f"SET mailbox.{name} = '{bad}'")
        with raises("22023") as e:
            db.execute("SELECT mailbox._setting_int(%s)", [name])
        assert f"mailbox.{name}" in e.value.diag.message_primary
        assert f"from {low} to {high} (default {default})" in e.value.diag.message_hint
        db.execute(f"RESET mailbox.{name}")


def test_a_bad_value_is_22023_with_a_hint_for_both_kinds(db):
    db.execute("SET mailbox.outbox_chunk_rows = 'lots'")
    with raises("22023") as e:
        db.execute("SELECT mailbox._setting_int('outbox_chunk_rows')")
    assert (
        e.value.diag.message_primary
        == "invalid value for setting mailbox.outbox_chunk_rows: 'lots'"
    )
    db.execute("SET mailbox.outbox_force_retention = 'maybe'")
    with raises("22023") as e:
        db.execute("SELECT mailbox._setting_bool('outbox_force_retention')")
    assert (
        e.value.diag.message_hint == "mailbox.outbox_force_retention takes on or off (default off)."
    )
    db.execute("SET mailbox.outbox_force_retention = 'YES '")
    assert scalar(db, "SELECT mailbox._setting_bool('outbox_force_retention')") is True


def test_an_unknown_name_is_a_bug_not_a_default(db):
    with pytest.raises(psycopg.errors.InternalError_) as e:
        db.execute("SELECT mailbox._setting_int('no_such_setting')")
    assert "no int setting mailbox.no_such_setting" in str(e.value)
    with pytest.raises(psycopg.errors.InternalError_):
        db.execute("SELECT mailbox._setting_bool('outbox_chunk_rows')")  # wrong kind


def test_the_registry_is_not_callable_by_public(db, connect):
    db.execute("CREATE ROLE nobody_s LOGIN")
    try:
        c = connect(user="nobody_s")
        with raises("42501"):
            c.execute("SELECT * FROM mailbox._settings()")
    finally:
        db.execute("DROP ROLE nobody_s")
