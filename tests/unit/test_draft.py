"""The drafting of `reactor init` from catalog facts built by hand: no database."""

from __future__ import annotations

import tomllib
from typing import Any

from reactor.draft.catalog import checked_values
from reactor.draft.facts import Column, ForeignKey, Table
from reactor.draft.links import candidates, link
from reactor.draft.propose import draft
from reactor.draft.role import create_role
from reactor.draft.toml import Writer

TZ = "timestamp with time zone"


def _jobs(*extra: Column, status: Column | None = None, name: str = "exports") -> Table:
    return Table(
        "public",
        name,
        (
            Column("id", "bigint", not_null=True, filled=True),
            status or Column("status", "text", not_null=True, checked=("queued", "done", "error")),
            Column("result", "text"),
            Column("created_at", TZ, not_null=True, filled=True),
            Column("updated_at", TZ, not_null=True, filled=True),
            *extra,
        ),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )


def _one_to_one(*extra: Column, foreign_key: bool = True) -> Table:
    return Table(
        "public",
        "export_reports",
        (
            Column("export_id", "bigint", not_null=True),
            Column("result", "text", not_null=True),
            *extra,
        ),
        primary_key=("export_id",),
        unique=frozenset({"export_id"}),
        foreign_keys=(ForeignKey("export_id", ("public", "exports"), "id"),) if foreign_key else (),
    )


def _parsed(jobs: Table, runs: Table, terminal: tuple[str, ...] | None = None) -> dict[str, Any]:
    return tomllib.loads(draft(jobs, runs, terminal).text)


def test_an_artifact_keyed_by_the_job_id_is_one_to_one() -> None:
    for runs in (_one_to_one(), _one_to_one(foreign_key=False)):
        tied = link(_jobs(), runs)
        assert tied is not None
        assert (tied.id, tied.run, tied.key, tied.job, tied.one_to_one) == (
            "id",
            "id",
            "export_id",
            "export_id",
            True,
        )
        drafted = _parsed(_jobs(), runs, ("done",))
        assert "created_at" not in drafted["jobs"]
        assert drafted["runs"]["key"] == drafted["runs"]["job"] == "export_id"


def test_a_run_indirection_is_found_by_name_as_in_the_reference() -> None:
    jobs = Table(
        "public",
        "analysis_jobs",
        (
            Column("id", "uuid", not_null=True),
            Column("run_id", "uuid", not_null=True),
            Column("status", "text", not_null=True),
            Column("created_at", TZ, not_null=True, filled=True),
            Column("updated_at", TZ, not_null=True, filled=True),
        ),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )
    runs = Table(
        "public",
        "analysis_runs",
        (Column("id", "uuid", not_null=True), Column("job_id", "uuid", not_null=True)),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )
    tied = link(jobs, runs)
    assert tied is not None
    assert (tied.run, tied.key, tied.job, tied.one_to_one) == ("run_id", "id", "job_id", False)
    drafted = _parsed(jobs, runs, ("complete", "failed"))
    assert drafted["jobs"]["created_at"] == "created_at"


def test_a_foreign_key_from_the_job_to_the_artifact_names_the_run() -> None:
    jobs = _jobs(Column("batch", "uuid", not_null=True))
    jobs = Table(
        jobs.schema,
        jobs.name,
        jobs.columns,
        jobs.primary_key,
        jobs.unique,
        (ForeignKey("batch", ("public", "summaries"), "uid"),),
    )
    runs = Table(
        "public",
        "summaries",
        (Column("uid", "uuid", not_null=True), Column("export_id", "bigint", not_null=True)),
        unique=frozenset({"uid"}),
    )
    tied = link(jobs, runs)
    assert tied is not None
    assert (tied.run, tied.key, tied.job) == ("batch", "uid", "export_id")


def test_unrelated_tables_are_no_candidates_and_two_pairs_are_two() -> None:
    unrelated = Table("public", "users", (Column("id", "bigint"),), primary_key=("id",))
    assert candidates([_jobs(), unrelated]) == []
    other_jobs = _jobs(name="imports")
    other_runs = Table(
        "public",
        "import_logs",
        (Column("import_id", "bigint", not_null=True),),
        unique=frozenset({"import_id"}),
    )
    found = candidates([_jobs(), _one_to_one(), other_jobs, other_runs, unrelated])
    assert [(c.jobs.name, c.runs.name) for c in found] == [
        ("exports", "export_reports"),
        ("imports", "import_logs"),
    ]
    assert "--jobs exports --runs export_reports" in found[0].line()
    assert "one-to-one" in found[0].line()


def test_terminal_values_are_guessed_from_the_check_and_left_to_confirm() -> None:
    result = draft(_jobs(), _one_to_one())
    assert tomllib.loads(result.text)["jobs"]["terminal"] == ["done", "error"]
    assert any("confirm the finished values" in todo for todo in result.todos)
    confirmed = draft(_jobs(), _one_to_one(), ("done", "error"))
    assert confirmed.todos == ()


