"""The drafting of `reactor init` from catalog facts built by hand: no database."""

from __future__ import annotations

import shlex
import tomllib
import unicodedata
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reactor.draft.catalog import checked_values, find
from reactor.draft.facts import ColumnFacts, ForeignKey, TableFacts
from reactor.draft.links import candidates, link, parse_name
from reactor.draft.propose import draft
from reactor.draft.role import create_role
from reactor.draft.toml import Writer
from reactor.install.quote import readable

TZ = "timestamp with time zone"


def _jobs(
    *extra: ColumnFacts, status: ColumnFacts | None = None, name: str = "exports"
) -> TableFacts:
    return TableFacts(
        "public",
        name,
        (
            ColumnFacts("id", "bigint", not_null=True, filled=True),
            status
            or ColumnFacts("status", "text", not_null=True, checked=("queued", "done", "error")),
            ColumnFacts("result", "text"),
            ColumnFacts("created_at", TZ, not_null=True, filled=True),
            ColumnFacts("updated_at", TZ, not_null=True, filled=True),
            *extra,
        ),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )


def _one_to_one(*extra: ColumnFacts, foreign_key: bool = True) -> TableFacts:
    return TableFacts(
        "public",
        "export_reports",
        (
            ColumnFacts("export_id", "bigint", not_null=True),
            ColumnFacts("result", "text", not_null=True),
            *extra,
        ),
        primary_key=("export_id",),
        unique=frozenset({"export_id"}),
        foreign_keys=(ForeignKey("export_id", ("public", "exports"), "id"),) if foreign_key else (),
    )


def _parsed(
    jobs: TableFacts, runs: TableFacts, terminal: tuple[str, ...] | None = None
) -> dict[str, Any]:
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
    jobs = TableFacts(
        "public",
        "analysis_jobs",
        (
            ColumnFacts("id", "uuid", not_null=True),
            ColumnFacts("run_id", "uuid", not_null=True),
            ColumnFacts("status", "text", not_null=True),
            ColumnFacts("created_at", TZ, not_null=True, filled=True),
            ColumnFacts("updated_at", TZ, not_null=True, filled=True),
        ),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )
    runs = TableFacts(
        "public",
        "analysis_runs",
        (ColumnFacts("id", "uuid", not_null=True), ColumnFacts("job_id", "uuid", not_null=True)),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )
    tied = link(jobs, runs)
    assert tied is not None
    assert (tied.run, tied.key, tied.job, tied.one_to_one) == ("run_id", "id", "job_id", False)
    drafted = _parsed(jobs, runs, ("complete", "failed"))
    assert drafted["jobs"]["created_at"] == "created_at"


def test_a_foreign_key_from_the_job_to_the_artifact_names_the_run() -> None:
    jobs = _jobs(ColumnFacts("batch", "uuid", not_null=True))
    jobs = TableFacts(
        jobs.schema,
        jobs.name,
        jobs.columns,
        jobs.primary_key,
        jobs.unique,
        (ForeignKey("batch", ("public", "summaries"), "uid"),),
    )
    runs = TableFacts(
        "public",
        "summaries",
        (
            ColumnFacts("uid", "uuid", not_null=True),
            ColumnFacts("export_id", "bigint", not_null=True),
        ),
        unique=frozenset({"uid"}),
    )
    tied = link(jobs, runs)
    assert tied is not None
    assert (tied.run, tied.key, tied.job) == ("batch", "uid", "export_id")


