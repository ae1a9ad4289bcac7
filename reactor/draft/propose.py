"""The draft of a mapping file for one pair, from the catalog's facts: TOML whose every key says
where its value came from, and the TODO lines of what the catalog could not tell. Pure.

What it proposes follows DESIGN.md §2: the id, run, key and job columns from the foreign keys
and unique indexes (:mod:`reactor.draft.links`), the status and its terminal values from the
enum's labels or the CHECK's values (guessed by name unless ``--terminal`` names them), the
timestamps by name and type, ``[runs.columns]`` for every NOT NULL artifact column without a
default, and ``not_null`` from the job columns those are filled from.
"""

from __future__ import annotations

from dataclasses import dataclass

from reactor.draft.facts import INTEGER_TYPES, TEXT_TYPES, TIME_TYPES, ColumnFacts, TableFacts
from reactor.draft.links import Link, link, normal, status_column
from reactor.draft.toml import Writer, key_text
from reactor.install.quote import readable

# Status values that mean "finished", compared in lower case.
TERMINAL_NAMES = (
    "done",
    "complete",
    "completed",
    "succeeded",
    "success",
    "successful",
    "finished",
    "failed",
    "failure",
    "error",
    "errored",
)
_UPDATED = ("updatedat", "modifiedat", "updated", "modified", "lastmodified", "updatedon")
_CREATED = ("createdat", "insertedat", "created", "createdon")
_DELETED = ("deletedat", "discardedat", "deleted", "removedat")
_SAVED_BY = ("savedby", "savedvia", "writtenby", "origin")
_WORKER_VALUES = ("worker", "system", "reactor", "server", "background")
ZONE = "UTC"


@dataclass(frozen=True)
class Draft:
    """The mapping file drafted for one pair, and what is left to settle by hand."""

    text: str
    todos: tuple[str, ...]
    one_to_one: bool
    # False when the file cannot be parsed as it stands (no terminal values yet): the checks
    # of `reactor migrate` run once it can.
    complete: bool = True


def draft(jobs: TableFacts, runs: TableFacts, terminal: tuple[str, ...] | None = None) -> Draft:
    """The mapping file for ``jobs`` and ``runs``; ``terminal``: the values ``--terminal``
    gave, as typed."""
    out = Writer()
    tied = link(jobs, runs) or Link(None, None, None, None, False, {})
    out.comment(
        "The mapping of the reactor onto the app's tables, drafted by `reactor init` from the",
        "catalog. Each key says where its value came from; a line marked TODO needs a decision.",
        "Review it, then `reactor migrate` (as the tables' owner) installs the reactor for it.",
    )
    out.key(
        "reactor_schema", "reactor", "the reactor's own schema, which `reactor migrate` creates"
    )
    out.section("jobs")
    out.key("table", jobs.shown, "the job table (--jobs)")
    _ids(out, jobs, runs, tied)
    status = status_column(jobs)
    complete = _status(out, jobs, status, terminal)
    times = _times(out, jobs, tied.one_to_one)
    columns = _columns(out, jobs, runs, tied)
    filled_from = [
        (run_column, source)
        for run_column, source in columns
        if source is not None
        and (column := jobs.column(source)) is not None
        and not column.not_null
    ]
    if filled_from:
        # What a NULL costs: written as it is, the artifact's NOT NULL refuses it, and the job
        # is set aside. The draft takes the first fix, and says the other.
        out.key(
            "not_null",
            [source for _, source in filled_from],
            "a job needs a run only when these are set: "
            + ", ".join(
                f"{runs.shown}.{c} is NOT NULL and is filled from {s}, which may be NULL"
                for c, s in filled_from
            )
            + ". A job whose value is NULL then gets no run; to record it anyway, drop the "
            "column from not_null and coalesce it in [runs.columns] instead, e.g. "
            f'{key_text(filled_from[0][0])} = "coalesce(j.{readable(filled_from[0][1])}, ...)"',
            section="jobs",
        )
    naive = [t.name for t in times if t.naive]
    if naive:
        out.key(
            "time_zone",
            ZONE,
            f"{', '.join(naive)} {'is' if len(naive) == 1 else 'are'} timestamp without time "
            "zone: the zone the app writes its times in (Django, Rails, Prisma and Laravel "
            "write UTC by default)",
            section="jobs",
        )
    return Draft(out.text(), tuple(out.todos), tied.one_to_one, complete)


