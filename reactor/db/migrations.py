"""The migration engine: what `reactor migrate` applies, in order.

Migrations run on a dedicated connection, one short transaction each, while the app keeps
writing (:mod:`.online_ddl` says how); the script `reactor migrate --print` prints instead is
:mod:`.script`'s, from the same statements.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from reactor.core.ownership import SHARES, share_channels
from reactor.db import drift, indexes
from reactor.db.fit import fit
from reactor.db.indexes import DropIndex, Index
from reactor.db.online_ddl import build, copied_by, migration_transaction
from reactor.db.queries import Database
from reactor.db.session import AnyConnection
from reactor.errors import ConfigError, InstallLocked, SchemaMissing, UntrustedSchema
from reactor.install import Install, sql
from reactor.install.mapping import Mapping
from reactor.install.quote import identifier, readable

# The package's one logger, named as the JSON log lines have always named it.
log = logging.getLogger("reactor.db")

# The migrations of two processes must not interleave. Once the reactor's schema exists they
# take turns by the lease on its install_lock row, which only its owner may change; before that
# (a first install, an upgrade from before migration 0021) by this advisory lock, which any role
# that can connect may take: any constant works, this one is ours.
MIGRATE_LOCK = 0x7265_6163  # "reac"
# How long a first install waits for the advisory lock, in seconds, before it gives up naming
# the session that holds it. Another `reactor migrate` holds it for its first transaction only
# (then it holds the row), which takes well under a second unless the app's locks hold it back.
FIRST_INSTALL_WAIT_S = 60.0
# The migration that made the install_lock table.
INSTALL_LOCK_SINCE = 21
# How often a waiting migrate asks for its turn again, in seconds.
_LOCK_POLL_S = 0.2


# The first schema version a mapping other than the reference could install (the baseline of
# schema.sql came with the mapping): the numbered migrations before it know only the reference
# tables, and the ones after it are rendered for any mapping.
MAPPED_SINCE = 14


@dataclass(frozen=True)
class Migrated:
    """What `reactor migrate` did: the install it left (the mapping typed by the catalog, the
    channel), and the migrations it applied (none when the schema was up to date)."""

    install: Install
    applied: list[int]
    # The indexes it did not build because the table has one that does the same, as
    # (the index it would have built, the table's own).
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # The install was recorded for another render of the mapping file, and this one re-installed
    # its functions and triggers for the file as it is now.
    reinstalled: bool = False


async def schema_version(conn: AnyConnection, schema: str) -> int | None:
    """The newest applied migration in the reactor's ``schema``, or None when it is absent."""
    versions = identifier(schema, "schema_version")
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (versions,))
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(f"SELECT max(version) FROM {versions}")
    row = await cur.fetchone()
    return row[0] if row else None


async def require_schema(conn: AnyConnection, schema: str) -> None:
    """Raise SchemaMissing unless every migration of this release is applied in ``schema``."""
    found = await schema_version(conn, schema)
    needed = sql.latest_version()
    if found is None or found < needed:
        have = "no reactor schema" if found is None else f"schema version {found}"
        raise SchemaMissing(
            f"the database has {have}, this reactor needs version {needed}; "
            "run `reactor migrate` (or apply `reactor migrate --print`)"
        )


