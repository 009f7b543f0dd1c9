"""Login, logout, the guard every page route passes, and the security-headers middleware.

`guarded(kind)` wraps a route: "page" sends a visitor without a session to the login page,
"live" answers 401 (the page's script then goes to the login), "post" also requires the
session's CSRF value and a same-origin request. Rules live in security.py; this module applies
them. Every form's POST ends in a 303 redirect to a page (`redirect_with` keeps a refusal's
notice for it in the session), so the address bar never shows a POST's URL and a reload
never posts again.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from . import security
from .api import server_token
from .render import logged_in, render, session_of

router = APIRouter()


async def form_data(request: Request) -> dict[str, str]:
    """An urlencoded form body, last value per field (the page posts no files)."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in fields.items()}


def form_list(raw: bytes, name: str) -> list[str]:
    return parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True).get(name, [])


def own_origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def _safe_next(target: str) -> str:
    """Only a path of this page after login, never another site (`//evil`, `https://...`)."""
    return target if target.startswith("/ui/") and not target.startswith("//") and "\\" not in target else "/ui/"


def redirect_with(request: Request, target: str, **flash: Any) -> Response:
    """POST-redirect-GET: a 303 to `target`, which shows `flash` (a notice, a refused form) once."""
    session = session_of(request)
    if session is not None and flash:
        session.flash = flash
    return RedirectResponse(target, status_code=303)


def guarded(kind: str) -> Callable[[Callable[..., Awaitable[Response]]], Callable[..., Awaitable[Response]]]:
    def wrap(handler: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
        @functools.wraps(handler)
        async def guard(request: Request, *args: Any, **kwargs: Any) -> Response:
            session = session_of(request)
            if session is None:
                if kind == "page":
                    return RedirectResponse(f"/ui/login?next={quote(request.url.path)}", status_code=303)
                return JSONResponse({"detail": "log in first (no valid session)"}, status_code=401)
            if kind == "post":
                presented = request.headers.get(security.CSRF_HEADER) or (await form_data(request)).get(
                    security.CSRF_FIELD
                )
                if not security.same_origin(request.headers, own_origin(request)) or not session.csrf_ok(presented):
                    return JSONResponse(
                        {"detail": "cross-site request refused (bad CSRF value or Origin)"}, status_code=403
                    )
            return await handler(request, *args, **kwargs)

        return guard

    return wrap


@router.get("/ui/login", name="web_login_page")
async def login_page(request: Request, next: str = "/ui/", failed: bool = False) -> Response:
    if logged_in(request):  # nothing to log in to: go where the login would have led
        return RedirectResponse(_safe_next(next), status_code=303)
    error = "That is not the coordinator's token." if failed else None
    return render(request, "login.html", {"next": _safe_next(next), "error": error}, status=401 if failed else 200)


@router.post("/ui/login", name="web_login")
async def login(request: Request) -> Response:
    form = await form_data(request)
    target = _safe_next(form.get("next", "/ui/"))
    if not security.same_origin(request.headers, own_origin(request)):
        return JSONResponse({"detail": "cross-site login refused"}, status_code=403)
    if not security.token_matches(server_token(request.app), form.get("token", "")):
        return RedirectResponse(f"/ui/login?failed=1&next={quote(target)}", status_code=303)
    cookie, _ = request.app.state.sessions.create()
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        security.SESSION_COOKIE,
        cookie,
        max_age=int(request.app.state.sessions.lifetime),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/ui/logout", name="web_logout")
@guarded("post")
async def logout(request: Request) -> Response:
    request.app.state.sessions.revoke(request.cookies.get(security.SESSION_COOKIE))
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(security.SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


class PageSecurityHeaders:
    """Pure ASGI middleware: the page's security headers on every response under /ui (replacing
    the API's: a stricter CSP, and a referrer policy that lets the browser send the Origin the
    POST check needs), and the missing ones on every other response."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        page = scope["path"] == "/" or scope["path"].startswith("/ui/")
        host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        secure_origin = security.trustworthy(scope.get("scheme", "http"), host)

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if page:
                    ours = {k.encode() for k in security.SECURITY_HEADERS}
                    headers = [(k, v) for k, v in headers if k.lower() not in ours]
                extra = security.add_security_headers({k.decode("latin-1"): v for k, v in headers}, secure_origin)
                message["headers"] = headers + [(k.encode(), v.encode()) for k, v in extra.items()]
            await send(message)

        await self.app(scope, receive, send_with_headers)
