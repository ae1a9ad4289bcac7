"""reactor.settings.table: each setting is declared once, and its field, its variable, its flag
and its line on the reference page all come from that row; a default is written once; the
settings stand below the hooks."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from docs import generate
from reactor.cli.arguments import build_parser
from reactor.errors import ConfigError
from reactor.settings.config import PairSettings, ProcessSettings, Settings
from reactor.settings.setting import Setting
from reactor.settings.table import DASHBOARD_ADDR, HTTP_ADDR, IN_FILE, TABLE
from tests import tools
from tests.unit.test_layout import room_graph

PACKAGE = tools.ROOT / "reactor"

# Values some setting takes, one of which each single variable accepts as other than its default.
SAMPLES = (
    "0.05",
    "7",
    "300",
    "poll",
    "chan_7",
    "10.0.0.5:1234",
    "x" * 32,
    "postgresql://app@db.internal/app",
    "https://page.example/",
    "audit=notify:audit_channel",
)

BY_NAME = {setting.name: setting for setting in TABLE}


def sample(setting: Setting) -> tuple[str, object]:
    """A text ``setting``'s variable takes that is not its default, and the value it gives."""
    for text in SAMPLES:
        try:
            value = getattr(Settings.from_env({setting.variable: text}), setting.name)
        except ConfigError:
            continue
        if value != setting.value:
            return text, value
    raise AssertionError(f"no sample sets {setting.variable}")


@pytest.mark.parametrize("setting", TABLE, ids=lambda s: s.name)
def test_every_setting_is_a_field_of_its_scopes_dataclass(setting: Setting) -> None:
    kind = PairSettings if setting.scope == "pair" else ProcessSettings
    (field,) = [f for f in dataclasses.fields(kind) if f.name == setting.name]
    assert field.metadata["setting"] is setting
    assert field.repr is not setting.hidden
    if setting.family is None:
        assert getattr(Settings(), setting.name) == setting.value
    else:
        assert getattr(Settings(), setting.name) == {}


def test_every_field_is_a_setting_but_the_one_derived() -> None:
    # dashboard_addr_chosen says whether REACTOR_DASHBOARD_ADDR was set: no variable of its own.
    names = {f.name for f in dataclasses.fields(Settings)}
    assert names == set(BY_NAME) | {"dashboard_addr_chosen"}
    assert [f.name for f in dataclasses.fields(PairSettings)] == [
        s.name for s in TABLE if s.scope == "pair"
    ]


@pytest.mark.parametrize("setting", [s for s in TABLE if s.family is None], ids=lambda s: s.name)
def test_every_setting_is_read_from_its_variable(setting: Setting) -> None:
    text, value = sample(setting)
    assert getattr(Settings.from_env({setting.variable: f" {text} "}), setting.name) == value
    if setting.scope == "pair" and setting.in_file:
        from_file = Settings().overridden({setting.name: text}, "pair.toml")
        assert getattr(from_file, setting.name) == value


def test_a_family_is_read_by_its_prefix() -> None:
    (family,) = [s for s in TABLE if s.family is not None]
    assert family.family is not None
    read = Settings.from_env({family.family + "JUDGE": " k3y "})
    assert getattr(read, family.name) == {family.family + "JUDGE": "k3y"}


@pytest.mark.parametrize("setting", TABLE, ids=lambda s: s.name)
def test_every_setting_is_documented_on_the_generated_page(setting: Setting) -> None:
    page = generate.settings_reference()
    (row,) = [line for line in page.splitlines() if line.startswith(f"| `{setting.variable}` |")]
    cells = [cell.strip() for cell in row.strip("|").split(" | ")]
    _, flag, default, unit, meaning = cells
    assert meaning == setting.doc.replace("|", "\\|")
    assert unit == (setting.unit or "")
    if setting.default is None:
        assert default == setting.unset
    else:
        assert default == (f"`{setting.default}`" if setting.default else "empty")
    assert (flag != "") is (setting.flag is not None)
    if setting.unit == "seconds":
        assert setting.variable.endswith("_SECONDS")


@pytest.mark.parametrize("setting", [s for s in TABLE if s.flag], ids=lambda s: s.name)
def test_every_declared_flag_is_taken_by_its_commands_and_wins(setting: Setting) -> None:
    assert setting.flag is not None
    parser = build_parser()
    text, value = sample(setting)
    for command in setting.flag.commands:
        extra = ["--once"] if command == "sweep" else []
        args = parser.parse_args([command, *extra, setting.option, text])
        assert getattr(args, setting.name) == text
        assert setting.variable in next(
            action.help or ""
            for action in _actions(parser, command)
            if setting.option in action.option_strings
        )
        # The flag wins over the variable.
        environ = {} if setting.default is None else {setting.variable: setting.default}
        overridden = Settings.from_env(environ, {setting.name: getattr(args, setting.name)})
        assert getattr(overridden, setting.name) == value


def _actions(parser: argparse.ArgumentParser, command: str) -> list[argparse.Action]:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(commands.choices[command]._actions)


def test_no_setting_without_a_flag_is_a_flag() -> None:
    parser = build_parser()
    for setting in TABLE:
        if setting.flag is None:
            for command in ("run", "sweep", "migrate"):
                with pytest.raises(SystemExit):
                    parser.parse_args([command, setting.option, "1"])


def test_a_pairs_file_may_set_its_pair_settings_but_the_secrets() -> None:
    assert set(IN_FILE) == {s.name for s in TABLE if s.scope == "pair"} - {
        "webhook_secret",
        "webhook_secrets",
    }
    with pytest.raises(ConfigError, match="unknown key"):
        Settings().overridden({"webhook_secret": "x" * 32}, "pair.toml")


def _source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py")))


@pytest.mark.parametrize("default", [HTTP_ADDR, DASHBOARD_ADDR])
def test_an_address_default_is_written_once(default: str) -> None:
    assert _source().count(default) == 1


def test_the_http_address_default_is_written_once_in_any_form() -> None:
    # Neither as text for a message's example nor as the field's (host, port).
    assert _source().count(HTTP_ADDR.rpartition(":")[2]) == 1
    assert Settings().http_addr == ("127.0.0.1", 9187)  # what the design's table says
    assert Settings().dashboard_addr == ("127.0.0.1", 9188)


def test_the_settings_need_not_the_hooks() -> None:
    assert "reactor.hooks" not in room_graph()["reactor.settings"]


def test_no_settings_module_is_over_450_lines() -> None:
    for path in (PACKAGE / "settings").glob("*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 450, path.name


def test_a_class_declaring_other_settings_than_its_scopes_is_refused() -> None:
    from reactor.settings.config import TABLED, from_table

    class Short:
        grace: float = TABLED

    with pytest.raises(TypeError, match="the table's pair settings"):
        from_table("pair")(Short)
