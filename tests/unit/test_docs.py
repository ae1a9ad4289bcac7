"""docs/: the parts written from the code are what the code gives now, every page is in the
site's nav and linked from README, and every variable the reactor reads is documented."""

from __future__ import annotations

import re
import tomllib

import yaml

from docs import generate
from reactor.settings import pairs
from reactor.settings.config import Settings
from tests import tools

DOCS = tools.ROOT / "docs"


def test_the_generated_parts_are_current() -> None:
    stale = [str(page.relative_to(tools.ROOT)) for page in generate.stale()]
    assert stale == [], "run `uv run python docs/generate.py`"


def _nav_pages(entries: list[object]) -> list[str]:
    pages: list[str] = []
    for entry in entries:
        assert isinstance(entry, dict), entry
        for value in entry.values():
            pages += _nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def test_every_page_is_in_the_nav_and_linked_from_readme() -> None:
    site = yaml.safe_load((tools.ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert site["theme"]["name"] == "material"
    assert site["strict"] is True
    nav = _nav_pages(site["nav"])
    written = sorted(str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md"))
    assert sorted(nav) == written
    readme = (tools.ROOT / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([\w/.-]+\.md)\)", readme))
    # The site's home page only repeats README's list of pages.
    assert linked == set(written) - {"index.md"}


def test_readme_keeps_the_newcomers_commands() -> None:
    readme = (tools.ROOT / "README.md").read_text(encoding="utf-8")
    assert "\nuv run reactor demo " in readme
    assert "\nuv run pytest " in readme
    development = readme.split("\n## Development\n")[1]
    assert "\nuv run pytest " in development
    assert len(readme.splitlines()) <= 200


def test_the_worked_example_is_the_mapping_the_suite_runs() -> None:
    page = (DOCS / "mapping.md").read_text(encoding="utf-8")
    one_to_one, shared, *others = re.findall(r"```toml\n(.*?)```", page, flags=re.DOTALL)
    # The page opens with a one-to-one artifact, then a run several jobs share: both mappings
    # the suite runs.
    onetoone = (tools.ROOT / "tests" / "mappings" / "onetoone.toml").read_text(encoding="utf-8")
    assert tomllib.loads(one_to_one) == tomllib.loads(onetoone)
    second = (tools.ROOT / generate.SECOND_TOML).read_text(encoding="utf-8")
    assert tomllib.loads(shared) == tomllib.loads(second)
    # The files of "Many pairs": each one a pair the reactor would serve.
    assert len(others) == 2
    for text in others:
        pair = pairs.several([("mapping.md", tomllib.loads(text))], Settings())[0]
        assert pair.name.startswith("reactor")


def test_every_variable_the_reactor_reads_is_documented() -> None:
    source = "\n".join(
        path.read_text(encoding="utf-8") for path in (tools.ROOT / "reactor").rglob("*.py")
    )
    read = set(re.findall(r"REACTOR_[A-Z0-9_]+", source))
    text = (tools.ROOT / "README.md").read_text(encoding="utf-8") + "".join(
        page.read_text(encoding="utf-8") for page in DOCS.rglob("*.md")
    )
    assert sorted(name for name in read if name not in text) == []
    settings = (DOCS / "reference" / "settings.md").read_text(encoding="utf-8")
    for name in ("REACTOR_WEBHOOK_SECRET_<HOOK>", "REACTOR_CONFIG", "REACTOR_LISTEN_DATABASE_URL",
                 "REACTOR_DASHBOARD_TOKEN"):  # fmt: skip
        assert f"| `{name}` |" in settings
