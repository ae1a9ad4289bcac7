"""The sidecar: listener, timer loop and fallback scan in one structured task group.

Startup never waits for LISTEN: the scan, the timers and the hooks start at once, and the
reactor polls (each scan re-arms timers) until LISTEN is up; a bad or unreachable listen DSN
costs lateness, never work. When LISTEN comes up it asks for another scan with a re-arm, so
nothing that finished before it was listening falls through the gap. Shutdown is ordered:
:meth:`Reactor.stop` stops intake (the listener and new scans) at once, lets in-flight record
statements finish within the drain deadline, then cancels what is left; a record statement cut
short rolls back and loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

import anyio
import anyio.abc

from reactor import db
from reactor.config import Settings
from reactor.dbclock import DatabaseClock
from reactor.deadlines import Deadlines
from reactor.hooks import Hook, HookRetention, HookRunner
from reactor.listener import Listener
from reactor.metrics import TRIGGER_STATES, Metrics
from reactor.ownership import Membership
from reactor.reconcile import Reconciler
from reactor.recorder import DATABASE_ERRORS, Recorder

log = logging.getLogger(__name__)

# Past this share of the NOTIFY queue, the app's commits are at risk (they fail when it is full),
# and the job trigger stops notifying (migration 0008): the reactors poll instead.
QUEUE_WARNING = 0.5

# Record statements in flight at once: enough that one stuck on a frozen backend does not stop
# the rest, few enough to leave the pool room for the scan and the probes.
RECORD_CONCURRENCY = 4
POOL_SIZE = RECORD_CONCURRENCY + 3

# A replica is live while its heartbeat (one per probe interval) is younger than this many probe
# intervals: a slow check or two does not hand its jobs away.
LIVENESS_PROBES = 3

# How far past its grace the oldest queued job may be, as a health check sees it, before the
# periodic scan stops being skipped. A job a few milliseconds late is most likely one whose
# claim was in flight, and the timers' own retries (a row another replica held) come back
# within a second: a scan would only race them.
OVERDUE_TOLERANCE = 1.0

# Most queued jobs one poll arms; more (a burst) are read by the next poll, from where it ended.
POLL_LIMIT = 10_000


def trigger_state(trigger_channel: str | None, channel: str) -> str:
    """What the job trigger does for a replica listening on ``channel``: ``notifies`` it,
    queues without notifying anyone (``quiet``), notifies ``elsewhere``, or is ``missing``
    (or disabled), given the channel the trigger notifies ('' for none; None when missing)."""
    if trigger_channel is None:
        return "missing"
    if trigger_channel == "":
        return "quiet"
    return "notifies" if trigger_channel == channel else "elsewhere"


class Reactor:
    """One replica of the reactor, running against ``database``."""

    def __init__(
        self,
        settings: Settings,
        database: db.Database,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        listen_dsn: str | None = None,
        hooks: Mapping[str, Hook] | None = None,
    ) -> None:
        self.settings = settings
        self.database = database
        self.metrics = metrics or Metrics()
        self.metrics.trim_horizon.set(settings.trim_horizon)
        for mode in ("listen", "poll"):
            self.metrics.mode.labels(mode).set(1 if settings.mode == mode else 0)
        self.clock = clock
        self.replica_id = f"reactor-{uuid.uuid4().hex[:12]}"
        # Who claims what: until the first heartbeat this replica sees nobody, itself included,
        # and claims everything it fires.
        self.membership = Membership(self.replica_id)
        # Replicas that said they stopped (replica_leave): never live again, whatever a
        # heartbeat of theirs still in flight says. Ids are unique to a process.
        self._departed: set[str] = set()
        self.db_clock = DatabaseClock()
        self.deadlines: Deadlines[str] = Deadlines()
        # Jobs this replica found itself (the reconcile): nobody else was told, so it claims them
        # whoever owns them.
        self._adopted: set[str] = set()
        self.hook_runner: HookRunner | None = None
        if hooks:
            self.hook_runner = HookRunner(
                settings, database, dict(hooks), self.metrics, is_stopping=lambda: self.stopping
            )
        # Runs even without hooks configured: rows queued under an earlier configuration age too.
        self.hook_retention = HookRetention(settings, database, is_stopping=lambda: self.stopping)
        self.recorder = Recorder(
            database,
            self.metrics,
            on_recorded=self.hook_runner.wake if self.hook_runner else None,
            on_stuck=lambda job_id: self.arm(job_id, 0.0),
        )
        self.reconciler: Reconciler | None = None
        if settings.reconcile_interval > 0:
            self.reconciler = Reconciler(
                database,
                self.metrics,
                owner=self.replica_id,
                interval=settings.reconcile_interval,
                arm=self.adopt,
                is_stopping=lambda: self.stopping,
            )
        self.listener: Listener | None = None
        if settings.mode == "listen":
            self.listener = Listener(
                settings,
                database,
                self.metrics,
                on_job=self._on_notified,
                on_listening=lambda: self.request_scan(rearm=True),
                on_left=self._on_replica_left,
                check=self._check_on,
                poll=self._poll,
                poll_due=self._poll_due,
                dsn=listen_dsn or settings.listen_database_url or settings.require_database(),
            )
        self._health_check = db.HealthCheck(
            replica=self.replica_id,
            liveness=LIVENESS_PROBES * settings.probe_interval,
            retention=settings.hook_retention,
            channel=settings.channel,
        )
        self.scans = 0
        self._scanning = False
        self.polls = 0
        # The queue poll: when the last one started, and where the next one's window begins.
        self._last_poll = -math.inf
        self._poll_low: datetime | None = None
        # Health, as the last check saw it: None until the first one.
        self.database_ok: bool | None = None
        # The last check failed because the server is a read-only hot standby.
        self.database_read_only = False
        self.last_watch = -math.inf
        # When the last check started (from either road), and when one last answered.
        self._last_check = -math.inf
        self._last_seen = -math.inf
        # True while the NOTIFY queue is so full that the trigger skips its notifications.
        self.notify_skipped = False
        # The channel the job trigger notifies, as the last check read it from the catalog: ''
        # when it was installed not to notify, None when it is missing or disabled. Until the
        # first check, the channel this replica listens on.
        self.trigger_channel: str | None = settings.channel
        self._trigger_known = False
        # How long past its grace the oldest queued job waits, as the last health check saw.
        self.oldest_overdue = math.inf
        self._wake = anyio.Event()
        self._scan_requested = anyio.Event()
        self._rearm_wanted = False
        self._stopping = anyio.Event()
        self._intake = anyio.CancelScope()
        self._work = anyio.CancelScope()
        self._slots = anyio.Semaphore(RECORD_CONCURRENCY)
        # The task group the record statements run in, while the reactor runs.
        self._work_group: anyio.abc.TaskGroup | None = None

    @property
    def polling(self) -> bool:
        """True when timers come from polling the queue rather than from notifications."""
        if self.listener is None or not self.listener.delivering or self.notify_skipped:
            return True
        return trigger_state(self.trigger_channel, self.settings.channel) != "notifies"

    @property
    def scan_pending(self) -> bool:
        """True while a fallback scan is asked for or running."""
        return self._scanning or self._scan_requested.is_set()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopping.is_set()

    def arm(self, job_id: str, delay: float) -> None:
        """Fire ``job_id`` after ``delay`` seconds (replacing any earlier arming)."""
        if job_id not in self.deadlines and len(self.deadlines) >= self.settings.max_pending:
            self.metrics.deadlines_dropped.inc()
            return
        if self.deadlines.schedule(job_id, self.clock() + max(0.0, delay)):
            self._wake.set()
        self.metrics.deadlines_pending.set(len(self.deadlines))

    def adopt(self, job_id: str, delay: float) -> None:
        """Like :meth:`arm`, for a job this replica must claim itself, whoever owns it."""
        self._adopted.add(job_id)
        self.arm(job_id, delay)

    @property
    def takeover_delay(self) -> float:
        """How long a dead, frozen or cut-off replica keeps its jobs before others take them."""
        return (LIVENESS_PROBES + 1) * self.settings.probe_interval

    def request_scan(self, *, rearm: bool = False) -> None:
        """Run the fallback scan soon; with ``rearm``, also re-arm timers from the database."""
        self._rearm_wanted |= rearm
        self._scan_requested.set()

    def stop(self) -> None:
        """Stop intake now and give in-flight work ``settings.drain`` seconds to finish."""
        if self._stopping.is_set():
            return
        log.info("stopping: intake closed, draining", extra={"drain_s": self.settings.drain})
        self._stopping.set()
        self._intake.cancel()
        self._work.deadline = anyio.current_time() + self.settings.drain
        self._wake.set()
        self._scan_requested.set()
        if self._work_group is not None:
            # Hand this replica's jobs over now, not after the drain: its timers stop here.
            self._work_group.start_soon(self._leave)
        if self.hook_runner is not None:
            self.hook_runner.wake()
        if self.reconciler is not None:
            self.reconciler.wake()
        self.hook_retention.wake()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run until :meth:`stop`; ``task_status`` fires once the listener's first attempt is
        over, up or not (polling: at once). The work does not wait for it."""
        async with anyio.create_task_group() as intake:
            self.request_scan(rearm=True)
            with self._work:
                async with anyio.create_task_group() as work:
                    self._work_group = work
                    work.start_soon(self._timer_loop, work)
                    work.start_soon(self._scan_loop)
                    work.start_soon(self._poll_loop)
                    work.start_soon(self._watch_loop)
                    if self.hook_runner is not None:
                        work.start_soon(self.hook_runner.run)
                    if self.reconciler is not None:
                        work.start_soon(self.reconciler.run)
                    work.start_soon(self.hook_retention.run)
                    if self.listener is not None:
                        intake.start_soon(self._listen)
                        await self._first_listen_attempt(self.listener)
                    task_status.started()
            intake.cancel_scope.cancel()
        if self._work.cancel_called:
            log.warning("drain deadline passed; unfinished statements were rolled back")
        # Again after the drain: a health check still in flight at stop() may have written the
        # heartbeat back after the first leave deleted it; nothing checks any more now.
        await self._leave()
        log.info("stopped")

    async def _leave(self) -> None:
        # Rather than when its heartbeat goes stale: the others hear it at once.
        with anyio.move_on_after(2, shield=True), contextlib.suppress(*DATABASE_ERRORS):
            await self.database.leave(self.replica_id, self.settings.channel)

    def health(self) -> tuple[bool, bool, str]:
        """(alive, ready, reason): what /healthz and /readyz report.

        Alive: the watch loop has turned within a few probe intervals (the task group is not
        wedged). Ready: the database answered the last check and, in listen mode, LISTEN is up
        and its last delivery probe came back.
        """
        stale = anyio.current_time() - self.last_watch > 3 * self.settings.probe_interval + 10
        alive = not self.stopping and not (self.database_ok is not None and stale)
        if self.stopping:
            return alive, False, "stopping"
        if self.database_ok is False and self.database_read_only:
            return (
                alive,
                False,
                "the database is a read-only hot standby; waiting for a writable one "
                "(target_session_attrs=read-write)",
            )
        if not self.database_ok:
            return alive, False, "database unreachable" if self.database_ok is False else "starting"
        state = trigger_state(self.trigger_channel, self.settings.channel)
        if state == "missing":
            return alive, False, "the job trigger is missing or disabled; run `reactor migrate`"
        if self.listener is not None:
            if self.listener.state == "connecting":
                problem = self.listener.problem
                if problem is None:
                    return alive, False, "LISTEN connection not up yet; polling"
                return alive, False, f"LISTEN connection down: {problem}; polling, reconnecting"
            if self.listener.state == "degraded":
                return alive, False, "probe notifications do not arrive (pooler?); polling"
            if not self.listener.proven:
                return alive, False, "waiting for the first delivery probe"
            if state == "elsewhere":
                return (
                    alive,
                    False,
                    (
                        f"the job trigger notifies channel {self.trigger_channel!r}, not "
                        f"REACTOR_CHANNEL {self.settings.channel!r}; polling"
                    ),
                )
        return alive, True, "ok"

    async def _watch_loop(self) -> None:
        # The health check runs once per probe interval: on the LISTEN connection while the
        # listener carries it (one round trip proves that connection too), through the pool
        # otherwise. This loop steps in when the listener does not: not proven, reconnecting,
        # or no listener at all; it waits out a check the listener may still have in flight.
        while not self.stopping:
            self.last_watch = anyio.current_time()
            carried = self.listener is not None and self.listener.checking
            due = self._last_check + self.settings.probe_interval
            if carried:
                due += self.settings.probe_timeout
            now = anyio.current_time()
            if now < due:
                # At least once per probe interval, for /healthz and to notice the listener
                # giving the check back.
                await self._sleep_until(min(due, now + self.settings.probe_interval))
                continue
            self._last_check = now
            try:
                await self._check()
            except DATABASE_ERRORS as error:
                if self.database_ok is not False:
                    log.warning("database check failed", extra={"error": db.first_line(error)})
                self.database_ok = False
                self.database_read_only = db.read_only_server(error)

    async def _check_on(self, conn: db.AnyConnection, probe: str | None) -> None:
        # The listener's turn: the check on its own connection, with its probe if any.
        self._last_check = anyio.current_time()
        await self._check(probe, conn)

    async def _check(self, probe: str | None = None, conn: db.AnyConnection | None = None) -> None:
        sent = self.clock()
        with anyio.fail_after(self.settings.probe_timeout):
            health = await self.database.health(self._health_check, probe=probe, conn=conn)
        self.db_clock.observe(health.database_time, sent, self.clock())
        self._see_health(health)

    def _see_health(self, health: db.Health) -> None:
        self.database_ok = True
        self.database_read_only = False
        self._last_seen = anyio.current_time()
        usage = health.queue_usage
        self.metrics.queue_usage.set(usage)
        self.metrics.oldest_age.set(health.oldest_overdue)
        self.oldest_overdue = health.oldest_overdue
        self.metrics.hook_backlog.set(health.hook_backlog)
        self.metrics.hook_failed.set(health.hook_failed)
        self.metrics.set_aside_jobs.set(health.set_aside)
        self.metrics.reconcile_last_pass.set(health.reconcile_last_pass)
        if health.reconcile_requested and self.reconciler is not None:
            self.reconciler.wake()
        if health.hooks_expired:
            self.hook_retention.wake()
        if usage >= QUEUE_WARNING and not self.notify_skipped:
            log.error(
                "the NOTIFY queue is half full: a session is LISTENing without reading "
                "(idle in transaction, frozen, or a dead connection); the job trigger "
                "skips its notifications until it drains, and the reactor polls",
                extra={"queue_usage": round(usage, 3)},
            )
        self.notify_skipped = usage >= QUEUE_WARNING
        self._see_trigger(health.trigger_channel)
        self._see_replicas(frozenset(health.live_replicas))

    def _see_trigger(self, channel: str | None) -> None:
        known, self._trigger_known = self._trigger_known, True
        if known and channel == self.trigger_channel:
            return
        self.trigger_channel = channel
        state = trigger_state(channel, self.settings.channel)
        for each in TRIGGER_STATES:
            self.metrics.job_trigger.labels(each).set(1 if each == state else 0)
        extra = {"trigger_channel": channel, "channel": self.settings.channel}
        if state == "missing":
            log.error(
                "the job trigger on analysis_jobs is missing or disabled: finished jobs are not "
                "queued, only the reconcile finds them; run `reactor migrate`",
                extra=extra,
            )
        elif state == "quiet":
            log.info(
                "the job trigger queues without notifying (`reactor migrate --no-notify`): "
                "polling the queue",
                extra={"poll_interval_s": self.settings.poll_interval},
            )
        elif state == "elsewhere" and self.listener is not None:
            log.error(
                "the job trigger notifies another channel than REACTOR_CHANNEL: run `reactor "
                "migrate` with this REACTOR_CHANNEL; polling meanwhile",
                extra=extra,
            )
        elif state == "notifies" and self.listener is None:
            log.info(
                "the job trigger notifies, and in poll mode nobody hears it: `reactor migrate "
                "--no-notify` spares the app's commits the NOTIFY",
                extra=extra,
            )
        elif state == "notifies" and known:
            log.info("the job trigger notifies this replica's channel again", extra=extra)

    def _on_replica_left(self, replica: str) -> None:
        # Another replica stopped cleanly and said so: its jobs are ours now, not at our next
        # check. Our own word comes back to us too.
        if replica == self.replica_id or replica in self._departed:
            return
        self._departed.add(replica)
        self._see_replicas(self.membership.live)

    def _see_replicas(self, live: frozenset[str]) -> None:
        # Only those the database still shows need remembering.
        self._departed &= live
        live -= self._departed
        seen = Membership(self.replica_id, live)
        if seen == self.membership:
            return
        lost = self.membership.lost(seen)
        log.info(
            "replicas changed",
            extra={"live": len(live), "left": ",".join(sorted(lost)) or None},
        )
        self.membership = seen
        self.metrics.replicas_live.set(len(live))
        if lost:
            # Their jobs are ours now: whatever came due while they were gone is recorded by
            # a scan at once, and later deadlines fire here (every replica armed every job).
            self.request_scan()

    async def _sleep_until(self, when: float) -> None:
        with anyio.move_on_after(max(0.0, when - anyio.current_time())):
            await self._stopping.wait()

    async def _listen(self) -> None:
        assert self.listener is not None
        with self._intake:
            await self.listener.run()

    async def _first_listen_attempt(self, listener: Listener) -> None:
        # Whichever comes first: the listener's first attempt ends, or stop() is called.
        async with anyio.create_task_group() as tg:

            async def wait(event: anyio.Event) -> None:
                await event.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(wait, listener.settled)
            tg.start_soon(wait, self._stopping)

    def _on_notified(self, job_id: str, updated_at: float | None) -> None:
        # A full grace from receipt is never early: updated_at is set before the commit, and the
        # notification comes after it. Aiming at updated_at + grace by the database clock is
        # earlier by however long the app's transaction ran after setting updated_at; the
        # record statement decides in database time whichever way the timer was aimed.
        delay = self.settings.grace
        if updated_at is not None:
            deadline = self.db_clock.local(updated_at + self.settings.grace)
            if deadline is not None:
                delay = min(delay, deadline - self.clock())
        if delay <= 0 and self._record_now(job_id):
            return
        self.arm(job_id, delay)

    def _record_now(self, job_id: str) -> bool:
        # Due on arrival (a grace shorter than the notification took): claim it straight away
        # when a record slot is free, rather than by way of the timer loop, one task switch
        # later. False when it must wait its turn: the timer loop takes it then.
        if self._work_group is None or self.stopping or not self._claims(job_id):
            return False
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            return False
        self.deadlines.cancel(job_id)  # an earlier arming (a re-arm scan) would claim it twice
        self._work_group.start_soon(self._record, [job_id])
        return True

    async def _timer_loop(self, work: anyio.abc.TaskGroup) -> None:
        while not self.stopping:
            now = self.clock()
            fired = self.deadlines.pop_due(now, limit=self.settings.batch_size)
            # Every replica armed every job; only the owner claims it. Should the owner die,
            # the others learn it from the heartbeats and scan for what it left.
            due = [job for job in fired if self._claims(job)]
            if fired:
                self.metrics.left_to_owner.inc(len(fired) - len(due))
            if due:
                self.metrics.deadlines_pending.set(len(self.deadlines))
                await self._slots.acquire()
                work.start_soon(self._record, due)
                continue
            next_at = self.deadlines.next_deadline()
            self._wake = anyio.Event()
            with anyio.move_on_after(math.inf if next_at is None else next_at - now):
                await self._wake.wait()

    def _claims(self, job_id: str) -> bool:
        if job_id in self._adopted:
            self._adopted.discard(job_id)
            return True
        return self.membership.owns(job_id)

    async def _record(self, job_ids: list[str]) -> None:
        try:
            for job_id, delay in await self.recorder.record(job_ids):
                self.arm(job_id, delay)
        finally:
            self._slots.release()

    async def _scan_loop(self) -> None:
        failures = 0
        while True:
            # After a failed scan, try again soon (the database is likely back within seconds
            # and the jobs it missed are waiting), backing off up to the normal interval.
            wait = self.settings.scan_interval
            if failures:
                wait = min(wait, 0.5 * 2 ** (failures - 1))
            with anyio.move_on_after(wait):
                await self._scan_requested.wait()
            if self.stopping:
                return
            requested = self._scan_requested.is_set()
            self._scan_requested = anyio.Event()
            rearm, self._rearm_wanted = self._rearm_wanted, False
            if not (requested or rearm or failures) and self._nothing_overdue():
                # The health check just read the queue and found nothing past its grace: a
                # periodic scan would find nothing either.
                continue
            failures = 0 if await self.scan(rearm=rearm) is not None else failures + 1

    async def _poll_loop(self) -> None:
        # While notifications cannot be relied on, the timers come from the queue itself: every
        # poll interval, the queued jobs whose deadline comes within two intervals. Windows
        # overlap by that much, so a job queued by a transaction that was still open at the last
        # poll is read now (one that committed after its deadline is the scan's). Like the
        # health check, the poll rides the LISTEN connection while the listener carries the
        # check (the trigger notifies elsewhere or not at all); this loop polls through the pool
        # otherwise, waiting out a poll the listener may still have in flight.
        interval = self.settings.poll_interval
        while not self.stopping:
            now = anyio.current_time()
            due = self._poll_due()
            if due is None:
                self._poll_low = None
                await self._sleep_until(now + interval)
                continue
            if self.listener is not None and self.listener.checking:
                due += self.settings.probe_timeout
            if now < due:
                await self._sleep_until(min(due, now + interval))
                continue
            try:
                await self._poll()
            except DATABASE_ERRORS as error:
                # The check says so when the database is down; anything overdue meanwhile
                # is the scan's.
                log.debug("poll failed", extra={"error": db.first_line(error)})

    def _poll_due(self) -> float | None:
        """When the next poll of the queue is due (anyio time); None while none is wanted."""
        if not self.polling:
            return None
        return self._last_poll + self.settings.poll_interval

    async def _poll(self, conn: db.AnyConnection | None = None) -> None:
        # On ``conn`` when it is the listener's turn (its own connection), else pooled.
        self._last_poll = anyio.current_time()
        ahead = 2 * self.settings.poll_interval
        try:
            jobs, high = await self.database.poll_queue(
                self._poll_low, ahead=ahead, limit=POLL_LIMIT, conn=conn
            )
        except BaseException:
            self._poll_low = None
            raise
        self.polls += 1
        for job in jobs:
            self.arm(job.job_id, job.due_in + 0.001)
        full = len(jobs) >= POLL_LIMIT
        self._poll_low = jobs[-1].since if full else high - timedelta(seconds=ahead)

    def _nothing_overdue(self) -> bool:
        fresh = anyio.current_time() - self._last_seen < 2 * self.settings.probe_interval
        return fresh and self.database_ok is True and self.oldest_overdue < OVERDUE_TOLERANCE

    async def scan(self, *, rearm: bool) -> int | None:
        """One fallback pass: re-arm upcoming deadlines if asked, then drain the due backlog.

        Returns the number of runs recorded, or None when the database failed the pass.
        """
        started = self.clock()
        recorded: int | None = 0
        self._scanning = True
        try:
            if rearm:
                for job_id, due_in in await self.database.upcoming(self.settings.max_pending):
                    self.arm(job_id, due_in + 0.001)
            recorded = await self.recorder.drain(self.settings.batch_size)
        except DATABASE_ERRORS as error:
            recorded = None
            self.metrics.record_errors.inc()
            self._rearm_wanted |= rearm
            log.warning("scan failed, will retry", extra={"error": db.first_line(error)})
        finally:
            self._scanning = False
            self.scans += 1
            self.metrics.scan_duration.observe(self.clock() - started)
        if recorded:
            log.info("scan recorded runs", extra={"recorded": recorded})
        return recorded
