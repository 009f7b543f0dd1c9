"""The JSON the page's script polls: live values, log lines after a sequence number, and the
curves of the run records the group's current attempt announced. Page-specific, behind the page's session cookie (the
public API stays token-only)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slurmgen.coordinator.models import LINES_SKIPPED

from . import api, attempt_records, views
from .auth import guarded
from .routes import overview_data

router = APIRouter()
# The log view opens on the newest LOG_FIRST lines, then asks every quarter second (app.js
# LOG_POLL_MS) for the lines after the last it has: at most LOG_BATCH, the newest, with how many
# older ones were left out (`skipped`, which the view shows as a marker). A flood never makes an answer (nor the page's
# work on it) grow, and the newest line is in the next answer. Every line stays in the rank's
# file on its node. The Slurm and launch runs' logs (run_logs.py) answer the same way.
LOG_FIRST = 500
LOG_BATCH = 1000


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
    """Lines after `after` (0: the newest LOG_FIRST), oldest first, each with its attempt;
    `rank` is repeated so the script can drop an answer meant for another filter; `skipped`
    counts the lines after `after` left out before the first one (the API's X-Lines-Skipped),
    `at_least` when that is a lower bound (the server had let some go unread)."""
    limit = LOG_FIRST if after == 0 else LOG_BATCH
    params = {k: v for k, v in {"after": after, "rank": rank, "limit": limit, "tail": "true"}.items() if v is not None}
    reply = await api.call(request.app, "GET", f"/api/groups/{name}/logs", params=params)
    if not reply.ok:
        return _no_store(reply.body, reply.status)
    skipped = reply.headers.get(LINES_SKIPPED.lower(), "0") if after else "0"
    lines = [
        {
            "id": line["id"],
            "rank": line.get("rank"),
            "worker": line.get("worker"),
            "text": line["line"],
            "attempt": line.get("attempt"),
        }
        for line in reply.body
    ]
    return _no_store(
        {
            "lines": lines,
            "next": max([after] + [line["id"] for line in lines]),
            "rank": rank,
            "skipped": int(skipped.rstrip("+") or 0),
            "at_least": skipped.endswith("+"),
        }
    )


@router.get("/ui/live/groups/{name}/metrics", name="web_live_metrics")
@guarded("live")
async def live_metrics(request: Request, name: str) -> Response:
    reply = await api.call(request.app, "GET", f"/api/groups/{name}")
    if not reply.ok:
        return _no_store(reply.body, reply.status)
    runs = await asyncio.to_thread(attempt_records.attempt_runs, attempt_records.current_attempt(reply.body))
    return _no_store({"metrics": attempt_records.curves_of(runs)})
