"""The SQL shipped in the ``triggers`` package: migrations, schema files and named queries.

Pure loading and text assembly; nothing here connects to a database.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

import psycopg.sql

from reactor.install.mapping import REFERENCE, Mapping
from reactor.install.quote import DOLLAR_DELIMITER, dollar_quoted

_BLOCK = re.compile(r"^-- (name|fragment): (\w+)[ \t]*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{(\w+)\}\}")
# A slot the mapping fills: @jobs@, @j.updated_at@ (a column of row j), @eligible(j)@.
_SLOT = re.compile(r"@(?:(\w+)\.)?(\w+)(?:\((\w*)\))?@")
_MIGRATION = re.compile(r"(\d{4})_(\w+)\.sql")
# A psycopg placeholder, or a literal % written twice.
_PLACEHOLDER = re.compile(r"%(?:%|\((\w+)\)s)")
# The pieces of a statement's top-level WITH, matched where the scan of its parentheses stands,
# whatever the spacing and line breaks around them.
_WITH = re.compile(r"\s*WITH\s+", re.IGNORECASE)
_CTE_HEAD = re.compile(r"(\w+)\s+AS\s*\(", re.IGNORECASE)
_CTE_NEXT = re.compile(r"\s*,\s*")
_SELECT = re.compile(r"\s*SELECT\s+", re.IGNORECASE)
# What the scan for a closing parenthesis steps over whole: a quoted literal or name, a comment.
_OPAQUE = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)


@dataclass(frozen=True)
class Migration:
    """One numbered file of ``triggers/migrations``."""

    version: int
    name: str
    text: str


def read(name: str) -> str:
    """The text of ``triggers/<name>``."""
    return files("triggers").joinpath(name).read_text(encoding="utf-8")


def render(
    text: str,
    mapping: Mapping,
    *,
    channel: str | None = None,
    spread: bool = False,
    values: dict[str, str] | None = None,
    parameters: bool = False,
) -> str:
    """Fill the slots of ``text`` (a template) from ``mapping``, ``@channel@``
    with the NOTIFY channel, quoted as a literal, ``@spread@`` with the job trigger's second
    argument ('spread' when it notifies each share of the jobs on a channel of its own), and
    ``@name@`` with ``values[name]``, SQL the caller made (quoted names, a [runs.columns]
    expression).

    ``parameters``: the text is to run with psycopg parameters, as every named query is.
    psycopg then reads each ``%`` as the start of a placeholder, so every ``%`` a slot fills in
    (a table ``100%``, an expression's ``'100%'``, or ``%(hooks)s`` meant as text) is doubled,
    which psycopg turns back into one. The template's own ``%`` are its placeholders. Without
    ``parameters`` (migrations, the printed script) nothing is doubled: psycopg sends the text
    as it is.

    The template's dollar quotes (``AS $$ ... $$``) stay closed where it closes them: a
    delimiter that a filled-in name or value also holds is replaced by one that occurs nowhere
    else (:func:`~reactor.install.quote.dollar_quoted`).
    """

    def fill(match: re.Match[str]) -> str:
        alias, name, argument = match.groups()
        if name == "channel" and alias is None and argument is None:
            if channel is None:
                raise KeyError("@channel@ needs a channel")
            filled = psycopg.sql.quote(channel)
        elif name == "spread" and alias is None and argument is None:
            filled = "'spread'" if spread else "''"
        elif values is not None and name in values and alias is None and argument is None:
            filled = values[name]
        else:
            filled = mapping.slot(name, alias, argument)
        return filled.replace("%", "%%") if parameters else filled

    # Split at the template's own delimiters before anything is filled in: what a slot fills
    # in is never taken for one.
    parts = DOLLAR_DELIMITER.split(text)
    delimiters = DOLLAR_DELIMITER.findall(text)
    return dollar_quoted([_SLOT.sub(fill, piece) for piece in parts], delimiters)


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration, in version order."""
    found = []
    for entry in files("triggers").joinpath("migrations").iterdir():
        match = _MIGRATION.fullmatch(entry.name)
        if match:
            version, name = match.groups()
            text = entry.read_text(encoding="utf-8")
            found.append(Migration(int(version), name, text))
    found.sort(key=lambda m: m.version)
    # `reactor migrate` applies what comes after the newest applied version: a gap would be
    # skipped for good by a database migrated before the missing number arrived.
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations are not numbered 1..n: {[m.version for m in found]}")
    return tuple(found)


@cache
def baseline() -> Migration:
    """What a first install applies: schema.sql, the newest migration's state in one file, so
    that every mapping installs from the same text (the numbered migrations are the upgrade
    road of installs made before it, on the reference tables)."""
    latest = migrations()[-1]
    return Migration(latest.version, "baseline", read("schema.sql"))


def repeatable(mapping: Mapping = REFERENCE) -> Migration:
    """What every `reactor migrate` applies after the migrations: notify_triggers.sql, then the
    part of app_saves.sql that ``mapping``'s runs.app_saves names (the triggers of the app's
    plain save, or the statements that drop them)."""
    return Migration(
        0, "repeatable", read("notify_triggers.sql") + app_saves(mapping.runs.app_saves)
    )


def app_saves(mode: str) -> str:
    """The part of ``triggers/app_saves.sql`` for ``mode`` ("plain" or "upsert"), with its
    comments: it is printed by `reactor migrate --print`."""
    parts = _BLOCK.split(read("app_saves.sql"))
    blocks = {
        name: body for _, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
    }
    return f"\n-- app_saves = {mode}\n" + blocks[mode].strip() + "\n"


def latest_version() -> int:
    """The schema version this release needs."""
    return migrations()[-1].version


def queries(filename: str, mapping: Mapping) -> dict[str, str]:
    """The named queries of a file, with fragments (its own and queries.sql's) spliced in and
    slots filled from ``mapping``. An install renders them once (:meth:`Install.query`).

    Each is run with parameters (``{}`` when it takes none), never without: its filled-in ``%``
    are doubled for psycopg's placeholder parsing (see :func:`render`), which only parameters
    turn on.
    """
    return {
        name: render(text, mapping, parameters=True) for name, text in templates(filename).items()
    }


@cache
def templates(filename: str = "queries.sql") -> dict[str, str]:
    """The named queries of a file as written, fragments spliced in, slots still open."""
    fragments = _blocks("queries.sql", "fragment")
    fragments.update(_blocks(filename, "fragment"))
    named = _blocks(filename, "name")

    def expand(text: str, seen: tuple[str, ...] = ()) -> str:
        def splice(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in seen:
                raise RuntimeError(f"fragment {name} includes itself")
            return expand(fragments[name], (*seen, name))

        return _INCLUDE.sub(splice, text)

    return {name: expand(body) for name, body in named.items()}


def part_name(name: str, index: int) -> str:
    """What ``name`` (a parameter, a common table expression) is called in part ``index`` of
    a :func:`union`."""
    return f"{name}__p{index}"


@dataclass(frozen=True)
class UnionPart:
    """A named query as one part of a :func:`union`: the common table expressions of its
    top-level WITH, as (name, body) with the body between its parentheses, and what its one
    SELECT selects (the text after ``SELECT``)."""

    ctes: tuple[tuple[str, str], ...]
    select: str

    def rendered(self, mapping: Mapping) -> UnionPart:
        """The part with its slots filled from ``mapping`` (see :func:`render`), to run with
        parameters."""

        def fill(text: str) -> str:
            return render(text, mapping, parameters=True)

        return UnionPart(tuple((name, fill(body)) for name, body in self.ctes), fill(self.select))


def union_template(template: str, index: int) -> UnionPart:
    """``template`` (a named query as written: one top-level WITH, then one SELECT of one row)
    as part ``index`` of a :func:`union`: its parameters and its common table expressions get
    the part's suffix (:func:`part_name`), so that the parts of several pairs can share one
    WITH. Slots stay open; nothing a mapping fills in is touched. ValueError for a template of
    another shape."""
    ctes, select = _with_and_select(template)
    names = [name for name, _ in ctes]
    # A slot is left as it is, a placeholder and a name of the WITH get the suffix.
    tokens = re.compile(rf"{_SLOT.pattern}|{_PLACEHOLDER.pattern}|\b({'|'.join(names)})\b")

    def rename(match: re.Match[str]) -> str:
        placeholder, cte = match.group(4, 5)
        if placeholder is not None:
            return f"%({part_name(placeholder, index)})s"
        return match.group(0) if cte is None else part_name(cte, index)

    return UnionPart(
        tuple((part_name(name, index), tokens.sub(rename, body)) for name, body in ctes),
        tokens.sub(rename, select),
    )


def _with_and_select(template: str) -> tuple[tuple[tuple[str, str], ...], str]:
    # Read by its parentheses: WITH, then "name AS (body)" separated by commas, then SELECT.
    shape = ValueError("a part of a union is one WITH and one SELECT")
    found = _WITH.match(template)
    if found is None:
        raise shape
    at, ctes = found.end(), []
    while True:
        head = _CTE_HEAD.match(template, at)
        if head is None:
            raise shape
        close = _closing(template, head.end())
        ctes.append((head.group(1), template[head.end() : close]))
        at = close + 1
        comma = _CTE_NEXT.match(template, at)
        if comma is None:
            break
        at = comma.end()
    select = _SELECT.match(template, at)
    if select is None:
        raise shape
    return tuple(ctes), template[select.end() :]


def _closing(text: str, start: int) -> int:
    """Where the parenthesis open before ``start`` closes, stepping over literals, quoted
    names and comments."""
    depth, at = 1, start
    while at < len(text):
        opaque = _OPAQUE.match(text, at)
        if opaque is not None:
            at = opaque.end()
            continue
        depth += {"(": 1, ")": -1}.get(text[at], 0)
        if depth == 0:
            return at
        at += 1
    raise ValueError("a part of a union is one WITH and one SELECT")


def union(parts: Sequence[UnionPart]) -> str:
    """One statement of the ``parts`` (each made by :func:`union_template`): their common
    table expressions under one WITH, then each part's row, in order, with its index as column
    ``part``. PostgreSQL takes a data-modifying WITH only at the top of a statement, so the
    parts are composed into one WITH rather than nested."""
    # A part's own on the lines it wrote them on, each part from a line of its own.
    ctes = [", ".join(f"{name} AS ({body})" for name, body in part.ctes) for part in parts]
    selects = [f"SELECT {index} AS part, {part.select}" for index, part in enumerate(parts)]
    return "WITH " + ",\n".join(ctes) + "\n" + "\nUNION ALL\n".join(selects) + "\nORDER BY part"


@cache
def union_query(name: str, mappings: tuple[Mapping, ...], filename: str = "queries.sql") -> str:
    """The named query ``name``, run once for each of ``mappings`` in one statement (see
    :func:`union`), ready for the driver; part ``i`` takes its parameters under
    :func:`part_name`."""
    template = templates(filename)[name]
    return union(
        [
            union_template(template, index).rendered(mapping)
            for index, mapping in enumerate(mappings)
        ]
    )


def _blocks(filename: str, kind: str) -> dict[str, str]:
    # Text before the first marker is the file's own preamble (for audit.sql, runnable DDL).
    parts = _BLOCK.split(read(filename))
    return {
        name: _strip_comments(body)
        for block_kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True)
        if block_kind == kind
    }


def preamble(filename: str) -> str:
    """The part of a file before its first named block."""
    return _BLOCK.split(read(filename))[0]


def _strip_comments(body: str) -> str:
    # Whole-line comments only: they document the block, the server doesn't need them.
    lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
    return "\n".join(lines)
