"""Follow-up hooks: what runs after the reactor records a run (an LLM judge, ops diagnosis).

Hooks are durable: the record statement queues one ``reactor.hook_outbox`` row per run and hook,
and the :class:`HookRunner` of any replica leases rows with ``SKIP LOCKED``, runs them with a
timeout and bounded concurrency, and settles each attempt: done, retried after an exponential
backoff with jitter, or parked as failed after ``REACTOR_HOOK_MAX_ATTEMPTS``. No transaction
stays open while a hook runs. A replica killed mid-hook loses nothing: its lease expires and
another replica takes the row. On SIGTERM, unfinished leases are handed back at once.

Delivery is at least once. Every call carries an idempotency key, stable across retries and
replicas, so a hook can deduplicate.

Kinds, from ``REACTOR_HOOKS=name=spec,...``:

- ``python:module:function``: ``async def function(call: HookCall) -> None``; raising fails.
- ``notify:channel``: ``pg_notify(channel, json)``, for a worker that judges on its own.
- ``webhook:url``: a JSON POST; 2xx is success, a 4xx other than 408/429 a permanent failure,
  anything else is retried. With ``REACTOR_WEBHOOK_SECRET``, the request is signed in the
  ``X-Reactor-Signature: t=<unix seconds>,v1=<hex>`` header: HMAC-SHA256 of ``"<t>.<body>"``,
  so a receiver can refuse a replayed request as well as a forged one.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import inspect
import json
import logging
import math
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import aiohttp
import anyio
import anyio.abc
import tenacity
from psycopg_pool import AsyncConnectionPool

from reactor import db
from reactor.config import Settings
from reactor.errors import ConfigError
from reactor.metrics import Metrics
from reactor.recorder import DATABASE_ERRORS

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Reactor-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")
# A new hook starts where "name=" follows a comma, so commas inside a URL's query survive.
_SPLIT = re.compile(r",\s*(?=[A-Za-z_][A-Za-z0-9_-]*=)")
_MAX_BACKOFF = 600.0


@dataclass(frozen=True, slots=True)
class HookCall:
    """What a hook receives: which run, which attempt, and the key to deduplicate on."""

    run_id: str
    job_id: str
    hook: str
    attempt: int
    idempotency_key: str

    def as_json(self) -> str:
        """The call as a JSON object, as the notify and webhook kinds send it."""
        return json.dumps(asdict(self), separators=(",", ":"))


class PermanentFailure(Exception):
    """A hook failure that retrying cannot fix; the row is parked at once."""


class Hook(Protocol):
    """One configured hook."""

    name: str
    spec: str

    async def __call__(self, call: HookCall) -> None:
        """Run once; raise to fail (PermanentFailure: do not retry)."""
        ...


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The ``X-Reactor-Signature`` value: the timestamp is signed with the body against replays."""
    signed = f"{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def idempotency_key(run_id: str, job_id: str, hook: str) -> str:
    """Stable for one hook of one recorded (run, job), whichever replica or attempt runs it."""
    return f"{run_id}:{job_id}:{hook}"


@dataclass
class PythonHook:
    """``python:module:function``: an async callable in the reactor's own process."""

    name: str
    spec: str
    function: Callable[[HookCall], Awaitable[object]]

    async def __call__(self, call: HookCall) -> None:
        """Await the function."""
        await self.function(call)


@dataclass
class NotifyHook:
    """``notify:channel``: a NOTIFY with the call as JSON."""

    name: str
    spec: str
    channel: str
    pool: AsyncConnectionPool[db.AnyConnection]

    async def __call__(self, call: HookCall) -> None:
        """Send the notification from a pool connection."""
        await db.notify(self.pool, self.channel, call.as_json())


