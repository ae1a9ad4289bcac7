"""``reactor init``: the catalog read, the draft written and checked as ``reactor migrate``
would check it, and what to do next.

Everything it sends runs in READ ONLY transactions that are rolled back: drafting a mapping
changes nothing in the database, whatever the draft's expressions do.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib

from reactor import db
from reactor.draft import catalog, saves
from reactor.draft.facts import TableFacts
from reactor.draft.links import candidates, status_column
from reactor.draft.propose import Draft, draft
from reactor.draft.role import create_role
from reactor.errors import ConfigError, ReactorError, SchemaMissing, UsageError
from reactor.install import grants
from reactor.install.mapping import Mapping
from reactor.install.mapping_file import parse
from reactor.install.quote import literal, readable
from reactor.settings import pairs
from reactor.settings.config import Settings
from reactor.shown import printable, shell_word

# The exit code of a draft that needs a decision, or of a choice left to make: a usage error.
NEEDS_DECISION = 2


async def cmd_init(args: argparse.Namespace) -> int:
    """``reactor init``: draft the mapping for the pair named, or list the pairs found."""
    role = _role(args.role)
    terminal = _terminal(args.terminal)
    _refuse_existing(args.output)
    settings = Settings.from_env(os.environ)
    if role is not None and args.jobs is None and args.runs is None:
        return await _role_for_config(settings, role)
    if role is not None and args.output is None:
        raise UsageError(
            "--role prints the role's SQL on stdout: give -o FILE for the drafted mapping"
        )
    async with (
        await db.connect(
            settings.require_database(), "init", attempts=2, configure_session=False
        ) as conn,
        conn.transaction(force_rollback=True),
    ):
        await conn.execute("SET TRANSACTION READ ONLY")
        tables = await catalog.read_tables(conn)
        if args.jobs is None or args.runs is None:
            return _list(tables, args.jobs, args.runs)
        jobs, runs = _table(tables, args.jobs, "--jobs"), _table(tables, args.runs, "--runs")
        drafted = await saves.noted(conn, draft(jobs, runs, terminal), runs)
        problem, checked = await _check(conn, drafted)
    text = drafted.text
    todos = list(drafted.todos)
    if problem is not None:
        # The refusal names the catalog's constraints and columns: escaped, one comment line.
        problem = printable(problem)
        todos.append(f"`reactor migrate` would refuse it: {problem}")
        text += f"\n# TODO: `reactor migrate` would refuse it as it stands:\n#       {problem}\n"
    elif not drafted.complete:
        todos.append("the checks of `reactor migrate` run on it once the TODOs above are settled")
    _write(args.output, text)
    for todo in todos:
        print(f"reactor: TODO: {todo}", file=sys.stderr)
    if todos:
        where = args.output or "the draft"
        print(
            f"reactor: {where} needs {len(todos)} decision(s) before `reactor migrate`; run "
            "`reactor init` again with the flags they name, or edit the lines marked TODO",
            file=sys.stderr,
        )
    else:
        _next_steps(args.output, args.role, drafted, checked)
    if role is not None and checked is not None:
        sys.stdout.write(create_role(role) + "\n" + grants.grant_script(role, checked))
    return NEEDS_DECISION if todos else 0


def _refuse_existing(output: str | None) -> None:
    # A file reviewed and edited by hand is not replaced by a new draft; asked before the
    # catalog is read, and again by the write itself (_write), which is what decides.
    if output is not None and os.path.lexists(output):
        raise _exists(output)


def _exists(output: str) -> UsageError:
    return UsageError(f"-o {printable(output)}: the path exists; remove it, or name another")


def _write(output: str | None, text: str) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    # "x": created here or not at all. An existing file, or a symlink to anywhere (a dangling
    # one included, which open(..., "w") would follow and create), is refused.
    try:
        with open(output, "x", encoding="utf-8") as file:
            file.write(text)
    except FileExistsError:
        raise _exists(output) from None
    except OSError as error:
        raise UsageError(
            f"-o {printable(output)}: cannot create it ({error.strerror}); name a file in a "
            "directory you can write"
        ) from None


def _role(role: str | None) -> str | None:
    if role is None:
        return None
    try:
        return grants.check_role(role)
    except ConfigError as error:
        raise ConfigError(str(error).replace("--print-grants", "--role")) from None


def _terminal(flag: str | None) -> tuple[str, ...] | None:
    if flag is None:
        return None
    values = tuple(value.strip() for value in flag.split(","))
    if not all(values):
        raise UsageError(
            f"--terminal {flag!r}: give the values separated by commas, e.g. done,failed"
        )
    return values


def _table(tables: list[TableFacts], name: str, flag: str) -> TableFacts:
    found = catalog.find(tables, name)
    if found is None:
        shown = name if "." in name else f"public.{name}"
        raise ConfigError(
            f"{flag} {name}: no table {shown} (names are as in the catalog: case matters, and "
            "an unqualified name means public.NAME); `reactor init` without flags lists the "
            "pairs it finds"
        )
    return found


def _list(tables: list[TableFacts], jobs: str | None, runs: str | None) -> int:
    """Lists the candidate pairs on stderr; the choice is the user's, as flags."""
    found = candidates(tables)
    if jobs is not None:
        chosen = _table(tables, jobs, "--jobs")
        found = [c for c in found if c.jobs.key == chosen.key]
    if runs is not None:
        chosen = _table(tables, runs, "--runs")
        found = [c for c in found if c.runs.key == chosen.key]
    if not found:
        with_status = [t.shown for t in tables if status_column(t) is not None]
        print(
            "reactor: no job table with a status column and an artifact table referring to it "
            "(a foreign key, or a column named after it) was found"
            + (
                f"; tables with a status column: {printable(', '.join(with_status))}"
                if with_status
                else ""
            )
            + "; name the pair with --jobs TABLE --runs TABLE",
            file=sys.stderr,
        )
        return NEEDS_DECISION
    print(
        f"reactor: found {len(found)} candidate pair(s); `reactor init` drafts one when you name "
        "it, with --jobs and --runs:",
        file=sys.stderr,
    )
    for candidate in found:
        print(f"  {candidate.line()}", file=sys.stderr)
    return NEEDS_DECISION


