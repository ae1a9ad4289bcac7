"""Settings: read once from the environment (flags may override), validated, and immutable.

Two kinds: :class:`ProcessSettings` (the database, the ports, the LISTEN session, the cadence:
the process's, whichever pairs it serves) and :class:`PairSettings` (the grace, the channel,
the hooks: what a pair's ``[reactor]`` table may change). :class:`Settings` is what one pair's
reactor runs with, the two side by side.

Each field is a row of :data:`reactor.settings.table.TABLE`, whose scope says which kind holds
it: the row gives its default, its variable and its parser, and :func:`from_table` puts the
row on the field. A field is declared here only so that the type checker knows its type; a
class that declares other settings than its scope's rows is refused at import.

Every value is checked here, so the rest of the code can trust it. A bad value raises
:class:`ConfigError` naming the variable, what was wrong and what to set instead. No message
quotes a value that may be secret: a connection string is shown with every libpq secret
parameter masked (:func:`reactor.settings.dsn.redact_dsn`), or not at all when it does not parse.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, TypeVar

from reactor.errors import ConfigError
from reactor.settings import environment
from reactor.settings.dsn import check_dsn, redact_dsn
from reactor.settings.setting import Scope
from reactor.settings.table import SETTINGS, scope

Mode = Literal["listen", "poll"]

# Beyond this the listener's gathering would be a lateness of its own, not a few milliseconds.
MAX_LISTEN_COALESCE_S = 0.1

# A claimed hook's lease when none is set: its timeout, and this to report the outcome.
LEASE_MARGIN_S = 30.0

T = TypeVar("T")

# What a setting's field is declared with; from_table puts its row's default in its place.
TABLED: Any = object()


def from_table(kind: Scope) -> Callable[[type[T]], type[T]]:
    """Give each field of the decorated class (apply before @dataclass) its row of the table:
    its default and whether a repr shows it. The class must declare every setting of scope
    ``kind``, in the table's order, each as ``name: type = TABLED``, and no other setting."""

    def put(cls: type[T]) -> type[T]:
        declared = [name for name, value in vars(cls).items() if value is TABLED]
        rows = [row.name for row in scope(kind)]
        if declared != rows:
            raise TypeError(
                f"{cls.__name__} declares {declared}; the table's {kind} settings are {rows}"
            )
        for name in declared:
            setattr(cls, name, SETTINGS[name].field())
        return cls

    return put


@dataclass(frozen=True)
@from_table("pair")
class PairSettings:
    """What one job/artifact pair runs with: the environment's values, as its own ``[reactor]``
    table changes them (reactor.settings.pairs)."""

    grace: float = TABLED
    channel: str | None = TABLED
    batch_size: int = TABLED
    hooks: str = TABLED
    webhook_secret: str | None = TABLED
    webhook_secrets: Mapping[str, str] = TABLED
    hook_timeout: float = TABLED
    hook_concurrency: int = TABLED
    hook_max_attempts: int = TABLED
    hook_backoff: float = TABLED
    hook_max_backoff: float = TABLED
    hook_retention: float = TABLED
    hook_lease_seconds: float | None = TABLED

    def check_pair(self) -> None:
        """Raise ConfigError for pair values that parse but make no sense together."""
        if self.hook_lease < self.hook_timeout:
            raise ConfigError(
                "REACTOR_HOOK_LEASE_SECONDS must be at least REACTOR_HOOK_TIMEOUT_SECONDS, or "
                "a second replica would start a hook that is still running"
            )

    @property
    def hook_lease(self) -> float:
        """How long a claimed hook is ours before another replica may take it over."""
        return self.hook_lease_seconds or self.hook_timeout + LEASE_MARGIN_S