@dataclass
class WebhookHook:
    """``webhook:url``: a signed JSON POST through the runner's shared HTTP session."""

    name: str
    spec: str
    url: str
    secret: str | None
    session: Callable[[], aiohttp.ClientSession]

    async def __call__(self, call: HookCall) -> None:
        """POST the call; raise on anything but 2xx."""
        body = call.as_json().encode()
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: call.idempotency_key}
        if self.secret:
            headers[SIGNATURE_HEADER] = signature(self.secret, body, int(time.time()))
        async with self.session().post(self.url, data=body, headers=headers) as response:
            if 200 <= response.status < 300:
                return
            detail = f"HTTP {response.status} from {self.url}"
            if 400 <= response.status < 500 and response.status not in (408, 429):
                raise PermanentFailure(detail)
            raise RuntimeError(detail)


def parse_hooks(
    text: str,
    *,
    pool: AsyncConnectionPool[db.AnyConnection],
    secret: str | None,
    session: Callable[[], aiohttp.ClientSession],
) -> dict[str, Hook]:
    """Build the hooks of ``REACTOR_HOOKS``; ConfigError (one line) for anything wrong."""
    hooks: dict[str, Hook] = {}
    for item in filter(None, (part.strip() for part in _SPLIT.split(text.strip()))):
        name, sep, spec = item.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep or not _NAME.fullmatch(name):
            raise ConfigError(f"REACTOR_HOOKS: {item!r} is not name=kind:target")
        if name in hooks:
            raise ConfigError(f"REACTOR_HOOKS: hook {name!r} is defined twice")
        kind, _, target = spec.partition(":")
        if kind == "python":
            hooks[name] = PythonHook(name, spec, _import_function(name, target))
        elif kind == "notify":
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", target):
                raise ConfigError(f"REACTOR_HOOKS: {name}: {target!r} is not a channel name")
            hooks[name] = NotifyHook(name, spec, target, pool)
        elif kind == "webhook":
            hooks[name] = WebhookHook(name, spec, _check_url(name, target), secret, session)
        else:
            raise ConfigError(
                f"REACTOR_HOOKS: {name}: unknown kind {kind!r}; use python:module:function, "
                "notify:channel or webhook:url"
            )
    return hooks


@asynccontextmanager
async def open_hooks(
    settings: Settings, pool: AsyncConnectionPool[db.AnyConnection]
) -> AsyncIterator[dict[str, Hook]]:
    """The hooks of ``settings``, validated on entry, with their shared HTTP session.

    Raises ConfigError before anything connects, so bad configuration fails fast. The webhook
    session (pooled connections, timeouts) is created on first use and closed on exit.
    """
    session: aiohttp.ClientSession | None = None

    def shared_session() -> aiohttp.ClientSession:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=settings.hook_timeout, connect=10),
                connector=aiohttp.TCPConnector(limit=settings.hook_concurrency * 2),
            )
        return session

    hooks = parse_hooks(
        settings.hooks, pool=pool, secret=settings.webhook_secret, session=shared_session
    )
    try:
        yield hooks
    finally:
        if session is not None:
            await session.close()


def _import_function(name: str, target: str) -> Callable[[HookCall], Awaitable[object]]:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"REACTOR_HOOKS: {name}: write python:module:function, not {target!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's to fix; say which
        raise ConfigError(
            f"REACTOR_HOOKS: {name}: cannot import {module_name!r}: {type(error).__name__}: {error}"
        ) from None
    function = getattr(module, attribute, None)
    if function is None:
        raise ConfigError(f"REACTOR_HOOKS: {name}: {module_name} has no {attribute!r}")
    if not inspect.iscoroutinefunction(function):
        raise ConfigError(f"REACTOR_HOOKS: {name}: {target} must be an async function")
    return function  # type: ignore[no-any-return]


def _check_url(name: str, url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"REACTOR_HOOKS: {name}: {url!r} is not an http(s) URL")
    try:
        parts.port  # noqa: B018 -- raises ValueError for a malformed port
    except ValueError:
        raise ConfigError(f"REACTOR_HOOKS: {name}: {url!r} has a bad port") from None
    return url


