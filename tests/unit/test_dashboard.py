"""The operator's page without a database: sign-in, CSRF, same-site checks and the chart."""

from __future__ import annotations

from reactor.dashboard import Auth, bars, cross_site, lateness_buckets, next_reconcile
from reactor.metrics import Metrics

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

    from reactor.config import Settings
    from reactor.errors import ConfigError

    assert Settings.from_env({"REACTOR_DASHBOARD_TOKEN": TOKEN}).dashboard_token == TOKEN
    assert Settings.from_env({"REACTOR_DASHBOARD_TOKEN": ""}).dashboard_token is None
    with pytest.raises(ConfigError, match="at least 16") as raised:
        Settings.from_env({"REACTOR_DASHBOARD_TOKEN": "short-secret"})
    assert "short-secret" not in str(raised.value)
    assert TOKEN not in repr(Settings.from_env({"REACTOR_DASHBOARD_TOKEN": TOKEN}))
