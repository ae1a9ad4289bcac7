"""The container tests build the image and run it with podman: a minute or more, and root.
They run only when asked for by their marker (``uv run pytest -n 0 -m container
tests/container``, as .ci/run does), never in the plain ``uv run pytest``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "container" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="builds and runs the image; run with -m container")
    for item in items:
        if item.get_closest_marker("container") is not None:
            item.add_marker(skip)