@dataclass(frozen=True)
@from_table("process")
class ProcessSettings:
    """What the process runs with, whichever pairs it serves: the database, the ports, the
    LISTEN session and the cadence of every pair's duties."""

    database_url: str | None = TABLED
    listen_database_url: str | None = TABLED
    scan_interval: float = TABLED
    mode: Mode = TABLED
    drain: float = TABLED
    http_addr: tuple[str, int] | None = TABLED
    trim_horizon: float = TABLED
    reconcile_interval: float = TABLED
    probe_interval: float = TABLED
    probe_timeout: float = TABLED
    poll_interval: float = TABLED
    listen_coalesce: float = TABLED
    doorbell_rate: int = TABLED
    max_pending: int = TABLED
    dashboard_token: str | None = TABLED
    dashboard_addr: tuple[str, int] | None = TABLED
    dashboard_url: str | None = TABLED
    # Whether REACTOR_DASHBOARD_ADDR was set (no setting of its own): the default address is
    # optional (another replica on the host may hold it), one the operator chose is not.
    dashboard_addr_chosen: bool = False

    def check_process(self) -> None:
        """Raise ConfigError for process values that parse but make no sense together."""
        for name in ("database_url", "listen_database_url"):
            value = getattr(self, name)
            if value is not None:
                check_dsn(value, SETTINGS[name].variable)
        if self.probe_timeout > self.probe_interval * 4:
            raise ConfigError(
                "REACTOR_PROBE_TIMEOUT_SECONDS must not exceed 4x REACTOR_PROBE_INTERVAL_SECONDS"
            )
        if self.listen_coalesce > MAX_LISTEN_COALESCE_S:
            raise ConfigError(
                f"REACTOR_LISTEN_COALESCE_SECONDS must be at most {MAX_LISTEN_COALESCE_S:g}: "
                "every notified job may wait that long to be read (0 reads each as it arrives)"
            )
        if self.dashboard_url is not None and self.dashboard_addr is None:
            raise ConfigError(
                "REACTOR_DASHBOARD_URL is set but REACTOR_DASHBOARD_ADDR is empty, which turns "
                "the page off; give the page an address, or unset REACTOR_DASHBOARD_URL"
            )

    def require_database(self) -> str:
        """The DSN, or a ConfigError saying how to give one."""
        if not self.database_url:
            raise ConfigError(
                "DATABASE_URL is not set; export DATABASE_URL=postgresql://user@host/dbname"
            )
        return self.database_url

    @property
    def dashboard_host(self) -> str | None:
        """The host name of REACTOR_DASHBOARD_URL, lower-cased (None when it is unset)."""
        if self.dashboard_url is None:
            return None
        return urllib.parse.urlsplit(self.dashboard_url).hostname

    @property
    def dashboard_https(self) -> bool:
        """True when operators reach the page over HTTPS (REACTOR_DASHBOARD_URL says so)."""
        return self.dashboard_url is not None and self.dashboard_url.startswith("https://")

    @property
    def safe_database_url(self) -> str:
        """The DSN with every secret masked, for logs and messages."""
        return redact_dsn(self.database_url or "")


@dataclass(frozen=True)
class Settings(PairSettings, ProcessSettings):
    """What a pair's reactor runs with: the process's settings and the pair's own, side by
    side (:attr:`process`, :attr:`pair`). Build it with :meth:`from_env`."""

    @classmethod
    def of(cls, process: ProcessSettings, pair: PairSettings) -> Settings:
        """``pair``'s settings in the process of ``process``'s."""
        return cls(**_part(process, ProcessSettings), **_part(pair, PairSettings))

    @property
    def process(self) -> ProcessSettings:
        """The process's part: what every pair of the process shares."""
        return ProcessSettings(**_part(self, ProcessSettings))

    @property
    def pair(self) -> PairSettings:
        """The pair's own part: what its ``[reactor]`` table may change."""
        return PairSettings(**_part(self, PairSettings))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], overrides: Mapping[str, Any] | None = None
    ) -> Settings:
        """Read ``REACTOR_*`` and ``DATABASE_URL``; ``overrides`` (from flags) win when not None."""
        raw = environment.from_environment(environ, overrides)
        raw["dashboard_addr_chosen"] = "dashboard_addr" in raw
        settings = cls(**raw)
        settings.check()
        return settings

    def overridden(self, values: Mapping[str, Any], source: str) -> Settings:
        """These settings with ``values`` (a pair's ``[reactor]`` table, read from ``source``)
        in place of the environment's; only the settings a file may set may differ."""
        settings = replace(self, **environment.from_file(values, source))
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ConfigError for values that parse but make no sense together."""
        self.check_process()
        self.check_pair()


def _part(settings: ProcessSettings | PairSettings, kind: type[Any]) -> dict[str, Any]:
    # The fields of ``kind`` (one of the two), as ``settings`` holds them.
    return {f.name: getattr(settings, f.name) for f in fields(kind)}
