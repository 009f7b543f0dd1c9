"""The HTTP layer: `create_app(coordinator, token)` -> the ASGI app serving the JSON API.

Routes map arguments to `Coordinator` methods and its errors to status codes (404, 409, 422);
a token guards everything under /api but /api/health, and the schema (/openapi.json): an
`Authorization: Bearer` header, or the `slurmgen_token` cookie. `Gate`, the outermost layer,
checks that token and the body's size before anything reads or parses the body, so a stranger
gets 401 or 413 for the price of the headers. There is no /docs or /redoc page (Swagger UI
and ReDoc load their scripts from a CDN). The web page (`slurmgen.coordinator.web`) is mounted
(`web.mount(app)`) when that package exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
import json
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import TypeAdapter, ValidationError

from slurmgen.contract.version import VERSION as __version__
from slurmgen.coordinator.models import (
    LINES_SKIPPED,
    AgentLines,
    AgentOrders,
    AgentReport,
    Changed,
    ErrorOut,
    GroupConfig,
    GroupCreate,
    GroupDetail,
    GroupOut,
    LogLine,
    MoveRequest,
    RankOut,
    WorkerOut,
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
# Request bodies, checked before anything is parsed: an agent's report may carry 2,000 lines of
# up to 4 KiB (escaped in JSON); every other API body is a few KiB; the page's forms less.
AGENT_BODY_LIMIT = 64 * 1024 * 1024
API_BODY_LIMIT = 1024 * 1024
PAGE_BODY_LIMIT = 64 * 1024
SHOWN_INPUT = 120  # characters of a refused value a 422 repeats
LOG_LINES = TypeAdapter(list[LogLine])
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut}, 409: {"model": ErrorOut}, 401: {"model": ErrorOut}}


def token_matches(presented: str | None, token: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), token.encode())


def presented_token(headers: Any, cookies: Any) -> str | None:
    """The token a request carries: its `Authorization: Bearer` header, else the token cookie."""
    header = headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else cookies.get(TOKEN_COOKIE)


def make_token_check(token: str):
    """The FastAPI dependency that refuses a request without the token (401). Async: a plain
    function would cost every API request a hop to the threadpool and back (a heartbeat's
    largest single cost in the profile, docs/measurements.md)."""

    async def require_token(request: Request) -> None:
        if not token_matches(presented_token(request.headers, request.cookies), token):
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

    @r.get("/workers", response_model=list[WorkerOut])
    def workers():
        return c.workers()

    @r.post("/workers/move", response_model=list[WorkerOut])
    def move(body: MoveRequest):
        return c.move(body.workers, body.group)

    @r.delete("/workers/{name}", status_code=204)
    def forget(name: str):
        c.forget_worker(name)


def _group_routes(r: APIRouter, c: Coordinator) -> None:
    """A group's life: create, configure, see its ranks, start, stop, read its output."""

    @r.get("/groups", response_model=list[GroupOut])
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
        """Replace the whole config: a field left out takes its default."""
        return c.configure(name, body)

    @r.patch("/groups/{name}/config", response_model=GroupOut)
    def update_config(name: str, body: dict[str, Any] = Body(..., examples=[{"world_size": 2}])):
        """Change only the fields given; null sets a field back to its default (env and argv
        are replaced whole). What `slurmgen group config` sends."""
        return c.update_config(name, body)

    @r.get("/groups/{name}/ranks", response_model=list[RankOut])
    def ranks(name: str):
        return c.ranks(name)

    @r.post("/groups/{name}/start", response_model=GroupOut)
    def start(name: str):
        return c.start(name)

    @r.post("/groups/{name}/stop", response_model=GroupOut)
    def stop(name: str):
        return c.stop(name)

    @r.get("/groups/{name}/logs", response_model=list[LogLine])
    def logs(
        name: str,
        rank: int | None = None,
        attempt: int | None = None,
        after: int = 0,
        limit: int = Query(500, ge=1, le=5000),
        tail: bool = False,
    ):
        """Lines with id > after, oldest first: the first `limit`, or with tail=true the last; the
        header X-Lines-Skipped counts the lines after `after` that the limit left out ("N+": at
        least N, the server having let older unread lines go)."""
        lines, skipped = c.logs(name, rank, attempt, after, limit, tail)
        # serialised once, here (as a heartbeat's orders): the page asks for up to 2,000 lines
        # twice a second under a flood, and a returned list would be validated and dumped again
        return Response(LOG_LINES.dump_json(lines), media_type="application/json", headers={LINES_SKIPPED: skipped})


