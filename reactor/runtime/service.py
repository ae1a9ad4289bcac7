"""One pair's runnable under its replica (:mod:`reactor.runtime.replica`): its parts, each
built with the parts it uses.

- :mod:`reactor.claim.dispatch` owns every claim: the LISTEN session, the poll, the scan's
  re-arm, the reconcile and the recorder's retries offer jobs to one work queue, which hands
  out the due ones this replica owns, one claim per job at a time, to the recorder.
- Each insurance pass (:mod:`~reactor.insurance.health`, :mod:`~reactor.insurance.poll`,
  :mod:`~reactor.insurance.scan`, :mod:`~reactor.insurance.reconcile`,
  :mod:`~reactor.insurance.retention`) declares its own cadence; the pair runs those it has on
  one :class:`~reactor.insurance.cadence.Scheduler`, all through the pool.
- What the LISTEN session names goes from the pair's subscriber to its verifier and work
  queue, never through here; the session's state goes to :mod:`reactor.runtime.hearing`.
- :mod:`reactor.runtime.vitals` keeps what the checks saw; :mod:`reactor.core.ownership` who
  is live.

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
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc

from reactor import db
from reactor.claim.dispatch import Dispatcher, WorkQueue
from reactor.core.clock import Clock, SystemClock
from reactor.core.dbclock import DatabaseClock
from reactor.core.ownership import LIVENESS_PROBES, Membership, Roster
from reactor.hooks import Hook, HookRunner
from reactor.hooks.runner import HOOKS
from reactor.insurance import health as pair_health
from reactor.insurance import poll, reconcile, retention, scan
from reactor.insurance.cadence import Cadence, Every, Scheduler
from reactor.insurance.health import PairCheck
from reactor.insurance.poll import PairPoll
from reactor.insurance.reconcile import Reconciler
from reactor.insurance.retention import HookRetention
from reactor.insurance.scan import PairScan
from reactor.listen.hints import Verifier
from reactor.listen.listener import Listener
from reactor.listen.subscriber import Subscriber
from reactor.record.recorder import Recorder
from reactor.record.writes import WriteHealth
from reactor.runtime.hearing import PairHearing
from reactor.runtime.membership import PairMembership
from reactor.runtime.view import ListenerView, PairView, lateness_buckets
from reactor.runtime.vitals import Vitals
from reactor.settings.config import Settings
from reactor.telemetry.metrics import Metrics

# The least time a batch of hints is given to be verified (see Verifier).
VERIFY_TIMEOUT_FLOOR_S = 1.0

log = logging.getLogger(__name__)

# Record statements in flight at once: enough that one stuck on a frozen backend does not stop
# the rest, few enough to leave the pool room for the scan and the probes.
RECORD_CONCURRENCY = 4
POOL_SIZE = RECORD_CONCURRENCY + 3


class Reactor:
    """One pair's reactor, a runnable of its :class:`~reactor.runtime.replica.Replica`, running
    against ``database`` under the replica's identity (``roster``) and LISTEN session. It builds
    each part with the parts it uses and composes the duties' cadence; what its LISTEN session
    hears goes to its verifier and work queue without coming back here."""

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
        self.metrics = metrics = metrics or Metrics()
        metrics.trim_horizon.set(settings.trim_horizon)
        for mode in ("listen", "poll"):
            metrics.mode.labels(mode).set(1 if settings.mode == mode else 0)
        self.clock = clock = clock or SystemClock()
        # Who this replica is and who it sees live: the replica's, this pair's view of it.
        self.roster = roster
        self.replica_id = roster.membership.me
        self.db_clock = DatabaseClock()
        # The replica's LISTEN session (None: polling), which the replica runs.
        self.listener = listener
        # Whether the record statements can write: the recorder judges it, /readyz reports it.
        self.writes = WriteHealth()
        self.vitals = Vitals(settings, database.install, metrics, clock, self.writes)
        self._stopping = anyio.Event()
        self.schedule = Scheduler(
            Cadence(), clock, {}, on_failure=self._duty_failed, failures=db.DATABASE_ERRORS
        )
        self.cadence = self.schedule.cadence
        self.hook_runner: HookRunner | None = None
        if hooks:
            self.hook_runner = HookRunner(
                settings,
                database,
                dict(hooks),
                metrics,
                replica=self.replica_id,
                schedule=self.schedule,
            )
        # Runs even without hooks configured: rows queued under an earlier configuration age too.
        self.hook_retention = HookRetention(settings, database, stopping=self._stopping)
        self.recorder = Recorder(
            database, metrics, hooks=self.hook_runner, clock=clock, writes=self.writes
        )
        self.queue = WorkQueue(self.replica_id, capacity=settings.max_pending)
        self.dispatcher = Dispatcher(
            self.queue,
            self.recorder,
            clock,
            metrics,
            concurrency=RECORD_CONCURRENCY,
            batch_size=settings.batch_size,
        )
        self.scanner = PairScan(
            settings,
            database,
            queue=self.queue,
            intake=self.dispatcher,
            recorder=self.recorder,
            backlog=self.vitals,
            schedule=self.schedule,
            metrics=metrics,
            clock=clock,
        )
        self.poll = PairPoll(
            settings,
            database,
            queue=self.queue,
            intake=self.dispatcher,
            seen=self.vitals,
            listener=listener,
            schedule=self.schedule,
            metrics=metrics,
            clock=clock,
        )
        self.doorbell = self.poll.doorbell
        self.members = PairMembership(
            roster,
            self.queue,
            metrics,
            listener=listener,
            channel=database.install.channel,
            rescan=self.scanner,
            spread=self.vitals,
        )
        # Nothing the channel says is acted on before the tables confirm it: any role that
        # can connect can NOTIFY (see reactor.listen.hints).
        self.verifier = Verifier(
            database,
            clock,
            liveness=LIVENESS_PROBES * settings.probe_interval,
            # A lookup by primary key answers in milliseconds; a second, at least, keeps a
            # loaded machine or a pooler's hop from giving up a healthy one.
            timeout=max(settings.probe_timeout, VERIFY_TIMEOUT_FLOOR_S),
            intake=self.dispatcher,
            members=self.members,
            rescan=self.scanner,
            metrics=metrics,
        )
        self.reconciler: Reconciler | None = None
        if settings.reconcile_interval > 0:
            self.reconciler = Reconciler(
                database,
                metrics,
                owner=self.replica_id,
                interval=settings.reconcile_interval,
                intake=self.dispatcher,
                clock=clock,
            )
        self._compose()
        # The pair's side of the LISTEN session: the jobs and the replicas it names go to the
        # verifier, the rest to the parts that act on it.
        hearing = PairHearing(self.scanner, self.poll, self.schedule, self.members)
        self.subscriber = Subscriber(database, metrics, self.verifier, hearing)
        if listener is not None:
            listener.subscribe(self.subscriber)
        self._health_check = db.HealthCheck(
            replica=self.replica_id,
            liveness=LIVENESS_PROBES * settings.probe_interval,
            retention=settings.hook_retention,
        )
        self._work = anyio.CancelScope()
        self._work_group: anyio.abc.TaskGroup | None = None

    def _compose(self) -> None:
        # Each pass declares its own cadence; the pair runs the ones it has.
        settings, schedule = self.settings, self.schedule
        schedule.add(pair_health.every(settings), PairCheck(self, self.listener, self.clock).run)
        schedule.add(poll.every(settings), self.poll.run)
        schedule.add(scan.every(settings), self.scanner.duty)
        if self.reconciler is not None:
            schedule.add(reconcile.every(settings), self.reconciler.step)
        if self.hook_runner is not None:
            # Brought forward whenever runs are recorded or a slot comes free; the scan interval
            # is its ceiling, so rows other replicas queued are found too.
            every = Every(HOOKS, settings.scan_interval, retry=lambda _: settings.probe_interval)
            schedule.add(every, self._claim_hooks)
        schedule.add(retention.every(settings), self.hook_retention.duty)

    async def _claim_hooks(self) -> float | None:
        # In the group the duties run in, where a claimed hook's attempt runs on after its claim.
        assert self.hook_runner is not None
        assert self._work_group is not None
        return await self.hook_runner.claim(self._work_group)

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
        """True when timers come from polling the queue (see :attr:`PairPoll.polling`)."""
        return self.poll.polling

    @property
    def rings_doorbell(self) -> bool:
        """Whether this pair rings its doorbell (see :attr:`PairPoll.rings_doorbell`)."""
        return self.poll.rings_doorbell

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
        :class:`reactor.insurance.health.PairCheck`). Once a probe proved the LISTEN session ours,
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
        self.verifier.serving(self.dispatcher.live)
        self.subscriber.report(self.clock.now())
        self.verifier.report()
        self.poll_if_needed()

    def poll_if_needed(self) -> None:
        """Wake the poll if notifications may no longer be relied on (see
        :meth:`PairPoll.wake_if_needed`)."""
        self.poll.wake_if_needed()

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

    def view(self) -> PairView:
        """What the operator's page shows of this pair, read now."""
        listener = self.listener
        _, ready, reason = self.health()
        return PairView(
            replica_id=self.replica_id,
            mode=self.settings.mode,
            ready=ready,
            reason=reason,
            listener=None if listener is None else ListenerView.of(listener),
            polling=self.polling,
            trigger=self.vitals.trigger,
            live=frozenset(self.membership.live),
            deadlines=len(self.queue),
            lateness=tuple(lateness_buckets(self.metrics)),
            recent=tuple(self.recorder.recent),
        )

    def wake_hooks(self) -> None:
        """Claim hook rows now (an operator re-queued some), if this pair runs hooks."""
        if self.hook_runner is not None:
            self.hook_runner.wake()

    async def _first_listen_attempt(self, listener: Listener) -> None:
        # Whichever comes first: the listener's first attempt ends, or stop() is called.
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, listener.settled)
            tg.start_soon(wait, self._stopping)
