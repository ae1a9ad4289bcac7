"""The indexes `reactor migrate` builds on the app's tables, described as data.

An index on the job table must be built CONCURRENTLY, outside any transaction, so that the app
keeps writing; PostgreSQL builds none so on a partitioned table, which gets it ON ONLY the
parent, CONCURRENTLY on each partition, and each attached. That takes knowing the index's name,
table, columns and predicate, so each is an :class:`Index` value: rendered as SQL for the printed
script and for each step of a build, with every name quoted by psycopg, never parsed back out of
SQL text. The build itself, which needs the catalog, is :mod:`.online_ddl`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from reactor.install import Install
from reactor.install.quote import identifier

# The longest identifier PostgreSQL keeps (NAMEDATALEN - 1), in bytes; the names cut to it here
# are measured in characters, which agree for ASCII names.
MAX_NAME_BYTES = 63


@dataclass(frozen=True)
class Index:
    """An index: ``name`` in the schema of ``table`` (schema, name), on ``columns``, partial
    where ``predicate`` (SQL over the table's own columns) holds, when one is given."""

    name: str
    table: tuple[str, str]
    columns: tuple[str, ...]
    predicate: str | None

    @property
    def qualified(self) -> str:
        """The index's name as SQL: in its table's schema."""
        return identifier(self.table[0], self.name)

    def create(self, *, concurrently: bool = True, only: bool = False) -> str:
        """``CREATE INDEX [CONCURRENTLY] IF NOT EXISTS ... ON [ONLY] table (...) WHERE ...``."""
        how = " CONCURRENTLY" if concurrently else ""
        where = " ONLY" if only else ""
        columns = ", ".join(identifier(column) for column in self.columns)
        partial = "" if self.predicate is None else f" WHERE {self.predicate}"
        return (
            f"CREATE INDEX{how} IF NOT EXISTS {identifier(self.name)} ON{where} "
            f"{identifier(*self.table)} ({columns}){partial}"
        )

    def on_partition(self, partition: tuple[str, str]) -> Index:
        """The same index on ``partition``, named after it where this one names its table."""
        suffix = self.name.removeprefix(f"{self.table[1]}_")
        name = f"{partition[1]}_{suffix}"
        if len(name) > MAX_NAME_BYTES:
            digest = hashlib.sha1(name.encode()).hexdigest()[:8]
            name = f"{name[: MAX_NAME_BYTES - 9]}_{digest}"
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
    """The reconcile's walk, and the road from a run to its jobs: the job table's (run, id)
    over the jobs that hold their documents and are not deleted. Neither its key nor its
    predicate names a column that a job's progress or its finish changes (results, status,
    updated_at), so the app's updates of a job stay HOT, the one that finishes it included."""
    jobs = install.mapping.jobs
    schema, table = jobs.table[0], jobs.table[-1]
    walked = install.mapping.walked(None)
    # Where each job is its own run the key is the id alone: (id, id) would copy the id's
    # index, and without a predicate it is the primary key (migrate skips what is there).
    columns = (jobs.id,) if install.mapping.one_to_one else (jobs.run, jobs.id)
    return Index(
        f"{table}_reactor_run_idx"[:MAX_NAME_BYTES],
        (schema, table),
        columns,
        None if walked == "true" else walked,
    )


def repeatable(install: Install) -> tuple[Step, ...]:
    """What every `reactor migrate` builds after the triggers (notify_triggers.sql), again
    whenever it is missing."""
    return (walk_index(install),)


def of_migration(version: int, install: Install) -> tuple[Step, ...]:
    """What numbered migration ``version`` builds outside its transaction, and drops."""
    schema, table = install.mapping.jobs.table[0], install.mapping.jobs.table[-1]
    if version == 15:
        # The walk index without results in its predicate replaced one that named it.
        return (
            walk_index(install),
            DropIndex(schema, f"{table}_reactor_walk_idx"[:MAX_NAME_BYTES]),
        )
    if version == 16:
        # ... and then one without the status in it, so that a job's finish is HOT too.
        old = f"{table}_reactor_finished_idx"[:MAX_NAME_BYTES]
        return (walk_index(install), DropIndex(schema, old))
    return ()
