"""Follow-up hooks: what runs after the reactor records a run (an LLM judge, ops diagnosis).

Hooks are durable: the record statement queues one ``reactor.hook_outbox`` row per run and hook,
and the :class:`HookRunner` of any replica leases rows with ``SKIP LOCKED``, runs them with a
timeout and bounded concurrency, and settles each attempt: done, retried on a capped
exponential schedule with jitter (:func:`retry_delay`), or parked as failed after
``REACTOR_HOOK_MAX_ATTEMPTS``. A row whose run holds a later job by the time it is claimed is
settled as superseded and never called. No transaction stays open while a hook runs. A replica
killed mid-hook loses nothing: its lease expires and another replica takes the row (unless
that was the row's last attempt: see below). On SIGTERM,
unfinished leases are handed back at once. :class:`HookRetention` deletes settled rows once
``REACTOR_HOOK_RETENTION_SECONDS`` have passed, one replica at a time.

Delivery is at least once. Every call carries an idempotency key, stable across retries and
replicas, so a hook can deduplicate.

``REACTOR_HOOKS`` is ``name=kind:target`` items separated by commas. A hook name is a letter or
``_``, then up to 62 letters, digits, ``_`` or ``-``. A comma ends an item only where what
follows it looks like the start of the next one: ``name=kind:``, that is a name, ``=``, letters
and ``:`` (``,ops-diag=webhook:``), spaces allowed around the ``=``. So that a mistyped name is
reported rather than glued to the value before it, "a name" here is anything without space,
comma or ``=``. Any other comma belongs to the value: a webhook URL's query may hold
``?ids=1,2`` or ``?a=1,b=2``. A comma inside a value that is followed by ``x=letters:`` would
start an item; write it ``%2C`` (any URL may).

Kinds:

- ``python:module:function``: ``async def function(call: HookCall)`` runs on the event loop;
  a plain ``def`` runs in a worker thread, so blocking code cannot stall the reactor. Raising
  fails the attempt (:class:`PermanentFailure`: parked at once).
- ``notify:channel``: ``pg_notify(channel, json)``, for a worker that judges on its own.
- ``webhook:url``: a JSON POST, signed (:mod:`reactor.signature`) with the hook's own
  ``REACTOR_WEBHOOK_SECRET_<NAME>`` (the name upper-cased, ``-`` as ``_``) or else the shared
  ``REACTOR_WEBHOOK_SECRET``; unsigned when neither is set. 2xx is success; redirects are never
  followed; :func:`webhook_verdict` says which other statuses are permanent.

Nothing a hook reports is shown whole: URLs are cut to scheme, host and path, and configured
secrets are masked (:mod:`reactor.redact`), in logs, stored errors and status alike. A
configuration error names the hook and what is wrong, and quotes only what cannot be secret
(names, module paths): never a URL but as scheme, host and path, never a target that failed
its check.

A hook that raises anything but the runner's own cancellation, ``SystemExit`` and
``KeyboardInterrupt`` included, has failed an attempt like any other. A hook that kills its
process (``os._exit``, a crash in a C extension) leaves its row running until the lease runs
out; that counts as an attempt too, and the claim parks a row whose last attempt ended so
instead of handing it to the next replica to kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import importlib
import inspect
import json
import logging
import math
import random
import re
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Generator, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import anyio
import anyio.abc
from psycopg_pool import AsyncConnectionPool

from reactor import db, redact, tracing

if TYPE_CHECKING:
    # Imported where a webhook is called: the commands that call none start faster without it.
    import aiohttp
from reactor.config import Settings, webhook_secret_variable
from reactor.errors import ConfigError
from reactor.metrics import Metrics
from reactor.recorder import DATABASE_ERRORS
from reactor.signature import SIGNATURE_HEADER, sign

log = logging.getLogger(__name__)

IDEMPOTENCY_HEADER = "Idempotency-Key"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")
# Where the next item starts: a comma, then "name=kind:" (see the module docstring). The name
# part takes whatever a name would be misspelled as, valid names included, so that no item is
# glued to the value before it (a URL whose path then carried the next hook's credentials).
_SPLIT = re.compile(r",\s*(?=[^\s,=]+\s*=\s*[A-Za-z]+:)")
KINDS = ("python", "notify", "webhook")
# What a python:module:function target may name, and so be quoted in a message.
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Each retry waits up to this share longer than its schedule says, at random, so the rows a
# receiver's outage failed together do not all come back in the same second.
JITTER = 0.25

# Answers that retrying the same request cannot change. 301 and 308 say the URL moved for good
# (redirects are never followed: a followed 301 turns the signed POST into a bodyless GET, and
# a followed 307 sends the signed body to whatever host the redirect names), and 410 says the
# endpoint is gone. Every other failure is retried on the schedule, 4xx included: a receiver
# mid-deploy or mid-key-rotation answers 401, 403 or 404 for minutes, and a day of retries
# costs little next to a verdict never delivered.
PERMANENT_STATUSES = frozenset({301, 308, 410})

# A hook step that keeps the event loop longer than this is logged with the hook's name: it
# delays every timer and notification of the reactor by as much.
BLOCK_LIMIT = 0.1
# How often a threaded hook's watchdog looks at the loop's punctuality.
_WATCH_TICK = 0.05
_ASYNC_HINT = "blocking code in an async def: make it async all the way, or a plain def"
_GIL_HINT = "a plain def in a thread that keeps the GIL (a C extension?)"

_LEASE_HINT = (
    "its replica died or stalled while running it, every time: a hook that kills or freezes "
    "its process? Fix it, then `reactor hooks retry`"
)

# Retention deletes in batches of this many rows, so each delete is a short transaction.
_PURGE_BATCH = 1000


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


def idempotency_key(run_id: str, job_id: str, hook: str) -> str:
    """Stable for one hook of one recorded (run, job), whichever replica or attempt runs it."""
    return f"{run_id}:{job_id}:{hook}"


@dataclass
class PythonHook:
    """``python:module:function``: a callable in the reactor's own process.

    An ``async def`` is awaited on the event loop. A plain ``def`` runs in a daemon thread,
    at most ``threads`` of them at once (a thread abandoned at its timeout still counts until
    it returns), so a blocking hook cannot stall the listener and the timers.
    """

    name: str
    spec: str
    function: Callable[[HookCall], object]
    threads: anyio.Semaphore
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = _is_async(self.function)

    async def __call__(self, call: HookCall) -> None:
        """Await the function, or run it in a thread and wait for it."""
        if self.is_async:
            await cast(Awaitable[object], self.function(call))
        else:
            await _in_thread(self.name, self.function, call, self.threads)


@dataclass
class NotifyHook:
    """``notify:channel``: a NOTIFY with the call as JSON."""

    name: str
    spec: str
    channel: str
    pool: AsyncConnectionPool[db.AnyConnection]

    async def __call__(self, call: HookCall) -> None:
        """Send the notification from a pool connection."""
        # No call timeout of its own: the runner bounds every hook with the hook timeout.
        await db.notify(db.Pooled(self.pool, timeout=None), self.channel, call.as_json())


def webhook_verdict(status: int) -> Literal["done", "retry", "permanent"]:
    """What an HTTP status means for a webhook attempt; see PERMANENT_STATUSES for why."""
    if 200 <= status < 300:
        return "done"
    return "permanent" if status in PERMANENT_STATUSES else "retry"


@dataclass
class WebhookHook:
    """``webhook:url``: a signed JSON POST through the runner's shared HTTP session."""

    name: str
    spec: str = field(repr=False)  # the URL may carry credentials
    url: str = field(repr=False)
    secret: str | None = field(repr=False)
    session: Callable[[], aiohttp.ClientSession] = field(repr=False)
    clock: Callable[[], float] = field(default=time.time, repr=False)

    async def __call__(self, call: HookCall) -> None:
        """POST the call; raise on anything but 2xx (PermanentFailure when retrying is moot)."""
        body = call.as_json().encode()
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: call.idempotency_key}
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(self.secret, body, timestamp=int(self.clock()))
        tracing.inject_traceparent(headers)  # not signed: the signature covers t and the body
        shown = redact.safe_url(self.url)
        import aiohttp

        try:
            async with self.session().post(
                self.url, data=body, headers=headers, allow_redirects=False
            ) as response:
                status, location = response.status, response.headers.get("Location")
            tracing.current().set({"http.response.status_code": status})
        except aiohttp.ClientError as error:
            # Client errors may quote the URL whole (credentials, query): never pass them on.
            detail = f"{type(error).__name__}: {error}"
            raise RuntimeError(redact.scrub(detail, redact.url_secrets(self.url))) from None
        verdict = webhook_verdict(status)
        if verdict == "done":
            return
        detail = f"HTTP {status} from {shown}"
        if 300 <= status < 400:
            target = f" to {redact.safe_url(location)}" if location else ""
            detail += f" (a redirect{target}; redirects are not followed)"
        if verdict == "permanent":
            raise PermanentFailure(detail)
        raise RuntimeError(detail)


