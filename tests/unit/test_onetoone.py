"""reactor.install.mapping for the shapes apps have: one-to-one artifacts, integer status, no
created_at."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from reactor.errors import ConfigError
from reactor.install import mapping, mapping_file, sql

ONETOONE = Path(__file__).parent.parent / "mappings" / "onetoone.toml"


def one_to_one(**jobs: Any) -> dict[str, Any]:
    return {
        "jobs": {"table": "app.exports", "id": "id", "run": "id", "status": "state", **jobs},
        "runs": {"table": "app.export_reports", "key": "export_id", "job": "export_id"},
    }


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_onetoone_file_leaves_created_at_out() -> None:
    loaded = mapping_file.load(str(ONETOONE))
    assert loaded.one_to_one
    assert loaded.jobs.created_at is None
    assert loaded.runs.key == loaded.runs.job == "export_id"


def test_created_at_keeps_its_default_where_jobs_share_a_run() -> None:
    parsed = mapping_file.parse({"jobs": {"run": "report_id"}})
    assert not parsed.one_to_one
    assert parsed.jobs.created_at == "created_at"


def test_created_at_given_in_a_one_to_one_mapping_is_kept() -> None:
    assert mapping_file.parse(one_to_one(created_at="made")).jobs.created_at == "made"


def test_integers_in_terminal_render_bare() -> None:
    parsed = mapping_file.parse(one_to_one(terminal=[3, 4]))
    assert parsed.jobs.terminal == (3, 4)
    assert parsed.slot("terminal", None, None) == "(3, 4)"
    assert mapping_file.parse(one_to_one(terminal=["3"])).slot("terminal", None, None) == "('3')"


@pytest.mark.parametrize("terminal", [[3, "done"], [True], [1.5], [], "done"])
def test_terminal_is_all_strings_or_all_integers(terminal: Any) -> None:
    with pytest.raises(ConfigError, match=r"jobs\.terminal must be a non-empty list of strings"):
        mapping_file.parse(one_to_one(terminal=terminal), source="m.toml")


def test_key_and_job_as_one_column_need_run_to_be_the_id() -> None:
    document = one_to_one()
    document["jobs"]["run"] = "batch_id"
    with pytest.raises(ConfigError, match=r"set jobs.run = 'id' \(jobs.id\) too"):
        mapping_file.parse(document, source="m.toml")


def test_the_key_is_written_once_and_never_set_twice() -> None:
    loaded = mapping_file.load(str(ONETOONE)).in_public().typed({"id": "bigint", "state": "text"})
    record = squash(sql.queries("queries.sql", loaded)["record_jobs"])
    assert (
        'INSERT INTO "app"."export_reports" AS r ("export_id", "saved_by", "body", "summary",'
        ' "owner_id", "written_at") SELECT n.run_id, \'worker\', (j.body)' in record
    )
    assert '"export_id" = EXCLUDED."export_id"' not in record
    assert '"body" = EXCLUDED."body"' in record
    # No created_at anywhere: each job is its own run.
    for text in sql.queries("queries.sql", loaded).values():
        assert '"created_at"' not in text
    assert "NULL::timestamptz AS created_at" in record


def test_an_artifact_of_the_reactors_columns_alone_sets_its_key_to_itself() -> None:
    bare = mapping_file.parse({**one_to_one(), "runs": {**one_to_one()["runs"], "columns": {}}})
    assert bare.slot("run_updates", None, None) == '"export_id" = EXCLUDED."export_id"'
    assert bare.slot("run_columns", None, None) == '"export_id", "saved_by"'


def test_rank_is_the_id_alone_without_created_at() -> None:
    loaded = mapping_file.load(str(ONETOONE))
    assert loaded.slot("rank", None, "rj") == '(rj."id")'
    assert mapping.REFERENCE.slot("rank", None, "rj") == '(rj."created_at", rj."id")'
    assert mapping.REFERENCE.slot("keys", None, "n") == "n.run_id, n.id"
    assert loaded.slot("keys", None, "n") == "n.run_id"


def test_every_trigger_renders_for_an_integer_status() -> None:
    parsed = mapping_file.parse(one_to_one(terminal=[3, 4], not_null=[], not_empty=[]))
    parsed = parsed.typed({"id": "bigint", "state": "integer", "updated_at": "timestamptz"})
    text = squash(sql.render(sql.repeatable().text, parsed, channel="c"))
    assert 'WHEN (NEW."state" IN (3, 4))' in text
    assert '"created_at"' not in text
