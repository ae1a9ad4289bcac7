"""What a command runs on, resolved against the database once at its start.

Each pair a command serves is checked against the catalog (:func:`reactor.db.fit` types its
mapping), its reactor schema, the schema's trust and the role's grants, into the
:class:`~reactor.settings.pairs.Pair` the command then passes everywhere: nothing downstream builds
an install again. A pair's own trouble leaves only that pair out when there are others. Before
that, each pair is given the webhook secrets its own hooks read (:func:`with_own_secrets`).
"""

from __future__ import annotations

import psycopg.errors

from reactor import db
from reactor.errors import (
    ConfigError,
    PrivilegeMissing,
    ReactorError,
    SchemaMissing,
    UntrustedSchema,
)
from reactor.hooks import secrets
from reactor.hooks.spec import secret_readers
from reactor.install.mapping import Mapping
from reactor.settings.config import ProcessSettings, Settings
from reactor.settings.pairs import Pair


def known_error(error: BaseException) -> ReactorError | None:
    """The user-facing error ``error`` stands for (looking inside a task group's exception
    group), or None for a bug, which keeps its traceback."""
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return known_error(error.exceptions[0])
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


def with_own_secrets(served: tuple[Pair, ...], settings: Settings) -> tuple[Pair, ...]:
    """``served``, each pair holding the webhook secrets of ``settings`` (the process's) that
    its own hooks read, and no other (:func:`reactor.hooks.secrets.own_secrets`); ConfigError,
    before anything connects, for a secret that no webhook or two pairs' webhooks would read."""
    webhooks = {pair.name: secret_readers(pair.settings.hooks) for pair in served}
    return secrets.own_secrets(served, webhooks, settings)


async def startup_connection(
    settings: ProcessSettings, role: str, *, standby: db.StandbyPolicy = "refuse"
) -> db.AnyConnection:
    """A command's own connection to DATABASE_URL (``role``: what it is for, see db.connect)."""
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


async def resolve(conn: db.AnyConnection, pair: Pair) -> Pair:
    """``pair`` as it runs: its mapping checked against the catalog and typed by it, the
    reactor's schema current, the role holding every grant it needs."""
    queries = db.Database.dedicated(pair.install, conn)
    try:
        pair = await fit_pair(conn, pair)
        install = pair.install
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
    await db.require_current_mapping(conn, install)
    return pair


async def fit_pair(conn: db.AnyConnection, pair: Pair) -> Pair:
    """``pair`` on its mapping as the catalog types it: the one place a command resolves a
    pair's install."""
    return pair.fitted(await db.fit(conn, pair.mapping))


async def resolve_served(
    conn: db.AnyConnection, served: tuple[Pair, ...]
) -> tuple[list[Pair], dict[str, ReactorError]]:
    """(the pairs that can run, resolved; the others, by name, and why not). A pair's own
    trouble (its tables, its schema, its grants) leaves only that pair out, when there are
    others; a lone pair's, or every pair's, is the command's error."""
    resolved: list[Pair] = []
    broken: dict[str, ReactorError] = {}
    for pair in served:
        try:
            resolved.append(await resolve(conn, pair))
        except (ReactorError, psycopg.errors.InsufficientPrivilege) as error:
            known = pair_trouble(error)
            if len(served) == 1 or known is None:
                raise
            broken[pair.name] = known
    if not resolved:
        # None can run: the first one's trouble, named, is the command's error.
        name, trouble = next(iter(broken.items()))
        raise type(trouble)(f"pair {name}: {trouble}")
    return resolved, broken


def pair_trouble(error: BaseException) -> ReactorError | None:
    """The error ``error`` stands for when it is one pair's own (its tables, its schema, its
    grants), which leaves the other pairs alone; None when it is the whole command's."""
    known = known_error(error)
    if isinstance(known, ConfigError | SchemaMissing | UntrustedSchema | PrivilegeMissing):
        return known
    return None


async def fit_for_print(settings: ProcessSettings, shape: Mapping) -> Mapping:
    """The mapping `migrate --print` renders: checked against the database when DATABASE_URL
    names one. Without it only the reference mapping, whose types are known, can be printed.

    Printing only reads the catalog: everything it sends runs in one READ ONLY transaction that
    is rolled back, so the database is left as it was, whatever the mapping's expressions do.
    """
    if settings.database_url:
        async with (
            await startup_connection(settings, "migrate") as conn,
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
