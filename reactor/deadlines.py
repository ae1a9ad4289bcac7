"""A keyed min-heap of deadlines: the reactor's timer wheel, with no I/O and no clock.

Every method that needs the time takes ``now`` as an argument, so tests drive it with a fake
clock and the service reads the monotonic clock once per loop turn.

Scheduling a key again replaces its deadline (the last write wins); :meth:`cancel` forgets it.
Replaced and cancelled entries stay in the heap as tombstones and are skipped when they reach
the top, which keeps every operation O(log n) without searching the heap. When tombstones
outnumber live entries the heap is rebuilt, so memory stays proportional to the live keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import Any, Generic, Protocol, TypeVar


class _Key(Hashable, Protocol):
    # Keys break ties between equal deadlines inside the heap, so they must be orderable.
    def __lt__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_Key)


class Deadlines(Generic[K]):
    """Deadlines by key; the earliest comes out first."""

    __slots__ = ("_heap", "_when")

    def __init__(self) -> None:
        # The heap holds (when, key) pairs, some of them stale; _when holds the live deadline of
        # each key. An entry is live when _when[key] is the very float object stored in it, so a
        # key rescheduled to an equal time still leaves exactly one live entry.
        self._heap: list[tuple[float, K]] = []
        self._when: dict[K, float] = {}

    def __len__(self) -> int:
        return len(self._when)

    def __contains__(self, key: object) -> bool:
        return key in self._when

    def __iter__(self) -> Iterator[K]:
        return iter(self._when)

    def schedule(self, key: K, when: float) -> bool:
        """Set ``key`` to fire at ``when``; return True if it is now the earliest deadline.

        The return value tells a sleeping timer loop that it must wake up earlier.
        """
        when = float(when)
        self._when[key] = when
        heapq.heappush(self._heap, (when, key))
        self._maybe_compact()
        self._drop_stale_head()
        return self._heap[0][1] == key and self._heap[0][0] is when

    def cancel(self, key: K) -> bool:
        """Forget ``key``; return whether it was pending."""
        found = self._when.pop(key, None) is not None
        self._maybe_compact()
        return found

    def when(self, key: K) -> float | None:
        """The deadline of ``key``, or None if it is not pending."""
        return self._when.get(key)

    def next_deadline(self) -> float | None:
        """The earliest pending deadline, or None when nothing is pending."""
        self._drop_stale_head()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float, limit: int | None = None) -> list[K]:
        """Remove and return the keys whose deadline is at or before ``now``, earliest first."""
        due: list[K] = []
        while self._heap and (limit is None or len(due) < limit):
            when, key = self._heap[0]
            if self._when.get(key) is not when:
                heapq.heappop(self._heap)
                continue
            if when > now:
                break
            heapq.heappop(self._heap)
            del self._when[key]
            due.append(key)
        return due

    def _drop_stale_head(self) -> None:
        while self._heap and self._when.get(self._heap[0][1]) is not self._heap[0][0]:
            heapq.heappop(self._heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._when) + 64:
            self._compact()

    def _compact(self) -> None:
        self._heap = [(when, key) for key, when in self._when.items()]
        heapq.heapify(self._heap)
