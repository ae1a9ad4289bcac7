"""Every ``reactor.…`` name the prose writes is a real module, or an attribute of one.

The prose is the comments and docstrings of reactor/, tests/, bench/ and docs/generate.py, the
comments of the SQL in triggers/ and of the TypeScript in examples/, and the pages: docs/ (the
generated reference included, since it is what a reader sees), README.md and
tests/apps/README.md. CHANGELOG.md is left out: it is history, and a line names the module as it
was when the line was written. So is bench/REPORT.md: ``python -m bench`` writes it from the
results of past runs, each at its own commit, and nobody edits it by hand; the prose it is
written from is in bench/*.py, which this reads.

A name in the ``reactor`` schema of PostgreSQL (``reactor.pending``, ``reactor.hook_outbox``,
a setting such as ``reactor.worker_key``) is SQL, not Python; those are read from triggers/. A
span or attribute name the code writes as a string (``reactor.scan``, ``reactor.jobs.count``) is
telemetry's; those are read from reactor/. A page's ``from reactor… import name`` must import,
and a path into the checkout (``reactor/…``, ``tests/…``, ``triggers/…``) must be there.
"""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import io
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests import tools

ROOT = tools.ROOT

# A dotted name that starts with `reactor`, not as the tail of a path, a word or a longer name
# (`./reactor.toml`, `backstop-reactor`, `self.reactor.queue`).
DOTTED = re.compile(r"(?<![\w./@-])~?(reactor(?:\.[A-Za-z_]\w*)+)")
# A page's import line, whose imported name must be there too.
FROM_IMPORT = re.compile(r"\bfrom (reactor(?:\.\w+)*) import (\w+)")
# A path into the checkout (a module's file, a room's folder, a test, a SQL file).
PATH = re.compile(
    r"(?<![\w./-])((?:reactor|tests|bench|triggers|docs|deploy|examples)/[\w/.-]*[\w/])"
)
# A Sphinx role whose target is relative to the package of the file it is written in.
RELATIVE_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj):`~?(\.[\w.]+)`")

# Names in the prose that are neither Python nor SQL, each with what it is.
NOT_PYTHON = {
    "reactor.toml": "the mapping file's usual name",
}

# The SQL objects of the reactor schema: `@reactor@.name` in the SQL files, the settings the SQL
# reads by name (`'reactor.worker_key'`), the indexes and the primary keys of its tables.
SQL_OBJECT = re.compile(r"@reactor@\.(\w+)")
SQL_SETTING = re.compile(r"'reactor\.(\w+)'")
SQL_INDEX = re.compile(r"\bINDEX\s+(?:CONCURRENTLY\s+)?(?:IF NOT EXISTS\s+)?(\w+)", re.IGNORECASE)
SQL_TABLE = re.compile(r"\bTABLE\s+(?:IF NOT EXISTS\s+)?@reactor@\.(\w+)", re.IGNORECASE)


