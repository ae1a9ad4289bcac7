"""The operator's page without a database: sign-in, CSRF, same-site checks and the chart."""

from __future__ import annotations

import pytest

from reactor.ops.dashboard import (
    Auth,
    HostAllowlist,
    Throttle,
    bars,
    cross_site,
    lateness_buckets,
    next_reconcile,
    split_host,
)
from reactor.telemetry.metrics import Metrics

TOKEN = "a-token-of-32-characters-or-so!!"


def test_token_and_sessions() -> None:
    now = [1_000_000.0]
    auth = Auth(TOKEN, lifetime=60, clock=lambda: now[0])
    assert auth.enabled
    assert auth.token_ok(TOKEN)
    assert not auth.token_ok(TOKEN[:-1])
    assert not auth.token_ok("")
    session = auth.issue()
    assert TOKEN not in session
    assert auth.session_ok(session)
    assert not auth.session_ok(session[:-1] + ("0" if session[-1] != "0" else "1"))
    assert not auth.session_ok("123.abc.def")
    assert not auth.session_ok(None)
    # Another process (another key) does not take this one's cookies.
    assert not Auth(TOKEN, clock=lambda: now[0]).session_ok(session)
    form = auth.form_token(session)
    assert auth.form_ok(session, form)
    assert not auth.form_ok(auth.issue(), form)  # tied to its session
    now[0] += 61
    assert not auth.session_ok(session)  # expired


def test_signing_out_ends_a_session_and_no_other() -> None:
    auth = Auth(TOKEN)
    mine, yours = auth.issue(), auth.issue()
    auth.end(mine)
    assert not auth.session_ok(mine)
    assert auth.session_ok(yours)
    auth.end(mine)  # twice, or a value never issued: nothing happens
    auth.end("never-issued")
    auth.end(None)
    assert auth.sessions == 1


def test_sessions_are_bounded() -> None:
    now = [0.0]
    auth = Auth(TOKEN, lifetime=60, clock=lambda: now[0], max_sessions=3)
    first, *rest = [auth.issue() for _ in range(4)]
    assert auth.sessions == 3
    assert not auth.session_ok(first)  # the oldest made room
    assert all(auth.session_ok(s) for s in rest)
    now[0] += 61
    auth.issue()  # the expired are forgotten on the next sign-in
    assert auth.sessions == 1


def test_without_a_token_nobody_acts() -> None:
    auth = Auth(None)
    assert not auth.enabled
    assert not auth.token_ok("")
    assert not auth.session_ok(auth.issue())


def test_cross_site_requests() -> None:
    host = "127.0.0.1:9187"
    assert cross_site({}, host) is None  # a script: no browser headers
    assert cross_site({"Sec-Fetch-Site": "same-origin", "Origin": f"http://{host}"}, host) is None
    assert cross_site({"Sec-Fetch-Site": "cross-site"}, host) == "Sec-Fetch-Site is cross-site"
    assert cross_site({"Sec-Fetch-Site": "same-site"}, host) is not None
    assert cross_site({"Origin": "https://evil.example"}, host) is not None
    assert cross_site({"Origin": "null"}, host) is not None


def test_lateness_chart() -> None:
    metrics = Metrics()
    for value in (0.003, 0.004, 0.2, 1000.0):
        metrics.lateness.observe(value)
    buckets = lateness_buckets(metrics)
    assert len(buckets) == 17
    assert sum(count for _, count in buckets) == 4
    assert dict(buckets)[0.005] == 2
    assert dict(buckets)[float("inf")] == 1
    drawn = bars([{"le": None if b == float("inf") else b, "count": c} for b, c in buckets])
    assert [bar.label for bar in drawn][:3] == ["1ms", "2.5ms", "5ms"]
    assert drawn[-1].label == "more"
    tallest = max(drawn, key=lambda bar: bar.height)
    assert tallest.count == 2
    assert tallest.height == 120
    assert all(bar.height == 0 for bar in drawn if not bar.count)
    assert bars([]) == []


