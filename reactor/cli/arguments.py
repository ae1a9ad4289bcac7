"""The ``reactor`` command line as a contract: its sub-commands, flags and help (DESIGN.md's CLI
table); :mod:`reactor.cli` runs them. The CLI reference page is generated from it.

The flags that override a setting come from the settings' table
(:data:`reactor.settings.table.TABLE`): each command takes those whose row names it.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from reactor.cli.served import with_own_secrets
from reactor.settings import pairs
from reactor.settings.config import Settings
from reactor.settings.table import DASHBOARD_ADDR, FLAGGED, TABLE

if TYPE_CHECKING:
    from reactor.settings.pairs import Pair

LOG_FORMATS = ("json", "console")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with one sub-command per DESIGN.md's CLI table."""
    parser = argparse.ArgumentParser(
        prog="reactor",
        description="Records every finished job's run in PostgreSQL, once, right after its grace.",
    )
    # No defaults here: argparse checks only what is typed, and the environment's values must
    # be checked too (see _log_settings).
    parser.add_argument(
        "--log-level", help="debug, info, warning, error or critical (REACTOR_LOG_LEVEL; info)"
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="default: console on a terminal, json otherwise (REACTOR_LOG_FORMAT)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the sidecar until SIGTERM/SIGINT")
    _setting_flags(run, "run")

    migrate = commands.add_parser("migrate", help="install or upgrade the reactor's SQL")
    migrate.add_argument(
        "--reference-schema", action="store_true", help="also create the app's two tables"
    )
    output = migrate.add_mutually_exclusive_group()
    output.add_argument("--print", action="store_true", help="write the SQL to stdout instead")
    output.add_argument(
        "--print-grants",
        metavar="ROLE",
        help="write the GRANT statements the runtime role ROLE needs, and nothing else",
    )
    migrate.add_argument(
        "--from",
        dest="from_version",
        type=int,
        default=0,
        metavar="VERSION",
        help="with --print: only what comes after this applied schema version",
    )
    _setting_flags(migrate, "migrate")
    migrate.add_argument(
        "--notify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the job trigger notifies the reactors; --no-notify queues without it "
        "and the reactors poll (default: keep what is installed, notify on a first install)",
    )
    migrate.add_argument(
        "--spread",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the job trigger notifies each share of the jobs on a channel of its own, "
        "so that each replica of a fleet hears only its own (default: keep what is installed, "
        "not on a first install)",
    )

    sweep = commands.add_parser(
        "sweep", help="repair after a restore or bypass: a full reconcile pass, then a drain"
    )
    sweep.add_argument("--once", action="store_true", required=True, help="drain once and exit")
    _setting_flags(sweep, "sweep")

    state = commands.add_parser(
        "status", help="backlog, trim-horizon risk, hooks, LISTEN replicas; exit 1 if at risk"
    )
    state.add_argument("--json", action="store_true", help="print the stable JSON shape")

    hooks = commands.add_parser("hooks", help="list, re-queue or cancel follow-up hook calls")
    hooks.add_argument(
        "--pair", metavar="NAME", help="the pair's hooks (its reactor_schema), of several"
    )
    actions = hooks.add_subparsers(dest="hooks_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="pending, running and failed hook calls; exit 1 if any failed"
    )
    listing.add_argument("--failed", action="store_true", help="only the parked (failed) ones")
    listing.add_argument("--json", action="store_true", help="print the stable JSON shape")
    listing.add_argument("--limit", type=str, default="100", help="most rows shown (100)")
    retry = actions.add_parser(
        "retry", help="re-queue failed or cancelled hook calls, on a fresh schedule"
    )
    retry.add_argument("--failed", action="store_true", help="every failed hook call")
    retry.add_argument("ids", nargs="*", metavar="ID", help="row ids from `reactor hooks list`")
    cancel = actions.add_parser("cancel", help="cancel pending or failed hook calls")
    cancel.add_argument("ids", nargs="+", metavar="ID", help="row ids from `reactor hooks list`")

    init = commands.add_parser(
        "init",
        help="draft the mapping file of the app's own tables from the catalog; exit 2 while a "
        "TODO remains",
    )
    init.add_argument(
        "--jobs", metavar="TABLE", help="the job table (schema.table; unqualified: public)"
    )
    init.add_argument(
        "--runs", metavar="TABLE", help="the artifact table (schema.table; unqualified: public)"
    )
    init.add_argument(
        "--terminal",
        metavar="V1,V2,...",
        help="the status values of a finished job (numbers for an integer status)",
    )
    init.add_argument(
        "--role",
        metavar="NAME",
        help="also print the runtime role's CREATE ROLE and grants on stdout (alone: for the "
        "mapping files in force)",
    )
    init.add_argument(
        "-o", dest="output", metavar="FILE", help="write the mapping to FILE, a new file"
    )

    demo = commands.add_parser("demo", help="the whole loop on an embedded PostgreSQL")
    demo.add_argument("--jobs", type=int, default=300, help="jobs the worker finishes")
    demo.add_argument("--grace", type=float, default=2.0, help="grace window in seconds")
    demo.add_argument("--save-ratio", type=float, default=0.7, help="share of jobs a tab saves")
    demo.add_argument("--replicas", type=int, default=2, help="reactor replicas side by side")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument(
        "--hold",
        action="store_true",
        help="after the summary, keep the cluster and the page up until Ctrl-C",
    )
    demo.add_argument(
        "--http-addr", help=f"HOST:PORT of the page, or empty for none ({DASHBOARD_ADDR})"
    )
    demo.add_argument(
        "--config",
        metavar="FILE",
        help="the mapping of the app's tables (as REACTOR_CONFIG, which it overrides)",
    )
    demo.add_argument(
        "--schema",
        metavar="FILE",
        help="SQL that creates the app's tables first, e.g. pg_dump --schema-only of the app",
    )
    return parser


def _setting_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Add to ``parser`` the flag of each setting whose row names ``command``. No defaults and
    no types: the value is parsed as the variable's is, and an absent flag leaves it be."""
    for setting in TABLE:
        if setting.flag is not None and command in setting.flag.commands:
            takes = setting.flag.takes or setting.unit
            parser.add_argument(setting.option, help=f"{takes} ({setting.variable})")


def settings_from(args: argparse.Namespace) -> Settings:
    """The process settings: the environment, overridden by the settings' flags."""
    overrides = {setting.name: getattr(args, setting.name, None) for setting in FLAGGED}
    return Settings.from_env(os.environ, overrides)


def pairs_from(args: argparse.Namespace, settings: Settings) -> tuple[Pair, ...]:
    """The pairs every command runs on: the files REACTOR_CONFIG names, or the reference, each
    with the webhook secrets its own hooks read."""
    flags = frozenset(s.name for s in FLAGGED if getattr(args, s.name, None) is not None)
    return with_own_secrets(pairs.from_env(os.environ, settings, flags), settings)