def parse_hooks(
    text: str,
    *,
    pool: AsyncConnectionPool[db.AnyConnection],
    secret: str | None,
    session: Callable[[], aiohttp.ClientSession],
    threads: anyio.Semaphore,
    own_secrets: Mapping[str, str] | None = None,
    known_secrets: Collection[str] = (),
) -> dict[str, Hook]:
    """Build the hooks of ``REACTOR_HOOKS``; ConfigError (one line) for anything wrong.

    ``secret`` signs every webhook that has none of its own in ``own_secrets`` (by variable
    name, REACTOR_WEBHOOK_SECRET_<NAME>); such a variable that names no webhook hook is an
    error. Messages quote no secret: not a URL whole (REACTOR_HOOKS may hold webhook
    credentials), not a target that failed its check, none of ``known_secrets``.
    """
    hooks: dict[str, Hook] = {}
    own_secrets = own_secrets or {}
    items = filter(None, (part.strip() for part in _SPLIT.split(text.strip())))
    for number, item in enumerate(items, start=1):
        name, sep, spec = item.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep:
            raise ConfigError(f"REACTOR_HOOKS: item {number} is not name=kind:target")
        if not _NAME.fullmatch(name):
            # Not quoted: the text before "=" may be a stray URL's, credentials and all.
            raise ConfigError(
                f"REACTOR_HOOKS: item {number} does not start with a hook name (a letter or _, "
                "then letters, digits, _ or -; at most 63) and ="
            )
        if name in hooks:
            raise ConfigError(f"REACTOR_HOOKS: hook {name!r} is defined twice")
        kind, _, target = spec.partition(":")
        if kind == "python":
            function = _import_function(name, target, known_secrets)
            hooks[name] = PythonHook(name, spec, function, threads)
        elif kind == "notify":
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", target):
                raise ConfigError(
                    f"REACTOR_HOOKS: {name}: notify takes a channel name (letters, digits and _, "
                    "at most 63, not starting with a digit)"
                )
            hooks[name] = NotifyHook(name, spec, target, pool)
        elif kind == "webhook":
            own = own_secrets.get(webhook_secret_variable(name))
            url = _check_url(name, target)
            hooks[name] = WebhookHook(name, spec, url, own or secret, session)
        else:
            raise ConfigError(f"REACTOR_HOOKS: {name}: {_unknown_kind(kind)}")
    _check_own_secrets(hooks, own_secrets)
    return hooks


