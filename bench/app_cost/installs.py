"""The installs app_cost compares on analysis_jobs, and how each is put in place between rounds."""

from __future__ import annotations

from dataclasses import dataclass

from bench.conn import Conn, scalar
from bench.trigger_overhead.triggers import Triggers


@dataclass(frozen=True)
class Config:
    """One install on analysis_jobs: the job triggers' form and whether the reactor's indexes
    are there. ``extra`` is SQL run after that, for a variant of the installed objects;
    ``queue_unlogged`` makes the queue (reactor.pending) UNLOGGED after it, where every other
    install has it logged, as installed. ``twin``: the install it is that variant of."""

    label: str
    job_triggers: str  # "with" (as installed), "quiet" (--no-notify), "notify_only", "without"
    indexes: bool
    floor: str  # the install this one is divided by: what PostgreSQL makes its like pay at least
    extra: tuple[str, ...] = ()
    queue_unlogged: bool = False
    twin: str | None = None


# The installs compared, by name; a variant is one more entry. Each is divided by its floor:
# a notifying install by 'notify_only', a trigger that does nothing but pg_notify on the
# transition into a terminal status (what every notifying commit pays: the trigger call and the
# commit-time lock on the cluster's notification queue), the rest by BASELINE, no trigger.
# NOISE is the baseline again under another name, so its ratio shows the noise.
CONFIGS: dict[str, Config] = {
    "none": Config("no reactor triggers or index on analysis_jobs", "without", False, "none"),
    "none_again": Config(
        "none again, as if another install: the noise floor", "without", False, "none"
    ),
    "notify_only": Config(
        "a trigger that only notifies on the transition: the notifying floor",
        "notify_only",
        False,
        "none",
    ),
    "default": Config(
        "as `reactor migrate` installs it: triggers and walk index", "with", True, "notify_only"
    ),
    "quiet": Config(
        "the same, job triggers installed not to notify (--no-notify)", "quiet", True, "none"
    ),
    # A measurement only: what an unlogged queue would save (a real one would need the queue
    # rebuilt after a crash or a promotion, which empties it).
    "default_unlogged": Config(
        "default, queue unlogged: reactor.pending SET UNLOGGED after the install",
        "with",
        True,
        "notify_only",
        queue_unlogged=True,
        twin="default",
    ),
    "quiet_unlogged": Config(
        "quiet, queue unlogged: reactor.pending SET UNLOGGED after the install",
        "quiet",
        True,
        "none",
        queue_unlogged=True,
        twin="quiet",
    ),
}
BASELINE = "none"
NOISE = "none_again"

# The reactor's indexes on analysis_jobs, whatever this version calls them.
REACTOR_INDEXES = """
SELECT c.relname, pg_get_indexdef(i.indexrelid)
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
 WHERE i.indrelid = 'analysis_jobs'::regclass AND c.relname LIKE '%reactor%'
 ORDER BY 1
"""

# The schema of the functions the reactor's triggers on analysis_jobs call: the reactor's.
REACTOR_SCHEMA = """
SELECT DISTINCT p.pronamespace::regnamespace::text
  FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
 WHERE t.tgrelid = 'analysis_jobs'::regclass AND NOT t.tgisinternal AND t.tgname LIKE 'reactor%'
"""

# The queue's persistence: 'p' logged, 'u' unlogged.
QUEUE_PERSISTENCE = "SELECT relpersistence FROM pg_class WHERE oid = %s::regclass"

# The foreign keys to or from the queue: a logged table may not reference an unlogged one, so
# any of these could stand in the way of SET UNLOGGED.
QUEUE_FOREIGN_KEYS = """
SELECT conname, conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint
 WHERE contype = 'f' AND (conrelid = %(queue)s::regclass OR confrelid = %(queue)s::regclass)
"""


async def set_queue_persistence(conn: Conn, schema: str, *, unlogged: bool) -> None:
    """Make the queue UNLOGGED, or LOGGED as installed, unless it already is (an empty table:
    the rewrite is instant, and its indexes follow it)."""
    queue = f"{schema}.pending"
    wanted = "u" if unlogged else "p"
    if str(await scalar(conn, QUEUE_PERSISTENCE, (queue,))) == wanted:
        return
    await conn.execute(f"ALTER TABLE {queue} SET {'UNLOGGED' if unlogged else 'LOGGED'}")
    found = str(await scalar(conn, QUEUE_PERSISTENCE, (queue,)))
    if found != wanted:
        raise RuntimeError(f"{queue} is '{found}' after the ALTER, not '{wanted}'")


class Installed:
    """The reactor's objects on the app's tables as `reactor migrate` left them."""

    def __init__(
        self,
        triggers: Triggers,
        run_triggers: Triggers,
        indexes: list[tuple[str, str]],
        schema: str,
    ) -> None:
        self.triggers = triggers
        self.run_triggers = run_triggers
        self.indexes = indexes  # (name, CREATE INDEX ...)
        self.schema = schema

    @classmethod
    async def read(cls, conn: Conn) -> Installed:
        """Read the installed triggers and indexes, and the reactor's schema."""
        cur = await conn.execute(REACTOR_INDEXES)
        indexes = [(str(name), str(definition)) for name, definition in await cur.fetchall()]
        if not indexes:
            raise RuntimeError("no reactor index on analysis_jobs; nothing to measure")
        return cls(
            await Triggers.read(conn),
            await Triggers.read(conn, "analysis_runs"),
            indexes,
            str(await scalar(conn, REACTOR_SCHEMA)),
        )

    async def install(self, conn: Conn, config: Config) -> None:
        """Put ``config`` in place (on an empty table: instant)."""
        # The quiet form re-renders every trigger the reactor has, analysis_runs' too: put
        # those back as installed first, so that a quiet round leaves nothing to the next.
        await self.run_triggers.install(conn, "with")
        await self.triggers.install(conn, config.job_triggers)
        for name, definition in self.indexes:
            await conn.execute(f"DROP INDEX IF EXISTS {name}")
            if config.indexes:
                await conn.execute(definition)
        for statement in config.extra:
            await conn.execute(statement)
        await set_queue_persistence(conn, self.schema, unlogged=config.queue_unlogged)
