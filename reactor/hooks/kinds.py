"""The three kinds a hook comes in, as callables (:mod:`.registry` says how each is read).

- ``python:module:function`` (:class:`PythonHook`): awaited on the event loop when it is an
  ``async def``; a plain ``def`` runs in a thread of its own (:func:`.guard.in_thread`).
- ``notify:channel`` (:class:`NotifyHook`): ``pg_notify(channel, json)``.
- ``webhook:url`` (:class:`WebhookHook`): a signed JSON POST; :func:`webhook_verdict` says what
  an answer means.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, cast

import anyio
from psycopg.rows import tuple_row
from psycopg_pool import AsyncConnectionPool

from reactor import db
from reactor.hooks.call import HookCall, PermanentFailure
from reactor.hooks.guard import in_thread
from reactor.hooks.signature import SIGNATURE_HEADER, sign
from reactor.telemetry import redact, tracing

if TYPE_CHECKING:
    # Imported where a webhook is called: the commands that call none start faster without it.
    import aiohttp

IDEMPOTENCY_HEADER = "Idempotency-Key"

# Answers that retrying the same request cannot change. 301 and 308 say the URL moved for good
# (redirects are never followed: a followed 301 turns the signed POST into a bodyless GET, and
# a followed 307 sends the signed body to whatever host the redirect names), and 410 says the
# endpoint is gone. Every other failure is retried on the schedule, 4xx included: a receiver
# mid-deploy or mid-key-rotation answers 401, 403 or 404 for minutes, and a day of retries
# costs little next to a verdict never delivered.
PERMANENT_STATUSES = frozenset({301, 308, 410})


@dataclass
class PythonHook:
    """``python:module:function``: a callable in the reactor's own process.

    An ``async def`` is awaited on the event loop. A plain ``def`` runs in a daemon thread,
    at most ``threads`` of them at once (a thread abandoned at its timeout still counts until
    it returns), so a blocking hook cannot stall the listener and the timers.
    """

    kind: ClassVar[str] = "python"
    name: str
    spec: str
    function: Callable[[HookCall], object]
    threads: anyio.Semaphore
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = is_async(self.function)

    @property
    def watches_loop(self) -> bool:
        """A plain def runs in a thread whose own watch covers the loop (guard.in_thread)."""
        return not self.is_async

    def secrets(self) -> Collection[str]:
        """None: a module path and a function name."""
        return ()

    async def __call__(self, call: HookCall) -> None:
        """Await the function, or run it in a thread and wait for it."""
        if self.is_async:
            await cast(Awaitable[object], self.function(call))
        else:
            await in_thread(self.name, self.function, call, self.threads)


@dataclass
class NotifyHook:
    """``notify:channel``: a NOTIFY with the call as JSON."""

    kind: ClassVar[str] = "notify"
    name: str
    spec: str
    channel: str
    pool: AsyncConnectionPool[db.AnyConnection] = field(repr=False)
    watches_loop: ClassVar[bool] = False

    def secrets(self) -> Collection[str]:
        """None: a channel name."""
        return ()

    async def __call__(self, call: HookCall) -> None:
        """Send the notification from a pool connection."""
        # No call timeout of its own: the runner bounds every hook with the hook timeout.
        on = db.Pooled(self.pool, timeout=None)
        await on.fetch("SELECT pg_notify(%s, %s)", (self.channel, call.as_json()), tuple_row)


def webhook_verdict(status: int) -> Literal["done", "retry", "permanent"]:
    """What an HTTP status means for a webhook attempt; see PERMANENT_STATUSES for why."""
    if 200 <= status < 300:
        return "done"
    return "permanent" if status in PERMANENT_STATUSES else "retry"


@dataclass
class WebhookHook:
    """``webhook:url``: a signed JSON POST through the runner's shared HTTP session."""

    kind: ClassVar[str] = "webhook"
    name: str
    spec: str = field(repr=False)  # the URL may carry credentials
    url: str = field(repr=False)
    secret: str | None = field(repr=False)
    session: Callable[[], aiohttp.ClientSession] = field(repr=False)
    clock: Callable[[], float] = field(default=time.time, repr=False)
    # Whose trace context a call carries, and where its status code is recorded.
    tracer: tracing.Tracing = field(default=tracing.PROCESS, repr=False)
    watches_loop: ClassVar[bool] = False

    def secrets(self) -> Collection[str]:
        """The signing secret and what the URL carries (user, password, query values)."""
        return {*redact.url_secrets(self.url), *([self.secret] if self.secret else [])}

    async def __call__(self, call: HookCall) -> None:
        """POST the call; raise on anything but 2xx (PermanentFailure when retrying is moot)."""
        body = call.as_json().encode()
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: call.idempotency_key}
        if self.secret:
            headers[SIGNATURE_HEADER] = sign(self.secret, body, timestamp=int(self.clock()))
        self.tracer.inject_traceparent(headers)  # not signed: the signature covers t and the body
        shown = redact.safe_url(self.url)
        import aiohttp

        try:
            async with self.session().post(
                self.url, data=body, headers=headers, allow_redirects=False
            ) as response:
                status, location = response.status, response.headers.get("Location")
            self.tracer.current().set({"http.response.status_code": status})
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


def is_async(function: object) -> bool:
    """Whether calling ``function`` gives a coroutine: a callable object's ``__call__`` counts
    too, as does a functools.partial of a coroutine function."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 -- the method, not callability
    )
