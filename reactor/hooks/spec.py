"""``REACTOR_HOOKS`` turned into hooks, checked before anything connects.

``REACTOR_HOOKS`` is ``name=kind:target`` items separated by commas; the package's docstring
says where a comma ends an item. Every message names the hook and what is wrong, and quotes only
what cannot be secret (names, module paths), never a URL but as scheme, host and path.
"""

from __future__ import annotations

import difflib
import importlib
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from psycopg_pool import AsyncConnectionPool

from reactor import db, redact
from reactor.config import Settings, webhook_secret_variable
from reactor.errors import ConfigError
from reactor.hooks.kinds import Hook, HookCall, NotifyHook, PythonHook, WebhookHook

if TYPE_CHECKING:
    import aiohttp

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")
# Where the next item starts: a comma, then "name=kind:" (see the module docstring). The name
# part takes whatever a name would be misspelled as, valid names included, so that no item is
# glued to the value before it (a URL whose path then carried the next hook's credentials).
_SPLIT = re.compile(r",\s*(?=[^\s,=]+\s*=\s*[A-Za-z]+:)")
KINDS = ("python", "notify", "webhook")
# What a python:module:function target may name, and so be quoted in a message.
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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

    hooks = _configured(settings, pool, shared_session)
    try:
        yield hooks
    finally:
        if session is not None:
            await session.close()


def webhook_names(text: str) -> tuple[str, ...]:
    """The names of the webhook hooks of ``text`` (a REACTOR_HOOKS value), read without checking
    the rest of it (parse_hooks does); what is not a hook's name is left out, since it may be
    a stray URL's credentials."""
    found: list[str] = []
    for item in filter(None, (part.strip() for part in _SPLIT.split(text.strip()))):
        name, sep, spec = (part.strip() for part in item.partition("="))
        webhook = sep and spec.partition(":")[0] == "webhook"
        if webhook and _NAME.fullmatch(name) and name not in found:
            found.append(name)
    return tuple(found)


def check_hooks(settings: Settings) -> None:
    """Raise ConfigError for anything wrong in REACTOR_HOOKS and its secrets, before anything
    connects (their modules are imported); the hooks themselves are made by open_hooks."""

    def unused() -> aiohttp.ClientSession:
        raise AssertionError("a hook checked is never called")

    _configured(settings, None, unused)


def _configured(
    settings: Settings,
    pool: AsyncConnectionPool[db.AnyConnection] | None,
    session: Callable[[], aiohttp.ClientSession],
) -> dict[str, Hook]:
    return parse_hooks(
        settings.hooks,
        pool=pool,  # type: ignore[arg-type]  # None only to check, when nothing is called
        secret=settings.webhook_secret,
        session=session,
        threads=anyio.Semaphore(settings.hook_concurrency),
        own_secrets=settings.webhook_secrets,
        known_secrets=redact.known_secrets(
            webhook_secret=settings.webhook_secret,
            webhook_secrets=settings.webhook_secrets.values(),
            dsns=(settings.database_url, settings.listen_database_url),
            urls=(),
        ),
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
