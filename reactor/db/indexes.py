"""The indexes `reactor migrate` builds on the app's tables, described as data.

An index on the job table must be built CONCURRENTLY, outside any transaction, so that the app
keeps writing; PostgreSQL builds none so on a partitioned table, which gets it ON ONLY the
parent, CONCURRENTLY on each partition, and each attached. That takes knowing the index's name,
table, columns and predicate, so each is an :class:`Index` value: rendered as SQL for the printed
script and for each step of a build, with every name quoted by psycopg, never parsed back out of
SQL text. The build itself, which needs the catalog, is :mod:`.migrations`'.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from reactor.install import Install
from reactor.quote import identifier

# The longest identifier PostgreSQL keeps (NAMEDATALEN - 1).
MAX_NAME = 63


@dataclass(frozen=True)
class Index:
    """A partial index: ``name`` in the schema of ``table`` (schema, name), on ``columns``,
    where ``predicate`` (SQL over the table's own columns) holds."""

    name: str
    table: tuple[str, str]
    columns: tuple[str, ...]
    predicate: str

    @property
    def qualified(self) -> str:
        """The index's name as SQL: in its table's schema."""
        return identifier(self.table[0], self.name)

    def create(self, *, concurrently: bool = True, only: bool = False) -> str:
        """``CREATE INDEX [CONCURRENTLY] IF NOT EXISTS ... ON [ONLY] table (...) WHERE ...``."""
        how = " CONCURRENTLY" if concurrently else ""
        where = " ONLY" if only else ""
        columns = ", ".join(identifier(column) for column in self.columns)
        return (
            f"CREATE INDEX{how} IF NOT EXISTS {identifier(self.name)} ON{where} "
            f"{identifier(*self.table)} ({columns}) WHERE {self.predicate}"
        )

    def on_partition(self, partition: tuple[str, str]) -> Index:
        """The same index on ``partition``, named after it where this one names its table."""
        suffix = self.name.removeprefix(f"{self.table[1]}_")
        name = f"{partition[1]}_{suffix}"
        if len(name) > MAX_NAME:
            digest = hashlib.sha1(name.encode()).hexdigest()[:8]
            name = f"{name[: MAX_NAME - 9]}_{digest}"
        return replace(self, name=name, table=partition)


@dataclass(frozen=True)
class DropIndex:
    """An index that is no longer needed, dropped without blocking the app."""

    schema: str
    name: str

    @property
    def qualified(self) -> str:
        return identifier(self.schema, self.name)

    def drop(self, *, concurrently: bool = True) -> str:
        how = " CONCURRENTLY" if concurrently else ""
        return f"DROP INDEX{how} IF EXISTS {self.qualified}"


Step = Index | DropIndex


def walk_index(install: Install) -> Index:
    """The reconcile's walk, and the road from a run to its jobs: the job table's
    (run, id) over the jobs that can still need a run. Its predicate names only columns that
    change once in a job's life, so the app's progress updates stay HOT."""
    jobs = install.mapping.jobs
    schema, table = jobs.table[0], jobs.table[-1]
    return Index(
        f"{table}_reactor_finished_idx"[:MAX_NAME],
        (schema, table),
        (jobs.run, jobs.id),
        install.mapping.walked(None),
    )


def repeatable(install: Install) -> tuple[Step, ...]:
    """What every `reactor migrate` builds after the triggers (notify_triggers.sql), again
    whenever it is missing."""
    return (walk_index(install),)


def of_migration(version: int, install: Install) -> tuple[Step, ...]:
    """What numbered migration ``version`` builds outside its transaction (the numbered
    migrations are the reference tables' upgrade road)."""
    if version == 15:
        # The walk index without results in its predicate replaced one that named it.
        schema = install.mapping.jobs.table[0]
        return (walk_index(install), DropIndex(schema, "analysis_jobs_reactor_walk_idx"))
    return ()
