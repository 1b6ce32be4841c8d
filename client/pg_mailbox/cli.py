"""The `pg-mailbox` command: relay, ingest, status, maintain, demo.

Options of every subcommand come from the flag, env ``PG_MAILBOX_<OPTION>``, a TOML
``--config`` file or the default, in that order (pg_mailbox.config). Exit codes: 0 done,
1 ``status --check`` found something degraded, 2 bad usage or config, 3 cannot start,
4 a poison message stopped the relay. Errors print a message and advice, no traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from pg_mailbox import __version__, config, demo, ingest, maintain, relay, status

EPILOG = (
    "Every option also comes from env PG_MAILBOX_<OPTION> (--batch-size -> "
    "PG_MAILBOX_BATCH_SIZE) or a TOML --config file (batch_size = 500); precedence: "
    "flag > env > file > default. Exit codes: 0 done, 1 degraded (status --check), "
    "2 bad usage, 3 cannot start, 4 poison message."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pg-mailbox",
        description="Tools for the pg_mailbox PostgreSQL extension.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def sub(name: str, module, help: str, description: str) -> None:  # noqa: A002
        p = commands.add_parser(name, help=help, description=description, epilog=EPILOG)
        module.add_arguments(p)
        p.set_defaults(func=module.run, _parser=p)

    sub(
        "relay",
        relay,
        "move outbox rows to a broker (outbox -> NATS, RabbitMQ, Redis, HTTP, an inbox)",
        "Consume a consumer group and publish every row to --sink, committing"
        " only what the sink acknowledged. See docs/relay.md.",
    )
    sub(
        "ingest",
        ingest,
        "move broker messages into an inbox",
        "Read --source (NATS JetStream, RabbitMQ, Redis streams) and inbox_receive every"
        " message into --inbox; the broker ack follows the inbox commit.",
    )
    sub(
        "status",
        status,
        "outboxes, groups, inboxes and recent alerts",
        "Show the state of every outbox, consumer group and inbox as a table (or --json);"
        " --check exits 1 when anything is degraded or critical.",
    )
    sub(
        "maintain",
        maintain,
        "run mailbox.run_maintenance() on an interval (when pg_cron is absent)",
        "Call mailbox.run_maintenance() every --interval seconds until SIGTERM.",
    )
    demo_parser = commands.add_parser(
        "demo",
        help="run the whole pipeline end to end on a throwaway cluster",
        description="Start a throwaway PostgreSQL cluster (or use --dsn), install pg_mailbox,"
        " and run orders -> captured outbox -> relay -> NATS (or the database's own inbox)"
        " -> ingest -> inbox end to end, with live progress and a closing summary.",
        epilog=EPILOG,
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.run, _parser=demo_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args._parser is not None:
            config.resolve(args._parser, args)
        return args.func(args)
    except config.MailboxCliError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # noqa: BLE001 - a message, not a traceback (SPEC §5.1)
        if os.environ.get("PG_MAILBOX_DEBUG"):
            raise
        print(
            f"pg-mailbox: unexpected error: {type(exc).__name__}: {exc}\n"
            "  rerun with PG_MAILBOX_DEBUG=1 for a traceback, and report it",
            file=sys.stderr,
        )
        return 1
