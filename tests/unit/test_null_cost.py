"""What a NULL costs (reactor.install.null_cost): the column sources of an expression, the
mapping file's line, and the fix a job set aside by a NOT NULL violation is told."""

from __future__ import annotations

from pathlib import Path

from reactor.install.mapping import Jobs, Mapping, Runs
from reactor.install.null_cost import (
    column_sources,
    costs,
    line_of,
    nullable_sources,
    set_aside_fix,
    violated_column,
)

FILE = """\
reactor_schema = "reactor"

[jobs]
table = "exports"
not_null = ["doc"]

[runs]
table = "reports"
columns.title = "j.title"

[runs.columns]
# the body
body = "j.body"
"Owner Id" = 'j."OwnerId"'
"""


def test_the_job_columns_an_expression_names() -> None:
    assert column_sources("j.result") == {"result"}
    assert column_sources('coalesce(j."OwnerId", j.Owner) || j . x') == {"OwnerId", "owner", "x"}
    # A function of a schema named j, a column of another alias, a string: no sources.
    assert column_sources("j.f(1) + jj.a + 'j.b'::text") == set()


def test_an_expression_may_be_null_by_its_nullable_sources_unless_coalesced_whole() -> None:
    assert nullable_sources("j.result", {"result"}) == ["result"]
    assert nullable_sources("j.meta->>'title'", {"meta"}) == ["meta"]
    assert nullable_sources("j.result", {"other"}) == []
    assert nullable_sources("coalesce(j.result, '')", {"result"}) == []
    assert nullable_sources("COALESCE (j.a, 'x')", {"a"}) == []
    # coalesce only in part: the rest may still be NULL.
    assert nullable_sources("coalesce(j.a, '') || j.b", {"a", "b"}) == ["a", "b"]


def test_costs_are_the_not_null_columns_filled_by_nullable_columns_outside_not_null() -> None:
    mapping = Mapping(
        jobs=Jobs(not_null=("doc",)),
        runs=Runs(columns=(("body", "j.body"), ("doc", "j.doc"), ("note", "j.note"))),
    )
    found = costs(mapping, ["body", "doc"], ["body", "doc", "note"])
    assert found == [("body", "j.body", ["body"])]


def test_the_line_of_a_column_in_the_mapping_file() -> None:
    assert line_of(FILE, "body") == 13
    assert line_of(FILE, "Owner Id") == 14
    assert line_of(FILE, "title") == 9
    assert line_of('[runs]\ncolumns = { a = "j.a" }\n', "a") == 2
    assert line_of(FILE, "missing") is None
    assert line_of("[jobs]\nbody = 1\n", "body") is None


def test_a_not_null_violation_on_a_mapped_column_names_the_line_and_both_fixes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reactor.toml"
    path.write_text(FILE)
    mapping = Mapping(runs=Runs(columns=(("body", "j.body"),)), source=str(path))
    error = 'null value in column "body" of relation "reports" violates not-null constraint'
    assert violated_column("23502", error) == "body"
    fix = set_aside_fix(mapping, "23502", error)
    assert fix is not None
    assert fix.startswith(f"{path}:13: ")
    assert "add body to [jobs] not_null" in fix
    assert "or coalesce it there" in fix
    # Another error, or a column the mapping does not fill: nothing to say.
    assert set_aside_fix(mapping, "23514", error) is None
    other = error.replace('"body"', '"owner"')
    assert set_aside_fix(mapping, "23502", other) is None
