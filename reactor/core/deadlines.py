"""Deadlines by key, earliest first: the reactor's timers, with no I/O and no clock.

Every method that needs the time takes ``now`` as an argument, so tests drive it with a fake
clock and the service reads the monotonic clock once per loop turn.

Scheduling a key again replaces its deadline (the last write wins); :meth:`cancel` forgets it.

Nearly every deadline the reactor makes is "receipt + the same grace", so they arrive in time
order. Those go to a FIFO (two deques, keys and times) where appending and popping are O(1);
only one that is earlier than the last one appended goes to a heap. ``pop_due`` takes whichever
head is earlier. A replaced or cancelled entry stays where it is as a tombstone and is skipped
when it reaches a head: an entry is live when its time is the very float object the key's
deadline is stored as. When tombstones outnumber live entries everything is rebuilt, so memory
stays proportional to the live keys.

A job id is a UUID in the listener's canonical text form (36 characters, lowercase): it costs
85 bytes as a str and 44 as a 128-bit int, so str keys in that form are held as ints and given
back as the same text. An instance holds str keys or other keys, not both: the packed ints must
not meet an int key.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Hashable, Iterator
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_HEX = "0123456789abcdef"
_ABSENT = object()  # the stored form of a key that cannot be pending; never stored itself


def pack_text(text: str) -> int | str:
    """A canonical job id as its 128-bit int; any other text as it is."""
    if len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-":
        digits = text.replace("-", "")
        # int() would also take uppercase, "_", a sign and spaces, none of which unpack as given.
        if len(digits) == 32 and not digits.strip(_HEX):
            return int(digits, 16)
    return text


def unpack_text(key: int | str) -> str:
    """The text :func:`pack_text` was given."""
    if isinstance(key, str):
        return key
    h = f"{key:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Deadlines(Generic[K]):
    """Deadlines by key; the earliest comes out first (equal ones in no promised order)."""

    __slots__ = ("_fifo_keys", "_fifo_times", "_heap", "_last", "_order", "_text", "_when")

    def __init__(self) -> None:
        # _when maps each pending key (in its stored form) to its live deadline. The FIFO's
        # times never decrease from head to tail, tombstones included; _last is its tail's time.
        self._when: dict[Any, float] = {}
        self._fifo_keys: deque[Any] = deque()
        self._fifo_times: deque[float] = deque()
        self._last = -math.inf
        # Heap entries carry a sequence number so that keys are never compared: a str key and
        # a packed one may meet on a tie, and keys need not be orderable at all.
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()
        self._text: bool | None = None  # str keys (packed), other keys, or none seen yet

    def __len__(self) -> int:
        return len(self._when)

    def __contains__(self, key: object) -> bool:
        return self._stored(key) in self._when

    def __iter__(self) -> Iterator[K]:
        if self._text:
            return (unpack_text(k) for k in self._when)  # type: ignore[misc]  # K is str here
        return iter(self._when)

    def schedule(self, key: K, when: float) -> bool:
        """Set ``key`` to fire at ``when``; return True if no pending deadline is earlier.

        The return value tells a sleeping timer loop that it must wake up earlier.
        """
        stored: Any = key
        if isinstance(key, str):
            if self._text is not True:
                self._claim(text=True)
            stored = pack_text(key)
        elif self._text is not False:
            self._claim(text=False)
        when = float(when)
        when_of = self._when
        if when >= self._last:
            when_of[stored] = when
            keys, times = self._fifo_keys, self._fifo_times
            keys.append(stored)
            times.append(when)
            self._last = when
            if len(keys) + len(self._heap) > 2 * len(when_of) + 64:
                self._compact()
                return self.next_deadline() == when
            # The new entry is live, so the skip stops at the latest there.
            while when_of.get(keys[0]) is not times[0]:
                keys.popleft()
                times.popleft()
            if times[0] < when:
                return False
            return not self._heap or self.next_deadline() == when
        if math.isnan(when):
            raise ValueError("a deadline must be a number, not NaN")
        when_of[stored] = when
        heapq.heappush(self._heap, (when, next(self._order), stored))
        self._maybe_compact()
        return self.next_deadline() == when

    def cancel(self, key: K) -> bool:
        """Forget ``key``; return whether it was pending."""
        found = self._when.pop(self._stored(key), None) is not None
        self._maybe_compact()
        return found

    def when(self, key: K) -> float | None:
        """The deadline of ``key``, or None if it is not pending."""
        return self._when.get(self._stored(key))

    def next_deadline(self) -> float | None:
        """The earliest pending deadline, or None when nothing is pending."""
        when_of, keys, times, heap = self._when, self._fifo_keys, self._fifo_times, self._heap
        while keys and when_of.get(keys[0]) is not times[0]:
            keys.popleft()
            times.popleft()
        while heap and when_of.get(heap[0][2]) is not heap[0][0]:
            heapq.heappop(heap)
        if not keys:
            self._last = -math.inf
            return heap[0][0] if heap else None
        return min(times[0], heap[0][0]) if heap else times[0]

    def pop_due(self, now: float, limit: int | None = None) -> list[K]:
        """Remove and return the keys whose deadline is at or before ``now``, earliest first."""
        when_of, keys, times, heap = self._when, self._fifo_keys, self._fifo_times, self._heap
        room = len(when_of) if limit is None else min(limit, len(when_of))
        due: list[Any] = []
        while room > 0:
            if keys and (not heap or times[0] <= heap[0][0]):
                when = times[0]
                if when_of.get(key := keys[0]) is when:
                    if when > now:
                        break
                    del when_of[key]
                    due.append(key)
                    room -= 1
                keys.popleft()
                times.popleft()
            elif heap:
                when, _, key = heap[0]
                if when_of.get(key) is when:
                    if when > now:
                        break
                    del when_of[key]
                    due.append(key)
                    room -= 1
                heapq.heappop(heap)
            else:
                break
        if not when_of:  # only tombstones left, if anything: start afresh
            keys.clear()
            times.clear()
            heap.clear()
        if not keys:
            self._last = -math.inf
        if self._text:
            return [unpack_text(k) for k in due]  # type: ignore[misc]  # K is str here
        return due

    def _stored(self, key: object) -> object:
        # Lookups with a key of the other kind find nothing instead of a packed look-alike.
        if isinstance(key, str):
            return pack_text(key) if self._text else _ABSENT
        return _ABSENT if self._text else key

    def _claim(self, *, text: bool) -> None:
        if self._text is None:
            self._text = text
            return
        held = "str" if self._text else "non-str"
        raise TypeError(f"these deadlines hold {held} keys; one instance takes one kind of key")

    def _maybe_compact(self) -> None:
        if len(self._fifo_keys) + len(self._heap) > 2 * len(self._when) + 64:
            self._compact()

    def _compact(self) -> None:
        # Everything live goes back into the FIFO in time order; the heap starts empty.
        live = sorted(self._when.items(), key=lambda item: item[1])
        self._fifo_keys = deque(key for key, _ in live)
        self._fifo_times = deque(when for _, when in live)
        self._last = live[-1][1] if live else -math.inf
        self._heap = []
