"""A run page's live values (`/ui/live/runs/SEQ`), so an open page follows the run as the list does.

The page is rendered once (run_detail.py); its script asks this every second (static/app.js, as the
runs list asks live.py's). The answer reads the run's one row of the registry, refreshed from Slurm
by the list's own Refresher (jobs/refresh.py: one batched query, at most every few seconds, a state
not renewed shown with its age), through the list's own `run_view`: the page's state and elapsed time
are the list's. `shape` changes when the run's state, Slurm's word, its attempts or its outcome do,
or when its current attempt's ranks first record a step: the page then redraws its facts, attempts
and time report from a fresh render. Between those, `fields` carry what moves: the elapsed time
(the current attempt's, from when it started), the state with its age, and each rank's last step,
read from the last TAIL bytes of the run's timeline file (the `steps` samples every rank writes once
a heartbeat period: contract/phases.py), as the log and the curves follow the run. Where the time
went (goodput, the ranks' timeline bars) is a whole render of the run's `status`, too dear to make
every second: `report` changes every REDRAW seconds while the run is live, and the page then
redraws that report alone from a fresh render (never its log view or charts).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slurmgen.contract.attempts import attempt_number
from slurmgen.contract.files import TIMELINE_NAME
from slurmgen.jsonl import objects
from slurmgen.runs.model import RunRow, get_row
from slurmgen.runs.registry import Registry

from .auth import guarded
from .run_extras import LIVE
from .runs_page import REFRESHER, registry_path, run_view
from .views import digest, state_class

router = APIRouter()
# The end of a timeline file read for the ranks' last steps: a line is about 150 bytes and every
# rank writes one a heartbeat period, so this holds the last seconds of hundreds of ranks, however
# long the run has gone on.
TAIL = 64 * 1024
# Seconds between two redraws of a live run's time report: at most one render of the page (a read of
# its timeline, over SSH for a job of a login node) per open page in this time.
REDRAW = 10.0


def timeline_file(row: RunRow) -> Path | None:
    """Where the run's ranks write their timeline, when this machine reads it (None: not known, or a
    job of a login node, whose file is read over SSH when the page is rendered, not every second)."""
    info = row.get("info") or {}
    if row["kind"] == "slurm":
        log_dir = info.get("log_dir")
        return Path(log_dir) / TIMELINE_NAME.format(job_id=row["job_id"]) if log_dir and not row["remote"] else None
    return Path(info["timeline"]) if info.get("timeline") else None


def last_steps(path: Path | None) -> tuple[int | None, dict[int, int]]:
    """(the newest attempt in the file's tail, {rank: its last step in that attempt}); (None, {})
    when there is no file or no line of an attempt in its last TAIL bytes."""
    if path is None:
        return None, {}
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL))
            text = f.read().decode(errors="replace")
    except OSError:
        return None, {}
    if size > TAIL:
        text = text.partition("\n")[2]  # the first line read is cut: not a line of the file
    lines = [e for e in objects(text.splitlines()) if isinstance(e.get("rank"), int)]
    if not lines:
        return None, {}
    attempt = max(attempt_number(e) for e in lines)
    steps: dict[int, int] = {}
    for e in lines:
        if attempt_number(e) == attempt and isinstance(e.get("step"), int):
            steps[e["rank"]] = max(steps.get(e["rank"], e["step"]), e["step"])
    return attempt, steps


def live_run(path: Any, seq: int, now: float) -> dict[str, Any] | None:
    """{"shape", "fields", "report"} of run SEQ's page (None: no such run); fields only while the
    run is live, and `report` (None once it ended) the REDRAW period `now` falls in."""
    with Registry.open(path) as reg:
        row = get_row(reg, seq)
    if row is None:
        return None
    view = run_view(row, now)
    live = view["state"] in LIVE
    attempt, steps = last_steps(timeline_file(row)) if live else (None, {})
    said = f"{view['state']} {view['as_of'] is not None} {view['attempts']} {view['outcome']} {row['last_state']}"
    stamp = f"{said} {attempt} {bool(steps)}"
    fields: list[list[Any]] = []
    if live:
        state = view["state_text"] + (f", as of {view['as_of']}" if view["as_of"] else "")
        fields.append([["run", seq, "state"], state, state_class(view["state"])])
        fields.append([["run", seq, "elapsed"], view["elapsed"], ""])
        fields += [[["rank", attempt, rank, "step"], str(step), ""] for rank, step in steps.items()]
    return {"shape": digest([stamp]), "fields": fields, "report": str(int(now // REDRAW)) if live else None}


@router.get("/ui/live/runs/{seq}", name="web_live_run")
@guarded("live")
async def live_run_page(request: Request, seq: int) -> Response:
    path = registry_path(request.app)
    await asyncio.to_thread(REFRESHER.refresh, path)
    body = await asyncio.to_thread(live_run, path, seq, time.time())
    if body is None:
        return JSONResponse(
            {"detail": f"there is no run {seq}"}, status_code=404, headers={"cache-control": "no-store"}
        )
    return JSONResponse(body, headers={"cache-control": "no-store"})
