"""The HTTP layer: `create_app(coordinator, token)` -> a FastAPI app serving the JSON API.

Routes map arguments to `Coordinator` methods and its errors to status codes (404, 409, 422);
a token guards everything but /api/health (`require_token`, also used by the web page's
routes: an `Authorization: Bearer` header, or the `slurmgen_token` cookie the page sets).
Every response carries security headers. The web page (`slurmgen.coordinator.web`, issue 13)
is mounted (`web.mount(app)`) when that package exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
from typing import List, Optional

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from slurmgen import __version__
from slurmgen.coordinator.models import (
    AgentOrders, AgentReport, Changed, ErrorOut, GroupConfig, GroupCreate, GroupDetail, GroupOut, LogLine,
    MoveRequest, RankOut, WorkerOut,
)
from slurmgen.coordinator.service import Conflict, Coordinator, Invalid, NotFound

TOKEN_COOKIE = "slurmgen_token"
TICK_SECONDS = 0.5
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
}
# FastAPI's /docs page loads Swagger UI from a CDN; only that page gets a wider policy.
DOCS_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
            "style-src 'self' https://cdn.jsdelivr.net; img-src 'self' data: https://fastapi.tiangolo.com; "
            "frame-ancestors 'none'")
ERRORS = {404: {"model": ErrorOut}, 409: {"model": ErrorOut}, 401: {"model": ErrorOut}}


def token_matches(presented: Optional[str], token: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), token.encode())


def make_token_check(token: str):
    """The FastAPI dependency that refuses a request without the token (401)."""

    def require_token(request: Request) -> None:
        header = request.headers.get("authorization", "")
        presented = header[7:] if header.lower().startswith("bearer ") else request.cookies.get(TOKEN_COOKIE)
        if not token_matches(presented, token):
            raise HTTPException(401, "missing or wrong token", headers={"WWW-Authenticate": "Bearer"})

    return require_token


def api_router(c: Coordinator) -> APIRouter:
    """The JSON API under /api, in three parts by who calls them: the worker pool and the
    groups (people, the CLI and the page), and the agents' channel."""
    r = APIRouter(prefix="/api", responses=ERRORS)
    _worker_routes(r, c)
    _group_routes(r, c)
    _agent_routes(r, c)
    return r


def _worker_routes(r: APIRouter, c: Coordinator) -> None:
    """The pool: every slot an agent reported, which group it is in, forgetting a gone one."""

    @r.get("/workers", response_model=List[WorkerOut])
    def workers():
        return c.workers()

    @r.post("/workers/move", response_model=List[WorkerOut])
    def move(body: MoveRequest):
        return c.move(body.workers, body.group)

    @r.delete("/workers/{name}", status_code=204)
    def forget(name: str):
        c.forget_worker(name)


def _group_routes(r: APIRouter, c: Coordinator) -> None:
    """A group's life: create, configure, see its ranks, start, stop, read its output."""

    @r.get("/groups", response_model=List[GroupOut])
    def groups():
        return c.groups()

    @r.post("/groups", response_model=GroupOut, status_code=201)
    def create(body: GroupCreate):
        return c.create_group(body.name)

    @r.get("/groups/{name}", response_model=GroupDetail)
    def detail(name: str):
        return c.detail(name)

    @r.delete("/groups/{name}", status_code=204)
    def delete(name: str):
        c.delete_group(name)

    @r.put("/groups/{name}/config", response_model=GroupOut)
    def configure(name: str, body: GroupConfig):
        return c.configure(name, body)

    @r.get("/groups/{name}/ranks", response_model=List[RankOut])
    def ranks(name: str):
        return c.ranks(name)

    @r.post("/groups/{name}/start", response_model=GroupOut)
    def start(name: str):
        return c.start(name)

    @r.post("/groups/{name}/stop", response_model=GroupOut)
    def stop(name: str):
        return c.stop(name)

    @r.get("/groups/{name}/logs", response_model=List[LogLine])
    def logs(name: str, rank: Optional[int] = None, attempt: Optional[int] = None,
             after: int = 0, limit: int = Query(500, ge=1, le=5000), tail: bool = False):
        """Lines with id > after, oldest first: the first `limit`, or with tail=true the last."""
        return c.logs(name, rank, attempt, after, limit, tail)


def _agent_routes(r: APIRouter, c: Coordinator) -> None:
    """The agents' channel: a heartbeat answered with orders, and a long poll for changes."""

    # async on purpose: the busiest route (every agent, every second) skips the threadpool
    # hop; the service call is a short transaction (well under a millisecond).
    @r.post("/agents/heartbeat", response_model=AgentOrders)
    async def heartbeat(body: AgentReport):
        return c.heartbeat(body)

    @r.get("/agents/changes", response_model=Changed)
    async def changes(since: int = -1, timeout: float = Query(25.0, ge=0, le=60)):
        """Long poll: returns when a start, stop or end may have brought new orders."""
        return Changed(version=await c.changes.wait(since, timeout))


def create_app(coordinator: Coordinator, token: str) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async def ticker():
            while True:
                await asyncio.sleep(TICK_SECONDS)
                await asyncio.to_thread(coordinator.tick)

        coordinator.changes.bind(asyncio.get_running_loop())
        task = asyncio.create_task(ticker())
        try:
            yield
        finally:
            task.cancel()

    app = FastAPI(title="slurmgen coordinator", version=__version__, lifespan=lifespan,
                  description="Worker groups across nodes: ranks, start, stop, fail as one.")
    app.state.coordinator = coordinator
    app.state.token = token
    require_token = make_token_check(token)
    app.state.require_token = require_token

    app.add_middleware(SecurityHeaders)

    for kind, status in ((NotFound, 404), (Conflict, 409), (Invalid, 422)):
        app.add_exception_handler(kind, _handler(status))

    @app.get("/api/health")
    def health():
        return {"ok": True, "version": __version__}

    app.include_router(api_router(coordinator), dependencies=[Depends(require_token)])
    if importlib.util.find_spec("slurmgen.coordinator.web") is not None:
        from slurmgen.coordinator import web

        web.mount(app)
    return app


class SecurityHeaders:
    """Pure ASGI middleware (Starlette's BaseHTTPMiddleware costs a task per request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        extra = dict(SECURITY_HEADERS)
        if path == "/docs":
            extra["Content-Security-Policy"] = DOCS_CSP
        if path.startswith("/api/"):
            extra["Cache-Control"] = "no-store"
        raw = [(k.lower().encode(), v.encode()) for k, v in extra.items()]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *raw]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def run(coordinator: Coordinator, token: str, host: str, port: int, **tls: Optional[str]) -> None:
    """Serve until SIGTERM/SIGINT. Judging stops the moment shutdown begins, and open long
    polls get at most 2 s, so a restart never fails a group for the silence it caused."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            coordinator.closing = True
            super().handle_exit(sig, frame)

    config = uvicorn.Config(create_app(coordinator, token), host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=2, **tls)
    Server(config).run()


def _handler(status: int):
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handle
