"""The draft's word on how the app saves its artifact rows (``runs.app_saves``): a commented
``app_saves = "plain"`` where the app may save with a plain INSERT, or why it may not."""

from __future__ import annotations

import textwrap
from dataclasses import replace

from reactor.db.saves import Reference, references
from reactor.db.session import AnyConnection
from reactor.draft.facts import TableFacts
from reactor.draft.propose import Draft

_WIDTH_CHARS = 99
_SECTION_AFTER = "\n\n[runs.columns]"


async def noted(conn: AnyConnection, drafted: Draft, runs: TableFacts) -> Draft:
    """``drafted`` with the note on app_saves for ``runs`` at the end of its [runs] section."""
    found = await references(conn, runs.key)
    return replace(drafted, text=with_note(drafted.text, note(runs, found)))


def note(runs: TableFacts, found: list[Reference]) -> list[str]:
    """The comment lines: "plain" left for the reader to choose, or why it cannot be."""
    if found:
        text = (
            f'app_saves stays "upsert" (the default): a plain save replaces the reactor\'s row '
            f"of {runs.shown} by deleting it, and {found[0].why()}. The app's save must be the "
            "upsert that marks itself (docs/getting-started.md, The app's own save)."
        )
        return _comment(text)
    text = (
        'The app\'s own save: "upsert" (the default) when it saves with INSERT ... ON CONFLICT '
        '(key) DO UPDATE SET ..., saved_by = the client value; "plain" when it saves as an '
        "ORM's create does, with a plain INSERT: `reactor migrate` then installs the triggers "
        "that let the app's row replace the reactor's (docs/mapping.md, The app's own save)."
    )
    return [*_comment(text), '# app_saves = "plain"']


def with_note(text: str, lines: list[str]) -> str:
    """``text`` (a drafted file) with ``lines`` at the end of its [runs] section."""
    at = text.find(_SECTION_AFTER)
    block = "\n".join(lines)
    if at < 0:
        return text.rstrip("\n") + "\n" + block + "\n"
    return text[:at] + "\n" + block + text[at:]


def _comment(text: str) -> list[str]:
    return textwrap.wrap(
        text,
        width=_WIDTH_CHARS,
        initial_indent="# ",
        subsequent_indent="# ",
        break_on_hyphens=False,
    )
