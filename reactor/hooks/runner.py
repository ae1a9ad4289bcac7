"""Claiming, running and settling hook attempts: one replica's share of the hook outbox.

The runner is a duty of the replica's cadence (:mod:`reactor.insurance.cadence`): each run of it
leases as many runnable rows as it has free slots, starts each attempt in the replica's task group
and says when it is due next: at once while rows keep coming, else when the next row's backoff or
lease ends, never later than the scan interval (rows other replicas queue are found so). A
recorded run, a finished attempt and an operator's retry bring it forward. No transaction stays
open while a hook runs.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc

from reactor import db
from reactor.core import backoff
from reactor.hooks.call import Hook, HookCall, PermanentFailure, idempotency_key
from reactor.hooks.guard import ASYNC_HINT, LoopGuard
from reactor.settings.config import Settings
from reactor.telemetry import redact, tracing
from reactor.telemetry.metrics import Metrics

log = logging.getLogger("reactor.hooks")


# Each retry waits up to this share longer than its schedule says, at random, so the rows a
# receiver's outage failed together do not all come back in the same second.
JITTER = 0.25

_LEASE_HINT = (
    "its replica died or stalled while running it, every time: a hook that kills or freezes "
    "its process? Fix it, then `reactor hooks retry`"
)


def retry_delay(attempt: int, *, base: float, cap: float, jitter: float) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 = the first try): the capped
    exponential schedule of :mod:`reactor.core.backoff`, then up to JITTER longer as ``jitter``
    (0..1, random in production) goes from 0 to 1. Pure, so tests pass the jitter."""
    delay = backoff.exponential(attempt, first=base, cap=cap)
    return backoff.jittered(delay, jitter, low=1.0, high=1.0 + JITTER)


def retry_span(*, attempts: int, base: float, cap: float) -> float:
    """The least time from the first try of a row to its last (jitter only adds to it)."""
    return sum(retry_delay(n, base=base, cap=cap, jitter=0.0) for n in range(1, attempts))


# The runner's duty in its pair's cadence.
HOOKS = "hooks"


class Schedule(Protocol):
    """What brings the runner's duty forward (:class:`reactor.insurance.cadence.Scheduler`)."""

    def hasten(self, name: str) -> None:
        """Run the duty ``name`` now (or right after the run in progress)."""
        ...