def test_an_integer_status_takes_integers_and_asks_for_them() -> None:
    status = Column("status", "integer", not_null=True, filled=True)
    confirmed = draft(_jobs(status=status), _one_to_one(), ("2", "3"))
    assert tomllib.loads(confirmed.text)["jobs"]["terminal"] == [2, 3]
    assert confirmed.complete
    unknown = draft(_jobs(status=status), _one_to_one())
    assert not unknown.complete
    assert tomllib.loads(unknown.text)["jobs"]["terminal"] == []
    assert "Rails enum" in unknown.todos[0]
    words = draft(_jobs(status=status), _one_to_one(), ("done",))
    assert "--terminal 'done': status is integer, a number" in words.todos


def test_a_terminal_value_outside_the_enum_is_a_todo() -> None:
    status = Column("status", "job_state", enum=True, labels=("queued", "complete", "failed"))
    result = draft(_jobs(status=status), _one_to_one(), ("complete", "done"))
    assert result.todos == (
        "--terminal 'done' is none of the enum's labels: queued, complete, failed",
    )


def test_not_null_artifact_columns_are_filled_by_name_or_left_as_todo() -> None:
    runs = _one_to_one(
        Column("owner", "uuid", not_null=True),
        Column("title", "text", not_null=True),
        Column("created_at", TZ, not_null=True),
        Column("notes", "text"),
    )
    jobs = _jobs(Column("owner", "uuid", not_null=True))
    result = draft(jobs, runs, ("done",))
    parsed = tomllib.loads(result.text)
    assert parsed["runs"]["columns"] == {
        "result": "j.result",
        "owner": "j.owner",
        "created_at": "now()",
    }
    # Only the nullable job column a NOT NULL artifact column is filled from.
    assert parsed["jobs"]["not_null"] == ["result"]
    assert '# title = "j.<column>"' in result.text
    assert len(result.todos) == 1
    assert "export_reports.title (text) is NOT NULL without a default" in result.todos[0]


def test_naive_timestamps_take_a_time_zone() -> None:
    naive = "timestamp without time zone"
    jobs = Table(
        "app",
        "Job",
        (
            Column("id", "text", not_null=True),
            Column("state", "text", checked=("done",)),
            Column("updatedAt", naive, not_null=True),
        ),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )
    runs = Table(
        "app",
        "Report",
        (
            Column("id", "text", not_null=True),
            Column("jobId", "text", not_null=True),
            Column("updatedAt", naive, not_null=True),
        ),
        primary_key=("id",),
        unique=frozenset({"id", "jobId"}),
        foreign_keys=(ForeignKey("jobId", ("app", "Job"), "id"),),
    )
    parsed = _parsed(jobs, runs, ("done",))
    assert parsed["jobs"]["table"] == "app.Job"
    assert parsed["jobs"]["updated_at"] == "updatedAt"
    assert parsed["jobs"]["time_zone"] == "UTC"
    assert parsed["runs"]["columns"] == {
        "id": "gen_random_uuid()::text",
        "updatedAt": "now() AT TIME ZONE 'UTC'",
    }


def test_saved_by_takes_the_values_its_check_allows() -> None:
    runs = _one_to_one(Column("origin", "text", checked=("user", "system")))
    parsed = _parsed(_jobs(), runs, ("done",))
    assert parsed["runs"]["saved_by"] == "origin"
    assert (parsed["runs"]["client"], parsed["runs"]["worker"]) == (["user"], "system")
    # None fits: the column `reactor migrate` adds.
    assert _parsed(_jobs(), _one_to_one(), ("done",))["runs"]["saved_by"] == "saved_by"


def test_check_values_as_postgresql_prints_them() -> None:
    varchar = (
        "CHECK (((status)::text = ANY ((ARRAY['queued'::character varying, "
        "'it''s done'::character varying])::text[])))"
    )
    assert checked_values([varchar], "character varying") == ("queued", "it's done")
    ors = "CHECK (((state = 'a'::text) OR (state = 'b'::text)))"
    assert checked_values([ors], "text") == ("a", "b")
    assert checked_values(["CHECK ((status = ANY (ARRAY[0, 1, -2])))"], "integer") == (0, 1, -2)
    assert checked_values(["CHECK ((status >= 0))"], "integer") == ()
    assert checked_values(["CHECK ((state <> 'gone'::text))"], "text") == ()
    assert checked_values([], "text") == ()


def test_the_writer_round_trips_names_toml_cannot_leave_bare() -> None:
    out = Writer()
    out.section("runs.columns")
    out.key("ownerId", 'j."ownerId"', "why")
    out.key("a b", 'it\'s "quoted"', "")
    out.todo("a long line " * 20)
    parsed = tomllib.loads(out.text())
    assert parsed == {"runs": {"columns": {"ownerId": 'j."ownerId"', "a b": 'it\'s "quoted"'}}}
    assert all(len(line) <= 99 for line in out.text().splitlines())


def test_the_role_is_created_unless_it_exists() -> None:
    script = create_role("reactor_rt")
    assert 'CREATE ROLE "reactor_rt" LOGIN;' in script
    assert "EXCEPTION WHEN duplicate_object" in script
    # A dollar sign in the name cannot end the block early.
    assert "$role_$" in create_role("a$role$b")
