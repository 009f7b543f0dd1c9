"""Curves by step on a run's page, from that run's own records (run_records.py: found by the
registry's identity of the run, never by matching names).

An array job is a sweep: its page draws every task's curve of a metric in one chart, one series
per task named by its task and parameters (the chart's legend). Records of a job submitted with
--remote are read over the job's SSH connection (the last lines of each metrics file, which the
page says). The page's script (static/app.js) draws the
answer of /ui/live/runs/SEQ/metrics with uPlot, steps on the x axis, as it does for a group.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slurmgen.runs.model import get_row
from slurmgen.runs.registry import Registry
from slurmgen.tracking.plot import order, series
from slurmgen.tracking.records import RunRecord

from . import attempt_records
from .auth import guarded
from .run_records import run_records, sweep_id
from .runs_page import registry_path

router = APIRouter()
Curves = dict[str, dict[str, tuple[list[int], list[float]]]]


def sweep_curves(runs: list[RunRecord]) -> Curves:
    """metric -> "<type> #<task> <params>" -> (steps, values): every task of a sweep in one chart."""
    out: Curves = {}
    for run in runs:
        sweep = run.sweep or {}
        params = " ".join(f"{k}={v}" for k, v in (sweep.get("params") or {}).items())
        name = f"#{sweep.get('task')} {params}".strip()
        twins = sum(1 for r in runs if (r.sweep or {}).get("task") == sweep.get("task"))
        if twins > 1:  # per-process records: one run per rank of the task
            name += f" {run.get('job_type') or run.dir.name}"
        for metric, kinds in series(run).items():
            for kind, points in kinds.items():
                out.setdefault(metric, {})[f"{kind} {name}"] = points
    return {metric: out[metric] for metric in order(list(out))}


def curves_for(path: Any, seq: int) -> dict[str, Any]:
    """{"metrics": Curves, "why": text or None} for run SEQ of the registry at `path`."""
    with Registry.open(path) as reg:
        row = get_row(reg, seq)
        record = reg.by_seq(seq) if row is not None and row.get("remote") else None
    if row is None:
        return {"metrics": {}, "why": f"there is no run {seq}"}
    runs, why = run_records(row, record)
    metrics = sweep_curves(runs) if sweep_id(row) else attempt_records.curves_of(runs)
    return {"metrics": metrics, "why": why, "runs": len(runs)}


@router.get("/ui/live/runs/{seq}/metrics", name="web_live_run_metrics")
@guarded("live")
async def live_run_metrics(request: Request, seq: int) -> Response:
    body = await asyncio.to_thread(curves_for, registry_path(request.app), seq)
    return JSONResponse(body, headers={"cache-control": "no-store"})
