"""What a row of the settings' table is (:data:`reactor.settings.table.TABLE`): a
:class:`Setting`, the :class:`Flag` that overrides it, and the :class:`Elsewhere` variables
read beside the settings, which the reference page names too."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from reactor.settings.parsers import Parser

# Whose a setting is: the process's, whichever pairs it serves, or each pair's own.
Scope = Literal["process", "pair"]


@dataclass(frozen=True)
class Flag:
    """The command-line option that overrides a setting: ``--`` and its name, ``_`` as ``-``."""

    # The sub-commands that take it.
    commands: tuple[str, ...]
    # What it takes, in its help; None: the setting's unit.
    takes: str | None = None


@dataclass(frozen=True)
class Setting:
    """One setting: where it is read from, how, its default, whose it is and what it means."""

    # Its field in reactor.settings.config's dataclasses.
    name: str
    # Its environment variable; a family's ends in <NAME> (REACTOR_WEBHOOK_SECRET_<HOOK>).
    variable: str
    parse: Parser = dataclasses.field(repr=False)
    # The default as the variable would be written (parsed into the field's); None: unset.
    default: str | None
    scope: Scope
    # One line of meaning, for the reference page; `x` for a literal, no links.
    doc: str
    # What a number counts ("seconds", "jobs"); None: not a number.
    unit: str | None = None
    flag: Flag | None = None
    # What an unset value means, on the page: exactly when the default is None.
    unset: str | None = None
    # Left out of every repr: what may hold a password or a key.
    hidden: bool = False
    # Whether a pair's [reactor] table may set it (a pair's alone); secrets come from the
    # environment only, never from a file kept in the app's repository.
    in_file: bool = True

    def __post_init__(self) -> None:
        if (self.default is None) != (self.unset is not None):
            raise ValueError(f"{self.name}: give `unset` exactly when the default is None")

    @property
    def family(self) -> str | None:
        """The prefix of a family's variables (REACTOR_WEBHOOK_SECRET_); None for a single one."""
        return self.variable.partition("<")[0] if "<" in self.variable else None

    @property
    def option(self) -> str:
        """The flag's option, ``--grace`` (whether the setting has a flag or not)."""
        return "--" + self.name.replace("_", "-")

    @property
    def value(self) -> Any:
        """The default, parsed: the field's value when nothing sets it."""
        if self.default is None:
            return None
        return self.parse(self.variable, self.default)

    def field(self) -> Any:
        """The dataclass field of the setting, its default and repr as the row says."""
        metadata = {"setting": self}
        if self.family is not None:
            # By variable name; a mapping is not hashable, and the values are secrets.
            return dataclasses.field(
                default_factory=dict, repr=False, hash=False, metadata=metadata
            )
        return dataclasses.field(default=self.value, repr=not self.hidden, metadata=metadata)


@dataclass(frozen=True)
class Elsewhere:
    """A variable read beside the settings, by the module that needs it, for the page."""

    variable: str
    unset: str
    doc: str