def _unknown_kind(kind: str) -> str:
    # The kind is never quoted: when a comma inside a URL split an item, or a spec is a bare
    # URL, what stands before the first ":" may be part of a password. A suggestion quotes
    # only our own words.
    if kind.lower() in ("http", "https"):
        hint = "; a URL is webhook:URL (a comma in a URL goes as %2C when name=kind: follows it)"
    else:
        close = difflib.get_close_matches(kind.lower(), KINDS, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown kind{hint}; use python:module:function, notify:channel or webhook:url"


def _check_own_secrets(hooks: Mapping[str, Hook], own_secrets: Mapping[str, str]) -> None:
    # A secret for no webhook would leave the hook it was meant for signing with the shared
    # one (a typo, a renamed hook), and its receiver refusing every call for a day of retries.
    webhooks: dict[str, list[str]] = {}
    for name, hook in hooks.items():
        if isinstance(hook, WebhookHook):
            webhooks.setdefault(webhook_secret_variable(name), []).append(name)
    for variable in sorted(own_secrets):
        names = webhooks.get(variable)
        if not names:
            raise ConfigError(
                f"{variable} is set, but REACTOR_HOOKS has no webhook hook of that name (the "
                "variable is REACTOR_WEBHOOK_SECRET_ and the name upper-cased, - as _)"
            )
        if len(names) > 1:
            raise ConfigError(
                f"{variable} would sign webhook hooks {' and '.join(map(repr, names))} alike; "
                "rename one of them"
            )


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
            import aiohttp

            session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=settings.hook_timeout, connect=10),
                connector=aiohttp.TCPConnector(limit=settings.hook_concurrency * 2),
            )
        return session

    hooks = parse_hooks(
        settings.hooks,
        pool=pool,
        secret=settings.webhook_secret,
        session=shared_session,
        threads=anyio.Semaphore(settings.hook_concurrency),
        own_secrets=settings.webhook_secrets,
        known_secrets=redact.known_secrets(
            webhook_secret=settings.webhook_secret,
            webhook_secrets=settings.webhook_secrets.values(),
            dsns=(settings.database_url, settings.listen_database_url),
            urls=(),
        ),
    )
    try:
        yield hooks
    finally:
        if session is not None:
            await session.close()


