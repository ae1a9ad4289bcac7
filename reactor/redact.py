"""Keeping secrets out of what the reactor shows: logs, stored errors, metrics and status.

A URL is shown as scheme, host, port and path only: its credentials, query string and fragment
are where tokens live. Text that may quote a URL (an HTTP client's exception, a hook's own
error message) goes through :func:`scrub`, which also blanks the secret values the reactor was
configured with, wherever they appear. Pure; nothing here does I/O.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Collection, Iterable

import psycopg
import psycopg.conninfo

MASK = "***"

# Anything that looks like scheme://..., up to whitespace or a quote.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
# Shorter values are too likely to be ordinary words or numbers in the text around them, and
# masking those would garble messages without hiding anything worth hiding.
_MIN_SECRET = 4


def safe_url(url: str) -> str:
    """``url`` as scheme://host[:port]/path: no user, password, query or fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # a malformed port or IPv6 literal: show nothing of it
        return "<malformed URL>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def scrub(text: str, secrets: Collection[str] = ()) -> str:
    """``text`` with every URL cut down to :func:`safe_url` and every secret masked."""
    text = _URL.sub(lambda match: safe_url(match.group(0)), text)
    # Longest first, so a secret that contains another is masked whole.
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def url_secrets(url: str) -> set[str]:
    """The values in ``url`` that may be secret: password, query values, fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        found = {parts.password or "", parts.fragment}
    except ValueError:
        return set()
    found.update(value for _, value in urllib.parse.parse_qsl(parts.query))
    return _long_enough(found)


def dsn_secrets(dsn: str) -> set[str]:
    """The password of a libpq connection string or URL, if it names one."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return set()
    return _long_enough({str(params.get("password") or "")})


def known_secrets(
    *, webhook_secret: str | None, dsns: Iterable[str | None], urls: Iterable[str]
) -> frozenset[str]:
    """Every configured secret value, for :func:`scrub`."""
    found = _long_enough({webhook_secret or ""})
    for dsn in dsns:
        if dsn:
            found |= dsn_secrets(dsn)
    for url in urls:
        found |= url_secrets(url)
    return frozenset(found)


def _long_enough(values: Iterable[str]) -> set[str]:
    return {value for value in values if len(value) >= _MIN_SECRET}