def _agent_routes(r: APIRouter, c: Coordinator) -> None:
    """The agents' channel: a heartbeat answered with orders, and a long poll for changes."""

    # async on purpose: the busiest route (every agent, every second) skips the threadpool
    # hop; the service call is a short transaction (well under a millisecond). The orders are
    # serialised once, here: a model returned would be validated against response_model and
    # dumped again, a second copy of work per beat (the schema still names AgentOrders).
    @r.post("/agents/heartbeat", response_model=AgentOrders)
    async def heartbeat(body: AgentReport) -> Response:
        return Response(c.heartbeat(body).model_dump_json(), media_type="application/json")

    @r.post("/agents/lines", status_code=204)
    async def lines(body: AgentLines) -> Response:
        """Output lines sent between heartbeats, as soon as they wait (node_agent.ship_lines)."""
        c.lines(body)
        return Response(status_code=204)

    @r.get("/agents/changes", response_model=Changed)
    async def changes(since: int = -1, timeout: float = Query(25.0, ge=0, le=60)):
        """Long poll: returns when a start, stop or end may have brought new orders."""
        return Changed(version=await c.changes.wait(since, timeout))


def create_app(coordinator: Coordinator, token: str) -> Gate:
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

    app = FastAPI(
        title="slurmgen coordinator",
        version=__version__,
        lifespan=lifespan,
        description="Worker groups across nodes: ranks, start, stop, fail as one.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.coordinator = coordinator
    app.state.token = token
    require_token = make_token_check(token)
    app.state.require_token = require_token

    app.add_middleware(HeartbeatShortcut, coordinator=coordinator, token=token)  # first: the innermost
    app.add_middleware(ApiSecurityHeaders)

    for kind, status in ((NotFound, 404), (Conflict, 409), (Invalid, 422)):
        app.add_exception_handler(kind, _handler(status))
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(ValidationError, _invalid)

    @app.get("/api/health")
    def health():
        return {"ok": True, "version": __version__}

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_token)])
    def schema():
        return app.openapi()

    app.include_router(api_router(coordinator), dependencies=[Depends(require_token)])
    if importlib.util.find_spec("slurmgen.coordinator.web") is not None:
        from slurmgen.coordinator import web

        web.mount(app)
    return Gate(app, token)


def _clipped(value: Any, limit: int = SHOWN_INPUT) -> Any:
    """A refused value as a 422 repeats it: long text cut (with its length), long lists too."""
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"
    if isinstance(value, list):
        return [_clipped(v, limit) for v in value[:20]] + ([f"... ({len(value)} items)"] if len(value) > 20 else [])
    if isinstance(value, dict):
        return {_clipped(str(k), limit): _clipped(v, limit) for k, v in list(value.items())[:20]}
    return value


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    """422 naming each bad field, never echoing a huge value back (a 50 MB name is cut)."""
    assert isinstance(exc, (RequestValidationError, ValidationError))  # the two it is registered for
    errors = []
    for e in exc.errors():
        loc = tuple(e.get("loc", ()))
        if isinstance(exc, ValidationError):  # raised by a route on a merged body (PATCH)
            loc = ("body", *loc)
        errors.append(
            {
                "type": e.get("type"),
                "loc": list(loc),
                "msg": _clipped(str(e.get("msg", "")), 400),
                "input": _clipped(e.get("input")),
            }
        )
    return JSONResponse({"detail": errors}, status_code=422)


def body_limit(path: str) -> int:
    if path in (HeartbeatShortcut.PATH, HeartbeatShortcut.LINES_PATH):
        return AGENT_BODY_LIMIT
    return API_BODY_LIMIT if path.startswith("/api/") else PAGE_BODY_LIMIT


def needs_token(path: str) -> bool:
    return (path.startswith("/api/") and path != "/api/health") or path == "/openapi.json"


