"""Jinja2 for the page: autoescape on for every template, so whatever a user or an agent
named (group, worker, host, env value, log line, a server message) is shown as text."""

from __future__ import annotations

from importlib import resources
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse

from slurmgen.contract.states import shown

from . import security
from .views import state_class

TEMPLATES = resources.files("slurmgen.coordinator.web") / "templates"
STATIC = resources.files("slurmgen.coordinator.web") / "static"

environment = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
environment.filters["state_class"] = state_class
environment.filters["shown"] = shown  # a state word as people read it: a stop on request is "stopped by you"


def session_of(request: Request) -> security.Session | None:
    """The request's live session (None: not logged in, expired or logged out)."""
    return request.app.state.sessions.get(request.cookies.get(security.SESSION_COOKIE))


def logged_in(request: Request) -> bool:
    return session_of(request) is not None


def take_flash(request: Request) -> dict[str, Any]:
    """What the POST before the redirect left for this page (shown once)."""
    session = session_of(request)
    if session is None:
        return {}
    flash, session.flash = session.flash, {}
    return flash


def flash_notice(flash: dict[str, Any]) -> dict[str, Any]:
    """The notice a POST left (`redirect_with(..., notice=..., done=True)` when it reports what was
    done, not a refusal) as the page templates take it (macros.html: notice_line)."""
    return {"notice": flash.get("notice"), "notice_done": bool(flash.get("done"))}


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    def url_for(route: str, **params: Any) -> str:
        return str(request.app.url_path_for(route, **params))

    def static(path: str) -> str:
        return url_for("web_static", path=path)

    session = session_of(request)
    html = environment.get_template(name).render(
        {"url_for": url_for, "static": static, "csrf": session.csrf if session else None, "notice": None, **context}
    )
    return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})
