"""One job/artifact pair as installed: the mapping the catalog typed, and what is rendered from it.

The settings say how the reactor runs; the mapping says which of the app's tables it serves and
in what names. A command resolves the two once at its start (:func:`reactor.db.fit` checks the
mapping against the catalog and types its columns) into an :class:`Install`, and every room
that sends SQL, reads a notification or names the app's tables takes it as a parameter: the
statements rendered once for it, the NOTIFY channel, the id type. Nothing of it is module state,
so two installs live side by side in one process, each with its own tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reactor.install import sql
from reactor.install.mapping import REFERENCE, Mapping


@dataclass(frozen=True)
class Install:
    """The reactor's objects for one mapping: its statements, its channel, its tables."""

    mapping: Mapping
    channel: str
    # The named statements of each file of triggers/, rendered on first use.
    _statements: dict[str, dict[str, str]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def of(cls, mapping: Mapping = REFERENCE, channel: str | None = None) -> Install:
        """The install of ``mapping``, notifying on ``channel`` (None: the mapping's own)."""
        return cls(mapping, channel or mapping.default_channel)

    @property
    def schema(self) -> str:
        """The schema of the reactor's own objects."""
        return self.mapping.reactor_schema

    @property
    def id_type(self) -> str:
        """The type of the job ids: uuid, bigint or text."""
        return self.mapping.jobs.id_type

    def query(self, name: str, filename: str = "queries.sql") -> str:
        """The named statement of ``triggers/<filename>``, ready for the driver."""
        rendered = self._statements.get(filename)
        if rendered is None:
            rendered = self._statements[filename] = sql.queries(filename, self.mapping)
        return rendered[name]

    def render(self, text: str, *, channel: str | None = None, spread: bool = False) -> str:
        """``text`` (a migration, a trigger) rendered for this install, as SQL that runs as it
        is; ``@channel@`` is ``channel`` when given ('' for a trigger that does not notify),
        else this install's channel; ``@spread@`` says whether the job trigger notifies each
        share of the jobs on a channel of its own (reactor/core/ownership.py)."""
        return sql.render(
            text, self.mapping, channel=self.channel if channel is None else channel, spread=spread
        )


# The reference tables' install, as `reactor migrate` leaves it: analysis_jobs and analysis_runs
# in public, the channel analysis_jobs_terminal.
REFERENCE_INSTALL = Install.of(REFERENCE.in_public())
