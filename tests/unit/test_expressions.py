"""The [runs.columns] lexer: one expression, whatever its literals, names and comments hold."""

from __future__ import annotations

import pytest

from reactor.errors import ConfigError
from reactor.install import mapping_file
from reactor.install.expressions import expression_problem

PWNED = (
    "j.doc_html FROM public.analysis_jobs j WHERE false; "
    "CREATE TABLE public.pwned AS SELECT current_user; SELECT j.doc_html"
)


@pytest.mark.parametrize(
    "expression",
    [
        "j.doc_html",
        "coalesce(j.title, '100%')",
        "coalesce(j.title, '%(hooks)s')",
        "coalesce(j.title, 'a; b')",
        "coalesce(j.title, 'it''s; fine')",
        "coalesce(j.title, E'it\\'s; fine')",
        # An E literal always takes backslash escapes: \' does not end it.
        "coalesce(j.title, e'\\'); ')",
        'j."odd; name"',
        'j."say ""hi""; now"',
        "coalesce(j.title, $$a; b$$)",
        "coalesce(j.title, $t$a $$ ; b$t$)",
        "j.title /* why; because */",
        "j.title /* nested /* ; */ still a comment ; */",
        "j.title -- a note; here\n|| 'x'",
        "j.a$b$c",  # a $ inside a word is part of it, not a dollar quote
        "ARRAY[j.a, j.b]",
        "j.meta->>'title'",
        "(SELECT max(x) FROM unnest(ARRAY[1, 2]) AS x)",
        "CASE WHEN j.a > 0 THEN 'x, y' ELSE 'z' END",
        "U&'d\\0061t\\+000061; '",
        "now() AT TIME ZONE 'UTC'",
        "j.n % 7",
    ],
)
def test_one_expression_passes(expression: str) -> None:
    assert expression_problem(expression) is None


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        (PWNED, "holds a ;"),
        ("j.doc_html; DROP TABLE x", "holds a ;"),
        ("j.title /* open ; ", "not closed"),
        ("'unclosed ; ", "not closed"),
        ('"unclosed ; ', "not closed"),
        ("$$unclosed ; ", "not closed"),
        ("$a$ ; $b$", "not closed"),
        ("j.title -- the rest of the line", "-- comment"),
        ("j.a) FROM t UNION SELECT (j.b", "do not balance"),
        ("(j.a", "do not balance"),
        ("j.a]", "do not balance"),
        ("(j.a]", "do not balance"),
        ("j.a, j.b", "holds a ,"),
        # Which quote ends a plain literal holding a backslash depends on the server's
        # standard_conforming_strings: each reading leaves a ; outside in one of these.
        ("'\\' ; DROP TABLE t; --'", "holds a ;"),
        ("'a\\' '; DROP TABLE t; '", "holds a ;"),
        ("E'\\'' ; x", "holds a ;"),
    ],
)
def test_what_is_not_one_expression_is_named(expression: str, says: str) -> None:
    problem = expression_problem(expression)
    assert problem is not None
    assert says in problem


def test_the_mapping_names_the_column_in_one_line() -> None:
    document = {"runs": {"columns": {"doc_html": PWNED, "results": "j.results"}}}
    with pytest.raises(ConfigError) as raised:
        mapping_file.parse(document, source="m.toml")
    message = str(raised.value)
    assert message.startswith("m.toml: [runs.columns] doc_html must be one SQL expression")
    assert "holds a ;" in message
    assert "\n" not in message


def test_the_statements_use_each_expression_in_parentheses() -> None:
    m = mapping_file.parse(
        {"runs": {"columns": {"doc_html": "j.doc_html", "results": "j.results"}}}
    )
    assert m.slot("run_values", None, None) == ", (j.doc_html), (j.results)"
