"""What the job trigger, as the catalog describes it, does for a replica."""

from __future__ import annotations

import pytest

from reactor.runtime.vitals import trigger_state
from reactor.telemetry.metrics import TRIGGER_STATES


@pytest.mark.parametrize(
    ("trigger_channel", "state"),
    [
        ("analysis_jobs_terminal", "notifies"),
        ("", "quiet"),
        ("another_channel", "elsewhere"),
        (None, "missing"),
    ],
)
def test_each_state(trigger_channel: str | None, state: str) -> None:
    assert trigger_state(trigger_channel, "analysis_jobs_terminal") == state
    assert state in TRIGGER_STATES


def test_channels_are_compared_exactly() -> None:
    # pg_notify takes the channel verbatim: a different case is another channel.
    assert trigger_state("Analysis_Jobs_Terminal", "analysis_jobs_terminal") == "elsewhere"
