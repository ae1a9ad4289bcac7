"""How an artifact table's rows belong to a job table's: the pairs a database holds, and the
id, run, key and job columns of one pair. Pure: it reads :mod:`reactor.draft.facts` only.

A pair is a job table with a status-like column and an artifact table that references it: by a
foreign key, or by a column named after it (``job_id``, ``export_id``, ``jobId``) of the job
id's type. When that column is unique in the artifact, the pair is one-to-one (Django's
``OneToOneField(primary_key=True)``, Rails' ``has_one`` with a unique index, Prisma's
``@unique`` relation); otherwise several jobs share a run, and the job table names the run by a
foreign key to the artifact's key or by a column named after the artifact (``run_id``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from reactor.draft.facts import INTEGER_TYPES, TEXT_TYPES, ColumnFacts, TableFacts
from reactor.install.quote import readable
from reactor.shown import has_hidden, printable, shell_word

# Column names that say "the status of the row", compared without case or underscores.
_STATUS_NAMES = ("status", "state", "phase", "stage")


@dataclass(frozen=True)
class Link:
    """The columns that tie a pair together, each with where it came from; None: not found."""

    id: str | None
    run: str | None
    key: str | None
    job: str | None
    one_to_one: bool
    why: dict[str, str]

    def describe(self, jobs: TableFacts, runs: TableFacts) -> str:
        """One line for the list of candidates."""
        if self.one_to_one:
            return f"one-to-one: {runs.shown}.{self.key} is unique and {self.why['job']}"
        run = f"{jobs.shown}.{self.run}" if self.run else "a run column to be named"
        return f"several jobs per run: {run} names the {runs.shown} row"


def normal(name: str) -> str:
    """A name compared without case or underscores: export_id, exportId and ExportID agree."""
    return name.replace("_", "").lower()


def singular(name: str) -> str:
    lowered = name.lower()
    if lowered.endswith("ies"):
        return name[:-3] + "y"
    if lowered.endswith("ses") or lowered.endswith("xes"):
        return name[:-2]
    if lowered.endswith("s") and not lowered.endswith("ss"):
        return name[:-1]
    return name


def reference_names(table: TableFacts, generic: str) -> set[str]:
    """The normal names of a column that refers to ``table``: job_id, app_export_id, export_id."""
    one = singular(table.name)
    last = one.replace("-", "_").split("_")[-1]
    return {normal(one) + "id", normal(last) + "id", generic + "id"}


def status_column(table: TableFacts) -> ColumnFacts | None:
    """The status-like column: by name (status, state, …_status) and by a type a status can
    have (text, varchar, an enum or an integer), an exact name first."""
    fitting = [
        c for c in table.columns if c.type in TEXT_TYPES or c.type in INTEGER_TYPES or c.enum
    ]
    for column in fitting:
        if normal(column.name) in _STATUS_NAMES:
            return column
    for column in fitting:
        if normal(column.name).endswith(_STATUS_NAMES):
            return column
    return None


def id_column(table: TableFacts) -> ColumnFacts | None:
    """The job's id: its one-column primary key."""
    if len(table.primary_key) == 1:
        return table.column(table.primary_key[0])
    return None


def link(jobs: TableFacts, runs: TableFacts) -> Link | None:
    """How ``runs`` belongs to ``jobs``, or None when nothing ties the two together."""
    job_id = id_column(jobs)
    if job_id is None:
        return None
    why: dict[str, str] = {"id": f"the primary key of {jobs.shown} ({job_id.type})"}
    job = _job_column(jobs, runs, job_id, why)
    if job is None:
        # The job table may still name the run itself, by a foreign key to the artifact.
        by_jobs = _run_by_foreign_key(jobs, runs, why)
        if by_jobs is None:
            return None
        run, key = by_jobs
        why["job"] = f"no column of {runs.shown} names the job it was written from"
        return Link(job_id.name, run, key, None, False, why)
    if job in runs.unique:
        why["run"] = (
            f"one-to-one: {runs.shown}.{job} is unique and refers to {jobs.shown}.{job_id.name}, "
            "so the run key is the job's id"
        )
        why["key"] = f"unique in {runs.shown}, and refers to the job: one row per job"
        return Link(job_id.name, job_id.name, job, job, True, why)
    found = _run_by_foreign_key(jobs, runs, why) or _run_by_name(jobs, runs, why)
    if found is None:
        return Link(job_id.name, None, None, job, False, why)
    run, key = found
    return Link(job_id.name, run, key, job, False, why)


def _job_column(
    jobs: TableFacts, runs: TableFacts, job_id: ColumnFacts, why: dict[str, str]
) -> str | None:
    # A foreign key to the job's id first; else a column named after the job table.
    for fk in runs.references(jobs):
        if fk.target_column == job_id.name:
            why["job"] = f"references {jobs.shown}.{job_id.name} (a foreign key)"
            return fk.column
    names = reference_names(jobs, "job")
    for column in runs.columns:
        if normal(column.name) in names and column.type == job_id.type:
            why["job"] = (
                f"named after {jobs.shown}, of its id's type {job_id.type} (no foreign key)"
            )
            return column.name
    return None


