"""The `pg-mailbox` command's shared option handling (SPEC §5.1): --help, precedence
flag > env > file > default, exit codes with advice and never a traceback."""

import pytest
from relayhelp import cli, setup_outbox

from pg_mailbox import cli as cli_module
from pg_mailbox import config

BAD_DSN = "host=127.0.0.1 port=1 dbname=nope connect_timeout=2"


def resolved(argv, environ=None):
    parser = cli_module.build_parser()
    args = parser.parse_args(argv)
    return config.resolve(args._parser, args, environ or {})


@pytest.mark.parametrize("command", ["relay", "ingest", "status", "maintain"])
def test_help_names_every_option_with_default_and_env(command):
    got = cli(command, "--help")
    assert got.returncode == 0
    text = " ".join(got.stdout.split())
    for flag in ("--dsn", "--config", "--log-format"):
        assert flag in text
    assert "env PG_MAILBOX_DSN" in text and "flag > env > file > default" in text
    if command == "relay":
        for flag in (
            "--group",
            "--sink",
            "--outbox",
            "--start",
            "--consumer",
            "--batch-size",
            "--visibility",
            "--poll-interval",
            "--once",
            "--max-attempts",
            "--on-poison",
            "--metrics-port",
        ):
            assert flag in text
        assert "(default: 100; env PG_MAILBOX_BATCH_SIZE)" in text
        assert "(stop|skip|park) (default: stop; env PG_MAILBOX_ON_POISON)" in text


def test_precedence_flag_env_file_default(tmp_path):
    cfg = tmp_path / "relay.toml"
    cfg.write_text('batch_size = 500\nvisibility = 45\npoll_interval = 2.5\ngroup = "from_file"\n')
    base = ["relay", "--config", str(cfg), "--sink", "stdout:"]
    env = {"PG_MAILBOX_BATCH_SIZE": "700", "PG_MAILBOX_VISIBILITY": "50"}
    args = resolved([*base, "--batch-size", "900"], env)
    assert args.batch_size == 900  # flag beats env and file
    assert args.visibility == 50  # env beats file
    assert args.poll_interval == 2.5 and args.group == "from_file"  # file beats default
    assert args.max_attempts == 10 and args.on_poison == "stop"  # defaults
    assert resolved(["relay", "--once"]).once is True
    assert resolved(["relay"], {"PG_MAILBOX_ONCE": "true"}).once is True
    assert resolved(["relay"]).once is False


