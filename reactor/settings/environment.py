"""The settings' values as the environment, the flags and a pair's ``[reactor]`` table write
them: each read by its row of :data:`.table.TABLE`, parsed, and named in every message.

Pure: the environment is passed in. No message quotes a secret (:mod:`.parsers`); a family's
variable (REACTOR_WEBHOOK_SECRET_<NAME>) is named, never its value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from reactor.errors import ConfigError
from reactor.settings.setting import Setting
from reactor.settings.table import IN_FILE, SETTINGS, TABLE

# What follows a family's prefix: a hook's name, or a pair's and a hook's, upper-cased, each
# at most 63 characters.
_FAMILY_SUFFIX = re.compile(r"[A-Z0-9_]{1,127}")


def from_environment(
    environ: Mapping[str, str], overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The values ``environ`` sets, by setting name; ``overrides`` (from flags, by setting
    name) win where they are not None. What neither sets is left out: its default stands."""
    raw: dict[str, Any] = {}
    for setting in TABLE:
        if setting.family is not None:
            members = _family(setting, environ)
            if members:
                raw[setting.name] = members
        elif setting.variable in environ:
            raw[setting.name] = read(setting, setting.variable, environ[setting.variable])
    for name, value in (overrides or {}).items():
        if value is not None:
            setting = SETTINGS[name]
            raw[name] = read(setting, setting.option, str(value))
    return raw


def from_file(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The values a pair's ``[reactor]`` table (read from ``source``) sets, by setting name;
    only the settings of :data:`.table.IN_FILE` may be set there."""
    raw: dict[str, Any] = {}
    for name, value in values.items():
        if name not in IN_FILE:
            raise ConfigError(
                f"{source}: unknown key [reactor] {name}; a pair may set " + ", ".join(IN_FILE)
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(f"{source}: [reactor] {name} must be a string or a number")
        raw[name] = read(SETTINGS[name], f"{source}: [reactor] {name}", str(value))
    return raw


def read(setting: Setting, source: str, text: str) -> Any:
    """``text``, the value ``source`` gives ``setting``, parsed."""
    return setting.parse(source, text.strip())


def _family(setting: Setting, environ: Mapping[str, str]) -> dict[str, str]:
    """Every variable of ``setting``'s family that is set and not empty (empty: unset, as for a
    single variable), by variable name."""
    prefix = setting.family or ""
    found: dict[str, str] = {}
    for variable, value in environ.items():
        if not variable.startswith(prefix) or not value.strip():
            continue
        if not _FAMILY_SUFFIX.fullmatch(variable.removeprefix(prefix)):
            raise ConfigError(
                f"{variable}: the part after {prefix} is a hook's name, or a "
                "pair's and a hook's, upper-cased, with - written as _ (hook ops-diag: "
                "REACTOR_WEBHOOK_SECRET_OPS_DIAG; of pair reactor: "
                "REACTOR_WEBHOOK_SECRET_REACTOR_OPS_DIAG)"
            )
        found[variable] = read(setting, variable, value)
    return found
