"""How a setting's text becomes its value: one parser per kind of value, each ``(source,
text) -> value`` or ConfigError.

``source`` is where the text came from (a variable, a flag, a file's ``[reactor]`` key), and
every message names it. No message quotes a value that may be secret: a token, a URL with user
information.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from reactor.errors import ConfigError

Parser = Callable[[str, str], Any]

# LISTEN takes an identifier; keep to the plain kind so it never needs quoting games.
_CHANNEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# No duration a setting holds is longer than a year: more is a typo, or a unit mistaken.
LONGEST_S = 365 * 86400.0

# A token shorter than this is guessable over HTTP; 32 random bytes, hex-encoded, are 64.
MIN_TOKEN_CHARS = 16


def seconds(minimum: float, *, inclusive: bool = True) -> Parser:
    """A finite number of seconds from ``minimum`` (excluded unless ``inclusive``) to a year."""

    def parse(source: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{source}={text!r} is not a number of seconds") from None
        too_small = value < minimum if inclusive else value <= minimum
        if not math.isfinite(value) or too_small or value > LONGEST_S:
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise ConfigError(f"{source}={text!r} must be a finite number of seconds {bound}")
        return value

    return parse


def count(minimum: int, maximum: int) -> Parser:
    """A whole number within ``minimum``..``maximum``."""

    def parse(source: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{source}={text!r} is not a whole number") from None
        if not minimum <= value <= maximum:
            raise ConfigError(f"{source}={text!r} must be between {minimum} and {maximum}")
        return value

    return parse


def text(source: str, text: str) -> str:
    """The text as it is (stripped)."""
    return text


def optional(source: str, text: str) -> str | None:
    """The text, or None when it is empty."""
    return text or None


def token(source: str, text: str) -> str | None:
    """A secret the operator presents, long enough not to be guessed; None when empty."""
    # The value is never quoted: it is the secret.
    if not text:
        return None
    if len(text) < MIN_TOKEN_CHARS or not text.isascii() or not text.isprintable():
        raise ConfigError(
            f"{source} must be at least {MIN_TOKEN_CHARS} printable ASCII characters; "
            "make one with `openssl rand -hex 32`, or leave it empty for a read-only page"
        )
    return text


def channel(source: str, text: str) -> str:
    """A NOTIFY channel: a plain identifier."""
    if not _CHANNEL.fullmatch(text):
        raise ConfigError(
            f"{source}={text!r} is not a plain identifier (letters, digits, _; at most 63)"
        )
    return text


def mode(source: str, text: str) -> str:
    """``listen`` or ``poll``."""
    if text not in ("listen", "poll"):
        raise ConfigError(f"{source}={text!r} must be 'listen' or 'poll'")
    return text


def address(example: str) -> Parser:
    """HOST:PORT as (host, port), or None when empty; ``example`` shows the form in messages."""

    def parse(source: str, text: str) -> tuple[str, int] | None:
        if not text:
            return None
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"{source}={text!r} must be HOST:PORT, e.g. {example}, or empty")
        return host.strip("[]") or "0.0.0.0", int(port)

    return parse


def page_url(source: str, text: str) -> str | None:
    """The address of the operator's page through a reverse proxy; None when empty."""
    if not text:
        return None
    # A value with user info is not quoted: it may hold a password.
    shown = source if "@" in text else f"{source}={text!r}"
    usage = (
        f"{shown} must be the page's address through your proxy, "
        "https://HOST[:PORT]/ (or http://), with no path, user, query or fragment"
    )
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        raise ConfigError(usage) from None
    # The page's links and redirects are absolute paths (/login, /actions/...): served under a
    # prefix, they would leave it, so a proxy must map the page's root to the reactor's.
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(usage)
    return text
