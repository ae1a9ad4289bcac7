"""Which job/artifact pairs a process serves: the files ``REACTOR_CONFIG`` names, each read once.

``REACTOR_CONFIG`` names one mapping file, or several separated by ``:`` as PATH is. One file
(or none: the reference pair) keeps the meaning it always had. With several, each file names
its own ``reactor_schema``: that schema holds the pair's queue, heartbeats and hook outbox, and
its name is the pair's name in the logs, the metrics, ``reactor status`` and ``--pair``.

A file's ``[reactor]`` table holds what differs for its pair (the grace, the channel, the hooks
and their bounds, :data:`reactor.settings.table.IN_FILE`); the environment gives the rest, and
the defaults. Reading is pure and validates every file before anything connects. Each pair's
settings hold every webhook secret the environment gives: which of them its own hooks read is
the hooks' to say (:func:`reactor.hooks.secrets.own_secrets`, before the hooks are made).
"""

from __future__ import annotations

from collections.abc import Mapping as Environ
from dataclasses import dataclass, replace
from typing import Any

from reactor.errors import ConfigError
from reactor.install import Install, mapping_file
from reactor.install.mapping import CONFIG_VARIABLE, REFERENCE, Mapping
from reactor.settings.config import Settings
from reactor.settings.table import SETTINGS


@dataclass(frozen=True)
class Pair:
    """One job/artifact pair, the one value a replica runs a pair from: its install (the
    mapping, as the file says it until :meth:`fitted` to the catalog, and its channel) and the
    settings it runs with."""

    install: Install
    settings: Settings

    @classmethod
    def of(cls, shape: Mapping, settings: Settings) -> Pair:
        """The pair of ``shape``, notifying on the channel ``settings`` name (or its own)."""
        return cls(Install.of(shape, settings.channel), settings)

    @property
    def mapping(self) -> Mapping:
        """Which of the app's tables the pair serves, and in what names."""
        return self.install.mapping

    @property
    def name(self) -> str:
        """The pair's name: the schema of its reactor objects, unique in a database."""
        return self.install.schema

    @property
    def channel(self) -> str:
        """The channel its job trigger notifies."""
        return self.install.channel

    def fitted(self, shape: Mapping) -> Pair:
        """This pair on ``shape``: its mapping as the catalog typed it (:func:`reactor.db.fit`)."""
        return replace(self, install=Install.of(shape, self.settings.channel))


def from_env(
    environ: Environ[str, str], settings: Settings, flags: frozenset[str] = frozenset()
) -> tuple[Pair, ...]:
    """The pairs ``REACTOR_CONFIG`` names (the reference pair when it is unset or empty),
    each with ``settings`` as its ``[reactor]`` table changes them. ``flags``: the settings a
    command-line flag gave, which no file may set as well."""
    paths = [path.strip() for path in environ.get(CONFIG_VARIABLE, "").split(":")]
    paths = [path for path in paths if path]
    if not paths:
        return (Pair.of(REFERENCE, settings),)
    if len(paths) == 1:
        return (_pair(_read(paths[0]), settings, flags),)
    if settings.channel is not None:
        raise ConfigError(
            "REACTOR_CHANNEL (or --channel) names one channel, and REACTOR_CONFIG names several "
            "pairs; set channel in a file's [reactor] table, or leave each pair its own"
        )
    return several([_read(path) for path in paths], settings, flags)


def several(
    documents: list[tuple[str, dict[str, Any]]],
    settings: Settings,
    flags: frozenset[str] = frozenset(),
) -> tuple[Pair, ...]:
    """The pairs of ``documents`` ((source, parsed TOML) each), served side by side: each
    must name its own ``reactor_schema``, and no two may share a schema or a channel."""
    pairs: list[Pair] = []
    for source, document in documents:
        if "reactor_schema" not in document:
            raise ConfigError(
                f"{source}: with several files in {CONFIG_VARIABLE}, each names its own "
                "reactor_schema (the schema of its pair's queue, and the pair's name)"
            )
        pair = _pair((source, document), settings, flags)
        for other in pairs:
            if pair.name == other.name:
                raise ConfigError(
                    f"{source}: reactor_schema = {pair.name!r} is also "
                    f"{other.mapping.source}'s; each pair needs a schema of its own"
                )
            if pair.channel == other.channel:
                raise ConfigError(
                    f"{source}: channel {pair.channel!r} is also {other.mapping.source}'s; "
                    "each pair's trigger needs a channel of its own"
                )
            if pair.mapping.runs.table == other.mapping.runs.table:
                raise ConfigError(
                    f"{source}: runs.table {pair.mapping.runs_shown} is also "
                    f"{other.mapping.source}'s; each pair writes an artifact table of its own"
                )
        pairs.append(pair)
    return tuple(pairs)


def named(pairs: tuple[Pair, ...], name: str | None) -> Pair:
    """The pair called ``name`` (``--pair``); None: the only one, when there is one."""
    if name is None:
        if len(pairs) == 1:
            return pairs[0]
        raise ConfigError(
            f"{CONFIG_VARIABLE} names several pairs; choose one: --pair {_names(pairs)}"
        )
    for pair in pairs:
        if pair.name == name:
            return pair
    raise ConfigError(f"--pair {name!r}: no such pair; {CONFIG_VARIABLE} names {_names(pairs)}")


def _names(pairs: tuple[Pair, ...]) -> str:
    return " | ".join(pair.name for pair in pairs)


def _read(path: str) -> tuple[str, dict[str, Any]]:
    return path, mapping_file.read(path)


def _pair(read: tuple[str, dict[str, Any]], settings: Settings, flags: frozenset[str]) -> Pair:
    source, document = read
    own = document.get("reactor", {})
    if not isinstance(own, dict):
        raise ConfigError(f"{source}: reactor must be a table, [reactor]")
    for name in sorted(flags & own.keys()):
        raise ConfigError(
            f"{SETTINGS[name].option} is given, and {source} sets [reactor] {name}; "
            "say it in one place"
        )
    return Pair.of(mapping_file.parse(document, source=source), settings.overridden(own, source))
