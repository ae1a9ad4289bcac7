"""A template's dollar quotes stay closed where it closes them, whatever a name holds; a name
or value with a control character is found before anything is rendered. Pure."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from reactor.db.script import CHECK_BODIES, migration_script
from reactor.install import REFERENCE_INSTALL, Install, sql
from reactor.install.mapping import REFERENCE, unshowable
from reactor.install.quote import dollar_quoted


def occurrences(text: str, tag: str) -> list[int]:
    """Where ``tag`` starts in ``text``, overlapping occurrences too."""
    return [m.start() for m in re.finditer(f"(?={re.escape(tag)})", text)]


def test_a_body_without_a_dollar_in_it_keeps_the_templates_delimiter() -> None:
    assert dollar_quoted(["AS ", " BEGIN END ", ";"], ["$$", "$$"]) == "AS $$ BEGIN END $$;"


@pytest.mark.parametrize(
    "body",
    [
        ' "id$$" ',  # the delimiter itself
        " x$",  # a $ before the closing delimiter: $$$ ends the body one early
        " $$ $reactor_1$ $reactor_2$ ",  # and the delimiters a render picks next
        " 'a' || $$ ",
    ],
)
def test_a_body_holding_its_delimiter_gets_one_it_does_not_hold(body: str) -> None:
    text = dollar_quoted(["AS ", body, ";"], ["$$", "$$"])

    tag = text[len("AS ") : text.index(body)]
    assert tag != "$$"
    assert text == f"AS {tag}{body}{tag};"
    # The body ends where the template ends it: the tag starts nowhere else.
    assert occurrences(text, tag) == [3, 3 + len(tag) + len(body)]


def test_the_picked_delimiter_skips_every_number_a_piece_holds() -> None:
    text = dollar_quoted(["AS ", " $$ reactor_1 reactor_3$ ", ";"], ["$$", "$$"])
    assert text == "AS $reactor_2$ $$ reactor_1 reactor_3$ $reactor_2$;"


def test_an_occurrence_across_a_piece_and_a_delimiter_counts() -> None:
    # "...x$t" then "$t$" reads "$t$" one place early.
    text = dollar_quoted(["DO ", " x$t", ";"], ["$t$", "$t$"])
    assert text == "DO $reactor_1$ x$t$reactor_1$;"


def test_each_tag_of_a_template_is_kept_or_replaced_on_its_own() -> None:
    pieces = ["DO ", " a ", " $q$ ", " b ", ";"]
    text = dollar_quoted(pieces, ["$t$", "$$", "$$", "$t$"])
    assert text == "DO $t$ a $$ $q$ $$ b $t$;"
    text = dollar_quoted(["DO ", " a ", " $$ ", " b ", ";"], ["$t$", "$$", "$$", "$t$"])
    assert text == "DO $t$ a $reactor_1$ $$ $reactor_1$ b $t$;"


def test_pieces_and_delimiters_must_alternate() -> None:
    with pytest.raises(ValueError, match="one piece more"):
        dollar_quoted(["a", "b"], ["$$", "$$"])


def test_render_takes_only_the_templates_delimiters_for_delimiters() -> None:
    # A name holding $$ in a body: the render's delimiter is another, the name is intact.
    hostile = replace(REFERENCE, jobs=replace(REFERENCE.jobs, id="id$$x"))
    text = sql.render("AS $$ SELECT @j.id@ $$;", hostile)
    assert text == 'AS $reactor_1$ SELECT j."id$$x" $reactor_1$;'
    # A $ outside a delimiter, a parameter, is left alone; so is every mapping that holds none.
    assert sql.render("AS $$ SELECT $1 $$;", REFERENCE) == "AS $$ SELECT $1 $$;"


def test_the_reference_install_renders_its_delimiters_as_written() -> None:
    # Nothing changes for a mapping whose names hold no delimiter: the printed script, and the
    # digest `reactor migrate` records, are what they were.
    for text in (sql.baseline().text, sql.repeatable().text, sql.preamble("audit.sql")):
        rendered = REFERENCE_INSTALL.render(text)
        assert rendered.count("$$") == text.count("$$") > 0
        assert "$reactor_" not in rendered


def test_the_printed_script_turns_the_compile_of_function_bodies_on_first() -> None:
    script = migration_script(REFERENCE_INSTALL, reference_schema=True)
    assert script.splitlines()[0] == CHECK_BODIES == "SET check_function_bodies = on;"


@pytest.mark.parametrize(
    ("changed", "key", "char"),
    [
        ({"jobs": replace(REFERENCE.jobs, id="id\nx")}, "jobs.id", "\n"),
        ({"jobs": replace(REFERENCE.jobs, table=("app\r", "jobs"))}, "jobs.table", "\r"),
        ({"jobs": replace(REFERENCE.jobs, not_null=("doc", "res\t"))}, "jobs.not_null", "\t"),
        ({"jobs": replace(REFERENCE.jobs, terminal=("done\x1b[2J",))}, "jobs.terminal", "\x1b"),
        ({"runs": replace(REFERENCE.runs, worker="w\u2028")}, "runs.worker", "\u2028"),
        ({"runs": replace(REFERENCE.runs, client=("c\x85",))}, "runs.client", "\x85"),
        ({"runs": replace(REFERENCE.runs, columns=(("d\x7f", "j.d"),))}, "[runs.columns]", "\x7f"),
    ],
)
def test_a_control_character_in_any_name_or_value_is_found(
    changed: dict[str, object], key: str, char: str
) -> None:
    found = unshowable(replace(REFERENCE, **changed))  # type: ignore[arg-type]
    assert found is not None
    assert (found[0], found[2]) == (key, char)


def test_names_of_any_other_kind_pass() -> None:
    jobs = replace(REFERENCE.jobs, id="id$$ \\! x 'y' \"z\" jöb", terminal=(3, 4))
    assert unshowable(replace(REFERENCE, jobs=jobs)) is None
    assert unshowable(REFERENCE) is None
    assert unshowable(Install.of().mapping) is None