def test_unrelated_tables_are_no_candidates_and_two_pairs_are_two() -> None:
    unrelated = TableFacts("public", "users", (ColumnFacts("id", "bigint"),), primary_key=("id",))
    assert candidates([_jobs(), unrelated]) == []
    other_jobs = _jobs(name="imports")
    other_runs = TableFacts(
        "public",
        "import_logs",
        (ColumnFacts("import_id", "bigint", not_null=True),),
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
    status = ColumnFacts("status", "integer", not_null=True, filled=True)
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
    status = ColumnFacts("status", "job_state", enum=True, labels=("queued", "complete", "failed"))
    result = draft(_jobs(status=status), _one_to_one(), ("complete", "done"))
    assert result.todos == (
        "--terminal 'done' is none of the enum's labels: queued, complete, failed",
    )


def test_not_null_artifact_columns_are_filled_by_name_or_left_as_todo() -> None:
    runs = _one_to_one(
        ColumnFacts("owner", "uuid", not_null=True),
        ColumnFacts("title", "text", not_null=True),
        ColumnFacts("created_at", TZ, not_null=True),
        ColumnFacts("notes", "text"),
    )
    jobs = _jobs(ColumnFacts("owner", "uuid", not_null=True))
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
    jobs = TableFacts(
        "app",
        "Job",
        (
            ColumnFacts("id", "text", not_null=True),
            ColumnFacts("state", "text", checked=("done",)),
            ColumnFacts("updatedAt", naive, not_null=True),
        ),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )
    runs = TableFacts(
        "app",
        "Report",
        (
            ColumnFacts("id", "text", not_null=True),
            ColumnFacts("jobId", "text", not_null=True),
            ColumnFacts("updatedAt", naive, not_null=True),
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
    runs = _one_to_one(ColumnFacts("origin", "text", checked=("user", "system")))
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


# Pieces of names that break out of TOML, a comment or a terminal when written raw.
_HOSTILE = ["\n", "\r", '"""', "#", "'", "\\", "\x1b[2J", "\x1b]0;x\x07", "[reactor]", "=", "\x7f"]
_HOSTILE += ["\u2028", "\u202e", "$(touch x)", "a", "Z", " ", "é", "\t", '"']
_hostile = st.lists(st.sampled_from(_HOSTILE), min_size=1, max_size=6).map("".join)
# Control characters a terminal acts on, and the line breaks str.splitlines() knows.
_HIDDEN = ("Cc", "Cf", "Zl", "Zp")


def _shows_nothing_hidden(text: str) -> bool:
    return all(unicodedata.category(c) not in _HIDDEN for c in text)


@settings(max_examples=150, deadline=None)
@given(
    schema=_hostile,
    jobs_name=_hostile,
    runs_name=_hostile,
    job_column=_hostile,
    copied=_hostile,
    unfilled=_hostile,
    labels=st.lists(_hostile, min_size=1, max_size=3),
    origins=st.lists(_hostile, min_size=1, max_size=2),
)
def test_a_draft_from_hostile_names_holds_only_the_keys_it_wrote(
    schema: str,
    jobs_name: str,
    runs_name: str,
    job_column: str,
    copied: str,
    unfilled: str,
    labels: list[str],
    origins: list[str],
) -> None:
    # Distinct tags keep the names apart and clear of the names the drafting looks for.
    job_column, copied, unfilled = "k1" + job_column, "c2" + copied, "u3" + unfilled
    jobs = TableFacts(
        schema,
        jobs_name,
        (
            ColumnFacts("id", "bigint", not_null=True, filled=True),
            ColumnFacts("status", "text", not_null=True, checked=(*labels, "done")),
            ColumnFacts(copied, "text"),
            ColumnFacts("updated_at", TZ, not_null=True, filled=True),
        ),
        primary_key=("id",),
        unique=frozenset({"id"}),
    )
    runs = TableFacts(
        schema,
        "r" + runs_name,
        (
            ColumnFacts(job_column, "bigint", not_null=True),
            ColumnFacts(copied, "text", not_null=True),
            ColumnFacts(unfilled, "integer", not_null=True),
            ColumnFacts("saved_by", "text", checked=tuple(origins)),
        ),
        primary_key=(job_column,),
        unique=frozenset({job_column}),
        foreign_keys=(ForeignKey(job_column, jobs.key, "id"),),
    )
    result = draft(jobs, runs)
    parsed = tomllib.loads(result.text)
    assert set(parsed) == {"reactor_schema", "jobs", "runs"}
    assert parsed["jobs"] == {
        "table": jobs.shown,
        "id": "id",
        "run": "id",
        "status": "status",
        "terminal": ["done"],
        "updated_at": "updated_at",
        "not_null": [copied],
    }
    assert parsed["runs"] == {
        "table": runs.shown,
        "key": job_column,
        "job": job_column,
        "saved_by": "saved_by",
        "client": ["client"],
        "worker": "worker",
        "columns": {copied: f"j.{readable(copied)}"},
    }
    # What reaches the terminal: each TODO a line of its own, nothing a terminal acts on.
    assert _shows_nothing_hidden(result.text.replace("\n", ""))
    assert all(_shows_nothing_hidden(todo) for todo in result.todos)
    assert any(unfilled.split("\n")[0][:2] in todo for todo in result.todos)
    (candidate,) = candidates([jobs, runs])
    assert _shows_nothing_hidden(candidate.line())


def test_a_candidate_line_is_a_command_that_names_its_tables() -> None:
    quote_break = "x'$(touch marker)'y"
    dotted = 'a.b"c'
    jobs = _jobs(name=quote_break)
    runs = TableFacts(
        "public",
        dotted,
        (ColumnFacts("export_id", "bigint", not_null=True),),
        unique=frozenset({"export_id"}),
        foreign_keys=(ForeignKey("export_id", jobs.key, "id"),),
    )
    (candidate,) = candidates([jobs, runs])
    words = shlex.split(candidate.line(), comments=True)
    assert words[:2] == ["reactor", "init"]
    flags = dict(zip(words[2::2], words[3::2], strict=True))
    assert find([jobs, runs], flags["--jobs"]) == jobs
    assert find([jobs, runs], flags["--runs"]) == runs
    assert flags["--runs"] == 'public."a.b""c"'


def test_a_name_with_a_control_character_gets_no_command() -> None:
    jobs = _jobs(name="ex\nports\x1b[31m")
    runs = TableFacts(
        "public",
        "reports",
        (ColumnFacts("export_id", "bigint", not_null=True),),
        unique=frozenset({"export_id"}),
        foreign_keys=(ForeignKey("export_id", jobs.key, "id"),),
    )
    (candidate,) = candidates([jobs, runs])
    line = candidate.line()
    assert "reactor init" not in line
    assert line.startswith("(no command: ")
    assert "ex\\nports\\x1b[31m" in line
    assert _shows_nothing_hidden(line)


def test_names_are_found_as_the_catalog_spells_them_or_quoted_as_in_sql() -> None:
    assert parse_name("Render") == ("public", "Render")
    assert parse_name('public."Render"') == ("public", "Render")
    assert parse_name('"my.app"."Job""s"') == ("my.app", 'Job"s')
    assert parse_name("work.tasks") == ("work", "tasks")
    for wrong in ("", "a.b.c", '"open', 'a"b', ".a", "a.", '""', '"a"b'):
        assert parse_name(wrong) is None, wrong


def test_the_artifacts_own_times_are_the_writes_and_its_soft_delete_is_its_own() -> None:
    runs = _one_to_one(
        ColumnFacts("inserted_at", TZ, not_null=True, filled=True),
        ColumnFacts("updated_at", TZ, not_null=True, filled=True),
        ColumnFacts("deleted_at", TZ),
        ColumnFacts("discarded_at", TZ, not_null=True, filled=True),
    )
    jobs = _jobs(ColumnFacts("deleted_at", TZ), ColumnFacts("discarded_at", TZ, not_null=True))
    result = draft(jobs, runs, ("done",))
    columns = tomllib.loads(result.text)["runs"]["columns"]
    assert columns == {"result": "j.result", "inserted_at": "now()", "updated_at": "now()"}
    assert "deleted_at is left out: the artifact's own soft-delete column" in result.text


def test_the_draft_says_what_a_null_costs_and_both_fixes() -> None:
    result = draft(_jobs(), _one_to_one(), ("done",))
    parsed = tomllib.loads(result.text)
    assert parsed["jobs"]["not_null"] == ["result"]
    comment = " ".join(line.lstrip("# ") for line in result.text.splitlines())
    assert "filled from result, which may be NULL" in comment
    assert 'coalesce it in [runs.columns] instead, e.g. result = "coalesce(j.result, ...)"' in (
        comment
    )
