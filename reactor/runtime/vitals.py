"""What the health checks saw, and what /healthz and /readyz say about it.

The service's checks feed :meth:`Vitals.saw` (or :meth:`Vitals.failed`); the loops ask it whether
anything is overdue and whether the timers must come from polling; the HTTP server asks it for
the verdict. No I/O: the time comes from the injected clock.
"""

from __future__ import annotations

import logging
import math

from reactor import db
from reactor.core.clock import Clock
from reactor.db.health import QUEUE_WARNING
from reactor.install import Install
from reactor.listen.listener import Listener
from reactor.record.writes import WriteHealth
from reactor.settings.config import Settings
from reactor.telemetry.metrics import TRIGGER_STATES, Metrics

log = logging.getLogger(__name__)

# How far past its grace the oldest queued job may be, as a health check sees it, before the
# periodic scan stops being skipped. A job a few milliseconds late is most likely one whose
# claim is in flight, and a claim's own retries (a row another replica held) come back within
# a second: a scan would only race them.
OVERDUE_TOLERANCE_S = 1.0

# How many probe intervals apart the health checks of a replica with nothing to change are.
# Its heartbeat must stay within the liveness of three probe intervals as the others judge it:
# two leaves one for a slow check. Idle, that is half the statements.
CALM_STRETCH = 2.0


def calm_interval(probe_interval: float, grace: float) -> float:
    """The seconds between the checks of a replica with nothing to change: stretched only when
    every job queued after a check is due (a grace on) after the next check plus one interval,
    so that the next check sees a killed replica gone before any of its jobs is due."""
    stretched = CALM_STRETCH * probe_interval
    return stretched if grace >= stretched + probe_interval else probe_interval


def trigger_state(trigger_channel: str | None, channel: str) -> str:
    """What the job trigger does for a replica listening on ``channel``: ``notifies`` it,
    queues without notifying anyone (``quiet``), notifies ``elsewhere``, or is ``missing``
    (or disabled), given the channel the trigger notifies ('' for none; None when missing)."""
    if trigger_channel is None:
        return "missing"
    if trigger_channel == "":
        return "quiet"
    return "notifies" if trigger_channel == channel else "elsewhere"