def _run_by_foreign_key(
    jobs: TableFacts, runs: TableFacts, why: dict[str, str]
) -> tuple[str, str] | None:
    for fk in jobs.references(runs):
        if fk.target_column in runs.unique:
            why["run"] = f"references {runs.shown}.{fk.target_column} (a foreign key)"
            why["key"] = f"unique in {runs.shown}; {jobs.shown}.{fk.column} references it"
            return fk.column, fk.target_column
    return None


def _run_by_name(jobs: TableFacts, runs: TableFacts, why: dict[str, str]) -> tuple[str, str] | None:
    keys = [runs.column(name) for name in _unique_first_primary(runs)]
    names = reference_names(runs, "run")
    for key in keys:
        if key is None:
            continue
        for column in jobs.columns:
            if normal(column.name) in names and column.type == key.type:
                why["run"] = f"named after {runs.shown}, of the type of its key {key.name}"
                why["key"] = (
                    f"unique in {runs.shown} ({key.type}); {jobs.shown}.{column.name} names it"
                )
                return column.name, key.name
    return None


def _unique_first_primary(table: TableFacts) -> list[str]:
    primary = [table.primary_key[0]] if len(table.primary_key) == 1 else []
    return primary + sorted(table.unique - set(primary))


@dataclass(frozen=True)
class Candidate:
    """A job table and an artifact table that belong together."""

    jobs: TableFacts
    runs: TableFacts
    status: ColumnFacts
    link: Link

    def line(self) -> str:
        """How the list of candidates shows it: the command that drafts it, and why. Safe to
        paste: each name is one shell word that names its table (:func:`flag`). A name with a
        control character gets no command at all, only the pair, escaped, and a note."""
        why = printable(
            f"status {self.status.name} ({self.status.type}); "
            f"{self.link.describe(self.jobs, self.runs)}"
        )
        hidden = [t for t in (self.jobs, self.runs) if has_hidden(flag(t))]
        if hidden:
            names = " and ".join(printable(flag(t)) for t in hidden)
            return (
                f"(no command: {names} holds a control character, shown escaped; rename it, or "
                f"write the mapping by hand) jobs {printable(flag(self.jobs))}, runs "
                f"{printable(flag(self.runs))}   # {why}"
            )
        return (
            f"reactor init --jobs {shell_word(flag(self.jobs))} "
            f"--runs {shell_word(flag(self.runs))}   # {why}"
        )


def flag(table: TableFacts) -> str:
    """The name ``--jobs``/``--runs`` take for ``table`` (:func:`reactor.draft.catalog.find`
    reads it back): as the mapping file shows it when that reads back to this table, else
    quoted as SQL quotes names (``public."a.b"``)."""
    shown = table.shown
    if parse_name(shown) == table.key:
        return shown
    return readable(*table.key)


def parse_name(text: str) -> tuple[str, str] | None:
    """(schema, table) that a flag names: ``table`` or ``schema.table``, each part as the
    catalog spells it (case matters) or double-quoted as SQL quotes it (``public."Render"``,
    ``"my.schema"."t"``); an unqualified name is in public. None: not a name of one or two
    parts."""
    parts: list[str] = []
    i = 0
    while True:
        if text.startswith('"', i):
            part, i = _quoted(text, i)
            if part is None:
                return None
        else:
            end = text.find(".", i)
            end = len(text) if end < 0 else end
            part = text[i:end]
            if '"' in part:
                return None
            i = end
        if not part:
            return None
        parts.append(part)
        if i == len(text):
            break
        if text[i] != ".":
            return None
        i += 1
    if len(parts) == 1:
        return ("public", parts[0])
    if len(parts) == 2:
        return (parts[0], parts[1])
    return None


def _quoted(text: str, start: int) -> tuple[str | None, int]:
    # A double-quoted part from ``start`` (its opening quote): its text, "" read as ", and the
    # index just past its closing quote; None when it never closes.
    i = start + 1
    out = []
    while i < len(text):
        if text[i] == '"':
            if text.startswith('""', i):
                out.append('"')
                i += 2
                continue
            return "".join(out), i + 1
        out.append(text[i])
        i += 1
    return None, i


def candidates(tables: Iterable[TableFacts]) -> list[Candidate]:
    """Every pair of ``tables`` that could be a job table and its artifact table."""
    listed = list(tables)
    found = []
    for jobs in listed:
        status = status_column(jobs)
        if status is None:
            continue
        for runs in listed:
            if runs.key == jobs.key or runs.partitioned:
                continue
            tied = link(jobs, runs)
            if tied is not None:
                found.append(Candidate(jobs, runs, status, tied))
    return found
