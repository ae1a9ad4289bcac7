"""reactor.install.sql: the shipped SQL loads, is fully assembled, and migrations are numbered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import reactor
from reactor.db import indexes
from reactor.install import REFERENCE_INSTALL, mapping, mapping_file, sql
from reactor.install.mapping import REFERENCE

QUERIES = sql.queries("queries.sql", REFERENCE_INSTALL.mapping)
EXPECTED = ("record_jobs", "record_oldest", "upcoming", "reconcile_step")
# The queries that decide whether a job needs a run; each must carry the shared predicate.
NEEDS_RUN_USERS = ("record_jobs", "record_oldest", "upcoming")


def fragment(name: str) -> str:
    """The raw text of ``-- fragment: name`` in queries.sql, comments dropped, not expanded."""
    text = sql.read("queries.sql")
    match = re.search(
        rf"^-- fragment: {name}[ \t]*\n(.*?)(?=^-- (?:name|fragment): |\Z)",
        text,
        re.MULTILINE | re.DOTALL,
    )
    assert match, f"fragment {name} not found in queries.sql"
    lines = [ln for ln in match.group(1).strip().splitlines() if not ln.lstrip().startswith("--")]
    return "\n".join(lines)


def squash(text: str) -> str:
    return " ".join(text.split())


# -- named queries -------------------------------------------------------------------------------


def test_the_expected_queries_exist() -> None:
    for name in EXPECTED:
        assert name in QUERIES
        assert REFERENCE_INSTALL.query(name) == QUERIES[name]


def test_unknown_query_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        REFERENCE_INSTALL.query("no_such_query")


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_query_is_fully_assembled(name: str) -> None:
    text = QUERIES[name]
    assert text.strip()
    assert "{{" not in text
    assert "}}" not in text
    assert not re.search(r"@\w+(\.\w+)?(\(\w*\))?@", text), "a slot left unfilled"
    assert "-- name:" not in text
    assert "-- fragment:" not in text
    # Whole-line comments are stripped.
    assert not [ln for ln in text.splitlines() if ln.lstrip().startswith("--")]
    # No trailing semicolon: one statement each, so it can be sent with parameters.
    assert not text.rstrip().endswith(";")


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_percent_signs_are_only_placeholders(name: str) -> None:
    # psycopg treats every % as a placeholder marker: a stray one breaks the statement.
    leftover = re.sub(r"%\(\w+\)s|%%", "", QUERIES[name])
    assert "%" not in leftover


def test_queries_take_the_parameters_the_recorder_passes() -> None:
    def params(name: str) -> set[str]:
        return set(re.findall(r"%\((\w+)\)s", QUERIES[name]))

    assert {"ids", "grace"} <= params("record_jobs")
    assert {"grace", "limit"} <= params("record_oldest")
    assert {"grace", "limit"} <= params("upcoming")


def test_an_install_renders_each_file_once() -> None:
    assert REFERENCE_INSTALL.query("record_jobs") is REFERENCE_INSTALL.query("record_jobs")


@pytest.mark.parametrize("name", NEEDS_RUN_USERS)
def test_needs_run_is_spliced_in(name: str) -> None:
    needs_run = (
        fragment("needs_run")
        .replace("{{outranked}}", fragment("outranked"))
        .replace("{{eligible}}", fragment("eligible"))
        .replace("{{walked}}", fragment("walked"))
    )
    assert "{{" not in needs_run
    assert squash(needs_run) in squash(sql.templates()[name])
    # And the characteristic pieces, in case the whitespace handling ever changes.
    text = QUERIES[name]
    for piece in (
        """j."status" IN ('complete', 'failed')""",
        'j."deleted_at" IS NULL',
        'j."doc_html" IS NOT NULL',
        'j."results" IS NOT NULL',
        """j."results" <> '{}'::jsonb""",
        'reactor.outranks_v2(j."id", r."job_id", r."saved_by")',
    ):
        assert piece in text


@pytest.mark.parametrize("name", ["record_jobs", "record_oldest"])
def test_writers_use_the_precedence_clause(name: str) -> None:
    text = QUERIES[name]
    assert 'ON CONFLICT ("id") DO UPDATE' in text
    assert "SKIP LOCKED" in text
    assert "FOR NO KEY UPDATE OF j" in text
    # The precedence function guards both the needs_run check and the ON CONFLICT re-check.
    assert text.count("reactor.outranks_v2(") >= 2


def test_every_query_the_code_names_exists() -> None:
    # Database.run("name", ..., filename="x.sql"), and status's _one(queries, "name"), which
    # reads status.sql: every name the code sends is a query of the file it names.
    root = Path(reactor.__file__).parent
    call = re.compile(
        r"""(\.run|\.fetch_dicts|_one)\(\s*(?:queries,\s*)?"(\w+)"((?:(?!\.run\(|\n\s*\n).){0,200})""",
        re.DOTALL,
    )
    named: set[tuple[str, str]] = set()
    for source in root.rglob("*.py"):
        for how, name, rest in call.findall(source.read_text(encoding="utf-8")):
            file = re.search(r'filename="([\w.]+)"', rest)
            default = "status.sql" if how == "_one" else "queries.sql"
            named.add((name, file.group(1) if file else default))
    assert len(named) > 20, "few named queries found: has the API moved?"
    for name, filename in sorted(named):
        assert name in sql.templates(filename), f"{name} is not a query of {filename}"


def test_the_reconcile_walks_on_the_index_predicate() -> None:
    # The walk must state the walk index's predicate itself, or the planner cannot use the index.
    walk = squash(QUERIES["reconcile_step"])
    assert f"WHERE {squash(mapping.REFERENCE.walked('j'))}" in walk
    assert 'ORDER BY j."run_id", j."id"' in walk
    index = squash(indexes.walk_index(REFERENCE_INSTALL).create())
    assert f"WHERE {squash(mapping.REFERENCE.walked(None))}" in index
    assert '("run_id", "id")' in index
    # The index names no column that the app's progress updates change: they stay HOT.
    for column in ("results", "updated_at"):
        assert column not in index


# -- migrations ----------------------------------------------------------------------------------


def test_migrations_are_numbered_one_to_n() -> None:
    migrations = sql.migrations()
    assert migrations
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert len({m.name for m in migrations}) == len(migrations)


def test_migration_files_all_follow_the_naming_rule() -> None:
    # A file that doesn't match NNNN_name.sql would be silently skipped.
    directory = Path(reactor.__file__).parent.parent / "triggers" / "migrations"
    if not directory.is_dir():
        pytest.skip("triggers is not installed from the source tree")
    names = sorted(p.name for p in directory.iterdir() if p.suffix == ".sql")
    assert names == [f"{m.version:04d}_{m.name}.sql" for m in sql.migrations()]


def test_migrations_have_text() -> None:
    for m in sql.migrations():
        assert m.text.strip(), m
        assert re.fullmatch(r"\w+", m.name)


def test_latest_version_is_the_newest_migration() -> None:
    assert sql.latest_version() == max(m.version for m in sql.migrations())
    assert sql.latest_version() == sql.migrations()[-1].version


# -- render: the channel ---------------------------------------------------------------------------


def test_render_quotes_the_channel_as_a_literal() -> None:
    assert sql.render("SELECT pg_notify(@channel@, 'x')", REFERENCE, channel="jobs_done") == (
        "SELECT pg_notify('jobs_done', 'x')"
    )


def test_render_replaces_every_occurrence() -> None:
    assert sql.render("@channel@ @channel@", REFERENCE, channel="c") == "'c' 'c'"


def test_render_escapes_quotes() -> None:
    # The config forbids such channels, but the quoting must hold regardless.
    assert sql.render("f(@channel@)", REFERENCE, channel="a'b") == "f('a''b')"
    assert sql.render("f(@channel@)", REFERENCE, channel="x'); DROP TABLE t; --") == (
        "f('x''); DROP TABLE t; --')"
    )


def test_render_leaves_text_without_placeholder_alone() -> None:
    assert sql.render("SELECT 1", REFERENCE, channel="c") == "SELECT 1"


def test_notify_triggers_take_the_channel() -> None:
    raw = sql.read("notify_triggers.sql")
    assert "@channel@" in raw
    text = sql.render(raw, REFERENCE, channel="my_channel")
    assert not re.search(r"@\w+(\.\w+)?(\(\w*\))?@", text), "a slot left unfilled"
    assert "job_changed_v1('my_channel', '')" in text
    spread = sql.render(raw, REFERENCE, channel="my_channel", spread=True)
    assert "job_changed_v1('my_channel', 'spread')" in spread


def test_migrations_and_schema_have_no_unfilled_includes() -> None:
    for m in sql.migrations():
        assert "{{" not in m.text
    assert "{{" not in sql.render(sql.read("schema.sql"), REFERENCE)


# -- a % the mapping fills in ---------------------------------------------------------------------

PERCENT = mapping_file.parse(
    {
        "jobs": {"table": "jobs 100%", "not_null": ["doc%"]},
        "runs": {"table": "runs 100%", "columns": {"title": "coalesce(j.title, '100%(hooks)s')"}},
    }
).in_public()


def test_a_named_query_doubles_each_percent_it_fills_in() -> None:
    # Named queries run with parameters: psycopg reads %% as one %, a lone % as a placeholder.
    record = sql.queries("queries.sql", PERCENT)["record_jobs"]
    assert '"public"."runs 100%%"' in record
    assert "(coalesce(j.title, '100%%(hooks)s'))" in record
    assert 'j."doc%%" IS NOT NULL' in record
    assert "%(ids)s" in record  # the template's own placeholders stay single


@pytest.mark.parametrize("filename", ["queries.sql", "status.sql", "hooks.sql", "dashboard.sql"])
def test_every_named_query_keeps_percent_signs_for_placeholders(filename: str) -> None:
    for name, text in sql.queries(filename, PERCENT).items():
        assert "%" not in re.sub(r"%\(\w+\)s|%%", "", text), name


def test_sql_run_without_parameters_keeps_one_percent() -> None:
    # Migrations and the printed script go to the server as they are.
    text = sql.render("SELECT 1@run_values@ FROM @jobs@ j", PERCENT)
    assert text == """SELECT 1, (coalesce(j.title, '100%(hooks)s')) FROM "public"."jobs 100%" j"""
    assert sql.render("SELECT @x@", PERCENT, values={"x": "'%'"}, parameters=True) == (
        "SELECT '%%'"
    )


# -- one statement for several pairs ------------------------------------------------------------

PART = """WITH probe AS (
    SELECT @j.probe@ FROM @jobs@ j WHERE @j.id@ = %(probe)s AND note LIKE 'a%%'
), other AS (
    SELECT 1 AS one FROM probe
)
SELECT (SELECT count(*) FROM other) AS n, %(probe)s AS probe_again"""


def test_a_part_renames_its_names_and_parameters_not_the_slots() -> None:
    part = sql.union_template(PART, 1)
    ctes = dict(part.ctes)
    assert list(ctes) == ["probe__p1", "other__p1"]
    assert "FROM probe__p1\n" in ctes["other__p1"]
    assert "FROM other__p1)" in part.select
    pieces = [*ctes.values(), part.select]
    assert sum(piece.count("%(probe__p1)s") for piece in pieces) == 2
    # What a mapping fills in is its own, and a literal % stays written twice.
    assert "@j.probe@" in ctes["probe__p1"]
    assert "LIKE 'a%%'" in ctes["probe__p1"]
    assert "probe_again" in part.select


def test_a_part_is_read_by_its_parentheses_not_its_line_layout() -> None:
    # One line, a parenthesis inside a literal, a quoted name and a comment: the same parts.
    text = (
        "with a as (SELECT ')' AS p, \"x)\" FROM t /* ) */ WHERE f(%(n)s)),b AS(SELECT 1 FROM a)"
        "   select (SELECT count(*) FROM b)"
    )
    part = sql.union_template(text, 0)
    assert part.ctes == (
        ("a__p0", "SELECT ')' AS p, \"x)\" FROM t /* ) */ WHERE f(%(n__p0)s)"),
        ("b__p0", "SELECT 1 FROM a__p0"),
    )
    assert part.select == "(SELECT count(*) FROM b__p0)"


@pytest.mark.parametrize(
    "text",
    ["SELECT 1", "WITH a AS (SELECT 1", "WITH a AS (SELECT 1) DELETE FROM t", "WITH (SELECT 1)"],
)
def test_a_template_that_is_not_one_with_and_one_select_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="one WITH and one SELECT"):
        sql.union_template(text, 0)


def test_a_union_holds_every_part_once_in_order() -> None:
    parts = [sql.union_template(PART, index) for index in range(3)]
    statement = sql.union(parts)
    assert statement.startswith("WITH probe__p0 AS (")
    assert statement.count(" AS (") == 6
    selects = re.findall(r"^(?:UNION ALL\n)?SELECT (\d) AS part,", statement, re.MULTILINE)
    assert selects == ["0", "1", "2"]
    assert statement.endswith("ORDER BY part")


def test_the_health_check_of_two_pairs_takes_each_pairs_parameters() -> None:
    second = mapping_file.load(str(Path(__file__).parents[1] / "mappings" / "second.toml"))
    statement = sql.union_query("health", (REFERENCE, second))
    single = set(re.findall(r"%\((\w+)\)s", QUERIES["health"]))
    assert set(re.findall(r"%\((\w+)\)s", statement)) == {
        sql.part_name(name, index) for name in single for index in (0, 1)
    }
    assert f"{second.reactor_schema}.replicas" in statement
    assert "reactor.replicas" in statement
