"""pg_dump / restore of a database that uses pg_mailbox (issue 7, finding 6; docs/backup.md).

A database with rows in flight -- outboxes (published, and captured with inline and
claim-check rows), consumer groups with committed offsets, live leases, numbered rows not yet
delivered and rows not yet numbered, a managed and an adopted inbox with ordering and pending,
processed and dead-letter messages -- is dumped with the PostgreSQL binaries of the server
under test, in plain format (restored by psql with ON_ERROR_STOP) and in custom format
(pg_restore --exit-on-error, in one job and with the parallel procedure of docs/backup.md),
into a new empty database. The restore must report no error, the state must equal the
original's, and the same calls made on both databases afterwards (polls with live and then
expired leases, commits, publishing, capture, inbox claims and marks) must give the same
answers.

test_restore_into_a_cluster_with_older_transaction_ids restores into a second, new cluster
whose transaction ids are behind the original's: offsets must continue there too.
"""

from __future__ import annotations

import re
import subprocess

import psycopg
import pytest
from dumps import (
    ROUTERS,
    STATE,
    _new_database,
    build_state,
    check_exercise,
    dump_and_restore,
    exercise,
    outbox_poll,
    state,
    state_at_version,
)
from groups import poll
from mbx import drop_role, make_role, scalar
from psycopg import sql
from snapshot import upgrade_sources

from pg_mailbox.cluster import Cluster, find_bindir


@pytest.fixture
def owner(db):
    """A role owning the captured table: roles live in the cluster, so the restored database
    on the same server has it too."""
    role = make_role(db)
    yield role
    drop_role(db, role)


