"""Who may act on the page, and which requests are the page's own: the token, sessions and
their form tokens, the sign-in throttle, the Host allowlist and the same-site check. Pure: no
I/O; the time is a clock passed in, or ``now``."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

# A signed-in browser stays signed in this long, or until the process restarts.
SESSION_SECONDS = 12 * 3600.0
COOKIE = "reactor_dashboard"


Who = Literal["bearer", "cookie"]

# The most sessions held at once; past it the oldest is signed out. A person signs in a few
# times a day, so only a script signing in in a loop gets near it.
MAX_SESSIONS = 1024


class Auth:
    """Who may act, for a process whose operator set ``token`` (None: nobody may).

    - A script sends ``Authorization: Bearer <token>``. A browser never adds that header on
      its own, so another site cannot make one send it: no CSRF token is needed.
    - A person posts the token once to ``/login`` and gets a session cookie: HttpOnly (no
      script reads it), SameSite=Strict (no other site's page sends it along), Secure when the
      page is reached over HTTPS. Its value is a random id this process holds in memory with its
      expiry: signing out deletes it, so a copy of the cookie is worthless from then on, and a
      restart signs everyone out. The token itself is never stored in it.
    - A POST carried by that cookie must also carry a form token, an HMAC of the session under
      a key made at random when the process starts, which only this process's pages hold; and
      it must come from the page itself: ``Sec-Fetch-Site`` same-origin when the browser sends
      it, and ``Origin``, when present, naming the host the request was sent to.

    Every comparison of a secret is in constant time (``hmac.compare_digest``), of digests of
    equal length; sessions are looked up by their digest, so the lookup's timing depends on
    nothing a client chose.
    """

    def __init__(
        self,
        token: str | None,
        *,
        lifetime: float = SESSION_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self._token = None if token is None else _digest(token.encode())
        self._key = secrets.token_bytes(32)
        self.lifetime = lifetime
        self.clock = clock
        self.max_sessions = max_sessions
        # digest of the session id -> when it expires, oldest first (every session lives as
        # long, so issue order is expiry order).
        self._sessions: OrderedDict[bytes, float] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """True when actions are possible at all (REACTOR_DASHBOARD_TOKEN is set)."""
        return self._token is not None

    def token_ok(self, presented: str) -> bool:
        """True when ``presented`` is the token."""
        if self._token is None:
            return False
        return hmac.compare_digest(_digest(presented.encode()), self._token)

    def issue(self) -> str:
        """A new session's cookie value."""
        now = self.clock()
        self._forget_expired(now)
        value = secrets.token_urlsafe(32)
        self._sessions[_digest(value.encode())] = now + self.lifetime
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return value

    def session_ok(self, value: str | None) -> bool:
        """True for a cookie value :meth:`issue` made that has neither expired nor ended."""
        if not self.enabled or not value:
            return False
        expires = self._sessions.get(_digest(value.encode()))
        return expires is not None and self.clock() < expires

    def end(self, value: str | None) -> None:
        """Sign the session ``value`` out: its cookie is refused from now on."""
        if value:
            self._sessions.pop(_digest(value.encode()), None)

    @property
    def sessions(self) -> int:
        """How many sessions are held (expired ones included until the next sign-in)."""
        return len(self._sessions)

    def form_token(self, session: str) -> str:
        """The CSRF token the pages of ``session`` carry in their forms."""
        return self._mac("form", session)

    def form_ok(self, session: str, presented: str) -> bool:
        """True when ``presented`` is ``session``'s form token."""
        return hmac.compare_digest(presented.encode(), self.form_token(session).encode())

    def _mac(self, purpose: str, text: str) -> str:
        return hmac.new(self._key, f"{purpose}:{text}".encode(), hashlib.sha256).hexdigest()

    def _forget_expired(self, now: float) -> None:
        while self._sessions:
            expires = next(iter(self._sessions.values()))
            if expires > now:
                return
            self._sessions.popitem(last=False)


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# A wrong token this many times within FAILURE_WINDOW_S from one address, and that address is
# refused (429) until the oldest of those failures is FAILURE_WINDOW_S old.
MAX_FAILURES = 5
FAILURE_WINDOW_S = 60.0
# The most addresses remembered; past it the one whose last failure is oldest is forgotten.
MAX_CLIENTS = 4096


class Throttle:
    """Failed presentations of the token, per client address, within a sliding window; pure
    (``now`` is passed in).

    An address with ``limit`` failures inside ``window`` seconds is refused until the oldest of
    them leaves the window. Each address is counted on its own: one client's success or
    failure changes nobody else's count. Memory is bounded by ``max_clients`` addresses of
    at most ``limit`` times each.
    """

    def __init__(
        self,
        *,
        limit: int = MAX_FAILURES,
        window: float = FAILURE_WINDOW_S,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        # address -> the times of its recent failures, oldest first; the address whose last
        # failure is oldest comes first.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait(self, client: str, now: float) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        times = self._recent(client, now)
        if times is None or len(times) < self.limit:
            return None
        return times[0] + self.window - now

    def failed(self, client: str, now: float) -> float | None:
        """Count a failure of ``client``; returns :meth:`wait` after it."""
        times = self._recent(client, now)
        if times is None:
            times = self._failures[client] = deque(maxlen=self.limit)
        times.append(now)
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
        return self.wait(client, now)

    def succeeded(self, client: str) -> None:
        """``client`` presented the token: its failures are forgotten, nobody else's."""
        self._failures.pop(client, None)

    @property
    def clients(self) -> int:
        """How many addresses are remembered."""
        return len(self._failures)

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times


# The names a browser on the reactor's own host uses for it; loopback cannot be pointed
# elsewhere by a DNS answer.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class HostAllowlist:
    """The Host headers the page answers: loopback names, the address it is configured on, and
    the host of REACTOR_DASHBOARD_URL; pure.

    This is what defeats DNS rebinding: a site the operator visits can point its own name at
    127.0.0.1 and have the browser read the page through an ``ssh -L`` tunnel, but the request
    then carries that site's name as its Host. Names are compared, not ports: a rebinding
    changes the name, and proxies differ in whether they pass a port on.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(_host_name(name) for name in names)

    @classmethod
    def for_page(cls, addr_host: str | None, url_host: str | None) -> HostAllowlist:
        """Loopback, plus the host the page is bound to (unless a wildcard) and the URL's."""
        names = set(LOOPBACK_NAMES)
        if addr_host is not None and addr_host not in _WILDCARDS:
            names.add(addr_host)
        if url_host is not None:
            names.add(url_host)
        return cls(names)

    def allows(self, host_header: str | None) -> bool:
        """True when a request whose Host header is ``host_header`` is for this page."""
        if not host_header:
            return False
        name = split_host(host_header)
        return name is not None and _host_name(name) in self.names


def split_host(header: str) -> str | None:
    """The name in a Host header (``name``, ``name:port``, ``[v6]`` or ``[v6]:port``), or None
    when it is none of those."""
    header = header.strip()
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name
    name, colon, port = header.partition(":")
    if colon and not port.isdigit():
        return None
    return name


def _host_name(name: str) -> str:
    # A trailing dot names the same host (an absolute name).
    return name.strip("[]").lower().removesuffix(".")


def cross_site(headers: Mapping[str, str], host: str) -> str | None:
    """Why a POST with ``headers``, sent to ``host``, did not come from this page; None when
    nothing says it came from elsewhere."""
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site != "same-origin":
        return f"Sec-Fetch-Site is {site}"
    origin = headers.get("Origin")
    if origin is None:
        return None
    if origin == "null" or urllib.parse.urlsplit(origin).netloc.lower() != host.lower():
        return "Origin names another site"
    return None


# What every response of the page carries.
HEADERS = {
    "Cache-Control": "no-store",
    # No script, no frames, no requests anywhere else; forms post only back here.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: under it a browser sends "Origin: null" even for the page's own forms.
    "Referrer-Policy": "same-origin",
}
