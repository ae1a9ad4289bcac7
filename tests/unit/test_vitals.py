"""What the health checks' answers make of the check's own period; no database."""

from __future__ import annotations

import dataclasses

import pytest

from reactor import db
from reactor.core.clock import FakeClock
from reactor.install import REFERENCE_INSTALL
from reactor.runtime.vitals import Vitals, calm_interval
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics

CHANNEL = REFERENCE_INSTALL.channel


def quiet_health(**changed: object) -> db.Health:
    health = db.Health(
        queue_usage=0.0,
        oldest_overdue=0.0,
        hook_backlog=0,
        hook_failed=0,
        hooks_expired=False,
        reconcile_last_pass=0.0,
        reconcile_requested=False,
        live_replicas=["me"],
        trigger_channel=CHANNEL,
        trigger_spread=False,
        probes_sent=0,
        database_time=0.0,
        set_aside=0,
        joined_told=0,
        hooks_orphaned=0,
        queued=False,
    )
    return dataclasses.replace(health, **changed)  # type: ignore[arg-type]


def vitals(clock: FakeClock, **settings: float) -> Vitals:
    return Vitals(Settings(**settings), REFERENCE_INSTALL, Metrics(), clock)  # type: ignore[arg-type]


def test_a_replica_with_nothing_to_change_checks_half_as_often() -> None:
    v = vitals(FakeClock())
    v.saw(quiet_health())
    # The first check has nothing to compare the trigger and the replicas with.
    assert v.check_interval == 5.0
    v.saw(quiet_health())
    assert v.check_interval == 10.0


def test_anything_to_act_on_brings_the_probe_interval_back() -> None:
    clock = FakeClock()
    for change in (
        {"queued": True},
        {"hook_backlog": 1},
        {"hooks_expired": True},
        {"hooks_orphaned": 1},
        {"reconcile_requested": True},
        {"set_aside": 1},
        {"queue_usage": 0.6},
        {"live_replicas": ["me", "other"]},
        {"trigger_channel": ""},
        {"trigger_spread": True},
    ):
        v = vitals(clock)
        v.saw(quiet_health())
        v.saw(quiet_health())
        assert v.check_interval == 10.0
        v.saw(quiet_health(**change))
        assert v.check_interval == 5.0, change


def test_a_failed_check_ends_the_calm() -> None:
    v = vitals(FakeClock())
    v.saw(quiet_health())
    v.saw(quiet_health())
    v.failed(OSError("connection refused"))
    assert v.check_interval == 5.0


def test_the_stretch_leaves_a_whole_interval_inside_the_grace() -> None:
    # A job queued right after a calm check is due a grace later: the next check, which sees
    # a killed replica gone and takes its jobs, must come an interval before that.
    assert calm_interval(5.0, 120.0) == 10.0
    assert calm_interval(5.0, 15.0) == 10.0
    assert calm_interval(5.0, 14.9) == 5.0
    assert calm_interval(5.0, 2.0) == 5.0


@pytest.mark.anyio
async def test_a_stretched_check_still_counts_as_fresh_for_the_scan() -> None:
    clock = FakeClock()
    v = vitals(clock)
    v.saw(quiet_health())
    v.saw(quiet_health())
    await clock.advance(15.0)
    assert v.nothing_overdue()
    await clock.advance(6.0)
    assert not v.nothing_overdue()