class Vitals:
    """The database's health as the last checks saw it."""

    def __init__(
        self,
        settings: Settings,
        install: Install,
        metrics: Metrics,
        clock: Clock,
        writes: WriteHealth | None = None,
    ) -> None:
        self.settings = settings
        self.writes = writes or WriteHealth()
        self.install = install
        self.metrics = metrics
        self.clock = clock
        # None until the first check answers or fails.
        self.database_ok: bool | None = None
        # The last check failed because the server is a read-only hot standby.
        self.read_only = False
        # True while the NOTIFY queue is so full that the trigger skips its notifications.
        self.notify_skipped = False
        # The channel the job trigger notifies, as the last check read it from the catalog: ''
        # when it was installed not to notify, None when it is missing or disabled. Until the
        # first check, the channel this replica listens on.
        self.trigger_channel: str | None = install.channel
        self._trigger_known = False
        # Whether it notifies each share of the jobs on a channel of its own (--spread): then
        # the listener LISTENs on the channels of the shares this replica owns.
        self.trigger_spread = False
        # How long past its grace the oldest queued job waits, and when a check last answered.
        self.oldest_overdue = math.inf
        self.last_seen = -math.inf
        # Whether the last check found nothing to change (see :meth:`_calm`), and the live
        # replicas it read.
        self.calm = False
        self._live: frozenset[str] | None = None

    @property
    def trigger(self) -> str:
        """The job trigger's state for this replica's channel (see :func:`trigger_state`)."""
        return trigger_state(self.trigger_channel, self.install.channel)

    def polling(self, listener: Listener | None) -> bool:
        """True when timers must come from polling the queue rather than from notifications."""
        if listener is None or not listener.delivering or self.notify_skipped:
            return True
        return self.trigger != "notifies"

    @property
    def check_interval(self) -> float:
        """The seconds to the next health check after the last one: the probe interval, and
        longer (see :func:`calm_interval`) while the last check found nothing to change."""
        probe = self.settings.probe_interval
        return calm_interval(probe, self.settings.grace) if self.calm else probe

    def nothing_overdue(self) -> bool:
        """True when a fresh check found no queued job past its grace (beyond the tolerance)."""
        fresh = self.clock.now() - self.last_seen < 2 * self.check_interval
        return fresh and self.database_ok is True and self.oldest_overdue < OVERDUE_TOLERANCE_S

    def failed(self, error: BaseException) -> None:
        """A check through the pool failed."""
        self.calm = False
        if self.database_ok is not False:
            log.warning("database check failed", extra={"error": db.first_line(error)})
        self.database_ok = False
        self.read_only = db.read_only_server(error)

    def saw(self, health: db.Health) -> None:
        """A check answered."""
        self.database_ok = True
        self.read_only = False
        self.last_seen = self.clock.now()
        trigger_before = (self._trigger_known, self.trigger_channel, self.trigger_spread)
        usage = health.queue_usage
        metrics = self.metrics
        metrics.queue_usage.set(usage)
        metrics.oldest_age.set(health.oldest_overdue)
        self.oldest_overdue = health.oldest_overdue
        metrics.hook_backlog.set(health.hook_backlog)
        metrics.hook_failed.set(health.hook_failed)
        metrics.set_aside_jobs.set(health.set_aside)
        metrics.reconcile_last_pass.set(health.reconcile_last_pass)
        if usage >= QUEUE_WARNING and not self.notify_skipped:
            log.error(
                "the NOTIFY queue is half full: a session is LISTENing without reading "
                "(idle in transaction, frozen, or a dead connection); the job trigger "
                "skips its notifications until it drains, and the reactor polls",
                extra={"queue_usage": round(usage, 3)},
            )
        self.notify_skipped = usage >= QUEUE_WARNING
        self._see_trigger(health.trigger_channel, listening=self.settings.mode == "listen")
        if health.trigger_spread != self.trigger_spread:
            self.trigger_spread = health.trigger_spread
            log.info(
                "the job trigger notifies each share of the jobs on a channel of its own "
                "(--spread): listening on this replica's shares"
                if health.trigger_spread
                else "the job trigger notifies every job on one channel",
                extra={"channel": self.install.channel},
            )
        trigger_after = (self._trigger_known, self.trigger_channel, self.trigger_spread)
        live, self._live = self._live, frozenset(health.live_replicas)
        self.calm = _calm(health) and trigger_before == trigger_after and live == self._live

    def _see_trigger(self, channel: str | None, *, listening: bool) -> None:
        known, self._trigger_known = self._trigger_known, True
        if known and channel == self.trigger_channel:
            return
        self.trigger_channel = channel
        state = self.trigger
        for each in TRIGGER_STATES:
            self.metrics.job_trigger.labels(each).set(1 if each == state else 0)
        extra = {"trigger_channel": channel, "channel": self.install.channel}
        if state == "missing":
            log.error(
                "the job trigger on %s is missing or disabled: finished jobs are not queued, "
                "only the reconcile finds them; run `reactor migrate`",
                self.install.mapping.jobs_shown,
                extra=extra,
            )
        elif state == "quiet":
            log.info(
                "the job trigger queues without notifying (`reactor migrate --no-notify`): "
                "polling the queue",
                extra={"poll_interval_s": self.settings.poll_interval},
            )
        elif state == "elsewhere" and listening:
            log.error(
                "the job trigger notifies another channel than REACTOR_CHANNEL: run `reactor "
                "migrate` with this REACTOR_CHANNEL; polling meanwhile",
                extra=extra,
            )
        elif state == "notifies" and not listening:
            log.info(
                "the job trigger notifies, and in poll mode nobody hears it: `reactor migrate "
                "--no-notify` spares the app's commits the NOTIFY",
                extra=extra,
            )
        elif state == "notifies" and known:
            log.info("the job trigger notifies this replica's channel again", extra=extra)

    def readiness(self, listener: Listener | None) -> tuple[bool, str]:
        """(ready, reason): ready when the database answered the last check, the record
        statements can write and, in listen mode, LISTEN is up and proven and the trigger
        notifies its channel."""
        if self.database_ok is False and self.read_only:
            return (
                False,
                "the database is a read-only hot standby; waiting for a writable one "
                "(target_session_attrs=read-write)",
            )
        if not self.database_ok:
            return False, "database unreachable" if self.database_ok is False else "starting"
        unwritable = self.writes.problem
        if unwritable is not None:
            # Everything else may be well: a pair that cannot write is not ready.
            return False, f"record statements fail, nothing is written: {unwritable}"
        state = self.trigger
        if state == "missing":
            return False, "the job trigger is missing or disabled; run `reactor migrate`"
        if listener is not None:
            if listener.state == "connecting":
                problem = listener.problem
                if problem is None:
                    return False, "LISTEN connection not up yet; polling"
                return False, f"LISTEN connection down: {problem}; polling, reconnecting"
            if listener.state == "degraded":
                return False, "probe notifications do not arrive (pooler?); polling"
            if not listener.proven:
                return False, "waiting for the first delivery probe"
            if state == "elsewhere":
                return (
                    False,
                    f"the job trigger notifies channel {self.trigger_channel!r}, not "
                    f"REACTOR_CHANNEL {self.install.channel!r}; polling",
                )
        return True, "ok"


def _calm(health: db.Health) -> bool:
    """True when a check found nothing to change: no job queued (any replica's), no hook row
    open, expired or orphaned, no reconcile pass asked for, the NOTIFY queue clear. The caller
    adds that the trigger and the live replicas are as the check before found them."""
    return not (
        health.queued
        or health.hook_backlog
        or health.hooks_expired
        or health.hooks_orphaned
        or health.reconcile_requested
        or health.set_aside
        or health.queue_usage >= QUEUE_WARNING
    )