@dataclass(eq=False, repr=False)
class HookRunner:
    """Claims, runs and settles hook rows for one replica."""

    settings: Settings
    database: db.Database
    hooks: dict[str, Hook]
    metrics: Metrics
    _: KW_ONLY
    # Whose leases the rows this runner claims are under.
    replica: str
    # Brings the runner's duty forward (see wake).
    schedule: Schedule
    jitter: Callable[[], float] = random.random
    # Where each attempt's span goes.
    tracer: tracing.Tracing = tracing.PROCESS
    in_flight: int = field(default=0, init=False)
    # Every configured secret, masked in whatever a hook reports.
    secrets: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        made_with = [secret for hook in self.hooks.values() for secret in hook.secrets()]
        self.secrets = redact.known_secrets(
            webhook_secret=settings.webhook_secret,
            webhook_secrets=[*settings.webhook_secrets.values(), *made_with],
            dsns=(settings.database_url, settings.listen_database_url),
            urls=(),
        )
        for name in self.hooks:
            for outcome in OUTCOMES:
                self.metrics.hook_outcomes.labels(name, outcome)

    async def claim(self, running: anyio.abc.TaskGroup) -> float | None:
        """Lease a row for every free slot and start each attempt in ``running``; the seconds
        until the duty is due again (None: its interval, the scan interval). Raises when the
        database failed the claim (the cadence retries it)."""
        free = self.settings.hook_concurrency - self.in_flight
        if free <= 0:
            return None  # a finishing attempt brings the duty forward
        claims = await self.database.claim_hooks(
            free,
            self.settings.hook_lease,
            replica=self.replica,
            max_attempts=self.settings.hook_max_attempts,
        )
        for claim in claims:
            if claim.superseded:
                self._superseded(claim)
            elif claim.parked:
                self._parked(claim)
            else:
                self.in_flight += 1
                running.start_soon(self._traced, claim)
        if len(claims) == free:
            return 0.0  # more may be waiting
        # Until the next row is due (a backoff or a lease ending); the interval is the ceiling.
        due_in = await self.database.next_hook_in()
        return None if due_in is None else max(due_in, 0.0) + 0.005

    def _parked(self, claim: db.HookClaim) -> None:
        # The claim statement parked it already, with the error; all that is left is to say so.
        self.metrics.hook_outcomes.labels(claim.hook, "failed").inc()
        log.error(
            "hook failed: the lease of its last attempt ran out, and the claim parked it",
            extra={
                "run_id": claim.run_id,
                "job_id": claim.job_id,
                "hook": claim.hook,
                "attempt": claim.attempt,
                "hint": _LEASE_HINT,
            },
        )

    def _superseded(self, claim: db.HookClaim) -> None:
        # The claim statement settled it already; all that is left is to say so.
        self.metrics.hook_outcomes.labels(claim.hook, "superseded").inc()
        log.info(
            "hook superseded: the run holds a later job",
            extra={"run_id": claim.run_id, "job_id": claim.job_id, "hook": claim.hook},
        )

    async def _traced(self, claim: db.HookClaim) -> None:
        # One span per attempt; _settle gives it the outcome, and the error (scrubbed).
        with self.tracer.span(
            "reactor.hook",
            hook=claim.hook,
            hook_kind=self.hooks[claim.hook].kind,
            run_id=claim.run_id,
            job_id=claim.job_id,
            attempt=claim.attempt,
        ):
            await self._execute(claim)

    async def _execute(self, claim: db.HookClaim) -> None:
        hook = self.hooks[claim.hook]
        call = HookCall(
            claim.run_id,
            claim.job_id,
            claim.hook,
            claim.attempt,
            idempotency_key(claim.run_id, claim.job_id, claim.hook, claim.finish),
        )
        fields = {
            "run_id": claim.run_id,
            "job_id": claim.job_id,
            "hook": claim.hook,
            "attempt": claim.attempt,
        }

        def blocked(seconds: float) -> None:
            extra = {**fields, "blocked_ms": round(seconds * 1000), "hint": ASYNC_HINT}
            log.warning("a hook blocked the event loop", extra=extra)

        # A threaded hook's own watch covers it; timing its steps too would report twice.
        threaded = hook.watches_loop
        try:
            try:
                with anyio.fail_after(self.settings.hook_timeout):
                    await (hook(call) if threaded else LoopGuard(hook(call), blocked))
            except anyio.get_cancelled_exc_class():
                # The drain ran out: hand the row back so the next replica starts it at once.
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await self._settle(claim, "released", fields)
                raise
            except TimeoutError:
                await self._fail(
                    claim,
                    f"timed out after {self.settings.hook_timeout:g} s",
                    fields,
                    permanent=False,
                )
            except PermanentFailure as error:
                await self._fail(claim, str(error), fields, permanent=True)
            except BaseException as error:  # a hook's failure is data, not a crash of the runner
                # SystemExit and KeyboardInterrupt too: raised by a hook, they are its failure.
                # The reactor's own stop arrives as a signal and then as the cancellation
                # above, never as one of these.
                await self._fail(claim, _described(error), fields, permanent=False)
            else:
                await self._settle(claim, "done", fields)
        finally:
            self.in_flight -= 1
            self.wake()

    def wake(self) -> None:
        """Claim rows now: a slot came free, runs were recorded, an operator re-queued a row."""
        self.schedule.hasten(HOOKS)

    async def _fail(
        self, claim: db.HookClaim, error: str, fields: dict[str, Any], *, permanent: bool
    ) -> None:
        error = redact.scrub(error, self.secrets)
        if permanent or claim.scheduled_attempt >= self.settings.hook_max_attempts:
            await self._settle(claim, "failed", {**fields, "error": error}, error=error)
        else:
            delay = retry_delay(
                claim.scheduled_attempt,
                base=self.settings.hook_backoff,
                cap=self.settings.hook_max_backoff,
                jitter=self.jitter(),
            )
            await self._settle(
                claim,
                "retry",
                {**fields, "error": error, "retry_in_s": round(delay, 3)},
                error=error,
                delay=delay,
            )

    async def _settle(
        self,
        claim: db.HookClaim,
        outcome: str,
        fields: dict[str, Any],
        *,
        error: str | None = None,
        delay: float = 0.0,
    ) -> None:
        self.metrics.hook_outcomes.labels(claim.hook, outcome).inc()
        self.tracer.current().set(outcome=outcome).error(error)
        level = {"done": logging.INFO, "retry": logging.WARNING}.get(outcome, logging.ERROR)
        if outcome == "released":
            level = logging.WARNING
        log.log(level, f"hook {outcome}", extra=fields)
        try:
            if outcome == "released":
                await self.database.release_hook(claim)
            else:
                status = {"done": "done", "retry": "pending", "failed": "failed"}[outcome]
                await self.database.finish_hook(claim, status, error=error, delay=delay)
        except db.DATABASE_ERRORS as db_error:
            # The lease will expire and another attempt will run: at least once still holds.
            log.warning(
                "could not settle a hook attempt; its lease will expire",
                extra={**fields, "error": db.first_line(db_error)},
            )


def _described(error: BaseException) -> str:
    """``Type: message``, or the type alone when the message is empty (KeyboardInterrupt())."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


# Every outcome of an attempt (or of a claim, for superseded), as the metric counts them.
OUTCOMES = ("done", "retry", "failed", "released", "superseded")
