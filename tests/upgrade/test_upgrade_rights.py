"""Who may install and update pg_mailbox (docs/upgrading.md, "Who runs the update").

pg_mailbox needs plpython3u, an untrusted language, so the control file says
superuser = true, trusted = false. PostgreSQL checks two things for ALTER EXTENSION UPDATE:
the caller owns the extension (its creator: a superuser, as CREATE EXTENSION needed one;
there is no ALTER EXTENSION OWNER), and, for a superuser = true extension, is a superuser
now. So a non-superuser can never run the update, not even the extension's own owner once it
lost SUPERUSER, nor the database owner. These tests pin the errors, and that nothing
changed after them.
"""

import psycopg
import pytest
from mbx import drop_role, raises, scalar
from psycopg import sql
from snapshot import schema_snapshot, upgrade_sources


@pytest.fixture
def database_owner(fresh_dsn):
    """A non-superuser LOGIN role owning the test database, with CREATE on it."""
    with psycopg.connect(fresh_dsn, autocommit=True) as su:
        name = "t_dbowner_" + su.info.dbname[-8:]
        su.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE").format(sql.Identifier(name)))
        su.execute(
            sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                sql.Identifier(su.info.dbname), sql.Identifier(name)
            )
        )
    yield name
    with psycopg.connect(fresh_dsn, autocommit=True) as su:
        su.execute(
            sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(
                sql.Identifier(su.info.dbname)
            )
        )
        drop_role(su, name)


@pytest.mark.parametrize("old", upgrade_sources())
def test_only_a_superuser_updates(fresh_dsn, database_owner, old):
    with psycopg.connect(fresh_dsn, autocommit=True) as su:
        su.execute(
            sql.SQL("CREATE EXTENSION pg_mailbox VERSION {} CASCADE").format(sql.Literal(old))
        )
        before = schema_snapshot(su)
        # the database owner, even granted what the extension's objects need
        su.execute(sql.SQL("GRANT mailbox_admin TO {}").format(sql.Identifier(database_owner)))
        su.execute(
            sql.SQL("GRANT CREATE ON SCHEMA mailbox TO {}").format(sql.Identifier(database_owner))
        )
        with psycopg.connect(fresh_dsn, user=database_owner, autocommit=True) as owner:
            with raises("42501") as info:
                owner.execute("ALTER EXTENSION pg_mailbox UPDATE")
            assert info.value.diag.message_primary == "must be owner of extension pg_mailbox"
        su.execute(
            sql.SQL("REVOKE CREATE ON SCHEMA mailbox FROM {}").format(
                sql.Identifier(database_owner)
            )
        )
        su.execute(sql.SQL("REVOKE mailbox_admin FROM {}").format(sql.Identifier(database_owner)))
        assert scalar(su, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'") == old
        assert schema_snapshot(su) == before
        # the superuser can, and the database owner then uses it through the mailbox_* roles
        su.execute("ALTER EXTENSION pg_mailbox UPDATE")
        assert scalar(su, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'") != old
        su.execute(sql.SQL("GRANT mailbox_admin TO {}").format(sql.Identifier(database_owner)))
        with psycopg.connect(fresh_dsn, user=database_owner, autocommit=True) as owner:
            owner.execute("SELECT mailbox.create_outbox('after_update')")
            owner.execute("SELECT mailbox.outbox_publish('after_update', '{}')")
            assert scalar(owner, "SELECT count(*) FROM mailbox.outboxes") == 1
        su.execute("SELECT mailbox.drop_outbox('after_update')")
        su.execute(sql.SQL("REVOKE mailbox_admin FROM {}").format(sql.Identifier(database_owner)))


def test_only_a_superuser_installs(fresh_dsn, database_owner):
    with psycopg.connect(fresh_dsn, user=database_owner, autocommit=True) as owner:
        with raises("42501") as info:
            owner.execute("CREATE EXTENSION pg_mailbox CASCADE")
        # plpython3u comes first (CASCADE); either way: superuser only
        assert "permission denied" in info.value.diag.message_primary
        assert "superuser" in (info.value.diag.message_hint or "")
        assert scalar(owner, "SELECT count(*) FROM pg_extension WHERE extname = 'pg_mailbox'") == 0


@pytest.mark.parametrize("old", upgrade_sources())
def test_the_owner_without_superuser_cannot_update(fresh_dsn, old):
    """The extension's owner is the superuser who created it; without SUPERUSER it cannot
    update it either."""
    with psycopg.connect(fresh_dsn, autocommit=True) as su:
        name = "t_extowner_" + su.info.dbname[-8:]
        su.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(name)))
        try:
            with psycopg.connect(fresh_dsn, user=name, autocommit=True) as owner:
                owner.execute(
                    sql.SQL("CREATE EXTENSION pg_mailbox VERSION {} CASCADE").format(
                        sql.Literal(old)
                    )
                )
                su.execute(sql.SQL("ALTER ROLE {} NOSUPERUSER").format(sql.Identifier(name)))
                with raises("42501") as info:
                    owner.execute("ALTER EXTENSION pg_mailbox UPDATE")
                assert info.value.diag.message_primary == (
                    'permission denied to update extension "pg_mailbox"'
                )
                assert info.value.diag.message_hint == (
                    "Must be superuser to update this extension."
                )
                assert (
                    scalar(
                        owner, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'"
                    )
                    == old
                )
                su.execute(sql.SQL("ALTER ROLE {} SUPERUSER").format(sql.Identifier(name)))
                owner.execute("ALTER EXTENSION pg_mailbox UPDATE")
                assert (
                    scalar(
                        owner, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'"
                    )
                    != old
                )
        finally:
            su.execute("DROP EXTENSION IF EXISTS pg_mailbox CASCADE")
            su.execute(sql.SQL("ALTER ROLE {} NOSUPERUSER").format(sql.Identifier(name)))
            drop_role(su, name)
