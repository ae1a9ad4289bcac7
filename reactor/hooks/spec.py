"""``REACTOR_HOOKS`` turned into hooks, checked before anything connects.

``REACTOR_HOOKS`` is ``name=kind:target`` items separated by commas; the package's docstring
says where a comma ends an item. Every message names the hook and what is wrong, and quotes only
what cannot be secret (names, module paths), never a URL but as scheme, host and path.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from psycopg_pool import AsyncConnectionPool

from reactor import db
from reactor.errors import ConfigError
from reactor.hooks.call import Hook
from reactor.hooks.registry import KINDS, Resources
from reactor.hooks.secrets import check_own_secrets
from reactor.settings.config import Settings
from reactor.telemetry import redact

if TYPE_CHECKING:
    import aiohttp

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,62}")
# Where the next item starts: a comma, then "name=kind:" (see the module docstring). The name
# part takes whatever a name would be misspelled as, valid names included, so that no item is
# glued to the value before it (a URL whose path then carried the next hook's credentials).
_SPLIT = re.compile(r",\s*(?=[^\s,=]+\s*=\s*[A-Za-z]+:)")


def parse_hooks(text: str, resources: Resources) -> dict[str, Hook]:
    """Build the hooks of ``REACTOR_HOOKS`` with ``resources``; ConfigError (one line) for
    anything wrong.

    Each item's kind (:data:`.registry.KINDS`) reads its target. A secret of its own
    (``resources.own_secrets``, by variable name, REACTOR_WEBHOOK_SECRET_<NAME>) that no hook of
    a secret-reading kind reads is an error. Messages quote no secret: not a URL whole
    (REACTOR_HOOKS may hold webhook credentials), not a target that failed its check, none of
    ``resources.known_secrets``.
    """
    hooks: dict[str, Hook] = {}
    for number, item in enumerate(_items(text), start=1):
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
        kind_name, _, target = spec.partition(":")
        kind = KINDS.get(kind_name)
        if kind is None:
            raise ConfigError(f"REACTOR_HOOKS: {name}: {_unknown_kind(kind_name)}")
        hooks[name] = kind.parse(name, target, resources)
    webhooks = [name for name, hook in hooks.items() if KINDS[hook.kind].reads_secrets]
    check_own_secrets(webhooks, resources.own_secrets)
    return hooks


def _items(text: str) -> filter[str]:
    return filter(None, (part.strip() for part in _SPLIT.split(text.strip())))


def _unknown_kind(kind: str) -> str:
    # The kind is never quoted: when a comma inside a URL split an item, or a spec is a bare
    # URL, what stands before the first ":" may be part of a password. A suggestion quotes
    # only our own words.
    if kind.lower() in ("http", "https"):
        hint = "; a URL is webhook:URL (a comma in a URL goes as %2C when name=kind: follows it)"
    else:
        close = difflib.get_close_matches(kind.lower(), list(KINDS), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
    usages = [known.usage for known in KINDS.values()]
    return f"unknown kind{hint}; use {', '.join(usages[:-1])} or {usages[-1]}"


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

    hooks = parse_hooks(settings.hooks, resources(settings, pool, shared_session))
    try:
        yield hooks
    finally:
        if session is not None:
            await session.close()


def secret_readers(text: str) -> tuple[str, ...]:
    """The names of the hooks of ``text`` (a REACTOR_HOOKS value) whose kind reads a secret of
    its own (webhooks), read without checking the rest of it (parse_hooks does); what is not a
    hook's name is left out, since it may be a stray URL's credentials."""
    found: list[str] = []
    for item in _items(text):
        name, sep, spec = (part.strip() for part in item.partition("="))
        kind = KINDS.get(spec.partition(":")[0]) if sep else None
        if kind is not None and kind.reads_secrets and _NAME.fullmatch(name) and name not in found:
            found.append(name)
    return tuple(found)


def check_hooks(settings: Settings) -> None:
    """Raise ConfigError for anything wrong in REACTOR_HOOKS and its secrets, before anything
    connects (their modules are imported); the hooks themselves are made by open_hooks."""

    parse_hooks(settings.hooks, resources(settings))


def resources(
    settings: Settings,
    pool: AsyncConnectionPool[db.AnyConnection] | None = None,
    session: Callable[[], aiohttp.ClientSession] | None = None,
) -> Resources:
    """What the hooks of ``settings`` are made with; without ``pool`` and ``session``, only
    to check them (nothing is called)."""
    return Resources(
        threads=anyio.Semaphore(settings.hook_concurrency),
        pool=pool,
        shared_secret=settings.webhook_secret,
        own_secrets=settings.webhook_secrets,
        known_secrets=redact.known_secrets(
            webhook_secret=settings.webhook_secret,
            webhook_secrets=settings.webhook_secrets.values(),
            dsns=(settings.database_url, settings.listen_database_url),
            urls=(),
        ),
        session=_never_called if session is None else session,
    )


def _never_called() -> aiohttp.ClientSession:
    raise AssertionError("a hook only checked is never called")
