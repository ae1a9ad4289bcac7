"""Every setting, once: the one table the settings' dataclasses, the environment's reader, the
command line's flags and the settings reference page are all made from.

A row (:class:`Setting`) says a setting's name (its field in :mod:`.config`), its variable, how
its text is parsed (:mod:`.parsers`), its default as the variable would be written, its scope,
its unit, the flag that overrides it (if any) and its line on the reference page. The scope
says whose it is: the process's (the database, the ports, the LISTEN session, the cadence),
whichever pairs it serves, or a pair's (the grace, the channel, the hooks), which that pair's
``[reactor]`` table may change unless it is a secret, which only the environment gives.

:data:`ELSEWHERE` names the few variables read beside the settings (the mapping files, the log
level and format), for the same page.
"""

from __future__ import annotations

from reactor.install.mapping import CONFIG_VARIABLE
from reactor.settings.parsers import (
    MIN_TOKEN_CHARS,
    address,
    channel,
    count,
    mode,
    optional,
    page_url,
    seconds,
    text,
    token,
)
from reactor.settings.setting import Elsewhere, Flag, Scope, Setting

# REACTOR_WEBHOOK_SECRET_<NAME> is a family: each variable of it is one webhook's own secret
# (reactor.hooks.secrets says which hook reads which).
WEBHOOK_SECRET_PREFIX = "REACTOR_WEBHOOK_SECRET_"

# The addresses the HTTP servers listen on unless told otherwise: loopback, so that nothing is
# exposed by default.
HTTP_ADDR = "127.0.0.1:9187"
DASHBOARD_ADDR = "127.0.0.1:9188"


