"""What a NULL costs, through the CLI: `reactor migrate` warns of a NOT NULL artifact column
filled from a job column that may be NULL, naming the mapping file's line; a job set aside for
it has a log line and a `reactor status` entry naming that line and the two fixes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg

from tests.acceptance.conftest import reactor_env, run_reactor

# The reference tables, with results (NOT NULL in analysis_runs) left out of not_null: a job
# may finish without verdicts, and its run then has none to write.
MAPPING = """\
reactor_schema = "reactor"

[jobs]
table = "analysis_jobs"
not_null = ["doc_html"]
not_empty = []

[runs]
table = "analysis_runs"

[runs.columns]
doc_html = "j.doc_html"
results = "j.results"
updated_at = "now()"
"""
RESULTS_LINE = 13


def test_a_null_the_artifact_refuses_is_warned_of_and_its_set_aside_names_the_fix(
    empty_database_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "reactor.toml"
    path.write_text(MAPPING)
    assert MAPPING.splitlines()[RESULTS_LINE - 1].startswith("results =")
    env = reactor_env(empty_database_url, REACTOR_CONFIG=str(path), REACTOR_GRACE_SECONDS="0")
    migrated = run_reactor("migrate", "--reference-schema", env=env)
    assert migrated.returncode == 0, migrated.stderr
    warnings = [
        json.loads(line) for line in migrated.stderr.splitlines() if '"warning"' in line.lower()
    ]
    (warning,) = [w for w in warnings if "NOT NULL" in w["message"]]
    assert f"{path}:{RESULTS_LINE}: the artifact's results is NOT NULL" in warning["message"]
    assert "add results to [jobs] not_null" in warning["message"]
    assert "or coalesce it there" in warning["message"]

    job = uuid.uuid4()
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO analysis_jobs (id, run_id, status, doc_html, results, updated_at)"
            " VALUES (%s, %s, 'complete', '<p>', NULL, now() - interval '1 hour')",
            (job, uuid.uuid4()),
        )
    swept = run_reactor("sweep", "--once", env=env)
    assert swept.returncode == 1, swept.stderr  # a job set aside
    (logged,) = [json.loads(line) for line in swept.stderr.splitlines() if "is set aside" in line]
    assert logged["job_id"] == str(job)
    assert logged["fix"].startswith(f"{path}:{RESULTS_LINE}: ")
    assert "add results to [jobs] not_null" in logged["fix"]

    status = run_reactor("status", "--json", env=env)
    assert status.returncode == 1, status.stderr
    (entry,) = json.loads(status.stdout)["set_aside"]["first"]
    assert entry["job_id"] == str(job)
    assert entry["fix"] == logged["fix"]
    told = run_reactor("status", env=env)
    assert f"{path}:{RESULTS_LINE}" in told.stdout.replace("\n", "")
