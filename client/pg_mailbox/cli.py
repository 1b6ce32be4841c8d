"""The `pg-mailbox` command."""

from __future__ import annotations

import argparse

from pg_mailbox import __version__, demo, maintain


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pg-mailbox", description="Tools for the pg_mailbox PostgreSQL extension."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo_parser = commands.add_parser(
        "demo",
        help="show the outbox end to end on a throwaway cluster",
        description="Start a throwaway PostgreSQL cluster (or use --dsn), install pg_mailbox,"
        " capture a table, publish an event and show what arrived.",
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.run)
    maintain_parser = commands.add_parser(
        "maintain",
        help="run mailbox.run_maintenance() on an interval (when pg_cron is absent)",
        description="Call mailbox.run_maintenance() every --interval seconds until SIGTERM.",
    )
    maintain.add_arguments(maintain_parser)
    maintain_parser.set_defaults(func=maintain.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
