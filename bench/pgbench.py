"""What a pgbench run reported: its transactions per second, and how many it processed."""

from __future__ import annotations

import re
import subprocess

_TPS = re.compile(r"tps = ([\d.]+) \(without initial connection time\)")
_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")


def report(done: subprocess.CompletedProcess[bytes]) -> tuple[int, float]:
    """(transactions processed, transactions per second) of a finished pgbench run; a
    RuntimeError with the end of what it said when it failed or reported neither."""
    out = done.stdout.decode()
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    tps, processed = _TPS.search(out), _PROCESSED.search(out)
    if tps is None or processed is None:
        raise RuntimeError(f"no tps in pgbench output: {out[-2000:]}")
    return int(processed.group(1)), float(tps.group(1))
