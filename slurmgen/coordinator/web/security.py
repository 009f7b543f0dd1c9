"""The page's defences: sessions, cross-site request checks and response headers.

The browser never holds the coordinator's token itself: the login form exchanges it for a
session, a random id (HttpOnly cookie, so page scripts cannot read it; SameSite=Strict, so
other sites cannot send it) that the server keeps in memory with its expiry and its own
random CSRF value. Logging out revokes it at once, a server restart revokes them all. A POST
must also carry the session's CSRF value (rendered into the page) and, when the browser says
where it comes from, an Origin equal to the page's own: either check alone stops a forged
cross-site form.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SESSION_COOKIE = "slurmgen_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"

# No inline script or style anywhere: everything comes from /static on this origin.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)
SECURITY_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # same-origin, not no-referrer: with no-referrer Chromium sends `Origin: null` on a form POST.
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
    "permissions-policy": "camera=(), microphone=(), geolocation=()",
}
SESSION_SECONDS = 12 * 3600  # a login lasts a working day
MAX_SESSIONS = 256  # logins kept at once; the oldest goes first (only a token holder adds one)


def token_matches(token: str, presented: str) -> bool:
    return hmac.compare_digest(token.encode(), presented.strip().encode())


@dataclass
class Session:
    """One login: when it ends, its CSRF value, and what the next page shows after a redirect
    (a refusal's notice, a refused form's values and errors: POST-redirect-GET)."""

    expires: float
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    flash: dict[str, Any] = field(default_factory=dict)

    def csrf_ok(self, presented: str | None) -> bool:
        if not presented:
            return False
        return hmac.compare_digest(self.csrf.encode(), presented.encode())


class Sessions:
    """The logins this server process handed out, by a hash of their cookie value (a lookup
    that leaks no timing about the id). In memory: a restart logs everybody out."""

    def __init__(self, lifetime: float = SESSION_SECONDS, clock: Callable[[], float] = time.time):
        self.lifetime, self.clock = lifetime, clock
        self.by_key: dict[str, Session] = {}

    @staticmethod
    def _key(cookie: str) -> str:
        return hashlib.sha256(cookie.encode()).hexdigest()

    def create(self) -> tuple[str, Session]:
        """A new session: (cookie value, session)."""
        now = self.clock()
        self.by_key = {k: s for k, s in self.by_key.items() if s.expires > now}
        while len(self.by_key) >= MAX_SESSIONS:
            self.by_key.pop(min(self.by_key, key=lambda k: self.by_key[k].expires))
        cookie = secrets.token_urlsafe(32)
        session = self.by_key[self._key(cookie)] = Session(expires=now + self.lifetime)
        return cookie, session

    def get(self, cookie: str | None) -> Session | None:
        if not cookie:
            return None
        session = self.by_key.get(self._key(cookie))
        if session is not None and session.expires <= self.clock():
            self.revoke(cookie)
            return None
        return session

    def revoke(self, cookie: str | None) -> None:
        if cookie:
            self.by_key.pop(self._key(cookie), None)


def same_origin(headers: Mapping[str, str], own_origin: str) -> bool:
    """False only when the browser names another origin (an old browser may send none)."""
    origin = headers.get("origin")
    return origin is None or origin == own_origin


LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


def trustworthy(scheme: str, host: str) -> bool:
    """Whether browsers honour Cross-Origin-Opener-Policy here (https or loopback); elsewhere
    Chromium ignores it with a console error on every page."""
    name = host.partition("]")[0] + "]" if host.startswith("[") else host.partition(":")[0]
    return scheme == "https" or name in LOOPBACK


def add_security_headers(headers: Mapping[str, str], secure_origin: bool = True) -> dict[str, str]:
    """The headers to add to a response that does not set them itself."""
    have = {k.lower() for k in headers}
    skip = set() if secure_origin else {"cross-origin-opener-policy"}
    return {k: v for k, v in SECURITY_HEADERS.items() if k not in have and k not in skip}
