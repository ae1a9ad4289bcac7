"""docs/bun.md, the Bun side, shows code from examples/bun, never a paraphrase of it."""

from __future__ import annotations

import re

from tests import tools


def normalized(text: str) -> str:
    return " ".join(text.split())


def test_the_bun_pages_snippets_are_the_example_code() -> None:
    page = (tools.ROOT / "docs" / "bun.md").read_text(encoding="utf-8")
    snippets = re.findall(r"```ts\n(.*?)```", page, flags=re.DOTALL)
    assert len(snippets) == 2
    sources = [
        normalized(path.read_text(encoding="utf-8")) for path in tools.BUN_EXAMPLE.glob("*.ts")
    ]
    for snippet in snippets:
        assert any(normalized(snippet) in source for source in sources), snippet
