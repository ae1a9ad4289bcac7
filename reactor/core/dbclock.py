"""The database's clock as seen from this process: where a database timestamp falls on ours.

A job is due at ``updated_at + grace`` by the database clock. Arming its timer at receipt plus
the grace is safe but late by however long the app's transaction ran after it set
``updated_at`` (milliseconds, often more). With an estimate of the offset between the database
clock and this process's monotonic clock, the timer can aim at the deadline itself.

Every health check is a sample: the database's ``clock_timestamp()`` was read somewhere between
sending the statement and receiving its answer, so the offset is known to within half that round
trip. The sample with the shortest round trip among the recent ones wins (as NTP filters), and
the deadline is pushed late by its uncertainty, so a timer never aims before the true deadline.
A wrong estimate costs one refused claim and a re-arm; the claim itself decides in database
time, so it can never cost an early write. Pure: the caller passes every reading in.
"""

from __future__ import annotations

from collections import deque


class DatabaseClock:
    """Maps database unix times to this process's monotonic clock."""

    def __init__(self, keep: int = 8) -> None:
        # (round trip, offset): offset = database time - local time at the round trip's middle.
        self._samples: deque[tuple[float, float]] = deque(maxlen=keep)

    def observe(self, database_time: float, sent: float, received: float) -> None:
        """One reading of the database clock, taken between ``sent`` and ``received`` (local)."""
        if received < sent:
            return
        self._samples.append((received - sent, database_time - (sent + received) / 2))

    def local(self, database_time: float) -> float | None:
        """The local time by which ``database_time`` has surely passed; None without samples."""
        if not self._samples:
            return None
        round_trip, offset = min(self._samples)
        return database_time - offset + round_trip / 2
