"""Keeping secrets out of what the reactor shows: logs, stored errors, metrics and status.

A URL is shown as scheme, host, port and path only: its credentials, query string and fragment
are where tokens live. Text that may quote a URL (an HTTP client's exception, a hook's own
error message) goes through :func:`scrub`, which also blanks the secret values the reactor was
configured with, wherever they appear, and the value of every libpq secret parameter
(:data:`DSN_SECRET_PARAMS`) written as ``key=value``. Pure; nothing here does I/O.

Secrets are collected as written and as decoded (``p%40ss`` and ``p@ss``): a message may quote
either form.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Collection, Iterable

import psycopg
import psycopg.conninfo
import psycopg.pq

MASK = "***"

# Anything that looks like scheme://..., up to whitespace or a quote.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
# The authority of a URL (userinfo@host:port), whatever it holds: no parser's opinion needed.
_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)")
# Shorter values are too likely to be ordinary words or numbers in the text around them, and
# masking those would garble messages without hiding anything worth hiding.
_MIN_SECRET = 4

# libpq marks its secret options with dispchar "*" in PQconndefaults (password, sslpassword,
# and oauth_client_secret from libpq 18 on); the SCRAM keys are password equivalents it marks
# "D" (debug) instead. These names stand in when libpq cannot be asked, and cover options a
# newer libpq knows than the one psycopg carries.
_KNOWN_SECRET_PARAMS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)


def _libpq_secret_params() -> frozenset[str]:
    try:
        options = psycopg.pq.Conninfo.get_defaults()
    except psycopg.Error:  # libpq could not say (out of memory): the known names must do
        return frozenset()
    return frozenset(option.keyword.decode() for option in options if option.dispchar == b"*")


# Every connection parameter whose value is a secret.
DSN_SECRET_PARAMS = _KNOWN_SECRET_PARAMS | _libpq_secret_params()

# ``key=value`` for a secret parameter, as an error may quote a key=value connection string:
# the value runs to its closing quote (or the end, when there is none), or unquoted to the next
# space, libpq's backslash escapes included.
_DSN_SECRET = re.compile(
    r"\b(" + "|".join(sorted(DSN_SECRET_PARAMS)) + r")(\s*=\s*)"
    r"('(?:\\.|[^'\\])*(?:'|\\?$)|(?:\\.|[^\s\\])+\\?)",
    re.IGNORECASE,
)


def safe_url(url: str) -> str:
    """``url`` as scheme://host[:port]/path: no user, password, query or fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # a malformed port or IPv6 literal: show nothing of it
        return "<malformed URL>"
    if not host:
        # Without "//host", urlsplit takes whatever follows the scheme for the path, and in a
        # URL that lost its scheme ("user:password@host/x") that path is the credentials.
        return "<URL without a host>"
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def scrub(text: str, secrets: Collection[str] = ()) -> str:
    """``text`` with every URL cut down to :func:`safe_url`, every ``password=...`` (any libpq
    secret parameter) masked, and every secret masked."""
    text = _URL.sub(lambda match: safe_url(match.group(0)), text)
    text = _DSN_SECRET.sub(lambda match: match.group(1) + match.group(2) + MASK, text)
    # Longest first, so a secret that contains another is masked whole.
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def url_secrets(url: str) -> set[str]:
    """The values in ``url`` that may be secret: the password (or a userinfo without one, as a
    token sent as the user name), every query value and the fragment.

    Read with string operations only, so a URL too malformed for urlsplit still gives them up.
    """
    head, _, fragment = url.partition("#")
    head, _, query = head.partition("?")
    found = {fragment}
    authority = _AUTHORITY.match(head)
    userinfo, at, _ = authority.group(1).rpartition("@") if authority else ("", "", "")
    if at:
        user, colon, password = userinfo.partition(":")
        found.add(password if colon else user)
    for item in re.split(r"[&;]", query):
        _, equals, value = item.partition("=")
        found.add(value if equals else item)  # a bare ?token is a value too
    return _long_enough(_with_decoded(found))


def dsn_secrets(dsn: str) -> set[str]:
    """The values of every libpq secret parameter in a connection string or URL (password,
    sslpassword, ...), as libpq reads them and as they are written."""
    found: set[str] = set()
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except (psycopg.ProgrammingError, UnicodeDecodeError):  # the latter: a URL's "%db"
        params = {}
    found.update(str(value) for key, value in params.items() if key in DSN_SECRET_PARAMS)
    # As written too: a URL's percent-encoding, a key=value string's quotes; and the best that
    # can be read from one that does not parse. Only ever masked, so reading too much is safe.
    for match in _DSN_SECRET.finditer(dsn):
        found.add(match.group(3))
        found.add(match.group(3).strip("'"))
    authority = _AUTHORITY.match(dsn)
    userinfo, at, _ = authority.group(1).rpartition("@") if authority else ("", "", "")
    if at:
        found.add(userinfo.partition(":")[2])
    _, _, query = dsn.partition("?")
    for item in re.split(r"[&;]", query.partition("#")[0]):
        key, _, value = item.partition("=")
        if urllib.parse.unquote(key).strip().lower() in DSN_SECRET_PARAMS:
            found.add(value)
    return _long_enough(_with_decoded(found))


def known_secrets(
    *,
    webhook_secret: str | None,
    dsns: Iterable[str | None],
    urls: Iterable[str],
    webhook_secrets: Iterable[str | None] = (),
) -> frozenset[str]:
    """Every configured secret value, for :func:`scrub`: the shared and per-hook webhook
    secrets, the databases' secret parameters and the webhook URLs' own secrets."""
    found = _long_enough({webhook_secret or "", *(secret or "" for secret in webhook_secrets)})
    for dsn in dsns:
        if dsn:
            found |= dsn_secrets(dsn)
    for url in urls:
        found |= url_secrets(url)
    return frozenset(found)


def _with_decoded(values: Iterable[str]) -> set[str]:
    # A client may quote the URL decoded ("p@ss" for "p%40ss"; "+" is a space in a query).
    found = set(values)
    for value in list(found):
        found.add(urllib.parse.unquote(value))
        found.add(urllib.parse.unquote_plus(value))
    return found


def _long_enough(values: Iterable[str]) -> set[str]:
    return {value for value in values if len(value) >= _MIN_SECRET}
