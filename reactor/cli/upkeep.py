"""The upkeep commands: ``reactor migrate`` (the schema), ``reactor sweep`` (a whole job table
reconciled and its backlog drained) and ``reactor hooks`` (the hook outbox). :mod:`reactor.cli`
parses their arguments and turns their errors into exit codes.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

import psycopg.errors

from reactor import db
from reactor.cli import extras
from reactor.cli.arguments import pairs_from, settings_from
from reactor.cli.served import fit_for_print, fit_pair, resolve_served, startup_connection
from reactor.errors import ConfigError, PrivilegeMissing, UsageError
from reactor.hooks import check_hooks
from reactor.install import sql
from reactor.settings import pairs
from reactor.settings.config import Settings
from reactor.telemetry import logs, tracing

if TYPE_CHECKING:
    from reactor.settings.pairs import Pair


async def cmd_migrate(args: argparse.Namespace) -> int:
    """``reactor migrate``: apply (or print) the migrations of every pair, idempotently; or
    print the grants every pair needs."""
    from reactor.cli import progress
    from reactor.install import grants

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
    served = pairs_from(args, settings)
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
    settings = settings_from(args)
    served = pairs_from(args, settings)
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
    from reactor.cli import progress
    from reactor.hooks import open_hooks
    from reactor.record.recorder import Recorder
    from reactor.telemetry.metrics import Metrics

    settings, install = pair.settings, pair.install
    pool = db.make_pool(settings.require_database(), max_size=1)
    # The runs a sweep writes get their hook rows like any other (a running replica runs them).
    async with open_hooks(settings, pool) as hooks, pool:
        database = db.Database.pooled(install, pool, settings=settings, hooks=list(hooks))
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


async def cmd_hooks(args: argparse.Namespace) -> int:
    """``reactor hooks list|retry|cancel``: look at and re-drive the hook outbox."""
    from reactor.hooks import ops as hook_ops

    action = args.hooks_command
    if action == "retry" and bool(args.failed) == bool(args.ids):
        raise UsageError("reactor hooks retry: give --failed or row ids, one of the two")
    ids = hook_ops.parse_ids(getattr(args, "ids", None) or [])
    if action == "list" and not (args.limit.isascii() and args.limit.isdigit()):
        raise UsageError(f"reactor hooks list: --limit {args.limit!r} is not a whole number")
    settings = settings_from(args)
    # No session settings, as for `reactor status`: DATABASE_URL may name a transaction pooler,
    # which would hand them on to the app's next transaction. Each statement here is one short
    # autocommit statement; the role's own bounds are enough for it.
    pair = pairs.named(pairs_from(args, settings), args.pair)
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
                rich=extras.installed("rich"),
            )
        except psycopg.errors.InsufficientPrivilege as error:
            raise PrivilegeMissing(
                f"cannot use the hook outbox: {db.first_line(error)}; grant what "
                "`reactor migrate --print-grants ROLE` prints, or run as the owner"
            ) from None