def check_round_trip(db, dsn, pg_cluster, fmt, tmp_path):
    """Dump the database of db (at dsn), restore it into a new one: the same state, and the
    same answers to the same calls on both."""
    version = scalar(db, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'")
    before = state(db)
    with _new_database(pg_cluster.dsn()) as target_dsn:
        dump_and_restore(dsn, target_dsn, fmt, tmp_path)
        with psycopg.connect(target_dsn, autocommit=True) as restored:
            assert version == scalar(
                restored, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'"
            )
            after = state(restored)
            for name in STATE:
                assert after[name] == before[name], name
            # the routers come back arm-less (every call dynamic), and the named receives name
            # the dumped tables' oids; maintenance's step puts back exactly the original's
            # routers: the 8 key routers and 2 of the 3 named ones (part 35, named receive;
            # the state's one managed inbox is ordered, so the named mark's router has no arm)
            routers = db.execute(ROUTERS).fetchall()
            assert scalar(restored, "SELECT mailbox._inbox_refresh_routes()") == 10
            assert restored.execute(ROUTERS).fetchall() == routers
            got = exercise(restored)
    expected = exercise(db)
    check_exercise(expected)
    check_exercise(got)
    assert got == expected


@pytest.mark.parametrize("fmt", ["plain", "custom", "parallel"])
def test_dump_restores_a_working_database(db, dsn, pg_cluster, owner, fmt, tmp_path):
    build_state(db, owner)
    check_round_trip(db, dsn, pg_cluster, fmt, tmp_path)


def test_restore_into_a_cluster_with_older_transaction_ids(db, dsn, tmp_path):
    """A new cluster's transaction ids are behind the original's (the usual disaster
    recovery): rows not yet numbered, and every row published there, still get offsets,
    each exactly once."""
    # the original has used more transaction ids than the new cluster will have
    db.execute(
        "DO $$ BEGIN FOR i IN 1 .. 3000 LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$"
    )
    db.execute("SELECT mailbox.create_outbox('events')")
    db.execute("SELECT mailbox.create_consumer_group('g', 'events', 'earliest')")
    for n in range(1, 6):
        db.execute("SELECT mailbox.outbox_publish('events', %s)", [f'{{"n": {n}}}'])
    assert [r[0] for r in poll(db, "g", "c1", 2, 3600)] == [1, 2]
    assert scalar(db, "SELECT mailbox.commit_offset('g', 'c1', 2)") == 2
    for n in range(6, 9):  # not numbered before the dump
        db.execute("SELECT mailbox.outbox_publish('events', %s)", [f'{{"n": {n}}}'])
    # an outbox never polled: no offsets and the initial sequencer state
    db.execute("SELECT mailbox.create_outbox('quiet')")
    db.execute("SELECT mailbox.create_consumer_group('q', 'quiet', 'earliest')")
    for n in range(1, 4):
        db.execute("SELECT mailbox.outbox_publish('quiet', %s)", [f'{{"n": {n}}}'])
    with Cluster() as other:
        with _new_database(other.dsn()) as target_dsn:
            dump_and_restore(dsn, target_dsn, "custom", tmp_path)
            with psycopg.connect(target_dsn, autocommit=True) as restored:
                assert scalar(restored, "SELECT pg_current_xact_id()::text::bigint") < scalar(
                    db, "SELECT max(_xid::text::bigint) FROM mailbox._outbox_log"
                )
                seen = []

                def take(conn):
                    # poll and commit: one consumer id has one batch in flight
                    batch = outbox_poll(conn, "g", "c2", 100, 3600)
                    if batch:
                        conn.execute("SELECT mailbox.commit_offset('g', 'c2', %s)", [batch[-1][0]])
                    return batch

                # the first poll renumbers the restored outbox while a producer's
                # transaction is open; its row comes once it commits
                with psycopg.connect(target_dsn) as open_tx:
                    open_tx.execute("SELECT mailbox.outbox_publish('events', '{\"n\": 9}')")
                    restored.execute("SELECT mailbox.outbox_publish('events', '{\"n\": 10}')")
                    seen += take(restored)
                    assert sorted(r[2]["n"] for r in seen) == [3, 4, 5, 6, 7, 8, 10]
                    open_tx.commit()
                seen += take(restored)
                for n in range(11, 14):
                    restored.execute(
                        "SELECT mailbox.outbox_publish('events', %s)", [f'{{"n": {n}}}']
                    )
                    seen += take(restored)
                assert [r[0] for r in seen] == list(range(3, 14))
                assert sorted(r[2]["n"] for r in seen) == list(range(3, 14))
                assert take(restored) == []
                got = outbox_poll(restored, "q", "c", 100, 3600)
                assert [(r[0], r[2]["n"]) for r in got] == [(1, 1), (2, 2), (3, 3)]
                restored.execute("SELECT mailbox.commit_offset('q', 'c', 3)")
                restored.execute("SELECT mailbox.outbox_publish('quiet', '{\"n\": 4}')")
                got = outbox_poll(restored, "q", "c", 100, 3600)
                assert [(r[0], r[2]["n"]) for r in got] == [(4, 4)]


def test_every_table_and_sequence_of_the_extension_is_dumped(db):
    """pg_dump saves the rows of an extension's table only when the script registered it with
    pg_extension_config_dump: a table or sequence added without it would silently come back
    empty after a restore. (The partitioned log parents hold no rows; their partitions are
    not extension members and are dumped as ordinary tables.)"""
    members = {
        r[0]
        for r in db.execute(
            "SELECT c.oid::regclass::text FROM pg_depend AS d JOIN pg_class AS c ON c.oid = d.objid"
            " WHERE d.classid = 'pg_class'::regclass AND d.deptype = 'e'"
            " AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_mailbox')"
            " AND c.relkind IN ('r', 'S', 'p')"
        )
    }
    dumped = {
        r[0]
        for r in db.execute(
            "SELECT unnest(extconfig)::regclass::text FROM pg_extension"
            " WHERE extname = 'pg_mailbox'"
        )
    }
    # _outbox_waiter, _inbox_waiter and _owner_code_running are soft state of running sessions
    # (_inbox_waiting_until bounds _inbox_waiter's waits: a restore has none, nor a bound)
    assert members - dumped == {
        "mailbox._outbox_log",
        "mailbox._outbox_delta_rows",
        "mailbox._outbox_waiter",
        "mailbox._inbox_waiter",
        "mailbox._inbox_waiting_until",
        "mailbox._owner_code_running",
    }
    assert dumped <= members
    # and none carries a filter: the install script writes no rows into them
    assert scalar(
        db,
        "SELECT extcondition IS NULL OR array_to_string(extcondition, '') = ''"
        " FROM pg_extension WHERE extname = 'pg_mailbox'",
    )


@pytest.mark.parametrize("old", upgrade_sources())
def test_dump_restores_an_updated_database(fresh_dsn, pg_cluster, old, tmp_path):
    """A database made with the previous release and updated (ALTER EXTENSION UPDATE, which
    rebuilt the capture functions and the inbox code) dumps and restores like a fresh one:
    the regenerated objects are not extension members, so pg_dump keeps them."""
    with state_at_version(fresh_dsn, old) as db:
        db.execute("ALTER EXTENSION pg_mailbox UPDATE")
        assert old != scalar(db, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'")
        check_round_trip(db, fresh_dsn, pg_cluster, "custom", tmp_path)


@pytest.mark.parametrize("old", upgrade_sources())
def test_restore_an_old_dump_then_update(fresh_dsn, pg_cluster, old, tmp_path):
    """A dump taken on the previous release, restored on a server where the new version is
    installed (docs/upgrading.md, "Restoring an old dump"): the dump's CREATE EXTENSION names
    no version, so the empty database gets the extension at the dumped version first, the
    dump is restored without its schema and extension entries, and then updated."""
    bindir = find_bindir()
    env = {"PATH": "/usr/bin:/bin"}
    with state_at_version(fresh_dsn, old) as db:
        before = state(db)
        dump = tmp_path / "old.dump"
        run = [str(bindir / "pg_dump"), "--format=custom", "--file", str(dump), fresh_dsn]
        subprocess.run(run, env=env, check=True, capture_output=True, timeout=300)
        listed = subprocess.run(
            [str(bindir / "pg_restore"), "--list", str(dump)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines(keepends=True)
        skip = re.compile(
            r" (SCHEMA - mailbox|EXTENSION - pg_mailbox|COMMENT - EXTENSION pg_mailbox) "
        )
        kept = [line for line in listed if not skip.search(line)]
        assert len(listed) - len(kept) >= 2, "the schema and extension entries were found"
        (tmp_path / "restore.list").write_text("".join(kept))
        with _new_database(pg_cluster.dsn()) as target_dsn:
            with psycopg.connect(target_dsn, autocommit=True) as restored:
                restored.execute(
                    sql.SQL("CREATE EXTENSION pg_mailbox VERSION {} CASCADE").format(
                        sql.Literal(old)
                    )
                )
            done = subprocess.run(
                [
                    str(bindir / "pg_restore"),
                    "--exit-on-error",
                    "--use-list",
                    str(tmp_path / "restore.list"),
                    "--dbname",
                    target_dsn,
                    str(dump),
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr
            with psycopg.connect(target_dsn, autocommit=True) as restored:
                after = state(restored)
                for name in STATE:
                    assert after[name] == before[name], name
                restored.execute("ALTER EXTENSION pg_mailbox UPDATE")
                assert old != scalar(
                    restored, "SELECT extversion FROM pg_extension WHERE extname = 'pg_mailbox'"
                )
                check_exercise(exercise(restored))


def test_a_restore_by_another_superuser_works_after_maintenance(db, dsn, pg_cluster, tmp_path):
    """pg_dump's CREATE EXTENSION makes whoever restores the extension owner. A managed
    inbox's generated functions come back as the old owner's SECURITY INVOKER functions,
    which refuse to run as anyone else (42501); run_maintenance() regenerates them as that
    owner's SECURITY DEFINER functions (docs/backup.md)."""
    db.execute("SELECT mailbox.create_inbox('moved')")
    db.execute("SELECT mailbox.inbox_receive('moved', 'before', '{}')")
    restorer = make_role(db)
    db.execute(f'ALTER ROLE "{restorer}" SUPERUSER LOGIN')
    try:
        with _new_database(pg_cluster.dsn()) as target_dsn:
            as_restorer = psycopg.conninfo.make_conninfo(target_dsn, user=restorer)
            dump_and_restore(dsn, as_restorer, "custom", tmp_path)
            with psycopg.connect(as_restorer, autocommit=True) as restored:
                assert (
                    scalar(
                        restored,
                        "SELECT pg_get_userbyid(extowner) FROM pg_extension"
                        " WHERE extname = 'pg_mailbox'",
                    )
                    == restorer
                )
                with pytest.raises(psycopg.errors.InsufficientPrivilege, match="must run as"):
                    restored.execute("SELECT mailbox.inbox_receive('moved', 'a', '{}')")
                restored.execute("SELECT mailbox.run_maintenance()")
                assert scalar(restored, "SELECT mailbox.inbox_receive('moved', 'a', '{}')")
                got = restored.execute(
                    "SELECT event_id FROM mailbox.inbox_claim('moved', 'w', 10)"
                ).fetchall()
                assert sorted(r[0] for r in got) == ["a", "before"]
                # the table's owner (not the extension owner) owns them, so they are definers
                assert restored.execute(
                    "SELECT DISTINCT p.prosecdef, pg_get_userbyid(p.proowner) FROM pg_proc p"
                    " WHERE p.proname ~ '^_inbox_[0-9]+_receive$'"
                ).fetchall() == [(True, scalar(db, "SELECT current_user"))]
                restored.execute("DROP EXTENSION pg_mailbox CASCADE")
    finally:
        db.execute(f'ALTER ROLE "{restorer}" NOSUPERUSER')
        drop_role(db, restorer)