def _is_async(function: object) -> bool:
    # A callable object's __call__ counts too, as does a functools.partial of a coroutine.
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 -- the method, not callability
    )


def _import_function(
    name: str, target: str, secrets: Collection[str]
) -> Callable[[HookCall], object]:
    module_name, _, attribute = target.partition(":")
    # Quoted only once they are known to be a module path and a name: a mistyped spec may hold
    # anything, a URL's credentials included.
    if not _MODULE.fullmatch(module_name) or not _ATTRIBUTE.fullmatch(attribute):
        raise ConfigError(
            f"REACTOR_HOOKS: {name}: write python:module:function, with a dotted module path "
            "and a function name"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's to fix; say which
        raise ConfigError(
            f"REACTOR_HOOKS: {name}: cannot import {module_name!r}: {type(error).__name__}: "
            f"{redact.scrub(str(error), secrets)}"
        ) from None
    function = getattr(module, attribute, None)
    if function is None:
        raise ConfigError(f"REACTOR_HOOKS: {name}: {module_name} has no {attribute!r}")
    if not callable(function):
        raise ConfigError(f"REACTOR_HOOKS: {name}: {module_name}:{attribute} is not a function")
    return function  # type: ignore[no-any-return]


def _check_url(name: str, url: str) -> str:
    # safe_url shows scheme, host, port and path only, or a placeholder when it cannot tell
    # which is which.
    shown = redact.safe_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a malformed port
    except ValueError:
        raise ConfigError(f"REACTOR_HOOKS: {name}: {shown!r} has a bad port or host") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"REACTOR_HOOKS: {name}: {shown!r} is not an http(s) URL with a host")
    return url