async def migrate(
    conn: AnyConnection,
    mapping: Mapping,
    *,
    channel: str | None = None,
    reference_schema: bool = False,
    notify: bool | None = None,
    spread: bool | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Migrated:
    """Install or upgrade the reactor for ``mapping``'s tables, then walk the jobs once.

    Safe while the app writes, and safe to run concurrently: the install lock makes a second
    migrate wait, then find nothing to do (see :class:`InstallLock`). Each migration is its own
    short transaction that waits at most a second for the app's locks and is retried; index
    builds run CONCURRENTLY outside it. The triggers are always re-pointed at ``channel`` (None: the
    mapping's own), so changing REACTOR_CHANNEL takes effect; with ``notify`` False they queue
    without notifying, and with None they keep the choice installed (notifying on a first
    install). ``spread`` likewise: each share of the jobs on a channel of its own, so that a
    replica hears only its own (not on a first install).

    Last comes a full reconcile pass. The triggers exist and are committed by then, so a job
    that turned eligible before they did is found by the pass, and any later one by them:
    nothing finishing during the install falls between the two. ``on_progress`` hears the
    number of jobs walked so far.
    """
    # Unbounded: an index build over a big table takes what it takes, and only waits.
    await conn.execute("SELECT set_config('statement_timeout', '0', false)")
    lock = await InstallLock.take(conn, Install.of(mapping))
    try:
        # Trust before harm: the reactor's schema is made by this role, or is this role's own
        # with nothing of another's in it. Nothing is changed before both checks pass.
        fresh = await _own_schema(conn, mapping.reactor_schema)
        await Database.dedicated(Install.of(mapping), conn).require_trusted()
        if reference_schema:
            await migration_transaction(conn, sql.read("reference.sql"))
        # Checks before harm: nothing is changed until the mapping fits the app's tables.
        install = Install.of(
            await fit(conn, mapping, installing=True, reference_schema=reference_schema), channel
        )
        queries = Database.dedicated(install, conn)
        # How the job trigger notifies: as asked, else as installed, else the first install's.
        installed = await queries.job_trigger()
        if notify is None:
            notify = installed is None or installed.channel != ""
        if spread is None:
            spread = installed is not None and installed.spread
        spread = spreadable(install, spread)
        applied = await schema_version(conn, install.schema) or 0
        reinstalled = await drift.mapping_changed(conn, install)
        done = []
        if applied == 0:
            text = install.render(sql.baseline().text) + record_all_statement(install)
            if fresh:
                # Made here, or the install fails: a schema planted since the check above would
                # otherwise be adopted by the baseline's IF NOT EXISTS.
                text = f"CREATE SCHEMA {identifier(install.schema)};\n{text}"
            # One transaction: the schema and its versions appear together or not at all.
            await migration_transaction(conn, text)
            await lock.settle()
            done = [m.version for m in sql.migrations()]
        elif not install.mapping.is_reference and applied < MAPPED_SINCE:
            raise ConfigError(
                f"the reactor's schema here is at version {applied}, installed for the reference "
                f"tables; upgrade it to version {MAPPED_SINCE} with the reference mapping "
                "(REACTOR_CONFIG unset) first"
            )
        for migration in sql.migrations():
            if migration.version <= applied or applied == 0:
                continue
            steps = indexes.of_migration(migration.version, install)
            text = install.render(migration.text)
            if not steps:
                text += ";\n" + record_statement(install, migration)
            await migration_transaction(conn, text)
            await lock.settle()
            for step in steps:
                await build(conn, step)
            if steps:
                await migration_transaction(conn, record_statement(install, migration))
            done.append(migration.version)
        repeatable = sql.repeatable(install.mapping)
        text = install.render(
            repeatable.text, channel=install.channel if notify else "", spread=spread
        )
        # With the functions it stands for, in their transaction.
        await migration_transaction(conn, f"{text}\n{drift.record_statement(install)}")
        skipped = []
        for step in indexes.repeatable(install):
            copied = await copied_by(conn, step) if isinstance(step, Index) else None
            if copied is None or not isinstance(step, Index):
                await build(conn, step)
                continue
            skipped.append((readable(step.table[0], step.name), copied))
            # One an earlier migrate built before it looked (the (id, id) of a one-to-one job
            # table) is a copy too.
            await build(conn, DropIndex(step.table[0], step.name))
        # Nothing was made meanwhile by another role: the definer functions are trusted now.
        await queries.require_trusted()
        # After an install, the pass queues what finished before the triggers existed: that is
        # expected, not drift. After a plain re-run, whatever it finds is drift.
        owner = "install" if done else "migrate"
        await queries.reconcile_pass(owner, on_progress=on_progress)
    finally:
        await lock.release()
    return Migrated(install, done, skipped, reinstalled)


def spreadable(install: Install, spread: bool) -> bool:
    """``spread``, once the channel is known to take a share's suffix."""
    if spread and share_channels(install.channel) is None:
        raise ConfigError(
            f"the channel {install.channel!r} is too long for --spread: a share's channel "
            f"appends '.{SHARES - 1}', and a channel name is at most 63 bytes; set a shorter "
            "REACTOR_CHANNEL, or migrate with --no-spread"
        )
    return spread


async def _own_schema(conn: AnyConnection, schema: str) -> bool:
    """True when ``schema`` does not exist yet (the install makes it), False when the migrating
    role owns it; UntrustedSchema when another role does: a schema another role made may hold
    what that role wants the definer functions to run."""
    cur = await conn.execute(
        "SELECT pg_get_userbyid(nspowner)::text, current_user::text FROM pg_namespace "
        "WHERE nspname = %s",
        (schema,),
    )
    row = await cur.fetchone()
    if row is None:
        return True
    owner, me = row
    if owner != me:
        raise UntrustedSchema(
            f"schema {schema} exists and belongs to role {owner}, not to {me}, which runs "
            "`reactor migrate`; the reactor installs only into a schema it made itself: run "
            f"`reactor migrate` as {owner} if that role is the install's owner, else drop the "
            f"schema (DROP SCHEMA {readable(schema)} CASCADE) or set reactor_schema to a new one"
        )
    return False


class InstallLock:
    """The turn of one `reactor migrate` on a database, held from its first statement to its
    last, across its transactions and index builds.

    Once the reactor's schema has its install_lock table, the turn is the lease on that table's
    row: only the schema's owner may change it, so no other role can hold what a migrate waits
    for, and a holder that died frees it (the lease names its session). Before then (a first
    install, an upgrade from before migration 0021) it is :data:`MIGRATE_LOCK`, which any role
    may take: a first install waits for it at most :data:`FIRST_INSTALL_WAIT_S` seconds, then
    raises InstallLocked naming the session that holds it. The transaction that creates the
    table gives its row to this session (:meth:`settle` then lets the advisory lock go), so a
    migrate waiting on the advisory lock meanwhile finds the row and waits on it instead.
    """

    def __init__(self, conn: AnyConnection, install: Install) -> None:
        self.conn = conn
        self.install = install
        self.advisory = False
        self.leased = False

    @classmethod
    async def take(cls, conn: AnyConnection, install: Install) -> InstallLock:
        """Wait for this session's turn on ``install``'s schema; InstallLocked when a first
        install waited its bound, UntrustedSchema when the schema is not one to write to."""
        # Polled, never waited for inside a statement: a waiting statement holds a snapshot,
        # and the other migrate's CREATE INDEX CONCURRENTLY waits for every older snapshot to
        # end. Waiting in the lock would deadlock the two.
        lock = cls(conn, install)
        if not await lock._has_table():
            await lock._take_advisory()
            if not await lock._has_table():
                return lock
            # Another migrate installed the table while this one waited: take turns by it.
            await lock._unlock_advisory()
        await lock._take_lease()
        return lock

    async def settle(self) -> None:
        """After a transaction that may have created the install_lock table: once its row is
        this session's, the advisory lock is let go for the next migrate to find the row."""
        if self.advisory and await self._has_table() and await self._scalar("install_lock_ours"):
            self.leased = True
            await self._unlock_advisory()

    async def release(self) -> None:
        """Give the turn up."""
        if self.leased:
            await self.conn.execute(self.install.query("release_install_lock", _FILE))
            self.leased = False
        if self.advisory:
            await self._unlock_advisory()

    async def _has_table(self) -> bool:
        # The schema's owner is checked first: to_regclass needs USAGE on the schema, and a
        # table of a schema another role made is not ours to write to (nor its triggers').
        if await _own_schema(self.conn, self.install.schema):
            return False
        cur = await self.conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (identifier(self.install.schema, "install_lock"),)
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def _take_lease(self) -> None:
        # Trust before harm: the lease is an UPDATE, and a trigger on the table would run it.
        await Database.dedicated(self.install, self.conn).require_trusted()
        told = False
        while True:
            cur = await self.conn.execute(self.install.query("take_install_lock", _FILE))
            row = await cur.fetchone()
            if row is None:
                # Deleted by hand: put it back, free, and take it.
                await self.conn.execute(self.install.query("restore_install_lock", _FILE))
                continue
            taken, pid, user, application = row
            if taken:
                self.leased = True
                return
            if not told:
                log.info(
                    "another `reactor migrate` is running (pid %s, user %s); waiting for it to "
                    "finish",
                    pid,
                    user,
                    extra={"pid": pid, "user": user, "application_name": application},
                )
                told = True
            await anyio.sleep(_LOCK_POLL_S)

    async def _take_advisory(self) -> None:
        deadline = anyio.current_time() + FIRST_INSTALL_WAIT_S
        told = False
        while True:
            cur = await self.conn.execute("SELECT pg_try_advisory_lock(%s)", (MIGRATE_LOCK,))
            row = await cur.fetchone()
            if row and row[0]:
                self.advisory = True
                return
            if anyio.current_time() >= deadline:
                raise InstallLocked(await self._refusal())
            if not told:
                log.info("another `reactor migrate` is running; waiting for it to finish")
                told = True
            await anyio.sleep(_LOCK_POLL_S)

    async def _refusal(self) -> str:
        cur = await self.conn.execute(
            self.install.query("advisory_holder", _FILE), {"key": MIGRATE_LOCK}
        )
        row = await cur.fetchone()
        pid, user, application = row if row else (None, None, None)
        holder = (
            f"pid {pid}, user {user}, application_name {application!r}"
            if pid is not None
            else "a session that has just let go"
        )
        end = f"SELECT pg_terminate_backend({pid})" if pid is not None else "it"
        return (
            f"the install lock (advisory lock {MIGRATE_LOCK}) has been held for "
            f"{FIRST_INSTALL_WAIT_S:g}s by {holder}; nothing was changed: if that is not a "
            f"`reactor migrate`, end it ({end}) and run `reactor migrate` again"
        )

    async def _unlock_advisory(self) -> None:
        await self.conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))
        self.advisory = False

    async def _scalar(self, name: str) -> bool:
        cur = await self.conn.execute(self.install.query(name, _FILE))
        row = await cur.fetchone()
        return bool(row and row[0])


_FILE = "install_lock.sql"


def record_all_statement(install: Install) -> str:
    """Marks every migration applied: what a first install from the baseline leaves."""
    values = ", ".join(f"({m.version}, '{m.name}')" for m in sql.migrations())
    return (
        f"\nINSERT INTO {readable(install.schema, 'schema_version')} (version, name) "
        f"VALUES {values} ON CONFLICT DO NOTHING;"
    )


def record_statement(install: Install, migration: sql.Migration) -> str:
    """Marks ``migration`` applied."""
    return (
        f"INSERT INTO {readable(install.schema, 'schema_version')} (version, name) "
        f"VALUES ({migration.version}, '{migration.name}') ON CONFLICT DO NOTHING;"
    )
