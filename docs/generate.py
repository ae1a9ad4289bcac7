"""The parts of docs/ that are written from the code, so that they cannot drift from it.

A page holds a generated part between two markers::

    <!-- generated: NAME (docs/generate.py) -->
    ...
    <!-- end generated: NAME -->

and this script rewrites what stands between them from the code: the CLI's options from
``reactor.cli.arguments.build_parser()``, every setting from ``reactor.settings.table.TABLE``,
the metrics registry of ``reactor.telemetry.metrics.Metrics``, the exit codes of
``reactor.errors``, the SQL that ``reactor migrate --print`` prints for
``tests/mappings/second.toml``, and README's diagram. Everything outside the markers is written by
hand.

    uv run python docs/generate.py           # rewrite the generated parts
    uv run python docs/generate.py --check   # exit 1, naming each stale page, when one is
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from prometheus_client import Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

from reactor import db, errors
from reactor.cli import arguments
from reactor.install import Install, mapping, mapping_file, sql
from reactor.settings import table
from reactor.settings.setting import Setting
from reactor.telemetry import metrics

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
SECOND_TOML = "tests/mappings/second.toml"

_WIDTH = 100
_BEGIN = "<!-- generated: {name} (docs/generate.py) -->"
_END = "<!-- end generated: {name} -->"
_REGION = re.compile(
    r"<!-- generated: (?P<name>[\w-]+) \(docs/generate\.py\) -->\n"
    r"(?P<body>.*?)"
    r"<!-- end generated: (?P=name) -->",
    re.DOTALL,
)


# ---- the CLI ----------------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(name, the choice action that carries its help) of each sub-command of ``parser``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield choice.dest, choice


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _value(action: argparse.Action) -> str | None:
    """What an option takes (``GRACE``, ``{json,console}``), or None for a flag."""
    if action.nargs == 0:
        return None
    if action.choices is not None:
        return "{" + ",".join(str(choice) for choice in action.choices) + "}"
    return str(action.metavar or action.dest.upper())


def _shown_option(action: argparse.Action) -> str:
    """How an option or argument is typed: ``--grace GRACE``, ``--notify, --no-notify``."""
    if not action.option_strings:
        name = str(action.metavar or action.dest)
        return {"*": f"[{name} ...]", "+": f"{name} [{name} ...]"}.get(str(action.nargs), name)
    value = _value(action)
    if value is None:
        return ", ".join(action.option_strings)
    return ", ".join(f"{option} {value}" for option in action.option_strings)


def _usage(path: str, parser: argparse.ArgumentParser) -> str:
    """A one-line synopsis of ``parser``, in argparse's notation."""
    grouped: dict[int, list[argparse.Action]] = {}
    for group in parser._mutually_exclusive_groups:
        for action in group._group_actions:
            grouped[id(action)] = group._group_actions
    words = [path]
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or id(action) in seen:
            continue
        if isinstance(action, argparse._SubParsersAction):
            words.append(f"{action.metavar} ...")
            continue
        if not action.option_strings:
            words.append(_shown_option(action))
            continue
        # A flag and its negation, or the members of an exclusive group: one bracket.
        members = grouped.get(id(action), [action])
        seen.update(id(member) for member in members)
        alternatives: list[str] = []
        for member in members:
            value = _value(member)
            if value is None:
                alternatives += member.option_strings
            else:
                alternatives.append(f"{member.option_strings[0]} {value}")
        shown = " | ".join(alternatives)
        words.append(shown if action.required else f"[{shown}]")
    # Wrapped at 100 columns, as argparse does, under the first word after the command.
    lines = [words[0]]
    for word in words[1:]:
        if len(lines[-1]) + 1 + len(word) > _WIDTH and lines[-1].strip() != path:
            lines.append(" " * (len(path) + 1) + word)
        else:
            lines[-1] += " " + word
    return "\n".join(lines)


def _default(action: argparse.Action) -> str:
    if action.required and action.nargs not in ("*", "?"):  # argparse calls `*` required
        return "required"
    if action.nargs == 0 or action.default is None or action.default == argparse.SUPPRESS:
        return ""
    return f"`{action.default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = [
        action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]
    if not rows:
        return []
    lines = ["| option | default | meaning |", "|---|---|---|"]
    for action in rows:
        shown = _cell(f"`{_shown_option(action)}`")
        lines.append(f"| {shown} | {_cell(_default(action))} | {_cell(action.help or '')} |")
    return [*lines, ""]