def retry_delay(attempt: int, *, base: float, cap: float, jitter: float) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 = the first try).

    Capped exponential: ``min(cap, base * 2**(attempt - 1))``, then up to JITTER longer as
    ``jitter`` (0..1, random in production) goes from 0 to 1. Pure, so tests pass the jitter.
    """
    if base <= 0:
        return 0.0
    # The exponent is bounded so that a thousandth attempt stays a float, not an overflow.
    delay = min(cap, base * 2.0 ** min(attempt - 1, 64))
    return delay * (1 + JITTER * jitter)


def retry_span(*, attempts: int, base: float, cap: float) -> float:
    """The least time from the first try of a row to its last (jitter only adds to it)."""
    return sum(retry_delay(n, base=base, cap=cap, jitter=0.0) for n in range(1, attempts))


class _LoopGuard:
    """Awaits a coroutine and times each of its steps on the event loop.

    A step is the code between two of the coroutine's suspensions: while it runs, nothing else
    on the loop does. One that takes longer than BLOCK_LIMIT is reported with ``on_block``.
    """

    def __init__(self, coroutine: Awaitable[None], on_block: Callable[[float], None]) -> None:
        self.coroutine = coroutine
        self.on_block = on_block

    def __await__(self) -> Generator[Any, Any, None]:
        steps = self.coroutine.__await__()
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = time.perf_counter()
            try:
                yielded = steps.throw(thrown) if thrown is not None else steps.send(sent)
            except StopIteration:
                self._check(started)
                return
            self._check(started)
            try:
                sent, thrown = (yield yielded), None
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as error:  # cancellation included: hand it to the hook
                sent, thrown = None, error

    def _check(self, started: float) -> None:
        took = time.perf_counter() - started
        if took > BLOCK_LIMIT:
            self.on_block(took)


async def _in_thread(
    name: str, function: Callable[[HookCall], object], call: HookCall, slots: anyio.Semaphore
) -> None:
    """Run a plain function in a daemon thread and wait for it, watching the event loop.

    Daemon, not an anyio worker thread: a thread cannot be interrupted, and at a timeout or
    the end of a drain the reactor must move on (and be able to exit) while it still runs. Its
    slot is freed only when it returns, so stuck threads cannot pile up past ``slots``.
    """
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[BaseException | None] = loop.create_future()
    await slots.acquire()

    def settle(outcome: BaseException | None) -> None:
        slots.release()
        if not finished.done():  # the waiter may have given up (timeout, drain)
            finished.set_result(outcome)

    def target() -> None:
        outcome: BaseException | None = None
        try:
            function(call)
        except BaseException as error:  # the hook's failure, reported on the loop
            outcome = error
        # A closed loop means the process is exiting: nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome)

    since = anyio.current_time()  # the watch covers the thread's start, too
    threading.Thread(target=target, name=f"hook-{name}", daemon=True).start()
    async with anyio.create_task_group() as watching:
        watching.start_soon(_watch_loop, name, since)
        try:
            outcome = await finished
        finally:
            watching.cancel_scope.cancel()
    if isinstance(outcome, Exception):
        raise outcome
    if outcome is not None:  # SystemExit and the like end the hook's thread, not the reactor
        raise RuntimeError(f"the hook raised {type(outcome).__name__}")


async def _watch_loop(name: str, since: float) -> None:
    # A threaded hook cannot hold the loop itself, but one that keeps the GIL (a C extension
    # that does not release it) starves it just the same: the loop then wakes this task late.
    due = since + _WATCH_TICK
    while True:
        await anyio.sleep(max(0.0, due - anyio.current_time()))
        now = anyio.current_time()
        if now - due > BLOCK_LIMIT:
            log.warning(
                "a hook blocked the event loop",
                extra={"hook": name, "blocked_ms": round((now - due) * 1000), "hint": _GIL_HINT},
            )
        due = now + _WATCH_TICK


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
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.settings = settings
        self.database = database
        self.hooks = hooks
        self.metrics = metrics
        self.is_stopping = is_stopping
        self.jitter = jitter
        self.in_flight = 0
        self._wake = anyio.Event()
        # Every configured secret, masked in whatever a hook reports.
        webhooks = [hook for hook in hooks.values() if isinstance(hook, WebhookHook)]
        self.secrets = redact.known_secrets(
            webhook_secret=settings.webhook_secret,
            webhook_secrets=[*settings.webhook_secrets.values(), *(h.secret for h in webhooks)],
            dsns=(settings.database_url, settings.listen_database_url),
            urls=[hook.url for hook in webhooks],
        )
        for name in hooks:
            for outcome in OUTCOMES:
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
                        claims = await self.database.claim_hooks(
                            free,
                            self.settings.hook_lease,
                            max_attempts=self.settings.hook_max_attempts,
                        )
                    for claim in claims:
                        if claim.superseded:
                            self._superseded(claim)
                            continue
                        if claim.parked:
                            self._parked(claim)
                            continue
                        self.in_flight += 1
                        running.start_soon(self._traced, claim)
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
        kind = self.hooks[claim.hook].spec.partition(":")[0]
        with tracing.span(
            "reactor.hook",
            hook=claim.hook,
            hook_kind=kind if kind in KINDS else None,
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
            idempotency_key(claim.run_id, claim.job_id, claim.hook),
        )
        fields = {
            "run_id": claim.run_id,
            "job_id": claim.job_id,
            "hook": claim.hook,
            "attempt": claim.attempt,
        }

        def blocked(seconds: float) -> None:
            extra = {**fields, "blocked_ms": round(seconds * 1000), "hint": _ASYNC_HINT}
            log.warning("a hook blocked the event loop", extra=extra)

        # A threaded hook's own watch covers it; timing its steps too would report twice.
        threaded = isinstance(hook, PythonHook) and not hook.is_async
        try:
            try:
                with anyio.fail_after(self.settings.hook_timeout):
                    await (hook(call) if threaded else _LoopGuard(hook(call), blocked))
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
            self._wake.set()

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
        tracing.current().set(outcome=outcome).error(error)
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


def _described(error: BaseException) -> str:
    """``Type: message``, or the type alone when the message is empty (KeyboardInterrupt())."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


