"""Webhook signatures: what the reactor sends, and what a receiver in Python checks.

The scheme is the one the large webhook senders use. With a secret set for a webhook hook, every
request it sends carries::

    X-Reactor-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>

The secret is the first set of its pair's ``REACTOR_WEBHOOK_SECRET_<PAIR>_<HOOK>``, the hook's
``REACTOR_WEBHOOK_SECRET_<HOOK>`` and the shared ``REACTOR_WEBHOOK_SECRET`` (names upper-cased,
``-`` written ``_``: hook ``ops-diag`` reads ``REACTOR_WEBHOOK_SECRET_OPS_DIAG``); with several
pairs, the names without the pair only where one pair alone could mean them
(``reactor.hooks.secrets``). Give each receiver a secret of its own: a receiver holds the key it
verifies with, and with a shared one it could sign calls to every other receiver.

Signing the timestamp with the body lets a receiver refuse a captured request replayed later:
it checks the signature, then that ``t`` is within a tolerance of its own clock. A receiver
should verify the raw bytes it received, before parsing them, and compare in constant time.

Pure and dependency-free, so a receiver imports it without the reactor's other modules::

    from reactor.hooks.signature import verify_signature

    if not verify_signature(secret, request.headers.get("X-Reactor-Signature"), raw_body,
                            now=time.time()):
        return 400
"""

from __future__ import annotations

import hashlib
import hmac
import math

SIGNATURE_HEADER = "X-Reactor-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE_S = 300.0


class SignatureError(ValueError):
    """A signature header that does not prove the body came from the secret's holder, now."""


def sign(secret: str | bytes, body: bytes, *, timestamp: int) -> str:
    """The ``X-Reactor-Signature`` value for ``body`` sent at ``timestamp`` (unix seconds)."""
    return f"t={timestamp},{SCHEME}={_digest(secret, timestamp, body)}"


def check_signature(
    secret: str | bytes,
    header: str | None,
    body: bytes,
    *,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE_S,
) -> int:
    """Return the signed timestamp, or raise SignatureError saying what is wrong.

    ``now`` is the receiver's clock in unix seconds; a timestamp further than ``tolerance``
    seconds from it, in either direction, is refused. Several ``v1`` entries may be present (a
    sender signing with an old and a new secret during a rotation): one match is enough.
    Entries of other schemes are ignored, so a future scheme can be added alongside.
    """
    if not header:
        raise SignatureError("no signature header")
    timestamp: int | None = None
    candidates: list[str] = []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise SignatureError("malformed signature header")
        if key == "t":
            if timestamp is not None or not (value.isascii() and value.isdigit()):
                raise SignatureError("malformed timestamp in signature header")
            timestamp = int(value)
        elif key == SCHEME:
            candidates.append(value)
    if timestamp is None or not candidates:
        raise SignatureError(f"signature header lacks t= or {SCHEME}=")
    if not math.isfinite(now) or abs(now - timestamp) > tolerance:
        raise SignatureError(f"timestamp outside the {tolerance:g} s tolerance")
    expected = _digest(secret, timestamp, body)
    # Compare every candidate, so the time taken does not say which one matched.
    matched = False
    for candidate in candidates:
        matched |= hmac.compare_digest(expected.encode(), candidate.encode())
    if not matched:
        raise SignatureError("signature does not match")
    return timestamp


def verify_signature(
    secret: str | bytes,
    header: str | None,
    body: bytes,
    *,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` within ``tolerance`` of ``now``."""
    try:
        check_signature(secret, header, body, now=now, tolerance=tolerance)
    except SignatureError:
        return False
    return True


def _digest(secret: str | bytes, timestamp: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
