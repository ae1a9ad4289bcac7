"""The kinds of hook, one entry each: how its target is read, and what secrets it reads.

A :class:`Kind` declares its name and usage (``webhook:url``), its parser (hook name, target
and the :class:`Resources` of the process, to a :class:`.Hook`, or ConfigError; each takes the
resources its hooks use), and the secret variables a hook of it reads. :mod:`.spec`, the pairs'
secrets (:mod:`.secrets`) and the runner go through :data:`KINDS` only: a new kind is one entry
here and one class in :mod:`.kinds`.

Every message names the hook and what is wrong, and quotes only what cannot be secret (names,
module paths), never a URL but as scheme, host and path, never a target that failed its check.
"""

from __future__ import annotations

import importlib
import re
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
from psycopg_pool import AsyncConnectionPool

from reactor import db
from reactor.errors import ConfigError
from reactor.hooks.call import Hook, HookCall
from reactor.hooks.kinds import NotifyHook, PythonHook, WebhookHook
from reactor.hooks.secrets import secret_for, secret_variables
from reactor.telemetry import redact, tracing

if TYPE_CHECKING:
    import aiohttp

# What a python:module:function target may name, and so be quoted in a message.
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CHANNEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


@dataclass(frozen=True)
class Resources:
    """What the process gives the kinds to make hooks with; each kind takes what it declares.

    ``pool`` is None only while REACTOR_HOOKS is checked, before anything connects: nothing is
    called then. ``shared_secret`` (REACTOR_WEBHOOK_SECRET) and ``own_secrets`` (by variable,
    REACTOR_WEBHOOK_SECRET_<HOOK>) are what the secret-reading kinds read; ``known_secrets`` are
    masked in every message.
    """

    threads: anyio.Semaphore
    pool: AsyncConnectionPool[db.AnyConnection] | None = field(repr=False)
    session: Callable[[], aiohttp.ClientSession] = field(repr=False)
    shared_secret: str | None = field(default=None, repr=False)
    own_secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    known_secrets: Collection[str] = field(default=(), repr=False)
    # Where the hooks' calls are traced.
    tracer: tracing.Tracing = field(default=tracing.PROCESS, repr=False)


@dataclass(frozen=True)
class Kind:
    """One kind of hook, as REACTOR_HOOKS names it."""

    name: str
    # How an item of the kind is written, for messages: "webhook:url".
    usage: str
    # (hook name, target, resources) to a hook; ConfigError for a target that is not one.
    parse: Callable[[str, str, Resources], Hook]
    # (pair, hook) to the variables the hook reads its secret from, the first set winning
    # (reactor.hooks.secrets); None: the kind reads no secret.
    secret_variables: Callable[[str, str], tuple[str, ...]] | None = None

    @property
    def reads_secrets(self) -> bool:
        """Whether a hook of this kind reads a secret of its own."""
        return self.secret_variables is not None


def _python(name: str, target: str, resources: Resources) -> Hook:
    return PythonHook(
        name,
        f"python:{target}",
        _import_function(name, target, resources.known_secrets),
        resources.threads,
    )


def _notify(name: str, target: str, resources: Resources) -> Hook:
    if not _CHANNEL.fullmatch(target):
        raise ConfigError(
            f"REACTOR_HOOKS: {name}: notify takes a channel name (letters, digits and _, "
            "at most 63, not starting with a digit)"
        )
    return NotifyHook(name, f"notify:{target}", target, resources.pool)  # type: ignore[arg-type]  # None only while checking, when nothing is called


def _webhook(name: str, target: str, resources: Resources) -> Hook:
    url = _check_url(name, target)
    return WebhookHook(
        name,
        f"webhook:{target}",
        url,
        secret_for(name, resources.own_secrets, resources.shared_secret),
        resources.session,
        tracer=resources.tracer,
    )


KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind("python", "python:module:function", _python),
        Kind("notify", "notify:channel", _notify),
        Kind("webhook", "webhook:url", _webhook, secret_variables),
    )
}


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
