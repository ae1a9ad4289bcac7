"""Settings: read once from the environment (flags may override), validated, and immutable.

Two kinds: :class:`ProcessSettings` (the database, the ports, the LISTEN session, the cadence:
the process's, whichever pairs it serves) and :class:`PairSettings` (the grace, the channel,
the hooks: what a pair's ``[reactor]`` table may change). :class:`Settings` is what one pair's
reactor runs with, the two side by side.

Every value is checked here, so the rest of the code can trust it. A bad value raises
:class:`ConfigError` naming the variable, what was wrong and what to set instead. No message
quotes a value that may be secret: a connection string is shown with every libpq secret
parameter masked (:func:`reactor.settings.dsn.redact_dsn`), or not at all when it does not parse.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from reactor.errors import ConfigError
from reactor.settings.dsn import check_dsn, redact_dsn

Mode = Literal["listen", "poll"]

# LISTEN takes an identifier; keep to the plain kind so it never needs quoting games.
_CHANNEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK> (or, for a hook name one pair alone has, _<HOOK>) signs
# that webhook hook with a secret of its own (reactor.hooks.secrets says which), so that no
# receiver holds the key to forge calls to the others. A pair's name and a hook's are 63 at most.
WEBHOOK_SECRET_PREFIX = "REACTOR_WEBHOOK_SECRET_"
_SECRET_SUFFIX = re.compile(r"[A-Z0-9_]{1,127}")


# Beyond this the listener's gathering would be a lateness of its own, not a few milliseconds.
MAX_LISTEN_COALESCE = 0.1


@dataclass(frozen=True)
class PairSettings:
    """What one job/artifact pair runs with: the environment's values, as its own ``[reactor]``
    table changes them (:data:`PAIR_SETTINGS`; reactor.settings.pairs)."""

    grace: float = 120.0
    batch_size: int = 500
    # REACTOR_CHANNEL; None: the mapping's own (<reactor_schema>_jobs_terminal, or
    # analysis_jobs_terminal for the reference pair).
    channel: str | None = None
    hooks: str = field(default="", repr=False)  # webhook URLs may carry credentials
    webhook_secret: str | None = field(default=None, repr=False)
    # REACTOR_WEBHOOK_SECRET_<NAME>, by variable name: a webhook's own secret, which takes
    # precedence over webhook_secret for that hook. In a pair's settings (reactor.settings.pairs),
    # the secret each of its webhooks reads, under REACTOR_WEBHOOK_SECRET_<HOOK> whichever variable
    # gave it, and no other.
    webhook_secrets: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)
    hook_timeout: float = 120.0
    hook_concurrency: int = 4
    # With the backoff below, 40 attempts keep retrying for at least 28 hours: a receiver's
    # deploy, outage or key rotation over a day does not park a hook.
    hook_max_attempts: int = 40
    # First retry delay; each later one doubles up to hook_max_backoff, plus up to 25% jitter.
    hook_backoff: float = 1.0
    hook_max_backoff: float = 3600.0
    # Settled rows (done, superseded, cancelled) are deleted this long after they settled.
    hook_retention: float = 7 * 86400.0
    # How long a claimed hook is ours; None: its timeout plus 30 s to report the outcome.
    hook_lease_seconds: float | None = None

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
        return self.hook_lease_seconds or self.hook_timeout + 30.0


@dataclass(frozen=True)
class ProcessSettings:
    """What the process runs with, whichever pairs it serves: the database, the ports, the
    LISTEN session and the cadence of every pair's duties."""

    database_url: str | None = field(default=None, repr=False)
    listen_database_url: str | None = field(default=None, repr=False)
    scan_interval: float = 30.0
    mode: Mode = "listen"
    drain: float = 20.0
    http_addr: tuple[str, int] | None = ("127.0.0.1", 9187)
    trim_horizon: float = 86400.0
    # A full reconcile pass over the jobs ends at least this often; 0 turns the reconcile off.
    reconcile_interval: float = 600.0
    # How often the listener proves its connection alive, and how long a proof may take.
    probe_interval: float = 5.0
    probe_timeout: float = 5.0
    # How often the queue is polled while notifications cannot be relied on (REACTOR_MODE=poll,
    # a trigger installed not to notify, LISTEN down, the doorbell awake): by one replica
    # alone; each of N live replicas polls N times less often, down to twice a grace.
    poll_interval: float = 0.25
    # After a batch of notifications, how long the listener lets the next ones gather before
    # it reads again: one wake-up per interval under a steady stream rather than one per
    # notification, a few milliseconds of a grace of seconds (docs/how-it-works.md, the figures).
    listen_coalesce: float = 0.005
    # From how many job notifications a second a replica rings the doorbell awake: the app's
    # commits skip their NOTIFY while it polls the queue itself (reactor/insurance/doorbell.py);
    # 0 (or a grace under two poll intervals): every finishing commit notifies.
    doorbell_rate: int = 20
    # The most deadlines held in memory; past it, new ones are left to the fallback scan.
    max_pending: int = 1_000_000
    # What an operator presents to the HTTP page to retry or cancel hooks and release jobs set
    # aside; None: the page is read-only.
    dashboard_token: str | None = field(default=None, repr=False)
    # Where the operator's page listens: apart from the probes, on loopback unless the operator
    # chooses otherwise, since it shows job ids, errors and the topology; None: no page.
    dashboard_addr: tuple[str, int] | None = ("127.0.0.1", 9188)
    # Whether REACTOR_DASHBOARD_ADDR was set: the default address is optional (another replica
    # on the host may hold it), one the operator chose is not.
    dashboard_addr_chosen: bool = False
    # The address operators open the page at through a reverse proxy (see _dashboard_url): its
    # host is accepted in the Host header, and https makes the session cookie Secure, since
    # the proxy ends TLS and the request the reactor sees is plain HTTP.
    dashboard_url: str | None = None

    def check_process(self) -> None:
        """Raise ConfigError for process values that parse but make no sense together."""
        for name in ("database_url", "listen_database_url"):
            value = getattr(self, name)
            if value is not None:
                check_dsn(value, ENVIRONMENT[name])
        if self.probe_timeout > self.probe_interval * 4:
            raise ConfigError(
                "REACTOR_PROBE_TIMEOUT_SECONDS must not exceed 4x REACTOR_PROBE_INTERVAL_SECONDS"
            )
        if self.listen_coalesce > MAX_LISTEN_COALESCE:
            raise ConfigError(
                f"REACTOR_LISTEN_COALESCE_SECONDS must be at most {MAX_LISTEN_COALESCE:g}: every "
                "notified job may wait that long to be read (0 reads each as it arrives)"
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
        return cls(**_values(process, ProcessSettings), **_values(pair, PairSettings))

    @property
    def process(self) -> ProcessSettings:
        """The process's part: what every pair of the process shares."""
        return ProcessSettings(**_values(self, ProcessSettings))

    @property
    def pair(self) -> PairSettings:
        """The pair's own part: what its ``[reactor]`` table may change."""
        return PairSettings(**_values(self, PairSettings))

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str], overrides: Mapping[str, Any] | None = None
    ) -> Settings:
        """Read ``REACTOR_*`` and ``DATABASE_URL``; ``overrides`` (from flags) win when not None."""
        raw: dict[str, Any] = {}
        for f in fields(cls):
            variable = ENVIRONMENT.get(f.name)
            if variable is not None and variable in environ:
                raw[f.name] = _parse(f.name, variable, environ[variable])
        secrets = _webhook_secrets(environ)
        if secrets:
            raw["webhook_secrets"] = secrets
        for name, value in (overrides or {}).items():
            if value is not None:
                raw[name] = _parse(name, "--" + name.replace("_", "-"), str(value))
        raw["dashboard_addr_chosen"] = "dashboard_addr" in raw
        settings = cls(**raw)
        settings.check()
        return settings

    def overridden(self, values: Mapping[str, Any], source: str) -> Settings:
        """These settings with ``values`` (a pair's ``[reactor]`` table, read from ``source``)
        in place of the environment's; only the keys of :data:`PAIR_SETTINGS` may differ."""
        raw: dict[str, Any] = {}
        for name, value in values.items():
            if name not in PAIR_SETTINGS:
                raise ConfigError(
                    f"{source}: unknown key [reactor] {name}; a pair may set "
                    + ", ".join(PAIR_SETTINGS)
                )
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ConfigError(f"{source}: [reactor] {name} must be a string or a number")
            raw[name] = _parse(name, f"{source}: [reactor] {name}", str(value))
        settings = replace(self, **raw)
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ConfigError for values that parse but make no sense together."""
        self.check_process()
        self.check_pair()


def _values(settings: ProcessSettings | PairSettings, part: type[Any]) -> dict[str, Any]:
    # The fields of ``part`` (one of the two kinds), as ``settings`` holds them.
    return {f.name: getattr(settings, f.name) for f in fields(part)}


# The settings a pair's own ``[reactor]`` table may set (reactor.settings.pairs): what is the pair's
# business, its grace, its channel and its hooks; the rest (the database, the ports, the
# cadence) belongs to the process that serves every pair.
PAIR_SETTINGS = (
    "grace",
    "channel",
    "batch_size",
    "hooks",
    "hook_timeout",
    "hook_concurrency",
    "hook_max_attempts",
    "hook_backoff",
    "hook_max_backoff",
    "hook_retention",
    "hook_lease_seconds",
)

ENVIRONMENT: dict[str, str] = {
    "database_url": "DATABASE_URL",
    "listen_database_url": "REACTOR_LISTEN_DATABASE_URL",
    "grace": "REACTOR_GRACE_SECONDS",
    "scan_interval": "REACTOR_SCAN_INTERVAL_SECONDS",
    "batch_size": "REACTOR_BATCH_SIZE",
    "channel": "REACTOR_CHANNEL",
    "mode": "REACTOR_MODE",
    "drain": "REACTOR_DRAIN_SECONDS",
    "http_addr": "REACTOR_HTTP_ADDR",
    "hooks": "REACTOR_HOOKS",
    "webhook_secret": "REACTOR_WEBHOOK_SECRET",
    "hook_timeout": "REACTOR_HOOK_TIMEOUT_SECONDS",
    "hook_concurrency": "REACTOR_HOOK_CONCURRENCY",
    "hook_max_attempts": "REACTOR_HOOK_MAX_ATTEMPTS",
    "hook_backoff": "REACTOR_HOOK_BACKOFF_SECONDS",
    "hook_max_backoff": "REACTOR_HOOK_MAX_BACKOFF_SECONDS",
    "hook_retention": "REACTOR_HOOK_RETENTION_SECONDS",
    "hook_lease_seconds": "REACTOR_HOOK_LEASE_SECONDS",
    "trim_horizon": "REACTOR_TRIM_HORIZON_SECONDS",
    "reconcile_interval": "REACTOR_RECONCILE_INTERVAL_SECONDS",
    "probe_interval": "REACTOR_PROBE_INTERVAL_SECONDS",
    "probe_timeout": "REACTOR_PROBE_TIMEOUT_SECONDS",
    "poll_interval": "REACTOR_POLL_INTERVAL_SECONDS",
    "listen_coalesce": "REACTOR_LISTEN_COALESCE_SECONDS",
    "doorbell_rate": "REACTOR_DOORBELL_RATE",
    "max_pending": "REACTOR_MAX_PENDING",
    "dashboard_token": "REACTOR_DASHBOARD_TOKEN",
    "dashboard_addr": "REACTOR_DASHBOARD_ADDR",
    "dashboard_url": "REACTOR_DASHBOARD_URL",
}


def _webhook_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """Every REACTOR_WEBHOOK_SECRET_<NAME> that is set and not empty (empty: unset, as for
    REACTOR_WEBHOOK_SECRET). Messages name the variable, never its value."""
    found: dict[str, str] = {}
    for variable, value in environ.items():
        if not variable.startswith(WEBHOOK_SECRET_PREFIX) or not value.strip():
            continue
        if not _SECRET_SUFFIX.fullmatch(variable.removeprefix(WEBHOOK_SECRET_PREFIX)):
            raise ConfigError(
                f"{variable}: the part after {WEBHOOK_SECRET_PREFIX} is a hook's name, or a "
                "pair's and a hook's, upper-cased, with - written as _ (hook ops-diag: "
                "REACTOR_WEBHOOK_SECRET_OPS_DIAG; of pair reactor: "
                "REACTOR_WEBHOOK_SECRET_REACTOR_OPS_DIAG)"
            )
        found[variable] = value.strip()
    return found


def _parse(name: str, source: str, text: str) -> Any:
    parser = _PARSERS.get(name, _text)
    return parser(source, text.strip())


def _seconds(minimum: float, *, inclusive: bool = True) -> Any:
    def parse(source: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{source}={text!r} is not a number of seconds") from None
        too_small = value < minimum if inclusive else value <= minimum
        if not math.isfinite(value) or too_small or value > 365 * 86400:
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise ConfigError(f"{source}={text!r} must be a finite number of seconds {bound}")
        return value

    return parse


def _count(minimum: int, maximum: int) -> Any:
    def parse(source: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{source}={text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise ConfigError(f"{source}={text!r} must be between {minimum} and {maximum}")
        return value

    return parse


def _text(source: str, text: str) -> str:
    return text


def _optional(source: str, text: str) -> str | None:
    return text or None


# A token shorter than this is guessable over HTTP; 32 random bytes, hex-encoded, are 64.
MIN_TOKEN = 16


def _token(source: str, text: str) -> str | None:
    # The value is never quoted: it is the secret.
    if not text:
        return None
    if len(text) < MIN_TOKEN or not text.isascii() or not text.isprintable():
        raise ConfigError(
            f"{source} must be at least {MIN_TOKEN} printable ASCII characters; "
            "make one with `openssl rand -hex 32`, or leave it empty for a read-only page"
        )
    return text


def _channel(source: str, text: str) -> str:
    if not _CHANNEL.fullmatch(text):
        raise ConfigError(
            f"{source}={text!r} is not a plain identifier (letters, digits, _; at most 63)"
        )
    return text


def _mode(source: str, text: str) -> str:
    if text not in ("listen", "poll"):
        raise ConfigError(f"{source}={text!r} must be 'listen' or 'poll'")
    return text


def _address(example: str) -> Any:
    def parse(source: str, text: str) -> tuple[str, int] | None:
        if not text:
            return None
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"{source}={text!r} must be HOST:PORT, e.g. {example}, or empty")
        return host.strip("[]") or "0.0.0.0", int(port)

    return parse


def _dashboard_url(source: str, text: str) -> str | None:
    if not text:
        return None
    # A value with user info is not quoted: it may hold a password.
    shown = source if "@" in text else f"{source}={text!r}"
    usage = (
        f"{shown} must be the page's address through your proxy, "
        "https://HOST[:PORT]/ (or http://), with no path, user, query or fragment"
    )
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        raise ConfigError(usage) from None
    # The page's links and redirects are absolute paths (/login, /actions/...): served under a
    # prefix, they would leave it, so a proxy must map the page's root to the reactor's.
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(usage)
    return text


_PARSERS: dict[str, Any] = {
    "database_url": _optional,
    "listen_database_url": _optional,
    "grace": _seconds(0.0),
    "scan_interval": _seconds(0.0, inclusive=False),
    "batch_size": _count(1, 100_000),
    "channel": _channel,
    "mode": _mode,
    "drain": _seconds(0.0),
    "http_addr": _address("127.0.0.1:9187"),
    "webhook_secret": _optional,
    "hook_timeout": _seconds(0.0, inclusive=False),
    "hook_concurrency": _count(1, 1000),
    "hook_max_attempts": _count(1, 1000),
    "hook_backoff": _seconds(0.0),
    "hook_max_backoff": _seconds(0.0),
    "hook_retention": _seconds(0.0, inclusive=False),
    "hook_lease_seconds": _seconds(0.0, inclusive=False),
    "trim_horizon": _seconds(0.0, inclusive=False),
    "reconcile_interval": _seconds(0.0),
    "probe_interval": _seconds(0.0, inclusive=False),
    "probe_timeout": _seconds(0.0, inclusive=False),
    "poll_interval": _seconds(0.01),
    "listen_coalesce": _seconds(0.0),
    "doorbell_rate": _count(0, 1_000_000),
    "max_pending": _count(1, 100_000_000),
    "dashboard_token": _token,
    "dashboard_addr": _address("127.0.0.1:9188"),
    "dashboard_url": _dashboard_url,
}
