"""Connection strings: whether one is well formed, and how one is shown without its secrets.

No message quotes a value that may be secret: a connection string is shown with every libpq
secret parameter masked (:func:`redact_dsn`), or not at all when it does not parse.
"""

from __future__ import annotations

import re

import psycopg.conninfo

from reactor.errors import ConfigError
from reactor.telemetry import redact

# What a malformed DSN is shown as: one that does not parse, or parses into a value that cannot
# be what its key says. No rule can tell which of its fragments are secret, so none is shown.
UNPARSABLE_DSN = "<a malformed connection string>"
# Values that must look like what they are, or the DSN is malformed. In a URL, a password with
# an unencoded "@" ends the userinfo early, so that its tail lands in the host; one with an
# unencoded "/" ends the authority, so that "user:start" is read as host:port and the tail (up
# to "@host/dbname") as the dbname; without the "@", "user:password" is host:port. Each shows
# up here as a value of the wrong shape; the rest of such a DSN is no more to be trusted.
_HOST = re.compile(r"[A-Za-z0-9_.:/%,\[\]-]*")
_SHAPES = {
    "host": _HOST,
    "hostaddr": _HOST,
    "port": re.compile(r"[0-9,]*"),
    "dbname": re.compile(r"[^@:]*"),
}
# A URL connection string up to its query or fragment: its authority, and its dbname when a "/"
# in the password ended the authority early.
_URL_DSN = re.compile(r"postgres(?:ql)?://([^?#]*)", re.IGNORECASE)
# A secret parameter's "name=" inside another value: a lost space glued it there, or an escaped
# one ("user=app\\ password=..."). A stray character inside the name ("p@ssword=") still reads
# as it: libpq would take the whole for the other value, and show the secret with it.
_GLUED = re.compile(
    "|".join(r"[^\w\s=]?".join(map(re.escape, name)) for name in sorted(redact.DSN_SECRET_PARAMS))
    + r"\s*=",
    re.IGNORECASE,
)


def check_dsn(dsn: str, source: str) -> None:
    """Raise ConfigError if ``dsn`` is not a libpq connection string or URL, or is one that a
    character left unencoded broke (see :func:`malformed_dsn`)."""
    if malformed_dsn(dsn):
        # Neither the DSN nor libpq's message (which quotes the text around the fault) is
        # shown: either may hold the password. Nor is any word that holds a fragment a short
        # password could be: the message is ours alone.
        raise ConfigError(
            f"{source} is not a valid connection string; write postgresql://user:secret@host:5432"
            "/dbname with every @, : and / in the user or secret percent-encoded (@ as %40, : as "
            "%3A, / as %2F), or key=value pairs with a value that holds spaces, quotes or "
            "backslashes quoted (key='it\\'s')"
        ) from None


def malformed_dsn(dsn: str) -> bool:
    """True when ``dsn`` does not parse, holds two ``@`` in a URL's authority, or parses into a
    host, port or dbname that cannot be one.

    A URL's userinfo ends at its first ``@``, and a password's unencoded ``@`` or ``/`` leaves
    its tail to the host, the port or the dbname: ``postgresql://u:p@ss@host/db`` would connect
    to a host named ``ss@host`` and libpq would quote it. Everything up to the query is taken
    for the authority here, since an unencoded ``/`` may have cut the real one short.
    """
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except (psycopg.ProgrammingError, UnicodeDecodeError):  # the latter: a URL's "%db"
        return True
    url = _URL_DSN.match(dsn)
    if url and url.group(1).count("@") > 1:
        return True
    return any(_malformed(key, str(value)) for key, value in params.items())


def redact_dsn(dsn: str) -> str:
    """``dsn`` in key=value form with every secret masked, for logs and messages.

    The value of every libpq secret parameter (:data:`reactor.telemetry.redact.DSN_SECRET_PARAMS`:
    password, sslpassword, ...) is masked, in either form, a URL's userinfo password included.
    A malformed DSN gives :data:`UNPARSABLE_DSN`: one that does not parse, or that parses into a
    host, port or dbname that cannot be one (a URL broken by a password's unencoded "@" or "/")
    or into a value holding ``password=`` (a lost space glued it there).
    """
    if malformed_dsn(dsn):
        return UNPARSABLE_DSN
    values = {key: str(value) for key, value in psycopg.conninfo.conninfo_to_dict(dsn).items()}
    shown = {k: redact.MASK if k in redact.DSN_SECRET_PARAMS else v for k, v in values.items()}
    return psycopg.conninfo.make_conninfo(**shown)


def _malformed(key: str, value: str) -> bool:
    if key in redact.DSN_SECRET_PARAMS:
        return False  # masked whatever it holds
    shape = _SHAPES.get(key)
    return bool(_GLUED.search(value)) or (shape is not None and not shape.fullmatch(value))