def _command_section(
    path: str, parser: argparse.ArgumentParser, summary: str, depth: int
) -> list[str]:
    lines = [f"{'#' * depth} `{path}`", "", summary, "", "```", _usage(path, parser), "```", ""]
    lines += _options_table(parser)
    commands = dict(_subcommands(parser))
    children = _children(parser)
    if children:
        lines += ["| command | does |", "|---|---|"]
        for name in children:
            lines.append(f"| `{path} {name}` | {_cell(commands[name].help or '')} |")
        lines.append("")
        for name, child in children.items():
            lines += _command_section(f"{path} {name}", child, commands[name].help or "", depth + 1)
    return lines


@functools.cache
def _parser() -> argparse.ArgumentParser:
    return arguments.build_parser()


def cli_reference() -> str:
    """Every command and option of ``reactor``, from the parser the console script runs."""
    parser = _parser()
    return "\n".join(_command_section("reactor", parser, parser.description or "", 2))


# ---- settings ---------------------------------------------------------------------------------


class Row(NamedTuple):
    """A line of the settings table."""

    variable: str
    flags: str
    default: str
    unit: str
    meaning: str


def _shown_default(text: str) -> str:
    return "empty" if text == "" else f"`{text}`"


def _setting_flags(setting: Setting) -> str:
    """The setting's option, with the commands that take it."""
    if setting.flag is None:
        return ""
    return f"`{setting.option}` ({', '.join(setting.flag.commands)})"


def _flags(variable: str) -> str:
    """The options whose help names ``variable``, with the commands that take them: for the
    variables read beside the settings, whose flags are declared with their commands."""
    parser = _parser()
    named = re.compile(rf"\b{re.escape(variable)}\b")
    found: dict[str, list[str]] = {}
    for path, command in [("reactor", parser), *_commands("reactor", parser)]:
        for action in command._actions:
            if action.option_strings and named.search(action.help or ""):
                found.setdefault(action.option_strings[0], []).append(path.removeprefix("reactor "))
    return "; ".join(
        f"`{option}`" + ("" if where == ["reactor"] else f" ({', '.join(where)})")
        for option, where in found.items()
    )


