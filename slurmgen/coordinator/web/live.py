"""The JSON the page's script polls: live values, log lines after a sequence number, and the
curves of the group's run records. Page-specific, behind the page's session cookie (the
public API stays token-only)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from . import api, records, views
from .auth import guarded
from .routes import overview_data

router = APIRouter()
LOG_BATCH = 500  # lines per poll: a burst catches up over a few polls instead of one huge reply


def _no_store(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"cache-control": "no-store"})


@router.get("/ui/live/overview", name="web_live_overview")
@guarded("live")
async def live_overview(request: Request) -> Response:
    data = await overview_data(request)
    return _no_store({"shape": data["shape"], "fields": views.live_fields(data)})


@router.get("/ui/live/groups/{name}/logs", name="web_live_logs")
@guarded("live")
async def live_logs(request: Request, name: str, after: int = 0, rank: int | None = None) -> Response:
    reply = await api.call(request.app, "GET", f"/api/groups/{name}/logs",
                           params={k: v for k, v in {"after": after, "rank": rank, "limit": LOG_BATCH}.items() if v is not None})
    if not reply.ok:
        return _no_store(reply.body, reply.status)
    lines = [{"id": line["id"], "rank": line.get("rank"), "worker": line.get("worker"), "text": line["line"],
              "attempt": line.get("attempt")} for line in reply.body]
    return _no_store({"lines": lines, "next": max([after] + [line["id"] for line in lines])})


@router.get("/ui/live/groups/{name}/metrics", name="web_live_metrics")
@guarded("live")
async def live_metrics(request: Request, name: str) -> Response:
    reply = await api.call(request.app, "GET", f"/api/groups/{name}")
    if not reply.ok:
        return _no_store(reply.body, reply.status)
    config = reply.body["group"]["config"]
    curves = await asyncio.to_thread(records.group_curves, name, records.search_root(config))
    return _no_store({"metrics": curves})
