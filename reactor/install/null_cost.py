"""What a NULL costs: an artifact column that is NOT NULL, filled from a job column that may be
NULL. Written as it is, such a job's run is refused by the artifact's constraint and the job is
set aside; the two fixes are the mapping's: add the job column to ``[jobs] not_null`` (the job
then needs no run), or ``coalesce`` it in ``[runs.columns]``.

Which expressions may be NULL is read from their column sources, not asked of the server: an
expression that names a job column (``j.col``, ``j."Col"``) which may be NULL, and is not a
``coalesce(...)`` as a whole, may be NULL. It is a warning's judgement (``reactor migrate``
warns, never refuses), so a false alarm costs a line, and no expression is ever run for it.

:func:`line_of` finds a ``[runs.columns]`` key's line in the mapping file, so that the warning,
the log line of a job set aside and its ``reactor status`` entry say where to make the fix.
Pure, but for :func:`where`, which reads the file.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable

from reactor.install.mapping import Mapping
from reactor.install.quote import readable
from reactor.shown import printable

# A column of the job row: j.name or j."Name" (with "" for a quote), not j.name( (a function).
_SOURCE = re.compile(r'(?<![\w."])j\s*\.\s*(?:"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_$]*))(?!\s*\()')
_STRING = re.compile(r"'(?:[^']|'')*'")
_COALESCE = re.compile(r"\s*coalesce\s*\(", re.IGNORECASE)
_HEADER = re.compile(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(?:#.*)?$")
# PostgreSQL's message of a NOT NULL violation (SQLSTATE 23502), its column named.
_NOT_NULL_MESSAGE = re.compile(r'null value in column "((?:[^"]|"")+)"')
NOT_NULL_VIOLATION = "23502"


def column_sources(expression: str) -> set[str]:
    """The job columns ``expression`` names (``j.col``, ``j."Col"``), outside its strings."""
    bare = _STRING.sub("''", expression)
    return {
        quoted.replace('""', '"') if quoted else plain.lower()
        for quoted, plain in _SOURCE.findall(bare)
    }


def _whole_coalesce(expression: str) -> bool:
    # coalesce( ... ) as the whole expression: its last argument is the operator's fallback.
    opened = _COALESCE.match(expression)
    if opened is None or not expression.rstrip().endswith(")"):
        return False
    depth = 0
    body = expression.rstrip()
    for index in range(opened.end() - 1, len(body)):
        depth += {"(": 1, ")": -1}.get(body[index], 0)
        if depth == 0:
            return index == len(body) - 1
    return False


def nullable_sources(expression: str, nullable: Iterable[str]) -> list[str]:
    """The job columns that may be NULL and make ``expression`` NULL with them, in their
    order; empty when the expression cannot be NULL by them."""
    maybe = set(nullable)
    if _whole_coalesce(expression):
        return []
    return sorted(column_sources(expression) & maybe)


def costs(
    mapping: Mapping, runs_not_null: Iterable[str], jobs_nullable: Iterable[str]
) -> list[tuple[str, str, list[str]]]:
    """(artifact column, its expression, the job columns it may be NULL by) for each NOT NULL
    artifact column of ``mapping`` (``runs_not_null``) filled from a job column that may be NULL
    (``jobs_nullable``) and is not in ``[jobs] not_null``."""
    required = set(runs_not_null)
    nullable = set(jobs_nullable) - set(mapping.jobs.not_null)
    found = []
    for column, expression in mapping.runs.columns:
        if column in required:
            sources = nullable_sources(expression, nullable)
            if sources:
                found.append((column, expression, sources))
    return found


def line_of(text: str, column: str) -> int | None:
    """The line (from 1) of the mapping file ``text`` that fills ``column`` in [runs.columns]:
    its key in ``[runs.columns]``, ``columns.KEY`` in ``[runs]``, or the line of an inline
    ``columns = {...}``; None when none is found."""
    section = ""
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header is not None:
            section = header.group(1).replace(" ", "")
            continue
        key = _key(line)
        if key is None:
            continue
        if section == "runs.columns" and key == (column,):
            return number
        inline = key == ("columns",) and column in _inline_keys(line)
        if section == "runs" and (key == ("columns", column) or inline):
            return number
    return None


def _key(line: str) -> tuple[str, ...] | None:
    # The dotted key a `key = value` line sets, as TOML reads it; None for anything else.
    if "=" not in line or line.lstrip().startswith("#"):
        return None
    try:
        parsed = tomllib.loads(line.split("=", 1)[0] + "= 0")
    except tomllib.TOMLDecodeError:
        return None
    path: list[str] = []
    node: object = parsed
    while isinstance(node, dict) and len(node) == 1:
        ((name, node),) = node.items()
        path.append(name)
    return tuple(path)


def _inline_keys(line: str) -> set[str]:
    try:
        parsed = tomllib.loads(line)
    except tomllib.TOMLDecodeError:
        return set()
    columns = parsed.get("columns")
    return set(columns) if isinstance(columns, dict) else set()


def where(mapping: Mapping, column: str) -> str:
    """Where ``column``'s expression is written: ``FILE:LINE`` of the mapping file, or
    ``[runs.columns] COLUMN in FILE`` when its line is not found (or the reference mapping)."""
    if mapping.source is None:
        return f"[runs.columns] {printable(column)} of the reference mapping"
    try:
        with open(mapping.source, encoding="utf-8") as file:
            number = line_of(file.read(), column)
    except (OSError, UnicodeDecodeError):
        number = None
    if number is None:
        return f"[runs.columns] {printable(column)} in {printable(mapping.source)}"
    return f"{printable(mapping.source)}:{number}"


def fixes(mapping: Mapping, column: str, sources: Iterable[str] = ()) -> str:
    """The two fixes of ``column``'s NULL, and where to make them."""
    named = ", ".join(printable(s) for s in sources) or "the job column it is filled from"
    return (
        f"{where(mapping, column)}: the artifact's {printable(column)} is NOT NULL and "
        f"{named} may be NULL; add {named} to [jobs] not_null (such a job then needs no run), "
        f'or coalesce it there ({printable(readable(column))} = "coalesce(...)")'
    )


def violated_column(sqlstate: str | None, error: str) -> str | None:
    """The column a NOT NULL violation's message (``error``, SQLSTATE ``sqlstate``) names;
    None for any other error."""
    if sqlstate != NOT_NULL_VIOLATION:
        return None
    found = _NOT_NULL_MESSAGE.search(error)
    return found.group(1).replace('""', '"') if found else None


def set_aside_fix(mapping: Mapping, sqlstate: str | None, error: str) -> str | None:
    """For a job set aside by a NOT NULL violation on a column ``[runs.columns]`` fills: the
    mapping's line and the two fixes; None for any other error."""
    column = violated_column(sqlstate, error)
    expressions = dict(mapping.runs.columns)
    if column is None or column not in expressions:
        return None
    return fixes(mapping, column, sorted(column_sources(expressions[column])))
