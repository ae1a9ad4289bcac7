"""The least privilege of the reactor's runtime role: what it needs, and nothing more.

:data:`REQUIRED` is the single list. ``reactor migrate --print-grants ROLE`` prints it as GRANT
statements (:func:`grant_script`), and the startup check runs the ``missing_privileges`` query of
``triggers/status.sql`` with :func:`check_params`, so what is granted and what is checked cannot
drift apart. Pure text; nothing here connects to a database.

The list was found by running every statement of the reactor as a role holding only these
grants (``tests/integration/test_privileges.py``) and by removing each grant in turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from reactor.errors import ConfigError
from reactor.install.mapping import REFERENCE, Mapping
from reactor.install.quote import readable

Kind = Literal["schema", "table", "any_column", "function", "sequence"]

# What PostgreSQL accepts unquoted, minus nothing: the name is double-quoted on output anyway,
# so mixed case survives, but anything fancier is more likely a typo than a role.
_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")


@dataclass(frozen=True)
class Privilege:
    """One privilege the runtime role must hold on one object, and why."""

    kind: Kind  # schema: USAGE on a schema; table: a table privilege; any_column: see below
    privilege: str  # USAGE, SELECT, INSERT, UPDATE or EXECUTE
    schema: str | None  # None for a schema, whose name is ``name``
    name: str  # the schema's, the table's or the function's name
    # For any_column: the column granted. PostgreSQL is satisfied by the privilege on any
    # column (or on the table), so the check accepts any; the grant names the one we chose.
    column: str | None = None
    # For a function: its argument types, as oidvectortypes() spells them.
    args: str | None = None

    @property
    def target(self) -> str:
        """The object as GRANT names it."""
        if self.kind == "schema":
            return f"SCHEMA {readable(self.name)}"
        if self.kind == "function":
            assert self.schema is not None
            return f"FUNCTION {readable(self.schema, self.name)}({self.args})"
        if self.kind == "sequence":
            assert self.schema is not None
            return f"SEQUENCE {readable(self.schema, self.name)}"
        assert self.schema is not None
        return readable(self.schema, self.name)

    @property
    def grant(self) -> str:
        """``GRANT <privilege> ON <object>``, without the grantee: what the message names."""
        column = f" ({readable(self.column)})" if self.column else ""
        return f"GRANT {self.privilege}{column} ON {self.target}"


@dataclass(frozen=True)
class Group:
    """Privileges on one object that are printed as one GRANT, with the reason for them."""

    why: str
    privileges: tuple[Privilege, ...]


def _table(schema: str | None, name: str, *privileges: str) -> tuple[Privilege, ...]:
    return tuple(Privilege("table", p, schema, name) for p in privileges)


def groups(mapping: Mapping) -> tuple[Group, ...]:
    """What the runtime role needs on the tables ``mapping`` names."""
    jobs_schema, jobs = _located(mapping.jobs.table)
    runs_schema, runs = _located(mapping.runs.table)
    id_type = mapping.jobs.id_type
    # The serial key of the artifact, which the record statement leaves to its default.
    drawn = tuple(
        Group(
            "The record statement leaves this column of the artifact table to its default,\n"
            "which draws from this sequence (nextval needs USAGE on it).",
            (Privilege("sequence", "USAGE", schema, name),),
        )
        for schema, name in mapping.runs.sequences
    )
    return (
        *_groups(
            jobs_schema,
            jobs,
            runs_schema,
            runs,
            mapping.jobs.updated_at,
            id_type,
            mapping.reactor_schema,
        ),
        *drawn,
    )


def _located(table: tuple[str, ...]) -> tuple[str, str]:
    # Always qualified: a GRANT on a bare name, run as the owner, could land on a table of the
    # same name in a schema earlier in the owner's search_path.
    return ("public", table[0]) if len(table) == 1 else (table[0], table[1])


def _groups(
    jobs_schema: str,
    jobs: str,
    runs_schema: str,
    runs: str,
    updated_at: str,
    id_type: str,
    reactor: str,
) -> tuple[Group, ...]:
    # One grant each: a group prints as one GRANT on one object. Every role may use public
    # unless that is revoked; the app's own use of it says it is not.
    app_schemas = tuple(
        Group("The schema of the app's tables.", (Privilege("schema", "USAGE", None, schema),))
        for schema in dict.fromkeys((jobs_schema, runs_schema))
        if schema != "public"
    )
    return (
        Group(
            "The reactor's own schema holds its version table, job queue and hook outbox.",
            (Privilege("schema", "USAGE", None, reactor),),
        ),
        *app_schemas,
        Group(
            "Reads jobs: which need a run, and the row a run is written from (inside PostgreSQL).",
            _table(jobs_schema, jobs, "SELECT"),
        ),
        Group(
            "The claim locks job rows (SELECT ... FOR NO KEY UPDATE OF j SKIP LOCKED), and\n"
            "PostgreSQL allows a row lock only to a role with UPDATE privilege on at least\n"
            "one column of the table; without any, the claim fails with 'permission denied\n"
            "for table'. One column is enough, and the reactor never updates a job.\n"
            "updated_at is the column whose misuse does least harm: it cannot rename a job or\n"
            "change its status, document or results, only move its deadline, as the app's own\n"
            "writes do.",
            (Privilege("any_column", "UPDATE", jobs_schema, jobs, column=updated_at),),
        ),
        Group(
            "Writes runs: INSERT ... ON CONFLICT (key) DO UPDATE ... RETURNING reads the row it\n"
            "conflicts with. No DELETE: the reactor never removes a run.",
            _table(runs_schema, runs, "SELECT", "INSERT", "UPDATE"),
        ),
        Group(
            "Startup checks the applied schema version (the migrations run as the owner).",
            _table(reactor, "schema_version", "SELECT"),
        ),
        Group(
            "Startup checks that the tables the mapping names are the ones `reactor migrate`\n"
            "installed the triggers on, by the oids it recorded, and that the mapping file is\n"
            "the one it installed them for (its digest).",
            _table(reactor, "app_tables", "SELECT"),
        ),
        Group(
            "The queue of jobs that may need a run, filled by the app's trigger and by the\n"
            "reconcile (INSERT). The record statements read it, lock their rows (FOR UPDATE ...\n"
            "SKIP LOCKED, which again needs UPDATE on one column; since only orders the scan) and\n"
            "delete what they settled.",
            (
                Privilege("table", "SELECT", reactor, "pending"),
                Privilege("table", "INSERT", reactor, "pending"),
                Privilege("any_column", "UPDATE", reactor, "pending", column="since"),
                Privilege("table", "DELETE", reactor, "pending"),
            ),
        ),
        Group(
            "Jobs whose write failed on their own data (the app's constraint or trigger rejected\n"
            "the row): the recorder sets each aside with its error (INSERT ... ON CONFLICT DO\n"
            "UPDATE), the record statements leave them out and release them once written\n"
            "(DELETE), and the health check and status count and list them.",
            _table(reactor, "set_aside", "SELECT", "INSERT", "UPDATE", "DELETE"),
        ),
        Group(
            "What each worker row was written from (the job and its updated_at), one row per\n"
            "run key: the record statement upserts it with the run (INSERT ... ON CONFLICT DO\n"
            "UPDATE), and the precedence rule reads it to tell a job's later finish.",
            _table(reactor, "recorded", "SELECT", "INSERT", "UPDATE"),
        ),
        Group(
            "The reconcile's shared state: one row, locked and advanced by each step of a pass.",
            _table(reactor, "reconcile", "SELECT", "UPDATE"),
        ),
        Group(
            "The doorbell: a replica that polls the queue under a stream of jobs keeps its\n"
            "channel's row awake (INSERT ... ON CONFLICT DO UPDATE), and the job trigger skips\n"
            "its NOTIFY meanwhile; the poll and the health check read it back.",
            _table(reactor, "doorbell", "SELECT", "INSERT", "UPDATE"),
        ),
        Group(
            "Heartbeats: each replica upserts its row and reads the others' to split the work,\n"
            "and deletes its own on a clean stop and the rows of replicas gone for an hour.",
            _table(reactor, "replicas", "SELECT", "INSERT", "UPDATE", "DELETE"),
        ),
        Group(
            "Hooks. The record statement queues hook rows in the same statement (INSERT, needed\n"
            "even with REACTOR_HOOKS empty: PostgreSQL checks privileges before it knows that no\n"
            "row comes), the hook runner leases and settles them (SELECT ... FOR UPDATE SKIP\n"
            "LOCKED, UPDATE), the health check counts them, and the retention job deletes settled\n"
            "rows once REACTOR_HOOK_RETENTION_SECONDS have passed (DELETE).",
            _table(reactor, "hook_outbox", "SELECT", "INSERT", "UPDATE", "DELETE"),
        ),
        Group(
            "The precedence rule the record statements call. `reactor migrate` revokes EXECUTE on\n"
            "every reactor function from PUBLIC, so the runtime role holds it by this grant alone.",
            (
                Privilege(
                    "function",
                    "EXECUTE",
                    reactor,
                    "outranks_v2",
                    args=f"{id_type}, {id_type}, text",
                ),
            ),
        ),
    )


def required(mapping: Mapping) -> tuple[Privilege, ...]:
    """Every privilege of :func:`groups`, in order."""
    return tuple(p for group in groups(mapping) for p in group.privileges)


# The reference mapping's, for what is printed and tested about it.
REQUIRED: tuple[Privilege, ...] = required(REFERENCE)


def check_role(role: str) -> str:
    """``role`` if it is a plain identifier we may grant to; ConfigError otherwise."""
    if not _ROLE.fullmatch(role):
        raise ConfigError(
            f"--print-grants {role!r}: the role must be a plain identifier "
            "(a letter or _, then letters, digits, _ or $; at most 63)"
        )
    if role.lower() == "public" or role.lower().startswith("pg_"):
        raise ConfigError(
            f"--print-grants {role!r}: name the reactor's own login role, "
            "not PUBLIC or a pg_ built-in role"
        )
    return role


def grant_script(role: str, mapping: Mapping) -> str:
    """The GRANT statements that give ``role`` exactly what the runtime needs on the tables
    ``mapping`` names, commented."""
    grantee = '"' + check_role(role) + '"'
    lines = [
        f"-- The least privilege of the reactor's runtime role {grantee}: `reactor run`,",
        "-- `reactor sweep` and `reactor status`. Run as the owner of the tables, after",
        "-- `reactor migrate` (which needs the owner too). `reactor run` checks exactly these",
        "-- at startup and exits 5 naming the first one missing.",
    ]
    for group in groups(mapping):
        lines.append("")
        lines.extend(f"-- {line}" for line in group.why.splitlines())
        first = group.privileges[0]
        privileges = ", ".join(
            p.privilege + (f" ({readable(p.column)})" if p.column else "") for p in group.privileges
        )
        lines.append(f"GRANT {privileges} ON {first.target} TO {grantee};")
    return "\n".join(lines) + "\n"


def check_params(mapping: Mapping) -> dict[str, Any]:
    """The parameters of status.sql's ``missing_privileges`` query: :func:`required` for
    ``mapping``, as arrays."""
    needed = required(mapping)
    return {
        "kinds": [p.kind for p in needed],
        "privileges": [p.privilege for p in needed],
        "schemas": [p.schema for p in needed],
        "names": [p.name for p in needed],
        "args": [p.args for p in needed],
        "grants": [p.grant for p in needed],
    }
