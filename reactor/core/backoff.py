"""How long to wait before trying again: one schedule for every retry loop of the reactor.

A retry after ``attempt`` failures in a row waits ``first * 2 ** (attempt - 1)`` seconds, at most
``cap`` (:func:`exponential`), and a loop that many replicas run at once spreads its retries out
with :func:`jittered`. The listener's reconnects, the cadence's failed duties and the hook
outbox's retries all take their delays from here; connecting at startup and the migrations'
lock retries use tenacity, whose loop they need as well. Pure: the caller passes the randomness.
"""

from __future__ import annotations

# 2 ** 64 is as far as the schedule doubles: a thousandth attempt stays a float, not an overflow.
_MAX_DOUBLINGS = 64


def exponential(attempt: int, *, first: float, cap: float) -> float:
    """Seconds to wait after the ``attempt``-th failure in a row (1: the first): ``first``,
    doubling with each failure, at most ``cap``; 0 when ``first`` is not positive."""
    if first <= 0:
        return 0.0
    return min(cap, first * 2.0 ** min(max(attempt - 1, 0), _MAX_DOUBLINGS))


def jittered(delay: float, rand: float, *, low: float, high: float) -> float:
    """``delay`` scaled into [``low`` x, ``high`` x] as ``rand`` goes from 0 to 1 (``rand`` is
    uniform in [0, 1) in production, chosen in tests)."""
    return delay * (low + (high - low) * rand)


# Reconnect backoff: the first retry within BACKOFF_BASE_S seconds, doubling per failure up to a
# cap; a problem retrying cannot fix (a wrong password, a missing role) is retried rarely.
BACKOFF_BASE_S = 0.2
BACKOFF_CAP_S = 5.0
BACKOFF_CAP_PERMANENT_S = 60.0


def backoff(failures: int, *, cap: float, base: float = BACKOFF_BASE_S, rand: float) -> float:
    """Seconds to wait before reconnect attempt ``failures + 1``; ``rand`` in [0, 1) jitters it.

    Exponential from ``base``, at most ``cap``, and never below half of that (so a burst of
    replicas spreads out, but none retries in a tight loop).
    """
    delay = exponential(failures, first=base, cap=cap)
    return jittered(delay, rand, low=0.5, high=1.0)
