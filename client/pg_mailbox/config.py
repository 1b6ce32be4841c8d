"""One option handling for every `pg-mailbox` subcommand (SPEC §5.1).

Each option is declared once with :func:`option`; its value comes from, in order of
precedence, the command line flag, the environment variable ``PG_MAILBOX_<OPTION>``
(``--batch-size`` -> ``PG_MAILBOX_BATCH_SIZE``), the TOML file named by ``--config``
(keys are the long option names with ``_``: ``batch_size = 500``) and the declared
default. ``--help`` shows every option's default and environment name.

Errors a user can fix raise :class:`StartupError` (exit 3) or :class:`UsageError`
(exit 2); :func:`pg_mailbox.cli.main` prints their message and advice, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "PG_MAILBOX_"

# exit codes (SPEC §5.1)
EXIT_OK = 0
EXIT_DEGRADED = 1  # status --check only
EXIT_USAGE = 2
EXIT_STARTUP = 3
EXIT_POISON = 4


class MailboxCliError(Exception):
    """An error with a message for a human and advice on what to do."""

    exit_code = 1

    def __init__(self, message: str, advice: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.advice = advice

    def render(self) -> str:
        text = f"pg-mailbox: error: {self.message}"
        if self.advice:
            text += f"\n  {self.advice}"
        return text


class UsageError(MailboxCliError):
    exit_code = EXIT_USAGE


class StartupError(MailboxCliError):
    """Cannot start: database unreachable, extension missing, unknown object, sink down."""

    exit_code = EXIT_STARTUP


class PoisonStop(MailboxCliError):
    """A poison message stopped the relay (--on-poison stop)."""

    exit_code = EXIT_POISON


_UNSET = object()


@dataclass
class Option:
    dest: str
    flag: str
    default: Any
    convert: Callable[[str], Any] | None
    is_flag: bool
    choices: tuple[str, ...] | None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


def _registry(parser: argparse.ArgumentParser) -> list[Option]:
    if not hasattr(parser, "_mailbox_options"):
        parser._mailbox_options = []  # type: ignore[attr-defined]
    return parser._mailbox_options  # type: ignore[attr-defined]


def option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: Any = None,
    type: Callable[[str], Any] | None = str,  # noqa: A002 - mirrors argparse
    help: str,  # noqa: A002
    flag_only: bool = False,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
) -> None:
    """Declare one option: a flag plus its env variable and config-file key."""
    dest = flag.lstrip("-").replace("-", "_")
    opt = Option(dest, flag, default, type, flag_only, choices)
    shown = "off" if flag_only and not default else default
    suffix = f" (default: {shown}; env {opt.env})"
    if choices:
        suffix = f" ({'|'.join(choices)})" + suffix
    if flag_only:
        parser.add_argument(
            flag, dest=dest, action="store_true", default=_UNSET, help=help + suffix
        )
    else:
        parser.add_argument(
            flag,
            dest=dest,
            default=_UNSET,
            metavar=metavar or dest.upper(),
            help=help + suffix,
            # validated in resolve(), where env and file values are checked the same way
        )
    _registry(parser).append(opt)


def add_common(parser: argparse.ArgumentParser, *, metrics: bool = True) -> None:
    """Options every subcommand has: --dsn, --config, --log-format, --metrics-port."""
    option(
        parser,
        "--dsn",
        default=None,
        help="libpq connection string or URI of the database; else libpq's PGHOST, PGPORT, ...",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=os.environ.get(ENV_PREFIX + "CONFIG"),
        help="TOML file of options, keys are the long option names with _ (env "
        f"{ENV_PREFIX}CONFIG)",
    )
    option(
        parser,
        "--log-format",
        default="text",
        choices=("text", "json"),
        help="log lines on stderr for humans (text) or machines (json)",
    )
    if metrics:
        option(
            parser,
            "--metrics-port",
            default=None,
            type=int,
            help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics; off when unset",
        )


def _convert(opt: Option, raw: Any, origin: str) -> Any:
    if raw is None:
        return None
    try:
        if opt.is_flag:
            value = raw if isinstance(raw, bool) else _bool(raw)
        elif opt.convert is None or opt.convert is str:
            value = str(raw)
        else:
            value = opt.convert(raw)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid value for {opt.flag} from {origin}: {raw!r} ({exc})") from None
    if opt.choices and value not in opt.choices:
        raise UsageError(
            f"invalid value for {opt.flag} from {origin}: {value!r}",
            f"choose one of: {', '.join(opt.choices)}",
        )
    return value


def load_file(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read config file {path}: {exc}") from None
    # keys may also use dashes; a [pg_mailbox] or [<command>] table is flattened in
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            continue
        flat[key.replace("-", "_")] = value
    return flat


def resolve(
    parser: argparse.ArgumentParser, args: argparse.Namespace, environ: dict | None = None
) -> argparse.Namespace:
    """Fill every declared option by precedence flag > env > file > default (in place)."""
    environ = os.environ if environ is None else environ
    file_values = load_file(getattr(args, "config", None))
    known = {o.dest for o in _registry(parser)} | {"config"}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise UsageError(
            f"unknown option(s) in {args.config}: {', '.join(unknown)}",
            f"valid keys: {', '.join(sorted(known - {'config'}))}",
        )
    for opt in _registry(parser):
        given = getattr(args, opt.dest, _UNSET)
        if given is not _UNSET:
            value = _convert(opt, given, opt.flag)
        elif opt.env in environ:
            value = _convert(opt, environ[opt.env], f"env {opt.env}")
        elif opt.dest in file_values:
            value = _convert(opt, file_values[opt.dest], f"{args.config} key {opt.dest}")
        else:
            value = opt.default
        setattr(args, opt.dest, value)
    if getattr(args, "dsn", None) is None:
        args.dsn = ""  # libpq reads PGHOST, PGPORT, ... itself
    return args


def parse_float(text: str) -> float:
    return float(text)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be 1 or more")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be more than 0")
    return value