def _commands(
    path: str, parser: argparse.ArgumentParser
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for name, child in _children(parser).items():
        yield f"{path} {name}", child
        yield from _commands(f"{path} {name}", child)


def _source(but: Path | None = None) -> str:
    """The package's source, where the names of the variables it reads stand (``but`` one file)."""
    paths = sorted(path for path in (ROOT / "reactor").rglob("*.py") if path != but)
    return "\n".join(path.read_text(encoding="utf-8") for path in paths)


def _words(text: str) -> set[str]:
    """The REACTOR_ names in ``text``; a family's as its prefix (REACTOR_WEBHOOK_SECRET_)."""
    return set(re.findall(r"REACTOR_[A-Z0-9_]+", text))


def settings() -> list[Row]:
    """Every variable the reactor reads: the settings' table in its order, then the variables
    read beside it (``table.ELSEWHERE``), each of which must be named in reactor/'s source."""
    rows = [
        Row(
            setting.variable,
            _setting_flags(setting),
            _shown_default(setting.default) if setting.default is not None else str(setting.unset),
            setting.unit or "",
            setting.doc,
        )
        for setting in table.TABLE
    ]
    # Where the variables are read: the table, which names them all, is no proof of that.
    source = _source(but=Path(table.__file__))
    for other in table.ELSEWHERE:
        if other.variable not in source:
            raise SystemExit(
                f"docs/generate.py: settings/table.py documents {other.variable}, which nothing "
                "reads"
            )
        rows.append(Row(other.variable, _flags(other.variable), other.unset, "", other.doc))
    return rows


def _settings_table(rows: list[Row]) -> str:
    lines = ["| variable | flag | default | unit | meaning |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| `{row.variable}` | {_cell(row.flags)} | {_cell(row.default)} | "
            f"{_cell(row.unit)} | {_cell(row.meaning)} |"
        )
    return "\n".join(lines)


def settings_reference() -> str:
    """Every variable with its flag, default, unit and meaning."""
    shown = _settings_table(settings())
    missing = sorted(_words(_source()) - _words(shown))
    if missing:
        raise SystemExit(
            f"docs/generate.py: reactor/ reads {', '.join(missing)}; add it to "
            "reactor/settings/table.py (TABLE, or ELSEWHERE when it is read beside the settings)"
        )
    return shown


def hook_settings() -> str:
    """The variables of the hook runner alone, for the hooks page."""
    return _settings_table(
        [row for row in settings() if row.variable.startswith(("REACTOR_HOOK", "REACTOR_WEBHOOK"))]
    )


# ---- metrics ----------------------------------------------------------------------------------


def metrics_reference() -> str:
    """The registry of one reactor: name, type, labels (with the values set at start), help."""
    registry = metrics.Metrics()
    started: dict[str, dict[str, list[str]]] = {}
    for family in registry.registry.collect():
        for sample in family.samples:
            for label, value in sample.labels.items():
                values = started.setdefault(family.name, {}).setdefault(label, [])
                if value not in values:
                    values.append(value)
    lines = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for collector in vars(registry).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        name = collector._name + ("_total" if isinstance(collector, Counter) else "")
        labels = []
        for label in collector._labelnames:
            shown = started.get(collector._name, {}).get(label, [])
            labels.append(f"`{label}`" + (f": {', '.join(shown)}" if shown else ""))
        meaning = collector._documentation
        if isinstance(collector, Histogram):
            bounds = ", ".join(f"{bound:g}" for bound in collector._upper_bounds[:-1])
            meaning += f" Buckets (s): {bounds}."
        lines.append(
            f"| `{name}` | {collector._type} | {_cell('; '.join(labels))} | {_cell(meaning)} |"
        )
    return "\n".join(lines)


# ---- exit codes -------------------------------------------------------------------------------

# What a command returns of its own accord, beside the errors of reactor/errors.py.
OUTCOMES = {
    0: "done; for `run`, a clean stop after SIGTERM or SIGINT and the drain",
    1: "`status`: something is at risk; `sweep --once`: a job is set aside; `hooks list`: a "
    "hook call is parked as failed",
    130: "interrupted (Ctrl-C)",
}
# What to do, by code, beside the one-line message (which says it too).
HINTS = {
    2: "The message names the setting, flag or row; argparse's own usage errors exit 2 too.",
    3: "`status` and `hooks` connect at most twice, the other commands five times; only `run` "
    "waits on a standby for its promotion.",
    4: "Run `reactor migrate`.",
    5: "The message names the grant; `reactor migrate --print-grants ROLE` prints them all.",
}


def exit_codes() -> str:
    """Every exit code: the commands' outcomes and the errors of reactor.errors, by code."""
    by_code: dict[int, list[str]] = {code: [text] for code, text in OUTCOMES.items()}
    for value in vars(errors).values():
        if (
            isinstance(value, type)
            and issubclass(value, errors.ReactorError)
            and value is not errors.ReactorError
            and value.__module__ == errors.__name__
        ):
            doc = " ".join((value.__doc__ or "").split())
            by_code.setdefault(value.exit_code, []).append(f"`{value.__name__}`: {doc}")
    stale = sorted(set(HINTS) - set(by_code))
    if stale:
        raise SystemExit(f"docs/generate.py: HINTS names exit codes no error has: {stale}")
    lines = ["| code | meaning |", "|---|---|"]
    for code in sorted(by_code):
        parts = by_code[code] + ([HINTS[code]] if code in HINTS else [])
        lines.append(f"| {code} | {_cell('<br>'.join(parts))} |")
    return "\n".join(lines)


# ---- the second mapping's SQL -----------------------------------------------------------------

# The column types the catalog reports for tests/mappings/second.sql (format_type, without
# modifiers), as `reactor migrate` fits them; tests/integration/test_mapping.py checks that
# `reactor migrate --print` against that schema prints exactly what second_script() renders.
SECOND_TYPES = {
    "jobId": "bigint",
    "reportKey": "text",
    "state": 'app."JobState"',
    "updatedAt": "timestamp without time zone",
    "createdAt": "timestamp without time zone",
    "html": "text",
    "verdicts": "jsonb",
}


def second_mapping() -> mapping.Mapping:
    """second.toml as `reactor migrate` types it from the catalog of second.sql."""
    return mapping_file.load(str(ROOT / SECOND_TOML)).in_public().typed(SECOND_TYPES)


def second_script() -> str:
    """`reactor migrate --print` for second.toml, with DATABASE_URL naming second.sql's
    database: a first install on the default channel."""
    return db.migration_script(Install.of(second_mapping()), reference_schema=False)


def printed_without_database() -> str:
    """What `REACTOR_CONFIG=tests/mappings/second.toml reactor migrate --print` says when
    DATABASE_URL is unset: the command itself, run in a clean environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTOR_")}
    env.pop("DATABASE_URL", None)
    env[mapping.CONFIG_VARIABLE] = SECOND_TOML
    done = subprocess.run(
        [sys.executable, "-m", "reactor", "migrate", "--print"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 2 or done.stdout:
        raise SystemExit(f"docs/generate.py: reactor migrate --print did not refuse: {done}")
    return done.stderr


def _excerpt(text: str, *parts: tuple[str, int]) -> str:
    """The lines of ``text`` from each (first line containing it, how many), joined by
    ``...`` lines indented as the part after them."""
    lines = text.splitlines()
    shown: list[str] = []
    for needle, count in parts:
        start = next(i for i, line in enumerate(lines) if needle in line)
        taken = lines[start : start + count]
        if shown:
            indent = len(taken[0]) - len(taken[0].lstrip())
            shown.append(" " * min(indent, 4) + "...")
        shown += taken
    return "\n".join(shown)


def _sql(text: str) -> str:
    return f"```sql\n{text.rstrip()}\n```"


def _job_trigger_lines(script: str) -> str:
    return _excerpt(script, ("    IF (NEW.", 4), ("INSERT INTO reactor.pending (job_id", 2))


def second_job_trigger() -> str:
    """The job trigger function's test and queue insert, typed from the catalog."""
    return _sql(_job_trigger_lines(second_script()))


def second_print_without_database() -> str:
    """The one line `migrate --print` gives for a mapping file without DATABASE_URL."""
    command = f"$ REACTOR_CONFIG={SECOND_TOML} reactor migrate --print"
    return f"```\n{command}\n{printed_without_database().strip()}\n```"


def second_record_write() -> str:
    """The INSERT of the record statements, rendered for second.toml."""
    query = sql.queries("queries.sql", second_mapping())["record_jobs"]
    lines = query.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("INSERT INTO"))
    end = next(i for i in range(start, len(lines)) if "outranks_v2(" in lines[i])
    return _sql("\n".join(lines[start : end + 1]))


