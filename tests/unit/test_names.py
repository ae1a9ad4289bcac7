"""Every ``reactor.…`` name the prose writes is a real module, or an attribute of one.

The prose is the comments and docstrings of reactor/, tests/, bench/ and docs/generate.py, the
comments of the SQL in triggers/, and the pages: docs/ (the generated reference included, since
it is what a reader sees), README.md and tests/apps/README.md. CHANGELOG.md is left out: it is
history, and a line names the module as it was when the line was written. So is bench/REPORT.md:
``python -m bench`` writes it from the results of past runs, each at its own commit, and nobody
edits it by hand; the prose it is written from is in bench/*.py, which this reads.

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


def _docstrings(tree: ast.AST) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
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
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node) for node in _docstrings(tree)}
        docstrings |= {
            id(argument)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            for argument in node.args
        }
        names |= {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and re.fullmatch(r"reactor(\.\w+)+", node.value)
        }
    return frozenset(names)


def python_prose(path: Path) -> Iterator[tuple[int, str]]:
    """The comments and docstrings of a Python file, each with its line."""
    text = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for docstring in _docstrings(ast.parse(text)):
        yield docstring.lineno, str(docstring.value)


def sql_prose(path: Path) -> Iterator[tuple[int, str]]:
    """The comments of a SQL file, each with its line."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if "--" in line:
            yield number, line.split("--", 1)[1]


def page_prose(path: Path) -> Iterator[tuple[int, str]]:
    """Every line of a Markdown page: its code blocks are prose a reader follows too."""
    yield from enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)


def prose() -> Iterator[tuple[Path, int, str]]:
    """Every piece of prose this test reads, with its file and line."""
    for folder in ("reactor", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield from ((path, line, text) for line, text in python_prose(path))
    yield from (
        (ROOT / "docs/generate.py", n, t) for n, t in python_prose(ROOT / "docs/generate.py")
    )
    for path in sorted((ROOT / "triggers").rglob("*.sql")):
        yield from ((path, line, text) for line, text in sql_prose(path))
    pages = [
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
        ROOT / "tests/apps/README.md",
    ]
    for path in pages:
        yield from ((path, line, text) for line, text in page_prose(path))


def package_of(path: Path) -> str | None:
    """The package a file of reactor/ is in, against which a relative role resolves."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] != "reactor":
        return None
    return ".".join(parts if parts[-1] == "__init__" and parts[:-1] else parts[:-1]).removesuffix(
        ".__init__"
    )


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
    """Whether ``name`` is a module of reactor, or an attribute (of an attribute...) of one."""
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


def test_every_name_in_the_prose_is_a_module_or_an_attribute_of_one() -> None:
    missing = unresolved()
    assert missing == [], "names that no longer exist:\n" + "\n".join(missing)


def test_the_reader_finds_a_name_in_each_kind_of_prose_and_rejects_a_made_up_one() -> None:
    # Without this, a reader that found nothing would pass the test above.
    found = {name for path, _, text in prose() for _, name in names_in(path, text)}
    assert {"reactor.listen.hints", "reactor.settings.config.Settings"} <= found
    assert resolves("reactor.core.deadlines.Deadlines")
    assert resolves("reactor.record.recorder")
    assert not resolves("reactor.core.deadlines.Nowhere")
    assert not resolves("reactor.intake.dispatch")
    assert is_sql("reactor.pending")
    assert not is_sql("reactor.intake")
    assert "reactor.jobs.count" in telemetry_names()
    assert not known("reactor.signature.verify_signature")
    assert known("reactor.hooks.signature.verify_signature")