def _sql_code(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


@cache
def sql_names() -> frozenset[str]:
    """The names, after ``reactor.``, of what the SQL files create or read in the schema."""
    names: set[str] = set()
    for path in (ROOT / "triggers").rglob("*.sql"):
        code = _sql_code(path.read_text(encoding="utf-8"))
        names |= set(SQL_OBJECT.findall(code)) | set(SQL_SETTING.findall(code))
        names |= set(SQL_INDEX.findall(code))
        names |= {f"{table}_pkey" for table in SQL_TABLE.findall(code)}
    return frozenset(names)


@cache
def parsed(path: Path) -> ast.Module:
    """A Python file's tree, parsed once for every reader here."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    # Statements only, nested ones included: a docstring is never inside an expression, and
    # leaving the expressions out makes the walk several times shorter.
    for statement in body:
        yield statement
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def _docstrings(tree: ast.Module) -> Iterator[ast.Constant]:
    for node in [tree, *_statements(tree.body)]:
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)
        ):
            yield node.body[0].value


@cache
def telemetry_names() -> frozenset[str]:
    """The ``reactor.…`` strings the code writes as values (span names, attribute keys).

    A logger's name is left out: each names the module it logs for, so prose that names one
    names the module.
    """
    names: set[str] = set()
    for path in (ROOT / "reactor").rglob("*.py"):
        tree = parsed(path)
        nodes = list(ast.walk(tree))
        left_out = {id(node) for node in _docstrings(tree)}
        left_out |= {
            id(argument)
            for node in nodes
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            for argument in node.args
        }
        names |= {
            node.value
            for node in nodes
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in left_out
            and re.fullmatch(r"reactor(\.\w+)+", node.value)
        }
    return frozenset(names)


def python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """The comments and docstrings of a Python file, each with its line."""
    text = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for docstring in _docstrings(parsed(path)):
        yield docstring.lineno, str(docstring.value)


def sql_prose(path: Path) -> Iterator[tuple[int, str]]:
    """The comments of a SQL file, each with its line."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if "--" in line:
            yield number, line.split("--", 1)[1]


def script_prose(path: Path) -> Iterator[tuple[int, str]]:
    """The line comments of a TypeScript file, each with its line."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if "//" in line:
            yield number, line.split("//", 1)[1]


def page_prose(path: Path) -> Iterator[tuple[int, str]]:
    """Every line of a Markdown page: its code blocks are prose a reader follows too."""
    yield from enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)


@cache
def prose() -> tuple[tuple[Path, int, str], ...]:
    """Every piece of prose this test reads, with its file and line."""
    return tuple(_prose())


def _prose() -> Iterator[tuple[Path, int, str]]:
    for folder in ("reactor", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield from ((path, line, text) for line, text in python_prose(path))
    yield from (
        (ROOT / "docs/generate.py", n, t) for n, t in python_prose(ROOT / "docs/generate.py")
    )
    for path in sorted((ROOT / "triggers").rglob("*.sql")):
        yield from ((path, line, text) for line, text in sql_prose(path))
    for path in sorted((ROOT / "examples").glob("*/*.ts")):
        yield from ((path, line, text) for line, text in script_prose(path))
    pages = [
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
        ROOT / "tests/apps/README.md",
    ]
    for path in pages:
        yield from ((path, line, text) for line, text in page_prose(path))


def package_of(path: Path) -> str | None:
    """The package a file of reactor/ is in (an ``__init__.py``'s own), against which a
    relative role resolves."""
    if not path.is_relative_to(ROOT / "reactor"):
        return None
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def names_in(path: Path, text: str) -> Iterator[tuple[int, str]]:
    """The absolute ``reactor.…`` names a piece of prose writes, each with its line in it."""

    def line(match: re.Match[str]) -> int:
        return text.count("\n", 0, match.start())

    yield from ((line(found), found[1]) for found in DOTTED.finditer(text))
    yield from ((line(found), f"{found[1]}.{found[2]}") for found in FROM_IMPORT.finditer(text))
    package = package_of(path)
    if package is not None:
        yield from ((line(found), package + found[1]) for found in RELATIVE_ROLE.finditer(text))


def _attribute_of_class(owner: type, name: str) -> bool:
    # An attribute an instance has but the class does not: a dataclass field without a default,
    # an annotation, a slot, or one `__init__` (or another method) assigns to `self`.
    for cls in inspect.getmro(owner):
        if name in getattr(cls, "__annotations__", {}) or name in getattr(cls, "__slots__", ()):
            return True
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=", source):
            return True
    return False


@cache
def resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute (of an attribute...) of one."""
    parts = name.split(".")
    module = importlib.import_module(parts[0])
    index = 1
    while index < len(parts):
        try:
            module = importlib.import_module(".".join(parts[: index + 1]))
        except ModuleNotFoundError as error:
            if error.name != ".".join(parts[: index + 1]):
                raise
            break
        index += 1
    found: object = module
    for part in parts[index:]:
        if not hasattr(found, part):
            # An instance's attribute will do: what lies past it is not on the class.
            return inspect.isclass(found) and _attribute_of_class(found, part)
        found = getattr(found, part)
    return True


def is_sql(name: str) -> bool:
    """Whether ``name`` is an object of the reactor schema, or a column of one."""
    parts = name.split(".")
    return parts[1] in sql_names() and len(parts) <= 3


def known(name: str) -> bool:
    """Whether ``name`` is Python that exists, SQL, telemetry's, or one of :data:`NOT_PYTHON`."""
    return name in NOT_PYTHON or name in telemetry_names() or is_sql(name) or resolves(name)


def is_path(written: str) -> bool:
    """Whether a file or folder is there, or a file of that name but its suffix (a mapping
    written as ``tests/mappings/second``)."""
    path = ROOT / written
    return path.exists() or any(path.parent.glob(glob.escape(path.name) + ".*"))


def unresolved() -> list[str]:
    """Each name no module has and each path no file is, as ``file:line: name``."""
    missing: list[str] = []
    for path, first, text in prose():
        gone = [(at, name) for at, name in names_in(path, text) if not known(name)]
        gone += [
            (text.count("\n", 0, found.start()), found[1])
            for found in PATH.finditer(text)
            if not is_path(found[1])
        ]
        missing += [f"{path.relative_to(ROOT)}:{first + at}: {name}" for at, name in gone]
    return missing


def test_every_name_and_path_the_prose_writes_exists() -> None:
    missing = unresolved()
    assert missing == [], "the prose names what no longer exists:\n" + "\n".join(missing)


class _Example:
    """A class whose instances have attributes the class itself lacks."""

    declared: int

    def __init__(self) -> None:
        self.assigned = 1


def test_each_reader_finds_the_names_of_its_prose_and_only_those(tmp_path: Path) -> None:
    # Without this, a reader that found nothing would pass the test above.
    module = tmp_path / "module.py"
    module.write_text(
        '"""The module, :mod:`reactor.core.deadlines`."""\n'
        'SPAN = "reactor.not.prose"  # see reactor.core.clock\n'
        "def f() -> None:\n"
        '    """:class:`~reactor.core.ownership.Roster`."""\n'
        "    if True:\n"
        "        class C:\n"
        '            """reactor.core.backoff, nested."""\n',
        encoding="utf-8",
    )
    found = {name for _, text in python_prose(module) for _, name in names_in(module, text)}
    assert found == {
        "reactor.core.deadlines",
        "reactor.core.clock",
        "reactor.core.ownership.Roster",
        "reactor.core.backoff",
    }
    script = tmp_path / "script.sql"
    script.write_text("SELECT 1 FROM @reactor@.pending;  -- see reactor.runtime.vitals\n")
    assert [text for _, text in sql_prose(script)] == [" see reactor.runtime.vitals"]
    queries = ROOT / "reactor" / "db" / "queries.py"
    assert list(names_in(queries, "a :class:`~.calls.Pooled`")) == [(0, "reactor.db.calls.Pooled")]
    package = ROOT / "reactor" / "db" / "__init__.py"
    assert list(names_in(package, "\n:mod:`.session`")) == [(1, "reactor.db.session")]
    page = "from reactor.hooks.signature import verify_signature"
    assert "reactor.hooks.signature.verify_signature" in {n for _, n in names_in(module, page)}
    assert list(names_in(module, "self.reactor.queue, ./reactor.toml, backstop-reactor.x")) == []


def test_a_name_resolves_to_a_module_an_attribute_or_an_instances_attribute() -> None:
    assert resolves("reactor.record.recorder")
    assert resolves("reactor.core.deadlines.Deadlines")
    assert resolves("tests.unit.test_names._Example.declared")
    assert resolves("tests.unit.test_names._Example.assigned")
    assert not resolves("tests.unit.test_names._Example.missing")
    assert not resolves("reactor.core.deadlines.Nowhere")
    assert not resolves("reactor.intake.dispatch")
    assert is_sql("reactor.pending")
    assert not is_sql("reactor.intake")
    assert "reactor.jobs.count" in telemetry_names()
    assert "reactor.db" not in telemetry_names()  # a logger's name
    assert known("reactor.hooks.signature.verify_signature")
    assert not known("reactor.signature.verify_signature")
    assert is_path("tests/mappings/second")
    assert not is_path("reactor/intake")


def test_the_prose_read_is_every_kind_this_test_promises() -> None:
    read = {path.relative_to(ROOT).as_posix() for path, _, _ in prose()}
    assert {
        "reactor/claim/dispatch.py",
        "tests/unit/test_layout.py",
        "bench/report.py",
        "docs/generate.py",
        "triggers/queries.sql",
        "examples/bun/reactor-hooks.test.ts",
        "docs/development.md",
        "docs/reference/cli.md",
        "README.md",
        "tests/apps/README.md",
    } <= read
    assert not {"CHANGELOG.md", "bench/REPORT.md"} & read