def second_full_script() -> str:
    """The whole script, typed from the catalog, in a block that starts folded."""
    return "\n".join(
        [
            "<details markdown>",
            "<summary>The whole script: a first install, on the default channel</summary>",
            "",
            _sql(second_script()),
            "",
            "</details>",
        ]
    )


# ---- README's diagram -------------------------------------------------------------------------


def diagram() -> str:
    """The picture under README's "How it works", where it is kept."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## How it works\n", 1)[1]
    match = re.search(r"^```\n.*?^```$", section, re.DOTALL | re.MULTILINE)
    if match is None:
        raise SystemExit("docs/generate.py: README's How it works has no diagram")
    return match.group(0)


# ---- pages ------------------------------------------------------------------------------------

REGIONS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "settings": settings_reference,
    "hook-settings": hook_settings,
    "metrics": metrics_reference,
    "exit-codes": exit_codes,
    "second-job-trigger": second_job_trigger,
    "second-print-without-database": second_print_without_database,
    "second-record-write": second_record_write,
    "second-script": second_full_script,
    "diagram": diagram,
}


def pages() -> dict[Path, str]:
    """Every page of docs/ with a generated part: its text as the code would write it now."""
    rendered: dict[str, str] = {}

    def fill(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in REGIONS:
            raise SystemExit(f"docs/generate.py: no generated part is called {name!r}")
        if name not in rendered:
            rendered[name] = REGIONS[name]().rstrip("\n")
        return f"{_BEGIN.format(name=name)}\n{rendered[name]}\n{_END.format(name=name)}"

    written: dict[Path, str] = {}
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        if _REGION.search(text):
            written[page] = _REGION.sub(fill, text)
    unused = sorted(set(REGIONS) - set(rendered))
    if unused:
        raise SystemExit(f"docs/generate.py: no page has the part(s) {', '.join(unused)}")
    return written


def stale() -> list[Path]:
    """The pages whose generated parts differ from what the code gives now."""
    return [page for page, text in pages().items() if page.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/' parts generated from the code.")
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 when a page is stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for page in old:
            print(f"{page.relative_to(ROOT)} is stale: run `uv run python docs/generate.py`")
        return 1 if old else 0
    for page, text in pages().items():
        if page.read_text(encoding="utf-8") != text:
            page.write_text(text, encoding="utf-8")
            print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