def test_next_reconcile_in_words() -> None:
    doc = {
        "checked_at": "2026-01-01T12:00:00+00:00",
        "reconcile": {
            "interval_seconds": 600.0,
            "in_progress": False,
            "requested": False,
            "last_pass": {"finished_at": "2026-01-01T11:58:00+00:00"},
        },
    }
    assert next_reconcile(doc) == "in about 8m"
    doc["reconcile"]["interval_seconds"] = 60.0  # type: ignore[index]
    assert next_reconcile(doc) == "due now"
    doc["reconcile"]["interval_seconds"] = 0.0  # type: ignore[index]
    assert next_reconcile(doc).startswith("turned off")
    assert next_reconcile({"reconcile": None}).startswith("no reconcile")


def test_the_token_setting() -> None:
    import pytest

    from reactor.errors import ConfigError
    from reactor.settings.config import Settings

    assert Settings.from_env({"REACTOR_DASHBOARD_TOKEN": TOKEN}).dashboard_token == TOKEN
    assert Settings.from_env({"REACTOR_DASHBOARD_TOKEN": ""}).dashboard_token is None
    with pytest.raises(ConfigError, match="at least 16") as raised:
        Settings.from_env({"REACTOR_DASHBOARD_TOKEN": "short-secret"})
    assert "short-secret" not in str(raised.value)
    assert TOKEN not in repr(Settings.from_env({"REACTOR_DASHBOARD_TOKEN": TOKEN}))


def test_the_throttle_counts_failures_per_address_in_a_sliding_window() -> None:
    throttle = Throttle(limit=3, window=60)
    assert throttle.wait("a", 0) is None
    assert throttle.failed("a", 0) is None
    assert throttle.failed("a", 10) is None
    assert throttle.failed("b", 10) is None
    assert throttle.failed("a", 20) == 40  # the third: until the first is 60 s old
    assert throttle.wait("a", 30) == 30
    assert throttle.wait("b", 30) is None  # its own count
    throttle.succeeded("b")
    assert throttle.wait("a", 30) == 30  # b's success is not a's
    assert throttle.wait("a", 60) is None  # the first left the window
    assert throttle.failed("a", 61) == 9  # 10, 20, 61: until the one at 10 leaves
    throttle.succeeded("a")
    assert throttle.wait("a", 62) is None
    assert throttle.clients == 0


def test_the_throttle_forgets_old_addresses_first() -> None:
    throttle = Throttle(limit=2, window=60, max_clients=1000)
    for n in range(100_000):
        throttle.failed(f"10.0.{n // 256}.{n % 256}", n / 1000)
    assert throttle.clients == 1000
    last = "10.0.390.159"  # the address of n = 99_999
    assert throttle.failed(last, 100) is not None
    assert throttle.wait("10.0.0.0", 100) is None  # long forgotten
    # Expired entries go as soon as they are looked at.
    assert throttle.wait(last, 1000) is None
    assert throttle.clients == 999


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost", "localhost"),
        ("localhost:9188", "localhost"),
        ("[::1]", "::1"),
        ("[::1]:9188", "::1"),
        ("reactor.example:443", "reactor.example"),
        ("host:port", None),
        ("[::1", None),
        ("[::1]x", None),
        ("[::1]:x", None),
    ],
)
def test_split_host(header: str, name: str | None) -> None:
    assert split_host(header) == name


def test_the_host_allowlist() -> None:
    hosts = HostAllowlist.for_page("0.0.0.0", "reactor.internal.example")
    for header in (
        "localhost",
        "LOCALHOST:1234",
        "localhost.",
        "127.0.0.1:9188",
        "[::1]:9188",
        "reactor.internal.example",
        "Reactor.Internal.Example:443",
    ):
        assert hosts.allows(header), header
    assert not hosts.allows(None)
    for refused in ("", "0.0.0.0:9188", "evil.example", "localhost.evil.example", "x:y"):
        assert not hosts.allows(refused), refused
    bound = HostAllowlist.for_page("10.0.0.5", None)
    assert bound.allows("10.0.0.5:9188")
    assert not bound.allows("reactor.internal.example")
