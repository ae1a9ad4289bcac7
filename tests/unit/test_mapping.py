"""reactor.install.mapping: the file is validated key by key, and slots render quoted SQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reactor.core.payload import parse_hint, parse_payload
from reactor.errors import ConfigError
from reactor.install import mapping, mapping_file, sql

UPPER = "0C6F3F1A-2B3C-4D8E-9A51-7F1C0B4E2D7A"
SECOND = Path(__file__).parent.parent / "mappings" / "second.toml"


def test_the_reference_mapping_is_the_reference() -> None:
    assert mapping.REFERENCE.is_reference


def test_the_second_mapping_parses_as_written() -> None:
    second = mapping_file.load(str(SECOND))
    assert not second.is_reference
    assert second.jobs.table == ("app", "Job")
    assert second.jobs.deleted_at is None
    assert second.jobs.terminal == ("done", "error")
    assert second.runs.client == ("user",)
    assert dict(second.runs.columns)["ownerId"] == 'j."ownerId"'


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"colour": "red"}, "unknown key colour"),
        ({"jobs": {"colour": "red"}}, "unknown key [jobs] colour"),
        # What the catalog says is never taken from the file.
        ({"jobs": {"types": []}}, "unknown key [jobs] types"),
        ({"runs": {"sequences": []}}, "unknown key [runs] sequences"),
        ({"jobs": "analysis_jobs"}, "jobs must be a table"),
        ({"jobs": {"table": "a.b.c"}}, "must be table or schema.table"),
        ({"jobs": {"id": 7}}, "jobs.id must be a column name"),
        ({"jobs": {"terminal": []}}, "jobs.terminal must be a non-empty list"),
        ({"jobs": {"not_null": ["doc_html"], "not_empty": ["results"]}}, "jobs.not_null"),
        ({"jobs": {"time_zone": " "}}, "jobs.time_zone must be a time zone name"),
        ({"runs": {"worker": "client"}}, "is also in runs.client"),
        ({"runs": {"columns": {"saved_by": "'x'"}}}, "written by the reactor itself"),
        ({"runs": {"columns": {"title": 3}}}, "must be a string holding an SQL expression"),
        ({"reactor_schema": "Bad-Name"}, "lower-case identifier"),
    ],
)
def test_a_wrong_key_is_named(document: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=None) as raised:
        mapping_file.parse(document, source="m.toml")
    assert says in str(raised.value)
    assert str(raised.value).startswith("m.toml:")


def test_a_reactor_schema_of_its_own_has_a_channel_of_its_own() -> None:
    assert mapping.REFERENCE.default_channel == "analysis_jobs_terminal"
    other = mapping_file.parse({"reactor_schema": "reports_reactor"})
    assert other.default_channel == "reports_reactor_jobs_terminal"
    # The app's own tables in the default reactor schema: named after the schema too, not
    # after the reference's tables.
    own_tables = mapping_file.parse({"jobs": {"table": "app.exports"}})
    assert own_tables.reactor_schema == "reactor"
    assert own_tables.default_channel == "reactor_jobs_terminal"
    assert not other.is_reference
    assert sql.render("SELECT 1 FROM @reactor@.pending", other) == (
        "SELECT 1 FROM reports_reactor.pending"
    )


def test_a_file_that_is_not_toml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text("[jobs\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        mapping_file.load(str(path))


def test_names_and_values_are_quoted_whatever_they_hold() -> None:
    hostile = mapping_file.parse(
        {
            "jobs": {"table": 'x"; DROP TABLE y; --', "terminal": ["it's done"], "not_null": []},
            "runs": {"worker": "o'brien"},
        }
    ).in_public()
    assert hostile.slot("jobs", None, None) == '"public"."x""; DROP TABLE y; --"'
    assert hostile.slot("terminal", None, None) == "('it''s done')"
    assert hostile.slot("worker", None, None) == "'o''brien'"


def test_a_naive_time_column_is_read_at_the_configured_zone() -> None:
    second = mapping_file.load(str(SECOND)).typed({"updatedAt": "timestamp without time zone"})
    assert second.slot("updated_at", "j", None) == """(j."updatedAt" AT TIME ZONE 'UTC')"""
    assert second.slot("created_at", "j", None) == 'j."createdAt"'  # untyped: as it is


def test_an_unknown_slot_is_an_error_not_text() -> None:
    with pytest.raises(KeyError):
        sql.render("SELECT @nope@", mapping.REFERENCE)
    with pytest.raises(KeyError, match="leaves out"):
        mapping_file.load(str(SECOND)).slot("deleted_at", "j", None)


def test_every_shipped_query_renders_for_the_second_mapping() -> None:
    second = (
        mapping_file.load(str(SECOND))
        .in_public()
        .typed({"jobId": "bigint", "reportKey": "text", "updatedAt": "timestamp without time zone"})
    )
    for filename in ("queries.sql", "status.sql", "hooks.sql"):
        for text in sql.queries(filename, second).values():
            assert "analysis_jobs" not in text
            assert "analysis_runs" not in text
    record = sql.queries("queries.sql", second)["record_jobs"]
    assert "%(ids)s::bigint[]" in record
    assert 'INSERT INTO "app"."Report"' in record


@pytest.mark.parametrize(
    ("id_type", "payload", "job"),
    [
        (
            "uuid",
            "0C6F3F1A-2B3C-4D8E-9A51-7F1C0B4E2D7A@1.5",
            "0c6f3f1a-2b3c-4d8e-9a51-7f1c0b4e2d7a",
        ),
        ("uuid", "42@1.5", None),
        ("bigint", "42@1.5", "42"),
        ("bigint", "4x2@1.5", None),
        ("text", "order@shop/7@1.5", "order@shop/7"),
    ],
)
def test_a_hint_names_a_job_of_the_mapping_id_type(
    id_type: str, payload: str, job: str | None
) -> None:
    parsed = parse_hint(payload, id_type)
    assert (parsed[0] if parsed else None) == job
    assert parse_payload("x" * 600, id_type) is None
