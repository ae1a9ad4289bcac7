"""``app_saves = "plain"`` through the real CLI where it cannot be made safe: an artifact table
that another table's foreign key references. `reactor init` says so in its draft, and `reactor
migrate` refuses the key, exit 2, in one line."""

from __future__ import annotations

from pathlib import Path

import psycopg

from tests.acceptance.conftest import reactor_env, run_reactor

MAPPINGS = Path(__file__).parent.parent / "mappings"
NOTES = """
CREATE TABLE app.report_notes (
    id        serial PRIMARY KEY,
    export_id bigint NOT NULL REFERENCES app.export_reports (export_id) ON DELETE CASCADE,
    note      text
);
"""


def test_a_referenced_artifact_is_refused_plain_saves(
    empty_database_url: str, tmp_path: Path
) -> None:
    url = empty_database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((MAPPINGS / "onetoone.sql").read_text() + NOTES)
    drafted = run_reactor(
        "init", "--jobs", "app.exports", "--runs", "app.export_reports", "--terminal",
        "done,error", env=reactor_env(url),
    )  # fmt: skip
    # The note is a note, not a decision: the draft's one TODO is written_at's, to fill.
    assert "Traceback" not in drafted.stderr
    assert "app_saves" not in drafted.stderr
    said = " ".join(line.removeprefix("# ") for line in drafted.stdout.splitlines())
    assert 'app_saves stays "upsert" (the default)' in said
    assert "report_notes_export_id_fkey of app.report_notes" in said
    assert '\n# app_saves = "plain"\n' not in drafted.stdout
    path = tmp_path / "reactor.toml"
    mapping = (MAPPINGS / "onetoone.toml").read_text()
    path.write_text(mapping.replace("[runs]\n", '[runs]\napp_saves = "plain"\n'))
    refused = run_reactor("migrate", env=reactor_env(url, REACTOR_CONFIG=str(path)))
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith('reactor: runs.app_saves = "plain" in REACTOR_CONFIG')
    assert "ON DELETE CASCADE: the save would delete the rows that refer to it" in lines[0]
    assert 'keep app_saves = "upsert" and save with INSERT ... ON CONFLICT (export_id)' in lines[0]
    # Nothing was installed: the reactor's schema is not there.
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regnamespace('reactor')").fetchone() == (None,)
