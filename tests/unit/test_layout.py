"""The layout holds: core/ imports no other room, no two rooms of reactor/ import each other, no
two modules of one room do either (type-checking imports included), and the modules of
:data:`PURE` do no I/O, wherever their room puts them."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import reactor

PACKAGE = Path(reactor.__file__).parent


def room_of(module: str) -> str:
    # A room is a folder of reactor/ (reactor.listen), or a module at its top (reactor.errors).
    return ".".join(module.split(".")[:2])


def imports(path: Path, *, type_checks: bool = True) -> Iterator[str]:
    """Every module ``path`` imports, by its full name, reactor's and the others: at the top,
    inside functions, and under ``if TYPE_CHECKING:`` unless ``type_checks`` is False. For
    ``from m import n`` both ``m`` and ``m.n`` (``n`` may be a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    checked = set()
    if not type_checks:
        checked = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body
            for node in ast.walk(stmt)
        }
    module = module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in checked:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                named = ".".join([*base, *([node.module] if node.module else [])])
            else:
                named = node.module or ""
            yield named
            yield from (f"{named}.{alias.name}" for alias in node.names)


def room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        room = room_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        reactor_names = (name for name in imports(path) if name.startswith("reactor."))
        targets = {room_of(name) for name in reactor_names} - {room, "reactor"}
        graph.setdefault(room, set()).update(targets)
    return graph


def test_core_imports_no_other_room() -> None:
    # What every step shares (the clock, deadlines, ownership, backoff, the channel's words)
    # stands below them all.
    assert room_graph()["reactor.core"] == set()


# The pure half of each pure/shell pair: no I/O, no clock of its own, no environment. Each sits
# in its concern's room beside the shell that drives it; purity is this list, not a folder.
PURE = (
    "reactor.core.backoff",
    "reactor.core.dbclock",
    "reactor.core.deadlines",
    "reactor.core.ownership",
    "reactor.claim.sources",
    "reactor.listen.session",
    "reactor.insurance.doorbell",
    "reactor.record.writes",
    "reactor.ops.admission",
    "reactor.ops.dashboard.guard",
    "reactor.install.expressions",
    "reactor.hooks.signature",
    "reactor.draft.facts",
    "reactor.draft.role",
    "reactor.draft.toml",
    "reactor.db.rows",
    "reactor.errors",
    "reactor.shown",
)
# What does I/O, or waits on something outside the process.
IO = {"anyio", "asyncio", "psycopg", "psycopg_pool", "socket", "aiohttp", "subprocess", "ssl"}
# And what reads the environment or a file.
OUTSIDE = re.compile(r"os\.environ|os\.getenv|(?<![\w.])open\(")


@functools.cache
def sources() -> dict[str, Path]:
    return {module_of(path): path for path in PACKAGE.rglob("*.py")}


def reached_from(start: str) -> tuple[set[str], set[str]]:
    """The reactor modules ``start`` loads when it runs, itself included, and every other
    package they import (top names)."""
    paths = sources()
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in imports(paths[module], type_checks=False):
            if not name.startswith("reactor"):
                outside.add(name.partition(".")[0])
                continue
            # The module itself and the packages it goes through, which Python runs first.
            parts = name.split(".")
            prefixes = (".".join(parts[:n]) for n in range(2, len(parts) + 1))
            todo += [prefix for prefix in prefixes if prefix in paths]
    return seen, outside


def test_the_pure_modules_do_no_io() -> None:
    paths = sources()
    found = {}
    for module in PURE:
        loaded, outside = reached_from(module)
        reading = [
            name
            for name in sorted(loaded)
            if OUTSIDE.search(paths[name].read_text(encoding="utf-8"))
        ]
        if outside & IO or reading:
            found[module] = sorted(outside & IO) + reading
    assert not found, f"pure modules that reach I/O: {found}"


def test_the_purity_check_sees_io() -> None:
    # The check itself, on modules known to do I/O: the listener (psycopg, anyio) and the
    # environment's reader.
    assert {"psycopg", "anyio"} <= reached_from("reactor.listen.listener")[1]
    assert "reactor.db.session" in reached_from("reactor.listen.listener")[0]


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """Each module of reactor/ and the modules of its own room it imports, at the top, inside
    functions or under ``if TYPE_CHECKING:``: a circle a type check hides is a circle still."""
    paths = sources()
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        room = room_of(module)
        targets = set()
        for name in imports(path):
            # `from <module> import <name>` names a module or a name of one: the module it is in.
            while name not in paths and "." in name:
                name = name.rpartition(".")[0]
            if name != module and room_of(name) == room and name != room:
                targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Circles of ``graph``, each as the path that closes it: at least one while there is any."""
    found: list[tuple[str, ...]] = []
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        if node in path:
            found.append((*path[path.index(node) :], node))
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, (*path, node))
        done.add(node)

    for node in sorted(graph):
        visit(node, ())
    return found


def test_no_two_rooms_import_each_other() -> None:
    found = circles(room_graph())
    assert not found, "rooms in a circle: " + "; ".join(" -> ".join(c) for c in found)


def test_no_two_modules_of_a_room_import_each_other() -> None:
    found = circles(module_graph())
    assert not found, "modules in a circle: " + "; ".join(" -> ".join(c) for c in found)


def test_a_circle_between_modules_is_found() -> None:
    # The search itself: a circle of two, one three modules round, and a module that only
    # leads into a circle without being on it.
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(sorted(c) for c in circles(graph)) == [["a", "a", "b"], ["c", "c", "d", "e"]]


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
