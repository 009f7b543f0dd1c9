"""Jinja2 for the page: autoescape on for every template, so whatever a user or an agent
named (group, worker, host, env value, log line, a server message) is shown as text."""

from __future__ import annotations

from importlib import resources
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse

from . import security
from .api import server_token
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


def logged_in(request: Request) -> bool:
    return security.session_ok(server_token(request.app), request.cookies.get(security.SESSION_COOKIE))


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    def url_for(route: str, **params: Any) -> str:
        return str(request.app.url_path_for(route, **params))

    def static(path: str) -> str:
        return url_for("web_static", path=path)

    csrf = security.csrf_value(server_token(request.app)) if logged_in(request) else None
    html = environment.get_template(name).render({"url_for": url_for, "static": static, "csrf": csrf,
                                                  "notice": None, **context})
    return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})
