"""How PL/Python finds mailbox_server, and the version guard (docs/design.md)."""

import re
from pathlib import Path

import psycopg
import pytest
from mbx import raises, scalar
from psycopg import sql
from snapshot import upgrade_sources

CONTROL = Path(__file__).resolve().parents[2] / "pg_mailbox.control"
VERSION = re.search(r"default_version\s*=\s*'([^']+)'", CONTROL.read_text()).group(1)


def loaded_version(conn):
    conn.execute("""CREATE OR REPLACE FUNCTION public.loaded_mailbox_server() RETURNS text
                    LANGUAGE plpython3u AS $$
import sys
m = sys.modules.get("mailbox_server")
return None if m is None else m.__version__ + " " + m.__file__
$$""")
    return scalar(conn, "SELECT public.loaded_mailbox_server()")


def test_package_is_loaded_from_the_versioned_install_dir(db):
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("SELECT mailbox.outbox_status('e')")
    version, path = loaded_version(db).split(" ", 1)
    assert version == VERSION
    assert f"/extension/pg_mailbox/python/{VERSION}/mailbox_server/" in path


def test_a_session_holding_another_version_reloads_before_running(db):
    """A pooled session that imported another version (as after ALTER EXTENSION UPDATE)
    must not run it: the next call sees the guard mismatch and reloads."""
    db.execute("SELECT mailbox.create_outbox('e')")
    db.execute("""DO LANGUAGE plpython3u $$
import sys, types
stale = types.ModuleType("mailbox_server")
stale.__version__ = "0.0.0-stale"
sys.modules["mailbox_server"] = stale
sys.modules["mailbox_server.outbox_status"] = types.ModuleType("mailbox_server.outbox_status")
GD["mailbox.version"] = "0.0.0-stale"
$$""")
    assert scalar(db, "SELECT mailbox.outbox_status('e')")["outbox"] == "e"
    assert loaded_version(db).split(" ")[0] == VERSION


def test_python_bodies_carry_the_control_version(db):
    bodies = db.execute("""SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_language l
                             ON l.oid = p.prolang
                            WHERE l.lanname = 'plpython3u'
                              AND p.pronamespace = 'mailbox'::regnamespace""").fetchall()
    assert bodies
    for name, src in bodies:
        assert f'"{VERSION}"' in src, name


def test_unwrap_raises_the_envelope_error_with_its_fields(db):
    envelope = (
        '{"error": {"sqlstate": "42704", "message": "outbox not found: x",'
        ' "detail": "d", "hint": "h"}}'
    )
    with raises("42704") as info:
        db.execute("SELECT mailbox._unwrap(%s::jsonb)", [envelope])
    diag = info.value.diag
    assert (diag.message_primary, diag.message_detail, diag.message_hint) == (
        "outbox not found: x",
        "d",
        "h",
    )
    assert scalar(db, "SELECT mailbox._unwrap('{\"result\": [1]}')") == [1]


@pytest.mark.parametrize("old", upgrade_sources())
def test_a_database_on_an_older_version_loads_its_own_python(fresh_dsn, old):
    """Installing a new version leaves the old one's Python in python/<old>/: a database
    still on the old version runs it, and the same session, once the database is updated,
    reloads the new version's on its next call (the version guard)."""
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE EXTENSION pg_mailbox VERSION {} CASCADE").format(sql.Literal(old))
        )
        conn.execute("SELECT mailbox.create_outbox('e')")
        assert scalar(conn, "SELECT mailbox.outbox_status('e')")["outbox"] == "e"
        version, path = loaded_version(conn).split(" ", 1)
        assert version == old
        assert f"/extension/pg_mailbox/python/{old}/mailbox_server/" in path
        conn.execute("ALTER EXTENSION pg_mailbox UPDATE")
        assert scalar(conn, "SELECT mailbox.outbox_status('e')")["outbox"] == "e"
        version, path = loaded_version(conn).split(" ", 1)
        assert version == VERSION
        assert f"/extension/pg_mailbox/python/{VERSION}/mailbox_server/" in path