# Every outcome of an attempt (or of a claim, for superseded), as the metric counts them.
OUTCOMES = ("done", "retry", "failed", "released", "superseded")


class HookRetention:
    """Deletes settled hook rows past ``REACTOR_HOOK_RETENTION_SECONDS``, in small batches.

    It runs when woken: the replica's health check says when settled rows have outlived their
    retention, so a quiet outbox costs no statement of its own. Every replica runs one; the
    purge statement's advisory lock lets one of them work at a time, and the others skip their
    turn. Failed rows are never deleted: they need a person.
    """

    def __init__(
        self, settings: Settings, database: db.Database, *, is_stopping: Callable[[], bool]
    ) -> None:
        self.settings = settings
        self.database = database
        self.is_stopping = is_stopping
        self._wake = anyio.Event()

    def wake(self) -> None:
        """Purge now (settled rows expired), or look at the stop flag (the reactor stops)."""
        self._wake.set()

    async def run(self) -> None:
        """Purge whenever woken, until the reactor stops; a failed purge waits for the next
        wake-up (the health check keeps seeing the expired rows)."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            if self.is_stopping():
                return
            try:
                await self.purge()
            except DATABASE_ERRORS as error:
                log.warning("hook retention failed", extra={"error": db.first_line(error)})

    async def purge(self, batch: int = _PURGE_BATCH) -> int:
        """Delete batches until none is full, or another replica has the turn; the count."""
        total = 0
        while not self.is_stopping():
            deleted = await self.database.purge_hooks(self.settings.hook_retention, batch)
            if deleted is None:
                break  # another replica is purging
            total += deleted
            if deleted < batch:
                break
        if total:
            log.info("deleted settled hook rows past their retention", extra={"deleted": total})
        return total
