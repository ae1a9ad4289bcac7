"""reactor.settings.config: Settings.from_env parses, validates and never shows a password; the
settings' table is the one place each setting is declared."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reactor.errors import ConfigError
from reactor.hooks.secrets import secret_for, webhook_secret_variable
from reactor.settings.config import PairSettings, ProcessSettings, Settings
from reactor.settings.dsn import UNPARSABLE_DSN, check_dsn, redact_dsn
from reactor.settings.table import IN_FILE, TABLE
from reactor.telemetry import redact

PASSWORD = "s3cr3t-Pa55"

# Each single variable's setting, by name (REACTOR_WEBHOOK_SECRET_<NAME> is a family).
ENVIRONMENT = {s.name: s.variable for s in TABLE if s.family is None}


def load(**environ: str) -> Settings:
    return Settings.from_env(environ)


def rejects(variable: str, value: str) -> ConfigError:
    """Assert that ``variable=value`` is refused with a message naming the variable."""
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({variable: value})
    message = str(caught.value)
    assert variable in message
    assert "\n" not in message
    assert caught.value.exit_code == 2
    return caught.value


# -- defaults and parsing ------------------------------------------------------------------------


def test_defaults_match_the_design() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert s.database_url is None
    assert s.listen_database_url is None
    assert s.grace == 120.0
    assert s.scan_interval == 30.0
    assert s.batch_size == 500
    assert s.channel is None  # the mapping's own: Install.of
    assert s.mode == "listen"
    assert s.drain == 20.0
    assert s.http_addr == ("127.0.0.1", 9187)
    assert s.hooks == ""
    assert s.trim_horizon == 86400.0
    assert s.hook_retention == 7 * 86400.0
    assert s.hook_max_backoff == 3600.0


def test_every_field_has_an_environment_variable() -> None:
    # webhook_secrets is a family of variables, REACTOR_WEBHOOK_SECRET_<NAME>;
    # dashboard_addr_chosen says whether REACTOR_DASHBOARD_ADDR was set.
    assert {f.name for f in fields(Settings)} == {*ENVIRONMENT, "webhook_secrets"} | {
        "dashboard_addr_chosen"
    }
    for variable in ENVIRONMENT.values():
        assert variable == "DATABASE_URL" or variable.startswith("REACTOR_")


def test_every_setting_is_the_processs_or_a_pairs() -> None:
    process = {f.name for f in fields(ProcessSettings)}
    pair = {f.name for f in fields(PairSettings)}
    assert not process & pair
    assert process | pair == {f.name for f in fields(Settings)}
    # What a [reactor] table may set is the pair's own; the secrets come from the environment.
    assert set(IN_FILE) == pair - {"webhook_secret", "webhook_secrets"}


def test_a_pairs_settings_are_made_of_the_two_parts() -> None:
    s = Settings.from_env(
        {"DATABASE_URL": "postgresql://app@db/app", "REACTOR_GRACE_SECONDS": "7"}
    ).overridden({"grace": 3, "channel": "mine"}, "pairs.toml")
    assert s.process == Settings.from_env({"DATABASE_URL": "postgresql://app@db/app"}).process
    assert (s.pair.grace, s.pair.channel) == (3.0, "mine")
    assert Settings.of(s.process, s.pair) == s


def test_unrelated_environment_is_ignored() -> None:
    assert Settings.from_env({"PATH": "/bin", "REACTOR": "x", "GRACE": "-1"}) == Settings()


def test_every_variable_parses() -> None:
    s = Settings.from_env(
        {
            "DATABASE_URL": f"postgresql://app:{PASSWORD}@db.internal:5432/app",
            "REACTOR_LISTEN_DATABASE_URL": "host=direct.internal dbname=app user=app",
            "REACTOR_GRACE_SECONDS": "2.5",
            "REACTOR_SCAN_INTERVAL_SECONDS": " 10 ",
            "REACTOR_BATCH_SIZE": "50",
            "REACTOR_CHANNEL": "jobs_done_v2",
            "REACTOR_MODE": "poll",
            "REACTOR_DRAIN_SECONDS": "0",
            "REACTOR_HTTP_ADDR": "0.0.0.0:8080",
            "REACTOR_HOOKS": "audit=notify:audit_channel",
            "REACTOR_WEBHOOK_SECRET": PASSWORD,
            "REACTOR_HOOK_TIMEOUT_SECONDS": "30",
            "REACTOR_HOOK_CONCURRENCY": "2",
            "REACTOR_HOOK_MAX_ATTEMPTS": "3",
            "REACTOR_HOOK_BACKOFF_SECONDS": "0.5",
            "REACTOR_HOOK_MAX_BACKOFF_SECONDS": "60",
            "REACTOR_HOOK_RETENTION_SECONDS": "86400",
            "REACTOR_HOOK_LEASE_SECONDS": "45",
            "REACTOR_TRIM_HORIZON_SECONDS": "3600",
            "REACTOR_PROBE_INTERVAL_SECONDS": "2",
            "REACTOR_PROBE_TIMEOUT_SECONDS": "8",
            "REACTOR_MAX_PENDING": "1000",
        }
    )
    assert s.database_url == f"postgresql://app:{PASSWORD}@db.internal:5432/app"
    assert s.listen_database_url == "host=direct.internal dbname=app user=app"
    assert s.grace == 2.5
    assert s.scan_interval == 10.0
    assert s.batch_size == 50
    assert s.channel == "jobs_done_v2"
    assert s.mode == "poll"
    assert s.drain == 0.0
    assert s.http_addr == ("0.0.0.0", 8080)
    assert s.hooks == "audit=notify:audit_channel"
    assert s.webhook_secret == PASSWORD
    assert s.hook_timeout == 30.0
    assert s.hook_concurrency == 2
    assert s.hook_max_attempts == 3
    assert s.hook_backoff == 0.5
    assert s.hook_max_backoff == 60.0
    assert s.hook_retention == 86400.0
    assert s.hook_lease == 45.0
    assert s.trim_horizon == 3600.0
    assert s.probe_interval == 2.0
    assert s.probe_timeout == 8.0
    assert s.max_pending == 1000
    assert isinstance(s.grace, float)
    assert isinstance(s.batch_size, int)


def test_settings_are_immutable() -> None:
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.grace = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("REACTOR_GRACE_SECONDS", "0"),  # record as soon as terminal: allowed
        ("REACTOR_DRAIN_SECONDS", "0"),
        ("REACTOR_GRACE_SECONDS", "31536000"),  # exactly a year
        ("REACTOR_GRACE_SECONDS", "1e-3"),
        ("REACTOR_SCAN_INTERVAL_SECONDS", "0.001"),
        ("REACTOR_BATCH_SIZE", "1"),
        ("REACTOR_BATCH_SIZE", "100000"),
        ("REACTOR_CHANNEL", "_"),
        ("REACTOR_CHANNEL", "c" * 63),
        ("REACTOR_MODE", "listen"),
    ],
)
def test_boundary_values_are_accepted(variable: str, value: str) -> None:
    settings = Settings.from_env({variable: value})
    field = next(name for name, env in ENVIRONMENT.items() if env == variable)
    # Taken as given: a value the parser rounded or clamped would be a different setting.
    parsed = getattr(settings, field)
    assert str(parsed) == value or float(parsed) == float(value)


@pytest.mark.parametrize(
    "text",
    ["", "127.0.0.1:9187", "localhost:0", "[::1]:9187", ":9187", "0.0.0.0:65535"],
)
def test_http_addr_forms(text: str) -> None:
    addr = load(REACTOR_HTTP_ADDR=text).http_addr
    if not text:
        assert addr is None
        return
    assert addr is not None
    host, port = addr
    assert host
    assert "[" not in host
    assert 0 <= port <= 65535
    assert str(port) == text.rpartition(":")[2]


def test_empty_http_addr_disables_http() -> None:
    assert load(REACTOR_HTTP_ADDR="").http_addr is None
    assert load(REACTOR_HTTP_ADDR="   ").http_addr is None


def test_ipv6_http_addr_is_unbracketed() -> None:
    assert load(REACTOR_HTTP_ADDR="[::1]:9187").http_addr == ("::1", 9187)


def test_blank_database_url_counts_as_unset() -> None:
    s = load(DATABASE_URL="  ")
    assert s.database_url is None
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        s.require_database()


def test_require_database_returns_the_dsn() -> None:
    assert load(DATABASE_URL="host=h dbname=d").require_database() == "host=h dbname=d"


# -- bad values ----------------------------------------------------------------------------------

SECONDS = [
    "REACTOR_GRACE_SECONDS",
    "REACTOR_SCAN_INTERVAL_SECONDS",
    "REACTOR_DRAIN_SECONDS",
    "REACTOR_HOOK_TIMEOUT_SECONDS",
    "REACTOR_HOOK_BACKOFF_SECONDS",
    "REACTOR_HOOK_MAX_BACKOFF_SECONDS",
    "REACTOR_HOOK_RETENTION_SECONDS",
    "REACTOR_HOOK_LEASE_SECONDS",
    "REACTOR_TRIM_HORIZON_SECONDS",
    "REACTOR_PROBE_INTERVAL_SECONDS",
    "REACTOR_PROBE_TIMEOUT_SECONDS",
    "REACTOR_LISTEN_COALESCE_SECONDS",
]
SECONDS_ZERO_NOT_ALLOWED = [
    "REACTOR_SCAN_INTERVAL_SECONDS",
    "REACTOR_HOOK_RETENTION_SECONDS",
    "REACTOR_HOOK_TIMEOUT_SECONDS",
    "REACTOR_HOOK_LEASE_SECONDS",
    "REACTOR_TRIM_HORIZON_SECONDS",
    "REACTOR_PROBE_INTERVAL_SECONDS",
    "REACTOR_PROBE_TIMEOUT_SECONDS",
]


@pytest.mark.parametrize("variable", SECONDS)
@pytest.mark.parametrize(
    "value",
    [
        "-1",
        "-0.001",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "Infinity",
        "1e400",  # overflows to inf
        "31536001",  # a year and a second
        "1e12",
        "abc",
        "",
        "5s",
        "2m",
        "1,5",
        "0x10",
    ],
)
def test_bad_seconds_are_rejected(variable: str, value: str) -> None:
    rejects(variable, value)


@pytest.mark.parametrize("variable", SECONDS_ZERO_NOT_ALLOWED)
@pytest.mark.parametrize("value", ["0", "0.0", "-0"])
def test_zero_seconds_are_rejected_where_meaningless(variable: str, value: str) -> None:
    rejects(variable, value)


@pytest.mark.parametrize(
    "variable",
    [
        "REACTOR_BATCH_SIZE",
        "REACTOR_MAX_PENDING",
        "REACTOR_HOOK_CONCURRENCY",
        "REACTOR_HOOK_MAX_ATTEMPTS",
    ],
)
@pytest.mark.parametrize("value", ["0", "-1", str(10**9), "abc", "", "1.5", "1e3", "nan"])
def test_bad_counts_are_rejected(variable: str, value: str) -> None:
    rejects(variable, value)


@pytest.mark.parametrize(
    "value",
    [
        "analysis jobs",  # a space
        "analysis'jobs",  # a quote
        'analysis"jobs',
        "jobs;drop",
        "c" * 64,  # one more than PostgreSQL's 63-byte identifiers
        "1jobs",
        "jobs-done",
        "",
        "jöbs",
        "jobs\nmore",
    ],
)
def test_bad_channels_are_rejected(value: str) -> None:
    rejects("REACTOR_CHANNEL", value)


@pytest.mark.parametrize("value", ["push", "", "LISTEN", "listen,poll", "pol"])
def test_bad_modes_are_rejected(value: str) -> None:
    rejects("REACTOR_MODE", value)


@pytest.mark.parametrize(
    "value",
    ["nohost", "1.2.3.4:99999", "1.2.3.4:65536", "host:", "host:-1", "host:http", "host:80x"],
)
def test_bad_http_addrs_are_rejected(value: str) -> None:
    rejects("REACTOR_HTTP_ADDR", value)


def test_the_page_has_an_address_of_its_own() -> None:
    assert Settings().dashboard_addr == ("127.0.0.1", 9188)
    assert load(REACTOR_DASHBOARD_ADDR="").dashboard_addr is None
    assert load(REACTOR_DASHBOARD_ADDR="[::1]:9300").dashboard_addr == ("::1", 9300)
    # Probes to every interface leave the page where it was.
    s = load(REACTOR_HTTP_ADDR="0.0.0.0:9187")
    assert (s.http_addr, s.dashboard_addr) == (("0.0.0.0", 9187), ("127.0.0.1", 9188))


@pytest.mark.parametrize("value", ["nohost", "host:", "host:99999", "host:http"])
def test_bad_dashboard_addrs_are_rejected(value: str) -> None:
    assert "127.0.0.1:9188" in str(rejects("REACTOR_DASHBOARD_ADDR", value))


@pytest.mark.parametrize(
    ("url", "host", "https"),
    [
        ("https://reactor.internal.example/", "reactor.internal.example", True),
        ("https://Reactor.Internal.Example:8443", "reactor.internal.example", True),
        ("http://10.0.0.5:9188/", "10.0.0.5", False),
        ("https://[fd00::5]/", "fd00::5", True),
    ],
)
def test_the_dashboard_url(url: str, host: str, https: bool) -> None:
    s = load(REACTOR_DASHBOARD_URL=url)
    assert (s.dashboard_url, s.dashboard_host, s.dashboard_https) == (url, host, https)


def test_no_dashboard_url_by_default() -> None:
    s = load(REACTOR_DASHBOARD_URL="")
    assert (s.dashboard_url, s.dashboard_host, s.dashboard_https) == (None, None, False)


@pytest.mark.parametrize(
    "value",
    [
        "reactor.internal.example",
        "ftp://reactor.internal.example/",
        "https://",
        "https://reactor.internal.example/reactor/",
        "https://reactor.internal.example/?x=1",
        "https://reactor.internal.example/#top",
        "https://user:pw@reactor.internal.example/",
        "https://reactor.internal.example:port/",
        "https://[::1/",
    ],
)
def test_bad_dashboard_urls_are_rejected(value: str) -> None:
    assert "pw" not in str(rejects("REACTOR_DASHBOARD_URL", value))


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param(
            {"REACTOR_DASHBOARD_URL": "https://r.example/", "REACTOR_DASHBOARD_ADDR": ""},
            ("REACTOR_DASHBOARD_URL", "REACTOR_DASHBOARD_ADDR"),
            id="a dashboard URL needs the page",
        ),
        pytest.param(
            {"REACTOR_PROBE_INTERVAL_SECONDS": "1", "REACTOR_PROBE_TIMEOUT_SECONDS": "5"},
            ("REACTOR_PROBE_TIMEOUT_SECONDS", "REACTOR_PROBE_INTERVAL_SECONDS"),
            id="probe timeout far beyond the interval",
        ),
        pytest.param(
            {"REACTOR_HOOK_LEASE_SECONDS": "60"},  # default timeout: 120 s
            ("REACTOR_HOOK_LEASE_SECONDS", "REACTOR_HOOK_TIMEOUT_SECONDS"),
            id="hook lease shorter than the hook timeout",
        ),
    ],
)
def test_settings_that_contradict_each_other_are_rejected_naming_both(
    env: dict[str, str], named: tuple[str, str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    for variable in named:
        assert variable in str(caught.value)


def test_the_listeners_gathering_is_a_few_milliseconds_at_most() -> None:
    assert Settings.from_env({}).listen_coalesce == 0.005
    assert Settings.from_env({"REACTOR_LISTEN_COALESCE_SECONDS": "0"}).listen_coalesce == 0.0
    with pytest.raises(ConfigError, match=r"REACTOR_LISTEN_COALESCE_SECONDS must be at most 0\.1"):
        Settings.from_env({"REACTOR_LISTEN_COALESCE_SECONDS": "0.5"})


def test_hook_lease_defaults_to_the_timeout_plus_a_margin() -> None:
    s = load(REACTOR_HOOK_TIMEOUT_SECONDS="300")
    assert s.hook_lease_seconds is None
    assert s.hook_lease > s.hook_timeout


def test_per_hook_webhook_secrets_are_read_and_never_shown() -> None:
    s = load(
        REACTOR_WEBHOOK_SECRET="shared-secret",
        REACTOR_WEBHOOK_SECRET_JUDGE=f" {PASSWORD} ",
        REACTOR_WEBHOOK_SECRET_OPS_DIAG="ops-secret",
        REACTOR_WEBHOOK_SECRET_AUDIT="",  # empty: unset, as for the shared one
    )
    assert s.webhook_secrets == {
        "REACTOR_WEBHOOK_SECRET_JUDGE": PASSWORD,
        "REACTOR_WEBHOOK_SECRET_OPS_DIAG": "ops-secret",
    }
    assert secret_for("judge", s.webhook_secrets, s.webhook_secret) == PASSWORD
    assert secret_for("ops-diag", s.webhook_secrets, s.webhook_secret) == "ops-secret"
    assert secret_for("audit", s.webhook_secrets, s.webhook_secret) == "shared-secret"
    assert secret_for("judge", load().webhook_secrets, None) is None
    assert PASSWORD not in repr(s)
    assert "ops-secret" not in repr(s)


def test_the_per_hook_variable_is_the_name_upper_cased_with_dashes_as_underscores() -> None:
    assert webhook_secret_variable("ops-diag") == "REACTOR_WEBHOOK_SECRET_OPS_DIAG"
    assert webhook_secret_variable("Judge_2") == "REACTOR_WEBHOOK_SECRET_JUDGE_2"


@pytest.mark.parametrize(
    "variable",
    ["REACTOR_WEBHOOK_SECRET_judge", "REACTOR_WEBHOOK_SECRET_OPS-DIAG", "REACTOR_WEBHOOK_SECRET_"],
)
def test_a_per_hook_variable_that_names_no_hook_is_refused_without_its_value(
    variable: str,
) -> None:
    error = rejects(variable, PASSWORD)
    assert PASSWORD not in str(error)
    assert "REACTOR_WEBHOOK_SECRET_OPS_DIAG" in str(error)  # how to write it


def test_webhook_secret_never_in_repr() -> None:
    s = load(REACTOR_WEBHOOK_SECRET=PASSWORD)
    assert s.webhook_secret == PASSWORD
    assert PASSWORD not in repr(s)
    assert load(REACTOR_WEBHOOK_SECRET="").webhook_secret is None


def test_the_message_shows_the_bad_value() -> None:
    error = rejects("REACTOR_GRACE_SECONDS", "-5")
    assert "-5" in str(error)


# -- database URLs -------------------------------------------------------------------------------


@pytest.mark.parametrize("variable", ["DATABASE_URL", "REACTOR_LISTEN_DATABASE_URL"])
@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://[bad",
        f"postgresql://app:{PASSWORD}@[bad",
        f"postgresql://app:{PASSWORD}@[::1/app",
        f"host=db password={PASSWORD} port='unterminated",
        f"host=db password = {PASSWORD} dbname",
        f"password={PASSWORD} =x",
        # "%db" decodes to no UTF-8: psycopg raises UnicodeDecodeError, not ProgrammingError.
        f"postgresql://app:{PASSWORD}@%db/app",
    ],
)
def test_malformed_dsn_is_rejected_without_the_password(variable: str, dsn: str) -> None:
    error = rejects(variable, dsn)
    assert PASSWORD not in str(error)
    assert PASSWORD not in repr(error)
    assert error.__cause__ is None  # `from None`: the driver's message (with the DSN) is gone
    assert error.__suppress_context__


def test_malformed_dsn_with_an_unterminated_quoted_password_hides_all_of_it() -> None:
    error = rejects("DATABASE_URL", "host=db password='correct horse battery")
    for word in ("correct", "horse", "battery"):
        assert word not in str(error)


# The password p@ss:w/rd, every character of it that means something in a URL left unencoded.
BROKEN_PASSWORD = "p@ss:w/rd"
BROKEN_FRAGMENTS = ("p@ss", "ss:w", "w/rd", "rd", "ss", "p@")


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://u:{BROKEN_PASSWORD}@127.0.0.1/db",
        # The tail past the second "@" lands in the host: libpq would resolve "ss@127.0.0.1".
        "postgresql://u:p@ss@127.0.0.1/db",
        "postgresql://u:p@ss@127.0.0.1:5432/db?sslmode=disable",
        # A "/" ends the authority early: "u:p@ss:5" is user, password, host and port, and the
        # tail, "@" and all, the dbname; libpq would name host "ss" in its error.
        "postgresql://u:p@ss:5/rd@127.0.0.1/db",
        f"host=127.0.0.1 password='{BROKEN_PASSWORD}",  # an unterminated quote
    ],
)
def test_a_dsn_a_password_broke_is_refused_naming_the_fix_and_no_part_of_it(dsn: str) -> None:
    message = str(rejects("DATABASE_URL", dsn))
    assert "percent-encoded (@ as %40" in message
    assert "\n" not in message
    for fragment in BROKEN_FRAGMENTS:
        assert fragment not in message, (fragment, message)
    assert redact_dsn(dsn) == UNPARSABLE_DSN


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u:p%40ss%3Aw%2Frd@127.0.0.1:5432/db",
        "postgresql://u%40corp:p%40ss@db.internal/db?sslmode=require",
        "postgresql://u@%2Fvar%2Frun%2Fpostgresql/db",
        "postgresql://u@[::1]:5432/db",
        "postgresql:///db?host=/var/run/postgresql",
        "postgresql://u:p%40ss@db1:5432,db2:5433/db",
        # key=value needs no encoding: the same password is well formed there.
        f"host=127.0.0.1 password={BROKEN_PASSWORD} dbname=db",
        f"host=127.0.0.1 password='{BROKEN_PASSWORD} x' dbname=db",
    ],
)
def test_a_dsn_with_its_special_characters_encoded_is_accepted(dsn: str) -> None:
    assert load(DATABASE_URL=dsn).database_url == dsn
    redacted = redact_dsn(dsn)
    assert "p%40ss" not in redacted
    assert "p@ss" not in redacted


def test_empty_port_is_libpq_default_port() -> None:
    # libpq: "An empty string ... specifies the default port number", so this is a valid DSN.
    assert load(DATABASE_URL="host=x port=").database_url == "host=x port="


def test_dsn_whose_port_swallowed_the_password_is_rejected_without_it() -> None:
    error = rejects("DATABASE_URL", f"host=x port= password={PASSWORD}")
    assert PASSWORD not in str(error)


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://app:{PASSWORD}@db:5432/app",
        f"postgres://app:{PASSWORD}@db/app?sslmode=require",
        f"postgresql://app@db/app?password={PASSWORD}",
        f"postgresql://app:{PASSWORD}@db1:5432,db2:5433/app",
        f"host=db user=app password={PASSWORD} dbname=app",
        f"host=db user=app password='{PASSWORD} with spaces' dbname=app",
    ],
)
def test_password_never_in_repr(dsn: str) -> None:
    s = Settings.from_env({"DATABASE_URL": dsn, "REACTOR_LISTEN_DATABASE_URL": dsn})
    assert s.database_url == dsn
    assert PASSWORD not in repr(s)
    assert PASSWORD not in str(s)
    assert PASSWORD not in s.safe_database_url
    assert "db" in s.safe_database_url


# -- redact_dsn ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://app:{PASSWORD}@db:5432/app",
        f"postgresql://app:{PASSWORD}@db/app?sslmode=require&application_name=x",
        f"postgresql://app@db/app?password={PASSWORD}",
        f"host=db user=app password={PASSWORD} dbname=app",
        f"host=db password = {PASSWORD}",
        f"password='{PASSWORD} two words' host=db",
    ],
)
def test_redact_dsn_removes_the_password(dsn: str) -> None:
    redacted = redact_dsn(dsn)
    assert PASSWORD not in redacted
    assert "db" in redacted  # the rest stays useful


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://app:{PASSWORD}@[db",
        f"host=db password={PASSWORD} port='oops",
        f"host=db password='{PASSWORD}' port='oops",
        f"host=db password='{PASSWORD} oops",
        f"host=db password={PASSWORD} oops",
        f"postgresql://app:{PASSWORD}@%db/app",
    ],
)
def test_a_dsn_that_does_not_parse_shows_nothing_of_itself(dsn: str) -> None:
    # Which of its fragments are the password, no rule can tell: none is shown.
    assert redact_dsn(dsn) == UNPARSABLE_DSN


@pytest.mark.parametrize(
    "param",
    sorted(
        redact.DSN_SECRET_PARAMS
        | {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
    ),
)
def test_redact_dsn_masks_every_secret_parameter(param: str) -> None:
    for dsn in (f"host=db {param}={PASSWORD}", f"postgresql://app@db/app?{param}={PASSWORD}"):
        redacted = redact_dsn(dsn)
        assert PASSWORD not in redacted
        assert redacted == UNPARSABLE_DSN or "db" in redacted  # an option libpq may not know


@pytest.mark.parametrize(
    "dsn",
    [
        # An unencoded "@" in the password ends the userinfo early: its tail lands in the host.
        "postgresql://app:Qx7v@W2kZ9mJ4@db/app",
        # An unencoded "/" ends the authority: "app:Qx7v" is host:port, the tail the dbname.
        "postgresql://app:Qx7v/W2kZ9mJ4@db/app",
        # No "@": libpq reads user:password as host:port.
        "postgresql://app:Qx7vW2kZ9mJ4/app",
        "postgresql://app:Qx7vW2kZ9mJ4",
        # A lost space: the password is the user's value now.
        "host=db user=apppassword=Qx7vW2kZ9mJ4",
    ],
)
def test_a_dsn_that_parses_into_misplaced_values_shows_nothing_of_itself(dsn: str) -> None:
    assert redact_dsn(dsn) == UNPARSABLE_DSN


_SECRET = "Qx7vW2kZ9mJ4"
_DSNS = [
    f"postgresql://app:{_SECRET}@db.internal:5432/app",
    f"postgresql://app:{_SECRET}@db/app?sslmode=require",
    f"postgresql://app@db/app?password={_SECRET}",
    f"postgresql://app@db/app?sslpassword={_SECRET}&sslmode=require",
    f"postgresql://:{_SECRET}@db",
    f"host=db user=app password={_SECRET} dbname=app",
    f"host=db password='{_SECRET}' port=5432",
    f"host=db sslpassword={_SECRET} user=app",
]


@st.composite
def _broken_dsns(draw: st.DrawFn) -> str:
    dsn = draw(st.sampled_from(_DSNS))
    # Cut short, or with characters that mean something to libpq's two syntaxes put anywhere.
    # (Both at once can make the password a well-formed host: "postgresql://app:@Qx7" has a
    # host named Qx7, and nothing can know otherwise.)
    if draw(st.booleans()):
        return dsn[: draw(st.integers(0, len(dsn)))]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(dsn)))
        dsn = dsn[:at] + draw(st.sampled_from(list("@/:?#&=,' \\[]%"))) + dsn[at:]
    return dsn


def _fragments(secret: str) -> list[str]:
    return [secret[i : i + 3] for i in range(len(secret) - 2)]


@settings(max_examples=1000)
@given(_broken_dsns())
def test_no_fragment_of_a_password_is_ever_shown(dsn: str) -> None:
    redacted = redact_dsn(dsn)
    try:
        check_dsn(dsn, "DATABASE_URL")
        message = ""
    except ConfigError as error:
        message = str(error)
    for fragment in _fragments(_SECRET):
        assert fragment not in redacted, (dsn, redacted)
        assert fragment not in message, (dsn, message)


def test_redact_dsn_keeps_the_connection_details() -> None:
    redacted = redact_dsn(f"postgresql://app:{PASSWORD}@db.internal:6543/reports")
    for part in ("app", "db.internal", "6543", "reports", "***"):
        assert part in redacted


def test_redact_dsn_leaves_passwordless_dsns_alone() -> None:
    redacted = redact_dsn("postgresql://app@db:5432/app")
    assert "password" not in redacted
    assert "db" in redacted
    assert redact_dsn("") == ""


# -- overrides -----------------------------------------------------------------------------------


def test_overrides_win_over_the_environment() -> None:
    s = Settings.from_env(
        {"REACTOR_GRACE_SECONDS": "10", "REACTOR_MODE": "listen", "REACTOR_BATCH_SIZE": "7"},
        {"grace": 3, "mode": "poll", "http_addr": ""},
    )
    assert s.grace == 3.0
    assert s.mode == "poll"
    assert s.http_addr is None
    assert s.batch_size == 7


def test_none_overrides_are_ignored() -> None:
    s = Settings.from_env(
        {"REACTOR_GRACE_SECONDS": "10"},
        {"grace": None, "batch_size": None, "database_url": None},
    )
    assert s.grace == 10.0
    assert s.batch_size == 500
    assert s.database_url is None


def test_overrides_are_validated_and_name_the_flag() -> None:
    with pytest.raises(ConfigError, match="--batch-size"):
        Settings.from_env({}, {"batch_size": 0})
    with pytest.raises(ConfigError, match="--grace"):
        Settings.from_env({}, {"grace": float("nan")})


def test_override_of_a_bad_environment_value_still_fails_on_the_environment() -> None:
    # The environment is parsed first; a bad variable is an error even if a flag replaces it.
    overrides: dict[str, Any] = {"grace": 5}
    with pytest.raises(ConfigError, match="REACTOR_GRACE_SECONDS"):
        Settings.from_env({"REACTOR_GRACE_SECONDS": "soon"}, overrides)


@pytest.mark.parametrize(
    ("environ", "chosen"),
    [
        ({}, False),
        ({"REACTOR_DASHBOARD_ADDR": "127.0.0.1:9188"}, True),  # the default, but chosen
        ({"REACTOR_DASHBOARD_ADDR": "10.0.0.5:9188"}, True),
        ({"REACTOR_DASHBOARD_ADDR": ""}, True),
    ],
)
def test_the_page_address_is_known_as_chosen_or_default(
    environ: dict[str, str], chosen: bool
) -> None:
    assert Settings.from_env(environ).dashboard_addr_chosen is chosen
