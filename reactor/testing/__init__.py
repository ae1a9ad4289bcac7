"""What the demo, the tests and the benchmarks share: the simulated app (:mod:`.app`) that
writes jobs and saves runs as a real app would, and the audit (:mod:`.audit`) that checks the
invariants on what it left.

It is also the benchmarks' one door into the reactor's insides. A benchmark imports what a user
of the package would (:mod:`reactor.cli`, :mod:`reactor.db`, :mod:`reactor.install`, ...) and
what is named here, nothing else; tests/unit/test_bench_shape.py holds it to that. The names
below are the internals a benchmark drives or reads a limit of, re-exported as they are (same
name, same object), so a module moving inside the reactor changes one import here rather than
the benchmarks. They are test support, not an API: they change when the reactor does. (The
embedded PostgreSQL the benchmarks start is :class:`reactor.demo.EmbeddedPostgres`: the demo
imports this package, so this one cannot name it.)

- Running a replica in process: :class:`Settings` and :class:`Pair` (what it is told),
  :func:`open_replica` and :class:`Replica` (the process-level replica), :class:`Reactor` (one
  pair's reactor under it), :class:`Recorder` and :class:`Metrics` (the write road alone).
- The pure logic timed alone: :class:`Deadlines` (the timer heap).
- Modules whose functions a benchmark calls as the reactor does: :mod:`mapping_file` (a
  mapping file parsed and loaded), :mod:`indexes` (the indexes migrate builds),
  :mod:`reconcile` (the reconcile pass's chunk sizing), :mod:`dashboard` and :mod:`http` (the
  page and its server).
- The reference tables' mapping, :data:`REFERENCE`, that a benchmark installs elsewhere (other
  schemas, other names) than :data:`reactor.install.REFERENCE_INSTALL` does.
- Limits a benchmark reports against: :data:`LIVENESS_PROBES` (the probes before a replica is
  taken over), :data:`POOL_MAX_IDLE_S` (how long an idle pool connection lives),
  :data:`RECENT_OUTCOMES` (the outcomes the page shows), :data:`SPLIT` (how many ways a
  rejected batch is split).
"""

from __future__ import annotations

from reactor.core.deadlines import Deadlines
from reactor.core.ownership import LIVENESS_PROBES
from reactor.db import indexes
from reactor.db.pool import POOL_MAX_IDLE_S
from reactor.install import mapping_file
from reactor.install.mapping import REFERENCE
from reactor.insurance import reconcile
from reactor.ops import dashboard, http
from reactor.record.recorder import RECENT_OUTCOMES, SPLIT, Recorder
from reactor.runtime.replica import Replica, open_replica
from reactor.runtime.service import Reactor
from reactor.settings.config import Settings
from reactor.settings.pairs import Pair
from reactor.telemetry.metrics import Metrics
from reactor.testing import audit
from reactor.testing.app import App

__all__ = [
    "LIVENESS_PROBES",
    "POOL_MAX_IDLE_S",
    "RECENT_OUTCOMES",
    "REFERENCE",
    "SPLIT",
    "App",
    "Deadlines",
    "Metrics",
    "Pair",
    "Reactor",
    "Recorder",
    "Replica",
    "Settings",
    "audit",
    "dashboard",
    "http",
    "indexes",
    "mapping_file",
    "open_replica",
    "reconcile",
]
