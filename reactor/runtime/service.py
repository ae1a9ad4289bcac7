"""One pair's runnable under its replica (reactor.runtime.replica): its parts wired together.

- :mod:`reactor.claim.dispatch` owns every claim: the listener, the poll, the scan's re-arm, the
  reconcile and the recorder's retries offer jobs to one work queue, which hands out the due
  ones this replica owns, one claim per job at a time.
- :mod:`reactor.insurance.cadence` owns every periodic duty, all through the pool: the health check
  (which carries the LISTEN session's probe; in a replica of several pairs the replica begins
  it, for all of them in one statement: :mod:`reactor.insurance.health`), the poll, the scan and the
  reconcile step.
- :mod:`reactor.runtime.vitals` keeps what the checks saw, for the loops and for /readyz.
- :mod:`reactor.core.ownership` keeps who is live, from the heartbeats and from what replicas say
  when they join and leave.

Startup never waits for LISTEN: the scan, the timers and the hooks start at once, and the
reactor polls until LISTEN is up; a bad or unreachable listen DSN costs lateness, never work.
When LISTEN comes up it asks for another scan with a re-arm, so nothing that finished before it
was listening falls through the gap. Shutdown is ordered: :meth:`Reactor.stop` tells the others
at once (they take this replica's jobs over), stops intake and the duties, lets claims in
flight finish within the drain deadline, then cancels what is left; a record statement cut
short rolls back and loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from reactor import db
from reactor.claim.dispatch import Dispatcher, WorkQueue
from reactor.claim.sources import LISTEN, RECONCILE
from reactor.core.clock import Clock, SystemClock
from reactor.core.dbclock import DatabaseClock
from reactor.core.ownership import LIVENESS_PROBES, Membership, Roster
from reactor.hooks import Hook, HookRunner
from reactor.insurance.cadence import Action, Cadence, Scheduler, backoff
from reactor.insurance.doorbell import Doorbell
from reactor.insurance.health import PairPoll, check_pair
from reactor.insurance.reconcile import MAX_ERROR_WAIT, Reconciler
from reactor.insurance.retention import HookRetention
from reactor.insurance.scan import PairScan
from reactor.listen.hints import Verifier
from reactor.listen.listener import Listener
from reactor.listen.subscriber import Subscriber
from reactor.record.recorder import Recorder
from reactor.record.writes import WriteHealth
from reactor.runtime.membership import PairMembership
from reactor.runtime.vitals import Vitals
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics

# The least time a batch of hints is given to be verified (see Verifier).
VERIFY_TIMEOUT_FLOOR = 1.0

log = logging.getLogger(__name__)

# Record statements in flight at once: enough that one stuck on a frozen backend does not stop
# the rest, few enough to leave the pool room for the scan and the probes.
RECORD_CONCURRENCY = 4
POOL_SIZE = RECORD_CONCURRENCY + 3


class Reactor:
    """One pair's reactor, a runnable of its :class:`~reactor.runtime.replica.Replica`, running
    against ``database`` under the replica's identity (``roster``) and LISTEN session."""

    def __init__(
        self,
        settings: Settings,
        database: db.Database,
        *,
        roster: Roster,
        listener: Listener | None,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        hooks: Mapping[str, Hook] | None = None,
    ) -> None:
        self.settings = settings
        self.database = database
        self.metrics = metrics or Metrics()
        self.metrics.trim_horizon.set(settings.trim_horizon)
        for mode in ("listen", "poll"):
            self.metrics.mode.labels(mode).set(1 if settings.mode == mode else 0)
        self.clock: Clock = clock or SystemClock()
        # Who this replica is and who it sees live: the replica's, this pair's view of it.
        self.roster = roster
        self.replica_id = roster.membership.me
        self.db_clock = DatabaseClock()
        # Whether the record statements can write: the recorder judges it, /readyz reports it.
        self.writes = WriteHealth()
        self.vitals = Vitals(settings, database.install, self.metrics, self.clock, self.writes)
        # Rung while the notifications come fast (listen mode only: in poll mode nobody hears
        # them, and the trigger is best installed with --no-notify).
        self.doorbell = Doorbell(
            settings.doorbell_rate if settings.mode == "listen" else 0,
            settings.poll_interval,
            database.grace,
        )
        self.hook_runner: HookRunner | None = None
        if hooks:
            self.hook_runner = HookRunner(
                settings,
                database,
                dict(hooks),
                self.metrics,
                replica=self.replica_id,
                wake=lambda: self.schedule.hasten("hooks"),
            )
        # Runs even without hooks configured: rows queued under an earlier configuration age too.
        self.hook_retention = HookRetention(settings, database, is_stopping=lambda: self.stopping)
        self.recorder = Recorder(
            database,
            self.metrics,
            on_recorded=self.hook_runner.wake if self.hook_runner else None,
            clock=self.clock,
            writes=self.writes,
        )
        self.queue = WorkQueue(self.replica_id, capacity=settings.max_pending)
        self.dispatcher = Dispatcher(
            self.queue,
            lambda jobs, alone: self.recorder.record(jobs, alone),
            self.clock,
            self.metrics,
            concurrency=RECORD_CONCURRENCY,
            batch_size=settings.batch_size,
        )
        self.members = PairMembership(self)
        # Nothing the channel says is acted on before the tables confirm it: any role that
        # can connect can NOTIFY (see reactor.listen.hints).
        self.verifier = Verifier(
            database,
            self.clock,
            liveness=LIVENESS_PROBES * settings.probe_interval,
            # A lookup by primary key answers in milliseconds; a second, at least, keeps a
            # loaded machine or a pooler's hop from giving up a healthy one.
            timeout=max(settings.probe_timeout, VERIFY_TIMEOUT_FLOOR),
            arm=lambda job_id, due_in: self.dispatcher.intake(LISTEN.hints([(job_id, due_in)])),
            left=self.members.left,
            joined=self.members.joined,
            reread=lambda: self.request_scan(rearm=True),
            on_unverified=self._count_unverified,
        )
        self.reconciler: Reconciler | None = None
        if settings.reconcile_interval > 0:
            self.reconciler = Reconciler(
                database,
                self.metrics,
                owner=self.replica_id,
                interval=settings.reconcile_interval,
                arm=lambda job_id, delay: self.dispatcher.intake(
                    RECONCILE.hints([(job_id, delay)])
                ),
                clock=self.clock,
            )
        self.poll = PairPoll(self)
        self.scanner = PairScan(self)
        self.cadence = self._cadence()
        self.schedule = Scheduler(
            self.cadence,
            self.clock,
            self._duties(),
            on_failure=self._duty_failed,
            failures=db.DATABASE_ERRORS,
        )
        # The replica's LISTEN session (None: polling), which the replica runs.
        self.listener = listener
        # The pair's side of that session.
        self.subscriber = Subscriber(
            database,
            self.metrics,
            on_job=self._on_notified,
            on_listening=lambda: self.request_scan(rearm=True),
            on_replica=lambda replica, left: self.verifier.replica(replica, left=left),
            on_rang=self._on_rang,
            # At once, not at the next check: its heartbeat names the session, which tells the
            # others at once if this process is killed.
            on_proven=lambda: self.schedule.hasten("health"),
            on_changed=self.poll_if_needed,
            shares=self.members.heard_shares,
        )
        if self.listener is not None:
            self.listener.subscribe(self.subscriber)
        self._health_check = db.HealthCheck(
            replica=self.replica_id,
            liveness=LIVENESS_PROBES * settings.probe_interval,
            retention=settings.hook_retention,
        )
        self._stopping = anyio.Event()
        self._work = anyio.CancelScope()
        self._work_group: anyio.abc.TaskGroup | None = None

    def _cadence(self) -> Cadence:
        settings = self.settings
        cadence = Cadence()
        # Both through the pool: the LISTEN session only listens. A failed check is tried again at
        # once (a connection of the pool may have died), then every interval.
        cadence.add(
            "health",
            settings.probe_interval,
            retry=lambda failures: 0.0 if failures == 1 else settings.probe_interval,
        )
        cadence.add("poll", settings.poll_interval, retry=lambda failures: settings.poll_interval)
        # After a failed scan, try again soon (the database is likely back within seconds and
        # the jobs it missed are waiting), backing off up to the normal interval.
        cadence.add("scan", settings.scan_interval, retry=backoff(0.5, settings.scan_interval))
        if self.reconciler is not None:
            cadence.add(
                "reconcile", settings.reconcile_interval, retry=backoff(0.5, MAX_ERROR_WAIT)
            )
        if self.hook_runner is not None:
            # Brought forward whenever runs are recorded or a slot comes free; the scan interval
            # is its ceiling, so rows other replicas queued are found too.
            cadence.add("hooks", settings.scan_interval, retry=lambda _: settings.probe_interval)
        # Only when the health check sees settled rows past their retention; a failed purge
        # waits for the next check that sees them again.
        cadence.add("retention", math.inf, retry=lambda _: math.inf, first_at=math.inf)
        return cadence

    def _duties(self) -> dict[str, Action]:
        duties: dict[str, Action] = {
            "health": lambda: check_pair(self),
            "poll": self.poll.run,
            "scan": self.scanner.duty,
        }
        if self.reconciler is not None:
            duties["reconcile"] = self.reconciler.step
        if self.hook_runner is not None:
            runner = self.hook_runner
            duties["hooks"] = lambda: runner.claim(self._working())
        duties["retention"] = self._purge
        return duties

    def _working(self) -> anyio.abc.TaskGroup:
        # The group the duties run in, where a claimed hook's attempt runs on after its claim.
        assert self._work_group is not None, "duties run only while the reactor runs"
        return self._work_group

    async def _purge(self) -> None:
        await self.hook_retention.purge()

    @property
    def membership(self) -> Membership:
        """Who this replica sees live, itself included once its first heartbeat is back."""
        return self.roster.membership

    @property
    def database_ok(self) -> bool | None:
        """Whether the database answered the last check (None before the first)."""
        return self.vitals.database_ok

    @property
    def polling(self) -> bool:
        """True when timers come from polling the queue rather than from notifications: they
        cannot be relied on, or the doorbell is (or was, within a grace) awake."""
        return self.vitals.polling(self.listener) or self.doorbell.covers(self.clock.now())

    @property
    def rings_doorbell(self) -> bool:
        """Whether this pair rings its doorbell under a stream: only a trigger that notifies its
        channel reads it, spread over a channel per share or not."""
        return self.vitals.trigger == "notifies"

    @property
    def polls(self) -> int:
        """The polls of the queue run so far."""
        return self.poll.runs

    @property
    def holding(self) -> bool:
        """True once this replica's first re-arm read its share of the queue: from then on it
        heartbeats, and the others leave that share to it."""
        return self.scanner.holding

    @property
    def scans(self) -> int:
        """The fallback scans run so far."""
        return self.scanner.runs

    @property
    def scan_pending(self) -> bool:
        """True while a fallback scan is asked for, running, or waiting to retry a failure."""
        return self.scanner.pending

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopping.is_set()

    @property
    def takeover_delay(self) -> float:
        """How long a frozen or cut-off replica keeps its jobs before others take them (a
        killed one: until the others' next check, one probe interval)."""
        return (LIVENESS_PROBES + 1) * self.settings.probe_interval

    def request_scan(self, *, rearm: bool = False) -> None:
        """Run the fallback scan soon; with ``rearm``, also offer upcoming jobs from the queue."""
        self.scanner.request(rearm=rearm)

    async def scan(self, *, rearm: bool) -> int:
        """One fallback pass: offer upcoming jobs if asked, then record the due backlog, oldest
        first, leaving out the jobs this replica's work queue holds a claim of. Returns the runs
        recorded; raises when the database failed the pass (a re-arm asked for is kept for the
        retry)."""
        return await self.scanner.run(rearm=rearm)

    def stop(self) -> None:
        """Stop intake now and give in-flight work ``settings.drain`` seconds to finish."""
        if self._stopping.is_set():
            return
        log.info("stopping: intake closed, draining", extra={"drain_s": self.settings.drain})
        self._stopping.set()
        if self.listener is not None:
            # The session ends once the last pair has left it.
            self.listener.unsubscribe(self.subscriber)
        self._work.deadline = anyio.current_time() + self.settings.drain
        self.dispatcher.close()
        self.verifier.close()
        self.schedule.close()
        if self._work_group is not None:
            # Hand this replica's jobs over now, not after the drain: its timers stop here.
            self._work_group.start_soon(self.leave)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until :meth:`stop`; ``task_status`` fires once the listener's first attempt is
        over, up or not (polling: at once). The work does not wait for it."""
        self.request_scan(rearm=True)
        with self._work:
            async with anyio.create_task_group() as work:
                self._work_group = work
                work.start_soon(self.dispatcher.run, work)
                work.start_soon(self.verifier.run)
                work.start_soon(self.schedule.run, work)
                if self.listener is not None:
                    await self._first_listen_attempt(self.listener)
                task_status.started()
        if self._work.cancel_called:
            log.warning("drain deadline passed; unfinished statements were rolled back")
        if self.reconciler is not None:
            await self.reconciler.release()
        # Again after the drain: a health check still in flight at stop() may have written the
        # heartbeat back after the first leave deleted it; nothing checks any more now.
        await self.leave()
        log.info("stopped")

    async def leave(self) -> None:
        """Drop this replica's heartbeat of the pair: the others hear it at once, rather than
        when it goes stale."""
        with anyio.move_on_after(2, shield=True), contextlib.suppress(*db.DATABASE_ERRORS):
            await self.database.leave(self.replica_id)

    def health(self) -> tuple[bool, bool, str]:
        """(alive, ready, reason): what /healthz and /readyz report.

        Alive: a health check began within a few probe intervals, on either road (the task
        group is not wedged). Ready: see :meth:`Vitals.readiness`.
        """
        began = self.cadence.duties["health"].last_begun
        stale = self.clock.now() - began > 3 * self.settings.probe_interval + 10
        alive = not self.stopping and not (self.vitals.database_ok is not None and stale)
        if self.stopping:
            return alive, False, "stopping"
        ready, reason = self.vitals.readiness(self.listener)
        return alive, ready, reason

    # The duties.

    def health_ask(self, probe: str | None) -> dict[str, Any]:
        """The parameters of this pair's health check now, carrying ``probe`` (see
        :func:`reactor.insurance.health.check_pair`). Once a probe proved the LISTEN session ours,
        its heartbeat names that session."""
        listener = self.listener
        return db.health_params(
            self.database.install,
            self.database.grace,
            self._health_check,
            probe,
            session_pid=None if listener is None else listener.session_pid,
            holding=self.scanner.holding,
            write_error=self.writes.problem,
        )

    def saw(self, health: db.Health, sent: float) -> None:
        """What this pair's health check read, sent at ``sent``: judged as its own."""
        self.db_clock.observe(health.database_time, sent, self.clock.now())
        spread = self.vitals.trigger_spread
        self.vitals.saw(health)
        self.doorbell.saw(self.clock.now(), health.bell_in)
        self.schedule.pace("health", self.vitals.check_interval)
        if self.vitals.trigger_spread != spread and self.listener is not None:
            self.listener.refresh(self.subscriber)
        if health.reconcile_requested and self.reconciler is not None:
            self.schedule.hasten("reconcile")
        if health.hooks_expired:
            self.schedule.hasten("retention")
        self.hook_retention.saw(health.hooks_overdue, self.vitals.check_interval)
        if health.hooks_orphaned and self.hook_runner is not None:
            # A dead replica's running hook calls are due now: run them again at once.
            self.hook_runner.wake()
        self.members.see_lost(self.roster.heartbeats(frozenset(health.live_replicas)))
        self.subscriber.report(self.clock.now())
        self.verifier.report()
        self.poll_if_needed()

    def poll_if_needed(self) -> None:
        """Wake the poll, which sleeps while notifications are relied on (see
        :class:`~reactor.insurance.health.PairPoll`), when they may no longer be: called as the
        LISTEN session changes state and after each check (the trigger's state, the NOTIFY
        queue's usage). A poll already on its cadence is left to it: brought forward at every
        check, a fleet's replica would poll more often than its share of the fleet's polls."""
        if self.polling and self.cadence.duties["poll"].next_at == math.inf:
            self.schedule.hasten("poll")

    def _duty_failed(self, name: str, error: BaseException) -> None:
        if name == "health":
            self.vitals.failed(error)
        elif name == "scan":
            self.metrics.record_errors.inc()
            log.warning("scan failed, will retry", extra={"error": db.first_line(error)})
        elif name == "hooks":
            log.warning("hook claim failed", extra={"error": db.first_line(error)})
        elif name == "retention":
            log.warning("hook retention failed", extra={"error": db.first_line(error)})
        elif name == "poll":
            # The check says so when the database is down.
            log.debug("poll failed", extra={"error": db.first_line(error)})
            if not self.cadence.duties["poll"].failures:
                # The next poll starts a fresh window: the deadlines this one would have read
                # are the scan's, asked for at the first failure in a row (its own backoff
                # paces it while the database stays away), which runs as the database answers.
                self.request_scan(rearm=True)

    # What the listener hears.

    def _on_notified(self, job_id: str, updated_at: float | None) -> None:
        # Verified against the queue before it is armed, at the deadline the job row gives:
        # the hint's own updated_at is the sender's word. A job another live replica owns is
        # left to it unverified, with no deadline: it costs nothing here.
        if job_id in self.queue or self.queue.membership.owns(job_id):
            self.verifier.job(job_id)
        else:
            self.dispatcher.intake(LISTEN.hints([(job_id, None)]))
        if self.rings_doorbell and self.doorbell.heard(self.clock.now()):
            # The next poll rings it; from then on the app's commits stop notifying.
            self.schedule.hasten("poll")

    def _on_rang(self) -> None:
        # The app's commits may have stopped notifying: poll from now on, before any job they
        # queued comes due.
        self.doorbell.told()
        self.schedule.hasten("poll")

    def _count_unverified(self, kind: str, count: int) -> None:
        self.metrics.notified["dropped" if kind == "dropped" else "unverified"].inc(count)

    async def _first_listen_attempt(self, listener: Listener) -> None:
        # Whichever comes first: the listener's first attempt ends, or stop() is called.
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, listener.settled)
            tg.start_soon(wait, self._stopping)
