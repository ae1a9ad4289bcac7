"""What the reactor's schema was installed on, against the mapping in force.

`reactor migrate` records the app's tables it puts its triggers on in
``<reactor_schema>.app_tables`` (by oid), and types its own tables' keys as the app's. A mapping
that names other tables is refused where going on would harm:

- `run`, `sweep` and `status` refuse a name that now finds another relation (a table renamed,
  dropped and made again, a mapping edited since): :func:`check_installed`.
- `migrate` refuses to move an install off tables that still carry its triggers: those are
  most often another app's, in a schema shared by mistake, and once moved the triggers would
  refuse every commit of theirs that finishes a job. It refuses keys of other types than its
  tables hold too, which no migration converts: :func:`check_move`.

Both pass when the role may not read ``app_tables`` yet: the startup's privilege check then
names the grant it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.rows import class_row

from reactor.db.session import AnyConnection
from reactor.errors import ConfigError
from reactor.install.mapping import Mapping
from reactor.install.quote import identifier, quote_ident
from reactor.shown import printable

# The schema's namespace, if this role may read its app_tables.
_SCHEMA = """
SELECT n.oid
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %(schema)s AND c.relname = 'app_tables'
   AND pg_catalog.has_schema_privilege(n.oid, 'USAGE')
   AND pg_catalog.has_table_privilege(c.oid, 'SELECT')
"""

# A table still carries the install's triggers when a trigger on it calls one of the schema's
# functions; a dropped table has none. The keys' types are those of the queue's job id and the
# reconcile's cursor, typed by the first install.
_INSTALLED = """
SELECT t.jobs::oid AS jobs_oid, t.runs::oid AS runs_oid,
       t.jobs::text AS jobs, t.runs::text AS runs,
       EXISTS (SELECT 1 FROM pg_catalog.pg_trigger g
                 JOIN pg_catalog.pg_proc p ON p.oid = g.tgfoid
                WHERE g.tgrelid IN (t.jobs::oid, t.runs::oid)
                  AND p.pronamespace = %(namespace)s) AS armed,
       (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod)
          FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
         WHERE c.relnamespace = %(namespace)s AND c.relname = 'pending'
           AND a.attname = 'job_id') AS job_type,
       (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod)
          FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
         WHERE c.relnamespace = %(namespace)s AND c.relname = 'reconcile'
           AND a.attname = 'cursor_run') AS run_type
  FROM {app_tables} t
"""


@dataclass(frozen=True)
class InstalledOn:
    """The app's tables an install's triggers were put on, and the key types it was made for."""

    jobs_oid: int
    runs_oid: int
    jobs: str
    runs: str
    # Whether a trigger on either table still calls the schema's functions.
    armed: bool
    # None before the migration that made the table.
    job_type: str | None
    run_type: str | None

    @property
    def shown(self) -> str:
        """The two tables as messages name them."""
        return f"{printable(self.jobs)} and {printable(self.runs)}"


async def installed_on(conn: AnyConnection, schema: str) -> InstalledOn | None:
    """What the install in ``schema`` was made for; None when there is none this role may
    read."""
    cur = await conn.execute(_SCHEMA, {"schema": schema})
    found = await cur.fetchone()
    if found is None:
        return None
    query = _INSTALLED.format(app_tables=identifier(schema, "app_tables"))
    async with conn.cursor(row_factory=class_row(InstalledOn)) as typed:
        await typed.execute(query, {"namespace": found[0]})
        return await typed.fetchone()


async def check_installed(conn: AnyConnection, mapping: Mapping, oids: tuple[int, int]) -> None:
    """`run`, `sweep`, `status`: the tables the mapping names (``oids``: jobs, runs, as the
    catalog has them now) are the ones `reactor migrate` installed the triggers on."""
    installed = await installed_on(conn, mapping.reactor_schema)
    if installed is None or oids == (installed.jobs_oid, installed.runs_oid):
        return
    raise ConfigError(
        f"the mapping names {mapping.jobs_shown} and {mapping.runs_shown}, but `reactor "
        f"migrate` installed the triggers on {installed.shown}; run `reactor migrate` with this "
        "mapping to install them there"
    )


async def check_move(conn: AnyConnection, mapping: Mapping, oids: tuple[int, int]) -> None:
    """`migrate`: an install is moved to the tables the mapping names (``oids``) only off
    tables that no longer carry its triggers, and only onto keys of the types it was made for.
    ``mapping`` is typed from the catalog."""
    installed = await installed_on(conn, mapping.reactor_schema)
    if installed is None:
        return
    schema = printable(quote_ident(mapping.reactor_schema))
    if oids != (installed.jobs_oid, installed.runs_oid) and installed.armed:
        raise ConfigError(
            f"the reactor's schema {schema} is installed on {installed.shown}, which still "
            f"carry its triggers: give the mapping of {mapping.jobs_shown} a reactor_schema of "
            "its own in REACTOR_CONFIG; to move the install there instead, drop the triggers "
            f"named {printable(mapping.reactor_schema)}_* from the old tables first"
        )
    wanted = (mapping.jobs.id_type, mapping.jobs.run_type)
    made_for = (installed.job_type, installed.run_type)
    if None not in made_for and made_for != wanted:
        raise ConfigError(
            f"the reactor's schema {schema} was made for job ids of type {made_for[0]} and run "
            f"keys of type {made_for[1]}, and {mapping.jobs_shown} has {wanted[0]} and "
            f"{wanted[1]}: give its mapping a reactor_schema of its own in REACTOR_CONFIG"
        )