def _ids(out: Writer, jobs: TableFacts, runs: TableFacts, tied: Link) -> None:
    why = tied.why
    if tied.id is None:
        out.todo(f"{jobs.shown} has no one-column primary key: set id to its job id column")
    else:
        out.key("id", tied.id, why.get("id", ""))
    if tied.run is None:
        out.todo(
            f"no column of {jobs.shown} names its {runs.shown} row: set run to it (the job's id "
            "when each job has a row of its own), and runs.key to the column it matches"
        )
    else:
        out.key("run", tied.run, why.get("run", ""))


def _status(
    out: Writer, jobs: TableFacts, status: ColumnFacts | None, terminal: tuple[str, ...] | None
) -> bool:
    if status is None:
        out.todo(
            f"{jobs.shown} has no status-like column (status, state: text, varchar, an enum or "
            "an integer): set status to the column that says a job is finished"
        )
        return False
    integer = status.type in INTEGER_TYPES
    kind = "an enum" if status.enum else status.type
    out.key("status", status.name, f"{kind}, the status-like column by its name")
    values = status.values
    source = "the enum's labels" if status.labels else "the CHECK constraint's values"
    if terminal is not None:
        typed: list[str | int] = []
        for value in terminal:
            if integer:
                try:
                    typed.append(int(value))
                except ValueError:
                    out.todo(f"--terminal {value!r}: {status.name} is {status.type}, a number")
                    continue
            else:
                typed.append(value)
        for given in typed:
            if values and given not in values:
                shown = ", ".join(map(str, values))
                out.todo(f"--terminal {given!r} is none of {source}: {shown}")
        if not typed:
            out.key("terminal", [], "TODO: the values of a finished job")
            return False
        out.key("terminal", typed, "the values of a finished job, as --terminal gave them")
        return True
    guessed = [v for v in values if isinstance(v, str) and v.lower() in TERMINAL_NAMES]
    command = "`reactor init ... --terminal V1,V2`"
    if guessed:
        listed = ", ".join(map(str, values))
        out.key("terminal", guessed, f"guessed by name from {source}: {listed}")
        out.todo(
            f"confirm the finished values of {status.name}: {command} with the ones a finished "
            f"job has (guessed: {','.join(guessed)})"
        )
        return True
    if values:
        out.todo(
            f"which of {source} ({', '.join(map(str, values))}) does a finished job have? "
            f"give them as {command}"
        )
    elif integer:
        out.todo(
            f"{status.name} is {status.type} and nothing in the catalog names its values: give "
            f"the numbers a finished job has (a Rails enum's, e.g. done: 2, failed: 3) as {command}"
        )
    else:
        out.todo(
            f"nothing in the catalog lists the values of {status.name} ({kind}): give the ones a "
            f"finished job has as {command}"
        )
    out.key("terminal", [], "TODO: the values of a finished job")
    return False


def _find_time(table: TableFacts, names: tuple[str, ...]) -> ColumnFacts | None:
    for name in names:
        for column in table.columns:
            if normal(column.name) == name and column.type in TIME_TYPES:
                return column
    return None


def _time(
    out: Writer, jobs: TableFacts, key: str, names: tuple[str, ...], why: str
) -> ColumnFacts | None:
    """The column of ``jobs`` that ``key`` maps to, written as that key (its type, then ``why``);
    None, and nothing written, when no column fits."""
    column = _find_time(jobs, names)
    if column is not None:
        out.key(key, column.name, f"{column.type}, by its name{why}")
    return column


def _times(out: Writer, jobs: TableFacts, one_to_one: bool) -> list[ColumnFacts]:
    updated = _time(out, jobs, "updated_at", _UPDATED, "")
    if updated is None:
        out.todo(
            f"{jobs.shown} has no updated_at: the reactor needs a timestamp the app sets "
            "whenever it touches a job; add one and set updated_at to it"
        )
    created = None
    if one_to_one:
        out.comment("created_at is left out: it orders several jobs of one run, and a run has one.")
    else:
        created = _time(out, jobs, "created_at", _CREATED, ": orders a run's jobs")
        if created is None:
            out.todo(
                f"{jobs.shown} has no created_at: several jobs share a run, and the reactor "
                "orders them by the time they were created; set created_at to that column"
            )
    deleted = _time(out, jobs, "deleted_at", _DELETED, ": a deleted job needs no run")
    if deleted is None:
        out.comment("deleted_at is left out: no soft-delete column was found.")
    return [column for column in (updated, created, deleted) if column is not None]


