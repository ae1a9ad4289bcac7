"""Each insurance pass declares its own cadence (``every``): its interval, how soon a failure is
tried again, and when it first runs. One test a pass, beside the pass's file's name."""

from __future__ import annotations

import math

from reactor.insurance import health, poll, reconcile, retention, scan
from reactor.insurance.cadence import Cadence, Every
from reactor.settings.config import Settings

SETTINGS = Settings(
    probe_interval=5.0, poll_interval=0.25, scan_interval=30.0, reconcile_interval=600.0
)


def retries(every: Every, failures: int) -> list[float]:
    return [every.retry(n) for n in range(1, failures + 1)]


def test_health_check_runs_every_probe_interval_and_retries_a_failure_at_once_then_on_it() -> None:
    every = health.every(SETTINGS)
    assert (every.interval, every.first_at) == (5.0, -math.inf)
    assert retries(every, 3) == [0.0, 5.0, 5.0]


def test_poll_runs_every_poll_interval_and_retries_on_it() -> None:
    every = poll.every(SETTINGS)
    assert (every.interval, every.first_at) == (0.25, -math.inf)
    assert retries(every, 2) == [0.25, 0.25]


def test_scan_runs_every_scan_interval_and_backs_off_from_half_a_second_up_to_it() -> None:
    every = scan.every(SETTINGS)
    assert every.interval == 30.0
    backoffs = retries(every, 12)
    assert backoffs[0] == 0.5
    assert backoffs == sorted(backoffs)
    assert backoffs[-1] == 30.0


def test_reconcile_runs_every_reconcile_interval_and_backs_off_up_to_its_error_wait() -> None:
    every = reconcile.every(SETTINGS)
    assert every.interval == 600.0
    backoffs = retries(every, 12)
    assert backoffs[0] == 0.5
    assert backoffs[-1] == reconcile.MAX_ERROR_WAIT_S


def test_retention_runs_only_when_a_health_check_asks_for_it() -> None:
    every = retention.every(SETTINGS)
    assert (every.interval, every.first_at) == (math.inf, math.inf)
    assert retries(every, 2) == [math.inf, math.inf]


def test_each_pass_has_a_duty_of_its_own_name() -> None:
    cadence = Cadence()
    for every in (
        health.every(SETTINGS),
        poll.every(SETTINGS),
        scan.every(SETTINGS),
        reconcile.every(SETTINGS),
        retention.every(SETTINGS),
    ):
        cadence.enter(every)
    assert sorted(cadence.duties) == ["health", "poll", "reconcile", "retention", "scan"]
    # Due at once, but the purge, which waits for a check to see settled rows past retention.
    assert [name for name, duty in cadence.duties.items() if duty.next_at == math.inf] == [
        "retention"
    ]
