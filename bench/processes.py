"""The CPU a benchmark's processes spent, read from Linux's /proc: the reactor's replicas, the
load generator, the server's backends."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def cpu_by_process(pids: Sequence[int], *, children: bool = False) -> dict[int, float]:
    """User plus system CPU seconds of each of ``pids`` (and, with ``children``, of each of
    their child processes), from Linux's /proc; a process that is gone is left out."""
    tick = os.sysconf("SC_CLK_TCK")
    wanted = set(pids)
    found: dict[int, float] = {}
    listed = (int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit())
    for pid in listed if children else wanted:
        try:
            # The fields after the command name, which is in parentheses and may hold spaces:
            # state (3rd field) first, so ppid is [1], utime [11] and stime [12].
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if pid in wanted or (children and int(fields[1]) in wanted):
            found[pid] = (int(fields[11]) + int(fields[12])) / tick
    return found