def test_precedence_end_to_end_through_the_dsn(db, dsn, tmp_path):
    """The DSN decides whether the command can start: flag > env > file, observed."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"dsn = '{dsn}'\n")
    assert cli("status", "--json", "--config", str(cfg)).returncode == 0
    # env beats the file
    got = cli("status", "--config", str(cfg), env={"PG_MAILBOX_DSN": BAD_DSN})
    assert got.returncode == 3 and "cannot connect" in got.stderr
    # the flag beats env
    got = cli("status", "--json", "--dsn", dsn, env={"PG_MAILBOX_DSN": BAD_DSN})
    assert got.returncode == 0, got.stderr


def test_bad_values_exit_2_with_a_message(tmp_path):
    got = cli("relay", "--batch-size", "zero", "--group", "g", "--sink", "stdout:")
    assert got.returncode == 2 and "--batch-size" in got.stderr
    got = cli("relay", "--group", "g", "--sink", "stdout:", env={"PG_MAILBOX_ON_POISON": "explode"})
    assert got.returncode == 2 and "stop, skip, park" in got.stderr
    cfg = tmp_path / "bad.toml"
    cfg.write_text("batch_sise = 5\n")
    got = cli("relay", "--config", str(cfg))
    assert got.returncode == 2 and "batch_sise" in got.stderr
    got = cli("relay", "--group", "g", "--sink", "kafka://x")
    assert got.returncode == 2 and "unknown sink scheme" in got.stderr
    for g in (got,):
        assert "Traceback" not in g.stderr


def test_unreachable_database_exits_3_with_advice():
    for command in (
        ["relay", "--group", "g", "--sink", "stdout:"],
        ["status"],
        ["ingest", "--inbox", "i", "--source", "redis://127.0.0.1:6379/0?stream=s&group=g"],
        ["maintain", "--once"],
    ):
        got = cli(*command, "--dsn", BAD_DSN)
        assert got.returncode == 3, (command, got.stderr)
        assert "cannot connect to the database" in got.stderr
        assert "PG_MAILBOX_DSN" in got.stderr and "Traceback" not in got.stderr


def test_missing_extension_exits_3_with_advice(fresh_dsn):
    for command in (
        ["relay", "--group", "g", "--sink", "stdout:"],
        ["status"],
        ["maintain", "--once"],
    ):
        got = cli(*command, "--dsn", fresh_dsn)
        assert got.returncode == 3, (command, got.stderr)
        assert "CREATE EXTENSION pg_mailbox" in got.stderr and "Traceback" not in got.stderr


def test_unknown_group_outbox_and_inbox_exit_3(db, dsn):
    got = cli("relay", "--dsn", dsn, "--group", "nope", "--sink", "stdout:")
    assert got.returncode == 3
    assert "consumer group not found: nope" in got.stderr
    assert "mailbox.create_consumer_group('nope'" in got.stderr
    got = cli("relay", "--dsn", dsn, "--group", "nope", "--outbox", "missing", "--sink", "stdout:")
    assert got.returncode == 3 and "cannot create consumer group" in got.stderr
    got = cli(
        "ingest",
        "--dsn",
        dsn,
        "--inbox",
        "nope",
        "--source",
        "redis://127.0.0.1:6379/0?stream=s&group=g",
    )
    assert got.returncode == 3 and "inbox not found: nope" in got.stderr
    for g in (got,):
        assert "Traceback" not in g.stderr


def test_outbox_option_creates_the_group(db, dsn):
    db.execute("SELECT mailbox.create_outbox('e')")
    got = cli(
        "relay",
        "--dsn",
        dsn,
        "--group",
        "new",
        "--outbox",
        "e",
        "--start",
        "earliest",
        "--sink",
        "stdout:",
        "--once",
    )
    assert got.returncode == 0, got.stderr
    assert (
        db.execute(
            "SELECT auto_offset_reset FROM mailbox.consumer_group_lag WHERE group_name = 'new'"
        ).fetchone()[0]
        == "earliest"
    )


def test_unreachable_sink_exits_3(db, dsn):
    setup_outbox(db)
    got = cli("relay", "--dsn", dsn, "--group", "g", "--sink", "nats://127.0.0.1:1?stream=S")
    assert got.returncode == 3 and "sink unreachable" in got.stderr
    assert "Traceback" not in got.stderr


def test_park_without_outbox_park_exits_3(db, dsn):
    """mailbox.outbox_park comes with partitioned outboxes; until then park cannot start."""
    setup_outbox(db)
    has_park = db.execute(
        "SELECT to_regprocedure('mailbox.outbox_park(text, text, bigint, text)') IS NOT NULL"
    ).fetchone()[0]
    got = cli(
        "relay", "--dsn", dsn, "--group", "g", "--sink", "stdout:", "--once", "--on-poison", "park"
    )
    if has_park:
        assert got.returncode == 0, got.stderr
    else:
        assert got.returncode == 3 and "outbox_park" in got.stderr


def test_status_json_table_and_check(db, dsn):
    setup_outbox(db)
    db.execute("SELECT mailbox.create_inbox('ib')")
    got = cli("status", "--dsn", dsn, "--json", "--check")
    assert got.returncode == 0, got.stderr
    import json

    data = json.loads(got.stdout)
    assert [o["outbox"] for o in data["outboxes"]] == ["e"]
    assert data["groups"][0]["group"] == "g" and data["healthy"] is True
    assert data["inboxes"][0]["inbox_name"] == "ib"
    table = cli("status", "--dsn", dsn)
    assert table.returncode == 0 and "consumer groups" in table.stdout and "ib" in table.stdout
    # a dead letter makes the inbox degraded: --check exits 1
    db.execute("SELECT mailbox.inbox_receive('ib', 'x1', '{}')")
    for _ in range(4):
        db.execute("SELECT mailbox.inbox_mark_failed('ib', 'x1', 'boom')")
    got = cli("status", "--dsn", dsn, "--json", "--check")
    assert got.returncode == 1, got.stdout
    assert json.loads(got.stdout)["problems"]