TABLE: tuple[Setting, ...] = (
    Setting(
        "database_url",
        "DATABASE_URL",
        optional,
        None,
        "process",
        "libpq connection string or URL; every command needs it except `demo`, and `migrate "
        "--print` or `--print-grants` on the reference mapping (with `REACTOR_CONFIG` they "
        "take the columns' types from it)",
        unset="required",
        hidden=True,
    ),
    Setting(
        "listen_database_url",
        "REACTOR_LISTEN_DATABASE_URL",
        optional,
        None,
        "process",
        "a direct connection for LISTEN when everything else goes through a pooler",
        unset="`DATABASE_URL`",
        hidden=True,
    ),
    Setting(
        "grace",
        "REACTOR_GRACE_SECONDS",
        seconds(0.0),
        "120",
        "pair",
        "how long a tab has to save a run before the reactor does",
        unit="seconds",
        flag=Flag(("run", "sweep")),
    ),
    Setting(
        "scan_interval",
        "REACTOR_SCAN_INTERVAL_SECONDS",
        seconds(0.0, inclusive=False),
        "30",
        "process",
        "period of the fallback scan",
        unit="seconds",
        flag=Flag(("run",)),
    ),
    Setting(
        "channel",
        "REACTOR_CHANNEL",
        channel,
        None,
        "pair",
        "the NOTIFY channel (a plain identifier); `reactor migrate` points the trigger at it; "
        "unset, each mapping's is `<reactor_schema>_jobs_terminal` (`reactor_jobs_terminal` "
        "by default), the reference tables' `analysis_jobs_terminal`",
        # Unset: the mapping's own (reactor.install.Install.of).
        unset="the mapping's",
        flag=Flag(("run", "migrate"), "NOTIFY channel"),
    ),
    Setting(
        "batch_size",
        "REACTOR_BATCH_SIZE",
        count(1, 100_000),
        "500",
        "pair",
        "jobs per claim statement",
        unit="jobs",
        flag=Flag(("run", "sweep"), "rows per claim"),
    ),
    Setting(
        "mode",
        "REACTOR_MODE",
        mode,
        "listen",
        "process",
        "`listen`, or `poll` (no LISTEN: timers come from polling the queue)",
        flag=Flag(("run",), "listen or poll"),
    ),
    Setting(
        "drain",
        "REACTOR_DRAIN_SECONDS",
        seconds(0.0),
        "20",
        "process",
        "how long SIGTERM waits for in-flight work",
        unit="seconds",
        flag=Flag(("run",)),
    ),
    Setting(
        "http_addr",
        "REACTOR_HTTP_ADDR",
        address(HTTP_ADDR),
        HTTP_ADDR,
        "process",
        "health and metrics (`/healthz`, `/readyz`, `/metrics`); empty disables; a port that is "
        "taken stops startup with exit 2",
        flag=Flag(("run",), "HOST:PORT or empty"),
    ),
    Setting(
        "hooks",
        "REACTOR_HOOKS",
        text,
        "",
        "pair",
        "follow-up hooks, `name=spec,...`",
        # Webhook URLs may carry credentials.
        hidden=True,
    ),
    Setting(
        "webhook_secret",
        WEBHOOK_SECRET_PREFIX.removesuffix("_"),
        optional,
        None,
        "pair",
        "HMAC key for webhooks without one of their own; with several pairs, only while one "
        "pair alone has webhooks",
        unset="none",
        hidden=True,
        in_file=False,
    ),
    Setting(
        # By variable name: a webhook's own secret, which takes precedence over webhook_secret
        # for that hook. In a pair's settings, the secret each of its webhooks reads, under
        # REACTOR_WEBHOOK_SECRET_<HOOK> whichever variable gave it, and no other
        # (reactor.hooks.secrets).
        "webhook_secrets",
        WEBHOOK_SECRET_PREFIX + "<HOOK>",
        text,
        None,
        "pair",
        "HMAC key of webhook hook HOOK alone (its name upper-cased, `-` as `_`: `ops-diag` "
        "reads `REACTOR_WEBHOOK_SECRET_OPS_DIAG`), after its pair's own "
        "`REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK>` (the reference pair's `reactor`: "
        "`REACTOR_WEBHOOK_SECRET_REACTOR_OPS_DIAG`); with several pairs, only for a name one pair "
        "alone gives a webhook (hooks.md, Verifying webhook signatures); empty counts as "
        "unset; one that no webhook reads stops startup",
        unset="`REACTOR_WEBHOOK_SECRET`",
        hidden=True,
        in_file=False,
    ),
    Setting(
        "hook_timeout",
        "REACTOR_HOOK_TIMEOUT_SECONDS",
        seconds(0.0, inclusive=False),
        "120",
        "pair",
        "one attempt's time limit",
        unit="seconds",
    ),
    Setting(
        "hook_concurrency",
        "REACTOR_HOOK_CONCURRENCY",
        count(1, 1000),
        "4",
        "pair",
        "hooks running at once per replica (threads for plain `def` hooks)",
        unit="hooks",
    ),
    Setting(
        # With the backoff below, 40 attempts keep retrying for at least 28 hours: a
        # receiver's deploy, outage or key rotation over a day does not park a hook.
        "hook_max_attempts",
        "REACTOR_HOOK_MAX_ATTEMPTS",
        count(1, 1000),
        "40",
        "pair",
        "attempts before a row is parked as failed",
        unit="attempts",
    ),
    Setting(
        # Each later retry doubles the delay, up to hook_max_backoff, plus up to 25% jitter.
        "hook_backoff",
        "REACTOR_HOOK_BACKOFF_SECONDS",
        seconds(0.0),
        "1",
        "pair",
        "first retry delay; doubles each time",
        unit="seconds",
    ),
    Setting(
        "hook_max_backoff",
        "REACTOR_HOOK_MAX_BACKOFF_SECONDS",
        seconds(0.0),
        "3600",
        "pair",
        "the longest retry delay, before jitter",
        unit="seconds",
    ),
    Setting(
        # Seven days after they settled.
        "hook_retention",
        "REACTOR_HOOK_RETENTION_SECONDS",
        seconds(0.0, inclusive=False),
        "604800",
        "pair",
        "how long settled rows (`done`, `superseded`, `cancelled`) are kept",
        unit="seconds",
    ),
    Setting(
        "hook_lease_seconds",
        "REACTOR_HOOK_LEASE_SECONDS",
        seconds(0.0, inclusive=False),
        None,
        "pair",
        "how long a claimed hook stays with its replica; at least the timeout",
        unit="seconds",
        # reactor.settings.config.PairSettings.hook_lease
        unset="timeout + 30",
    ),
    Setting(
        "trim_horizon",
        "REACTOR_TRIM_HORIZON_SECONDS",
        seconds(0.0, inclusive=False),
        "86400",
        "process",
        "how long after a job's last update the app trims its document (a `not_null` column "
        "of the mapping); drives the at-risk alarm",
        unit="seconds",
    ),
    Setting(
        "reconcile_interval",
        "REACTOR_RECONCILE_INTERVAL_SECONDS",
        seconds(0.0),
        "600",
        "process",
        "a full reconcile pass over the jobs that can still need a run ends at least this "
        "often; `0` turns it off",
        unit="seconds",
    ),
    Setting(
        "probe_interval",
        "REACTOR_PROBE_INTERVAL_SECONDS",
        seconds(0.0, inclusive=False),
        "5",
        "process",
        "how often a replica runs its health check: its heartbeat, and the proof of its LISTEN "
        "connection",
        unit="seconds",
    ),
    Setting(
        "probe_timeout",
        "REACTOR_PROBE_TIMEOUT_SECONDS",
        seconds(0.0, inclusive=False),
        "5",
        "process",
        "how long a check may take before the LISTEN connection is replaced; at most 4x the "
        "probe interval",
        unit="seconds",
    ),
    Setting(
        # By one replica alone; each of N live replicas polls N times less often, down to
        # twice a grace.
        "poll_interval",
        "REACTOR_POLL_INTERVAL_SECONDS",
        seconds(0.01),
        "0.25",
        "process",
        "how often the queue is polled when no notification can be relied on (`poll` mode, a "
        "trigger installed with `--no-notify`, LISTEN down, the doorbell awake), by one "
        "replica alone; each of N live replicas polls N times less often, at most every half "
        "grace",
        unit="seconds",
    ),
    Setting(
        # One wake-up per interval under a steady stream rather than one per notification, a
        # few milliseconds of a grace of seconds (docs/how-it-works.md, the figures).
        "listen_coalesce",
        "REACTOR_LISTEN_COALESCE_SECONDS",
        seconds(0.0),
        "0.005",
        "process",
        "after a batch of notifications, how long the listener lets the next gather before it "
        "reads again (one wake-up per interval under a stream); at most 0.1, `0` reads each "
        "as it arrives",
        unit="seconds",
    ),
    Setting(
        # The app's commits skip their NOTIFY while a replica polls the queue itself
        # (reactor/insurance/doorbell.py).
        "doorbell_rate",
        "REACTOR_DOORBELL_RATE",
        count(0, 1_000_000),
        "20",
        "process",
        "job notifications a second from which a replica rings the doorbell: the app's "
        "finishing commits skip their NOTIFY while the replicas poll the queue instead "
        "(how-it-works.md, The doorbell); `0`, or a grace under two poll intervals: every "
        "finishing commit notifies",
        unit="notifications a second",
    ),
    Setting(
        "max_pending",
        "REACTOR_MAX_PENDING",
        count(1, 100_000_000),
        "1000000",
        "process",
        "most timers held in memory (about 130 bytes each); beyond it the scan takes over",
        unit="timers",
    ),
    Setting(
        "dashboard_token",
        "REACTOR_DASHBOARD_TOKEN",
        token,
        None,
        "process",
        f"enables the operator's page's actions; at least {MIN_TOKEN_CHARS} printable ASCII "
        "characters (`openssl rand -hex 32`); unset or empty, the page is read-only",
        unset="none",
        hidden=True,
    ),
    Setting(
        # Apart from the probes, on loopback unless the operator chooses otherwise, since it
        # shows job ids, errors and the topology.
        "dashboard_addr",
        "REACTOR_DASHBOARD_ADDR",
        address(DASHBOARD_ADDR),
        DASHBOARD_ADDR,
        "process",
        "the operator's page (`/`, `/api/status`, `/login`, the actions), apart from the "
        "probes; keep it on loopback unless a proxy in front of it authenticates; empty "
        "disables; unset, the page is optional: when the default address is taken (another "
        "replica on the host), the replica logs one warning and runs without it; set, even to "
        "the default, a port that is taken stops startup with exit 2",
    ),
    Setting(
        # Its host is accepted in the Host header, and https makes the session cookie Secure,
        # since the proxy ends TLS and the request the reactor sees is plain HTTP.
        "dashboard_url",
        "REACTOR_DASHBOARD_URL",
        page_url,
        None,
        "process",
        "the address operators open the page at through a reverse proxy, `https://HOST[:PORT]/` "
        "with no path: the page then also answers to that Host, and `https` makes its session "
        "cookie Secure",
        unset="none",
    ),
)


ELSEWHERE: tuple[Elsewhere, ...] = (
    Elsewhere(
        CONFIG_VARIABLE,
        "none: the reference tables",
        "the TOML file that maps the reactor onto your own tables, or several separated by `:`, "
        "one job/artifact pair each, all served by one process (mapping.md, Many pairs); every "
        "command reads it",
    ),
    Elsewhere("REACTOR_LOG_LEVEL", "`INFO`", "`debug`, `info`, `warning`, `error` or `critical`"),
    Elsewhere("REACTOR_LOG_FORMAT", "console on a terminal, else `json`", "`json` or `console`"),
)

SETTINGS: dict[str, Setting] = {setting.name: setting for setting in TABLE}

# What a pair's own [reactor] table may set (reactor.settings.pairs): the pair's settings but
# its secrets.
IN_FILE = tuple(s.name for s in TABLE if s.scope == "pair" and s.in_file)

# The settings a command-line flag overrides.
FLAGGED = tuple(s for s in TABLE if s.flag is not None)


def scope(name: Scope) -> tuple[Setting, ...]:
    """The settings whose scope is ``name``, in the table's order."""
    return tuple(s for s in TABLE if s.scope == name)
