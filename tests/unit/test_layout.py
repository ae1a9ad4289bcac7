"""The layout holds: core/ is pure, and no two rooms of reactor/ import each other."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import reactor

PACKAGE = Path(reactor.__file__).parent


def room_of(module: str) -> str:
    # A room is a folder of reactor/ (reactor.listen), or a module at its top (reactor.errors).
    return ".".join(module.split(".")[:2])


def imports(path: Path) -> Iterator[str]:
    """The reactor modules ``path`` imports, at the top, inside functions or for type checks."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("reactor"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield ".".join([*base, *([node.module] if node.module else [])])
            elif node.module == "reactor":
                yield from (f"reactor.{alias.name}" for alias in node.names)
            elif node.module and node.module.startswith("reactor"):
                yield node.module


def room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        room = room_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        targets = {room_of(name) for name in imports(path)} - {room, "reactor"}
        graph.setdefault(room, set()).update(targets)
    return graph


def test_the_pure_room_imports_no_other() -> None:
    assert room_graph()["reactor.core"] == set()


def test_no_two_rooms_import_each_other() -> None:
    graph = room_graph()
    done: set[str] = set()

    def visit(room: str, path: tuple[str, ...]) -> None:
        assert room not in path, f"rooms in a circle: {' -> '.join((*path, room))}"
        if room in done:
            return
        for target in sorted(graph.get(room, ())):
            visit(target, (*path, room))
        done.add(room)

    for room in sorted(graph):
        visit(room, ())


def test_reactor_run_loads_neither_the_page_templates_nor_the_terminal_tables_at_start() -> None:
    # What `reactor run` imports before it is ready: jinja2 waits for the page's first request
    # and rich for `reactor status` or `reactor hooks`; each costs a replica tens of
    # milliseconds of its start, and nothing before /readyz needs them.
    script = (
        "import json, sys\n"
        "import reactor.cli, reactor.ops.http, reactor.runtime.replica\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(json.loads(result.stdout))
    assert {"aiohttp", "psycopg"} <= loaded  # what it does need, so the check can fail
    assert loaded.isdisjoint({"jinja2", "rich"})
