"""The benchmarks' quick mode: every benchmark runs at toy scale and writes its result.

It takes minutes (every benchmark starts its own PostgreSQL and loads its data), so it runs with
--long; CI runs it on every change (`uv run pytest --long tests/bench`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_quick_run_writes_every_result(tmp_path: Path) -> None:
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--results", str(results)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for name in BENCHMARKS:
        data = json.loads((results / f"{name}.json").read_text())
        assert data["name"] == name
        assert data["table"]["rows"], name
    assert (results / "REPORT.md").is_file()
