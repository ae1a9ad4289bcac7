"""The plain tables printed where the cli extra is not installed: aligned columns, a cell's
lines one under the other, nothing a terminal would act on."""

from __future__ import annotations

from reactor.shown import table


def test_columns_align_and_a_cells_lines_stay_in_their_column() -> None:
    text = table(
        ("check", "value", "state"),
        [("jobs", "3 due", "backlog"), ("hooks", "1 pending\n#4 judge: HTTP 503", "AT RISK")],
    )
    assert text.splitlines() == [
        "check  value               state",
        "-----  ------------------  -------",
        "jobs   3 due               backlog",
        "hooks  1 pending           AT RISK",
        "       #4 judge: HTTP 503",
    ]


def test_catalog_text_in_a_cell_is_escaped_not_acted_on() -> None:
    text = table(("name", "error"), [("job\x1b[2J", "bad\u202eevil\rline")])
    for hidden in ("\x1b", "\u202e", "\r"):
        assert hidden not in text
    assert "job\\x1b[2J" in text
    assert "bad\\u202eevil\\rline" in text
    assert len(text.splitlines()) == 3
