"""The page's defences: session cookie, cross-site request checks and response headers.

The browser never holds the coordinator's token itself: the login form exchanges it for a
cookie whose value is an HMAC of the token (HttpOnly, so page scripts cannot read it;
SameSite=Strict, so other sites cannot send it). A POST must also carry the CSRF value (a
second HMAC, rendered into the page) and, when the browser says where it comes from, an
Origin equal to the page's own: either check alone stops a forged cross-site form.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Mapping

SESSION_COOKIE = "slurmgen_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"

# No inline script or style anywhere: everything comes from /static on this origin.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "font-src 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
])
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


def _mac(token: str, purpose: str) -> str:
    return hmac.new(token.encode(), purpose.encode(), hashlib.sha256).hexdigest()


def session_value(token: str) -> str:
    """What the session cookie holds: derived from the token, useless as a token for the API."""
    return _mac(token, "slurmgen web session")


def csrf_value(token: str) -> str:
    return _mac(token, "slurmgen web csrf")


def token_matches(token: str, presented: str) -> bool:
    return hmac.compare_digest(token.encode(), presented.strip().encode())


def session_ok(token: str, cookie: str | None) -> bool:
    return bool(cookie) and hmac.compare_digest(session_value(token).encode(), cookie.encode())


def csrf_ok(token: str, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(csrf_value(token).encode(), presented.encode())


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