class Gate:
    """The outermost layer, pure ASGI: a request to a token-guarded path without the token gets
    401 and a body larger than its path's limit gets 413, both before any of the body is read
    (by its Content-Length, or while it streams in), so no stranger's request is parsed and
    the memory a request can take is bounded. Reads the body into one buffer of at most the
    limit and hands it on."""

    def __init__(self, app: FastAPI, token: str):
        self.app, self.token = app, token

    @property
    def state(self) -> Any:
        """The app's state (its coordinator, token and sessions), as on the app itself."""
        return self.app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        path = scope["path"]
        if needs_token(path) and not token_matches(presented_token(headers, _cookies(headers)), self.token):
            return await _refuse(send, 401, "missing or wrong token", {"www-authenticate": "Bearer"})
        limit = body_limit(path)
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            return await _refuse(send, 413, f"request body over {limit} bytes", {"connection": "close"})
        body = await _read_body(receive, limit)
        if body is None:
            return await _refuse(send, 413, f"request body over {limit} bytes", {"connection": "close"})
        await self.app(scope, _replay(body, receive), send)


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    from http.cookies import SimpleCookie

    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed cookie header is no token
        return {}
    return {k: m.value for k, m in jar.items()}


async def _read_body(receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it passes `limit` bytes (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as Starlette expects

    return replay


async def _refuse(send, status: int, detail: str, extra: dict[str, str]) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "cache-control": "no-store",
        **{k.lower(): v for k, v in SECURITY_HEADERS.items()},
        **extra,
    }
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HeartbeatShortcut:
    """Pure ASGI middleware, the innermost: a well-formed heartbeat (or lines an agent sends
    between its beats) goes straight to `Coordinator.heartbeat` (`Coordinator.lines`), past the
    router. FastAPI's routing, dependency solving and
    response machinery cost a heartbeat more CPU than the coordinator's own work (the profile
    in docs/measurements.md), and 1,000 agents send 1,000 a second. What the shortcut does not
    take (a body the model refuses or not sent as JSON, a token only in a cookie) goes on to the route, which
    answers it as it answers every request; the middlewares outside add the same headers."""

    PATH = "/api/agents/heartbeat"
    LINES_PATH = "/api/agents/lines"

    def __init__(self, app: Any, coordinator: Coordinator, token: str):
        self.app, self.coordinator, self.token = app, coordinator, token
        # path -> (its body's model, what answers it: status and body)
        self.paths: dict[str, tuple[Any, Callable[[Any], tuple[int, bytes]]]] = {
            self.PATH: (AgentReport, self._beat),
            self.LINES_PATH: (AgentLines, self._lines),
        }

    def _beat(self, report: AgentReport) -> tuple[int, bytes]:
        return 200, self.coordinator.heartbeat(report).model_dump_json().encode()

    def _lines(self, report: AgentLines) -> tuple[int, bytes]:
        self.coordinator.lines(report)
        return 204, b""

    async def __call__(self, scope, receive, send):
        taken = self.paths.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if taken is None:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        body = await _read_body(receive, AGENT_BODY_LIMIT)  # the Gate has read and limited it already
        plain = headers.get("content-type", "").startswith("application/json")
        if body is None or not plain or not token_matches(presented_token(headers, {}), self.token):
            return await self.app(scope, _replay(body or b"", receive), send)
        model, answer_to = taken
        try:
            report = model.model_validate_json(body)
        except ValidationError:
            return await self.app(scope, _replay(body, receive), send)
        try:
            status, answer = answer_to(report)
        except Conflict as e:
            status, answer = 409, json.dumps({"detail": str(e)}).encode()
        # a 204 has no body and, as the route's, no length
        head = (
            [(b"content-length", str(len(answer)).encode()), (b"content-type", b"application/json")] if answer else []
        )
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": answer})


class ApiSecurityHeaders:
    """Pure ASGI middleware (Starlette's BaseHTTPMiddleware costs a task per request)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        extra = dict(SECURITY_HEADERS)
        if path.startswith("/api/"):
            extra["Cache-Control"] = "no-store"
        raw = [(k.lower().encode(), v.encode()) for k, v in extra.items()]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *raw]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def run(
    coordinator: Coordinator,
    token: str,
    host: str,
    port: int,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Judging stops the moment shutdown begins, so a restart never
    fails a group for the silence it caused; open long polls are answered at once, so the
    shutdown is clean and quiet (no connection left for uvicorn to cancel)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            coordinator.closing = True
            coordinator.changes.close()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        create_app(coordinator, token),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )
    Server(config).run()


def _handler(status: int):
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handle
