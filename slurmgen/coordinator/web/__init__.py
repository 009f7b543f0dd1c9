"""The coordinator's web page, served by `slurmgen serve` under /ui (and / redirects there).

Server-rendered HTML (Jinja2, autoescape on) over the coordinator's own JSON API, called in
process (api.py), so the page changes nothing the CLI could not. A small script (static/app.js)
refreshes live values, the log view and the curves every second; htmx (vendored, like uPlot, by
scripts/vendor_js.sh) adds the settings form's live rank-table preview. The browser logs in
with the token and keeps only a random session id in an HttpOnly SameSite=Strict cookie;
POSTs need the session's CSRF value and a same-origin request, and end in a redirect; every
response carries a CSP with no inline script (security.py).
When a group's attempt ends, status_page.py writes a static status.html next to its run records.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles


def mount(app: FastAPI) -> None:
    """Add the page's routes, static files and security headers to the coordinator's app."""
    from . import (
        auth,
        controls,
        curves,
        live,
        routes,
        run_api,
        run_detail,
        run_live,
        run_logs,
        run_stacks,
        runs_page,
        security,
        status_page,
    )
    from .render import STATIC

    app.state.sessions = security.Sessions()

    app.include_router(auth.router, include_in_schema=False)
    app.include_router(controls.router, include_in_schema=False)  # before the catch-all action routes
    app.include_router(run_api.router)  # JSON, behind the API token like every /api/ path
    app.include_router(routes.router, include_in_schema=False)
    app.include_router(live.router, include_in_schema=False)
    app.include_router(runs_page.router, include_in_schema=False)
    app.include_router(run_detail.router, include_in_schema=False)
    app.include_router(curves.router, include_in_schema=False)
    app.include_router(run_logs.router, include_in_schema=False)
    app.include_router(run_stacks.router, include_in_schema=False)
    app.include_router(run_live.router, include_in_schema=False)
    app.mount("/ui/static", StaticFiles(directory=str(STATIC)), name="web_static")
    app.add_middleware(auth.PageSecurityHeaders)
    status_page.watch(app)
