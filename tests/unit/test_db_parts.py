"""reactor.db: its modules stand in floors, and a Database reads its pair's settings."""

from __future__ import annotations

import ast
from pathlib import Path

from reactor import db
from reactor.install import REFERENCE_INSTALL
from reactor.settings.config import Settings

ROOM = Path(db.__file__).parent

# Never connected to: making the queries opens nothing.
DSN = "postgresql://app@db.invalid/app"


def modules_imported(path: Path) -> set[str]:
    """The modules of reactor/db that ``path`` imports, at the top, inside functions or for
    type checks; ``from reactor.db import rows`` imports the module rows, and a name the
    package's face hands on is not counted (the face imports every module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("reactor.db.")}
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module.startswith("reactor.db."):
                found.add(node.module)
            elif node.module == "reactor.db":
                found |= {f"reactor.db.{a.name}" for a in node.names}
    return {name for name in found if (ROOM / f"{name.rpartition('.')[2]}.py").exists()}


def test_the_db_modules_import_each_other_in_no_circle() -> None:
    graph = {
        f"reactor.db.{path.stem}": modules_imported(path)
        for path in ROOM.glob("*.py")
        if path.name != "__init__.py"
    }
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"modules in a circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, (*path, module))
        done.add(module)

    assert "reactor.db.rows" in graph["reactor.db.queries"]  # the walk sees imports
    for module in sorted(graph):
        visit(module, ())


def test_the_queries_read_their_pairs_settings_where_they_are() -> None:
    settings = Settings(database_url=DSN, grace=7.5)
    pool = db.make_pool(DSN, max_size=1)
    pooled = db.Database.pooled(REFERENCE_INSTALL, pool, settings=settings, hooks=["judge"])
    # The pair's settings object itself, not a copy of its grace.
    assert pooled.settings is settings
    assert pooled.grace == 7.5
    assert pooled.hooks == ("judge",)


def test_queries_without_a_pairs_settings_wait_out_no_grace() -> None:
    pool = db.make_pool(DSN, max_size=1)
    # A command's checks and a test's own statements: a job is due once it needs a run.
    assert db.Database.pooled(REFERENCE_INSTALL, pool).grace == 0.0
