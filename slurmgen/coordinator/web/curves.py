"""Curves by step on a run's page, from that run's own records (slurmgen.tracking), found by the
registry's identity of the run, never by matching names.

A run whose registry row names its record directory (`record_dir`: a Slurm job of the bundled
trainer, a launch) shows the runs in it. An array job is a sweep: each task's record carries
`sweep: {"id": "slurm-<array id>", "task", "params"}`, so its page draws every task's curve of a
metric in one chart, one series per task named by its task and parameters (the chart's legend).
Records on another machine (a job submitted with --remote) are read there, over the job's SSH
connection, as `slurmgen status` and the run's log read them (the last lines of each metrics
file, which the page says). The page's script (static/app.js) draws the
answer of /ui/live/runs/SEQ/metrics with uPlot, steps on the x axis, as it does for a group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from slurmgen.errors import SlurmgenError
from slurmgen.jobs.records import record_dir
from slurmgen.jobs.registry import JobRecord, Registry
from slurmgen.jobs.runs import get_row
from slurmgen.tracking.plot import order, series
from slurmgen.tracking.records import RunRecord, find_runs

from . import records
from .auth import guarded
from .runs_page import registry_path

router = APIRouter()
Curves = dict[str, dict[str, tuple[list[int], list[float]]]]


def sweep_id(row: Mapping[str, Any]) -> str | None:
    """The sweep an array job's task records name (run_slurm.sh: slurm-<array id>)."""
    return f"slurm-{row['job_id']}" if row["kind"] == "slurm" and (row.get("info") or {}).get("array") else None


def _under(path: str | None) -> list[RunRecord]:
    return list(find_runs(path)) if path and Path(path).is_dir() else []


def _remote_records(row: Mapping[str, Any], record: JobRecord | None) -> tuple[list[RunRecord], str | None]:
    """A job submitted with --remote: its records read on the login node, as `slurmgen status`
    reads them and as its log is read (the job's SSH connection; the last TAIL_LINES metrics
    lines of each record, so a long run's curve starts late)."""
    from slurmgen.jobs.records import TAIL_LINES, remote_runs

    from .run_detail import runner_for

    info = row.get("info") or {}
    if record is None:
        return [], f"the run records are on {row['remote']}"
    runner = runner_for(record)
    try:
        found = [run for run, _ in remote_runs(runner, info.get("workdir") or "", info.get("command") or [], row["job_id"])]
    except (OSError, SlurmgenError) as exc:
        return [], f"the run records on {row['remote']} could not be read: {exc}"
    finally:
        runner.close()
    wanted = sweep_id(row)
    runs = [r for r in found if wanted is None or (r.sweep or {}).get("id") == wanted]
    note = f"read on {row['remote']} (at most the last {TAIL_LINES} metric lines of each record)" if runs else None
    return sorted(runs, key=lambda r: (int((r.sweep or {}).get("task") or 0), str(r.dir))), note


def run_records(row: Mapping[str, Any], record: JobRecord | None = None) -> tuple[list[RunRecord], str | None]:
    """(the run's records, why there are none, or what to know of them, when worth saying).
    `record`: the job's registry record, for a --remote job's connection."""
    info = row.get("info") or {}
    if row.get("remote"):
        return _remote_records(row, record)
    wanted = sweep_id(row)
    if wanted is None:
        return _under(row.get("record_dir")), None
    track = record_dir(info.get("workdir") or "", info.get("command") or [], "", f"runs/job-{row['job_id']}")
    runs = [r for r in _under(track) if (r.sweep or {}).get("id") == wanted]
    return sorted(runs, key=lambda r: (int((r.sweep or {}).get("task") or 0), str(r.dir))), None


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
    metrics = sweep_curves(runs) if sweep_id(row) else records.curves_of(runs)
    return {"metrics": metrics, "why": why, "runs": len(runs)}


@router.get("/ui/live/runs/{seq}/metrics", name="web_live_run_metrics")
@guarded("live")
async def live_run_metrics(request: Request, seq: int) -> Response:
    body = await asyncio.to_thread(curves_for, registry_path(request.app), seq)
    return JSONResponse(body, headers={"cache-control": "no-store"})