def _saved_by(runs: TableFacts, tied: Link) -> tuple[ColumnFacts | None, str]:
    taken = {tied.key, tied.job}
    for column in runs.columns:
        fits = column.type in TEXT_TYPES and (not column.not_null or column.filled)
        if normal(column.name) in _SAVED_BY and column.name not in taken and fits:
            return column, f"{column.type}, by its name"
    return None, (
        f"no text column of {runs.shown} says who saved a row: `reactor migrate` adds this one "
        "(NULL: a row the app saved)"
    )


def _columns(
    out: Writer, jobs: TableFacts, runs: TableFacts, tied: Link
) -> list[tuple[str, str | None]]:
    """Writes [runs] and [runs.columns]; (artifact column, the job column it is filled from)."""
    out.section("runs")
    out.key("table", runs.shown, "the artifact table (--runs)")
    if tied.key is not None:
        out.key("key", tied.key, tied.why.get("key", ""))
    else:
        out.todo(f"set key to the unique column of {runs.shown} that jobs.run matches")
    if tied.job is not None:
        same = "; the same column as key: one-to-one" if tied.one_to_one else ""
        out.key("job", tied.job, tied.why.get("job", "") + same)
    else:
        out.todo(f"set job to the column of {runs.shown} that holds the job's id")
    saved_by, why = _saved_by(runs, tied)
    out.key("saved_by", saved_by.name if saved_by else "saved_by", why)
    client, worker = ["client"], "worker"
    if saved_by is not None and saved_by.checked:
        allowed = [str(v) for v in saved_by.checked]
        found = [v for v in allowed if v.lower() in _WORKER_VALUES]
        if found:
            worker, client = found[0], [v for v in allowed if v != found[0]]
        else:
            out.todo(
                f"which of {runs.shown}.{saved_by.name}'s values ({', '.join(allowed)}) means the "
                "reactor wrote the row? set worker to it, and client to the others"
            )
    out.key("client", client, "the values that mean the app saved the row; NULL counts too")
    out.key("worker", worker, "the value the reactor writes")
    out.section("runs.columns")
    out.comment("Each artifact column the reactor writes = an SQL expression over the job row j.")
    written = {tied.key, tied.job, saved_by.name if saved_by else "saved_by"}
    own_key = set(runs.primary_key) - written
    filled: list[tuple[str, str | None]] = []
    for column in runs.columns:
        if column.name in written:
            continue
        required = column.not_null and not column.filled
        source = jobs.column(column.name)
        if normal(column.name) in _DELETED:
            # The job's soft delete is the job's: a deleted job needs no run, and the artifact
            # the reactor writes is a live one, whatever the app later does to it.
            out.comment(
                f"{column.name} is left out: the artifact's own soft-delete column is the "
                "app's to set, never copied from the job's"
            )
            if required:
                out.todo(
                    f"{runs.shown}.{column.name} is NOT NULL without a default: fill it with "
                    "the value of an artifact that is not deleted"
                )
        elif column.type in TIME_TYPES and normal(column.name) in (*_UPDATED, *_CREATED):
            # The artifact's own times: the write's, as the app's save sets them; a job's
            # created_at is when the job was made, not its artifact.
            now = f"now() AT TIME ZONE '{ZONE}'" if column.naive else "now()"
            out.key(column.name, now, "the time of the write, as the app's own save sets it")
            filled.append((column.name, None))
        elif column.name in own_key and required and column.type in ("uuid", *TEXT_TYPES):
            fresh = "gen_random_uuid()" + ("" if column.type == "uuid" else "::text")
            out.key(
                column.name, fresh, "the artifact's own primary key, without a default: a new one"
            )
            filled.append((column.name, None))
        elif column.name in own_key or source is None or source.name in (tied.id, tied.run):
            if required:
                out.todo(
                    f"{runs.shown}.{column.name} ({column.type}) is NOT NULL without a default, "
                    f"and no column of {jobs.shown} has its name: fill it with an SQL expression "
                    "over the job row j"
                )
                out.comment(f'{key_text(column.name)} = "j.<column>"')
        elif required or source.type == column.type:
            why = "NOT NULL without a default; " if required else ""
            types = (
                f"the same type, {column.type}"
                if source.type == column.type
                else f"{source.type} into {column.type}"
            )
            out.key(
                column.name,
                f"j.{readable(source.name)}",
                f"{why}{jobs.shown}.{source.name}: {types}",
            )
            filled.append((column.name, source.name))
    return [(c, s) for c, s in filled if (col := runs.column(c)) is not None and col.not_null]