def backoff_delay(attempt: int, base: float) -> float:
    """Seconds before retry number ``attempt`` (1 = the first retry): exponential, jittered."""
    if base <= 0:
        return 0.0
    wait = tenacity.wait_exponential_jitter(multiplier=base, max=_MAX_BACKOFF, jitter=base)
    state = tenacity.RetryCallState(
        retry_object=tenacity.AsyncRetrying(), fn=None, args=(), kwargs={}
    )
    state.attempt_number = attempt
    return float(wait(state))


class HookRunner:
    """Claims, runs and settles hook rows for one replica."""

    def __init__(
        self,
        settings: Settings,
        database: db.Database,
        hooks: dict[str, Hook],
        metrics: Metrics,
        *,
        is_stopping: Callable[[], bool],
    ) -> None:
        self.settings = settings
        self.database = database
        self.hooks = hooks
        self.metrics = metrics
        self.is_stopping = is_stopping
        self.in_flight = 0
        self._wake = anyio.Event()
        for name in hooks:
            for outcome in ("done", "retry", "failed", "released"):
                metrics.hook_outcomes.labels(name, outcome)

    def wake(self) -> None:
        """Claim now: this process just recorded runs."""
        self._wake.set()

    async def run(self) -> None:
        """Claim and run hooks until the reactor stops; in-flight hooks finish or are released."""
        async with anyio.create_task_group() as running:
            while not self.is_stopping():
                free = self.settings.hook_concurrency - self.in_flight
                claims: list[db.HookClaim] = []
                self._wake = anyio.Event()
                try:
                    if free > 0:
                        claims = await self.database.claim_hooks(free, self.settings.hook_lease)
                    for claim in claims:
                        self.in_flight += 1
                        running.start_soon(self._execute, claim)
                    pause = await self._pause(saturated=free > 0 and len(claims) == free)
                except DATABASE_ERRORS as error:
                    log.warning("hook claim failed", extra={"error": db.first_line(error)})
                    pause = self.settings.probe_interval
                with anyio.move_on_after(pause):
                    await self._wake.wait()

    async def _pause(self, *, saturated: bool) -> float:
        # More may be waiting: go again at once. Otherwise sleep until the next row is due
        # (a backoff or a lease ending), but never longer than the scan interval, so rows that
        # other replicas queue are found by this periodic claim.
        if saturated or self.in_flight >= self.settings.hook_concurrency:
            return 0.0 if saturated else math.inf
        due_in = await self.database.next_hook_in()
        ceiling = self.settings.scan_interval
        return ceiling if due_in is None else min(max(due_in, 0.0) + 0.005, ceiling)

    async def _execute(self, claim: db.HookClaim) -> None:
        hook = self.hooks[claim.hook]
        call = HookCall(
            claim.run_id,
            claim.job_id,
            claim.hook,
            claim.attempt,
            idempotency_key(claim.run_id, claim.job_id, claim.hook),
        )
        fields = {
            "run_id": claim.run_id,
            "job_id": claim.job_id,
            "hook": claim.hook,
            "attempt": claim.attempt,
        }
        try:
            try:
                with anyio.fail_after(self.settings.hook_timeout):
                    await hook(call)
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
            except Exception as error:  # a hook's failure is data, not a crash of the runner
                await self._fail(claim, f"{type(error).__name__}: {error}", fields, permanent=False)
            else:
                await self._settle(claim, "done", fields)
        finally:
            self.in_flight -= 1
            self._wake.set()

    async def _fail(
        self, claim: db.HookClaim, error: str, fields: dict[str, Any], *, permanent: bool
    ) -> None:
        if permanent or claim.attempt >= self.settings.hook_max_attempts:
            await self._settle(claim, "failed", {**fields, "error": error}, error=error)
        else:
            delay = backoff_delay(claim.attempt, self.settings.hook_backoff)
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
        except DATABASE_ERRORS as db_error:
            # The lease will expire and another attempt will run: at least once still holds.
            log.warning(
                "could not settle a hook attempt; its lease will expire",
                extra={**fields, "error": db.first_line(db_error)},
            )
