"""README's "Next to a Bun worker" shows code from examples/bun, never a paraphrase of it."""

from __future__ import annotations

import re

from tests import tools


def normalized(text: str) -> str:
    return " ".join(text.split())


def test_readme_snippets_are_the_example_code() -> None:
    readme = (tools.ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Next to a Bun worker\n")[1].split("\n## ")[0]
    snippets = re.findall(r"```ts\n(.*?)```", section, flags=re.DOTALL)
    assert len(snippets) == 2
    sources = [
        normalized(path.read_text(encoding="utf-8")) for path in tools.BUN_EXAMPLE.glob("*.ts")
    ]
    for snippet in snippets:
        assert any(normalized(snippet) in source for source in sources), snippet