async def _check(conn: db.AnyConnection, drafted: Draft) -> tuple[str | None, Mapping | None]:
    """(what `reactor migrate` would refuse in the draft, or None; the mapping it would install,
    typed by the catalog, when it accepts it)."""
    if not drafted.complete:
        return None, None
    try:
        mapping = parse(tomllib.loads(drafted.text), source="the draft").in_public()
        async with conn.transaction(force_rollback=True):
            return None, await db.fit(conn, mapping, installing=True)
    except (ConfigError, SchemaMissing) as error:
        return str(error), None


def _next_steps(
    output: str | None, role: str | None, drafted: Draft, mapping: Mapping | None
) -> None:
    # Command lines to paste: the file's path quoted for the shell, as every word would be.
    config = shell_word(printable(output or "reactor.toml"))
    runtime = role or "reactor_rt"
    assert mapping is not None
    saved_by = readable(mapping.runs.saved_by)
    lines = [
        "the draft migrates as it stands"
        + (" (one-to-one: one run per job)" if drafted.one_to_one else "")
        + ". Next:",
        f"  1. review {config}: each key says where its value came from",
        f"  2. REACTOR_CONFIG={config} reactor migrate        (as the owner of the tables)",
        f'  3. REACTOR_CONFIG={config} reactor init --role {runtime} | psql "$DATABASE_URL"',
        "     (the runtime role and its grants; give it a password or your usual login)",
        f"  4. REACTOR_CONFIG={config} DATABASE_URL=<as {runtime}> reactor run",
        f"The app's own save of {_sql_name(mapping.runs.table)} is an upsert that marks "
        f"itself: INSERT ... ON CONFLICT ({readable(mapping.runs.key)}) DO UPDATE SET ..., "
        f"{saved_by} = {literal(mapping.runs.client[0])}; or its plain INSERT, where the draft "
        'allows app_saves = "plain" under [runs].',
    ]
    if output is None:
        lines.insert(1, f"  0. save it: reactor init ... -o {config}")
    for line in map(printable, lines):
        print(f"reactor: {line}" if not line.startswith(" ") else line, file=sys.stderr)


def _sql_name(table: tuple[str, ...]) -> str:
    # As a person types it into SQL: unqualified in public, quoted where it must be.
    return readable(*(table[1:] if table[0] == "public" else table))


async def _role_for_config(settings: Settings, role: str) -> int:
    """``reactor init --role NAME`` alone: the role and the grants of the pairs REACTOR_CONFIG
    names (the reference pair without it), checked against the catalog."""
    served = pairs.from_env(os.environ, settings)
    scripts = []
    async with (
        await db.connect(
            settings.require_database(), "init", attempts=2, configure_session=False
        ) as conn,
    ):
        for pair in served:
            try:
                async with conn.transaction(force_rollback=True):
                    await conn.execute("SET TRANSACTION READ ONLY")
                    fitted = await db.fit(conn, pair.mapping.in_public(), installing=True)
            except ReactorError as error:
                raise type(error)(f"--role: {error}") from None
            scripts.append(grants.grant_script(role, fitted))
    sys.stdout.write(create_role(role) + "\n" + "\n".join(scripts))
    print(
        f"reactor: apply it as the tables' owner or a superuser (after `reactor migrate`), then "
        f"run `reactor run` with DATABASE_URL logging in as {role}",
        file=sys.stderr,
    )
    return 0
