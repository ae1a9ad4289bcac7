"""Tools from outside Python that some tests need: Bun (from npm), promtool (Debian's
``prometheus`` package) and Chromium (Debian's ``chromium``, driven by Playwright). Missing, a
test is skipped with the reason; under CI (``CI`` set), where ``.ci/run`` installs them, it fails
instead, so a green CI run always ran them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUN_EXAMPLE = ROOT / "examples" / "bun"


def missing(reason: str) -> NoReturn:
    """Skip the test, or fail it under CI."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: .ci/run should have installed it)")
    pytest.skip(reason)


def promtool() -> str:
    """The path of promtool."""
    path = shutil.which("promtool")
    if path is None:
        missing("promtool not found: apt-get install prometheus")
    return path


def chromium() -> str:
    """The path of a Chromium that Playwright can drive (Playwright downloads no browser here)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    missing("chromium not found: apt-get install --no-install-recommends chromium")


def bun() -> Path:
    """The Bun binary of examples/bun's lockfile, installed there with ``npm ci`` if missing."""
    binary = BUN_EXAMPLE / "node_modules" / ".bin" / "bun"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        missing("npm not found: Bun installs from examples/bun/package-lock.json with npm ci")
    result = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=BUN_EXAMPLE,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if result.returncode != 0 or not binary.exists():
        pytest.fail(f"npm ci in examples/bun failed:\n{result.stderr[-3000:]}")
    return binary
