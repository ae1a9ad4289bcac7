"""The benchmarks read like the tests: short functions, files of a readable length, and only the
reactor a user sees (its public packages, by the names their ``__init__`` gives) or the test
support of :mod:`reactor.testing`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests import tools

BENCH = tools.ROOT / "bench"
PACKAGE = tools.ROOT / "reactor"

MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 450

# The packages a bench may import from: the ones a user of the reactor works with, and the
# test support the demo, the tests and the benchmarks share.
ALLOWED = frozenset(
    {
        "reactor.cli",
        "reactor.db",
        "reactor.demo",
        "reactor.hooks",
        "reactor.install",
        "reactor.settings",
        "reactor.status",
        "reactor.testing",
    }
)


def bench_files() -> list[Path]:
    return sorted(BENCH.rglob("*.py"))


def shown(path: Path) -> Path:
    return path.relative_to(tools.ROOT) if path.is_relative_to(tools.ROOT) else path


def where(path: Path, line: int) -> str:
    return f"{shown(path)}:{line}"


def long_functions(path: Path, limit: int) -> Iterator[str]:
    """Each function of ``path`` longer than ``limit`` lines, its def line to its last line."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                yield f"{where(path, node.lineno)} {node.name}: {lines} lines"


@cache
def exported(package: str) -> frozenset[str]:
    """The names ``package``'s ``__init__`` gives, as mypy reads it: its ``__all__``, else what
    it defines, the modules of its own it imports, and what it imports ``as`` the same name."""
    init = PACKAGE.parent.joinpath(*package.split("."), "__init__.py")
    names: set[str] = set()
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                return frozenset(ast.literal_eval(node.value))
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            own = node.module == package
            names.update(a.name for a in node.names if own or a.asname == a.name)
    return frozenset(names)


def refused_imports(path: Path) -> Iterator[str]:
    """Each import of ``path`` that reaches past the reactor's public surface."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("reactor.") and alias.name not in ALLOWED:
                    yield f"{where(path, node.lineno)} import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module, names = node.module, [alias.name for alias in node.names]
            if module == "reactor":
                for name in names:
                    if f"reactor.{name}" not in ALLOWED:
                        yield f"{where(path, node.lineno)} from reactor import {name}"
            elif module.startswith("reactor."):
                if module not in ALLOWED:
                    yield f"{where(path, node.lineno)} from {module} import ..."
                    continue
                for name in names:
                    if name not in exported(module):
                        yield f"{where(path, node.lineno)} {module}.{name} is not exported"


def test_no_bench_function_is_over_the_limit() -> None:
    found = [line for path in bench_files() for line in long_functions(path, MAX_FUNCTION_LINES)]
    assert not found, "\n".join(found)


def test_no_bench_file_is_over_the_limit() -> None:
    found = [
        f"{shown(path)}: {lines} lines"
        for path in bench_files()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    ]
    assert not found, "\n".join(found)


def test_benches_import_only_the_public_reactor_and_its_test_support() -> None:
    found = [line for path in bench_files() for line in refused_imports(path)]
    assert not found, "\n".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    # The three checks on a file made to break each of them once, so a check that stopped
    # looking would fail here rather than pass for ever.
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from reactor import db, core\n"
        "from reactor.db import connect, pool\n"
        "from reactor.testing import audit\n"
        "import reactor.runtime.service\n"
        f"@decorated\ndef long():\n{body}\n"
        f"def short():\n{body[: body.rindex(chr(10))]}\n"
    )
    assert [line.split(" ", 1)[1] for line in long_functions(sample, MAX_FUNCTION_LINES)] == [
        f"long: {MAX_FUNCTION_LINES + 1} lines"
    ]
    assert [line.split(" ", 1)[1] for line in refused_imports(sample)] == [
        "from reactor import core",
        "reactor.db.pool is not exported",
        "import reactor.runtime.service",
    ]
