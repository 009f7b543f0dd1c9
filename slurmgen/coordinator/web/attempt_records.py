"""An attempt's run records (slurmgen.tracking) and their curves, for the page and status.html.

Found by identity, never by walking directories: a rank that records a run announces its
directory beside its heartbeat, its agent reports it, and the server keeps it with that
attempt (`AttemptOut.runs`). So the curves are those of the group's current attempt and of
no other run (a later attempt without records shows none), whatever the working directory.
A record the server cannot read (another node's own disk) is left out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmgen.tracking.plot import order, series
from slurmgen.tracking.records import RunRecord, read_run


def search_root(config: Mapping[str, Any]) -> Path | None:
    return Path(config["cwd"]) if config.get("cwd") else None


def current_attempt(detail: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The group's latest attempt in a `GroupDetail` (None before its first start)."""
    number = detail["group"].get("attempt")
    return next((a for a in detail["attempts"] if a["number"] == number), None)


def attempt_runs(attempt: Mapping[str, Any] | None) -> list[RunRecord]:
    runs = []
    for path in (attempt or {}).get("runs") or []:
        try:
            runs.append(read_run(path))
        except (OSError, ValueError):
            continue
    return runs


def curves_of(runs: list[RunRecord]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """metric -> series label -> (steps, values); the label is the metric type (train/val/test),
    with the run's id when the attempt has several runs (two runs of job type "main" are still
    two series, never one)."""
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    ids = [str(run.get("id") or run.dir) for run in runs]
    for run, run_id in zip(runs, ids):
        name = run_id if ids.count(run_id) == 1 else str(run.dir)  # one id in two places: say where
        suffix = f" {name}" if len(runs) > 1 else ""
        for metric, kinds in series(run).items():
            for kind, points in kinds.items():
                out.setdefault(metric, {})[f"{kind}{suffix}"] = points
    return {metric: out[metric] for metric in order(list(out))}


def status_dir(name: str, root: Path | None, runs: list[RunRecord], state_dir: Path) -> Path:
    """Where status.html goes: the directory holding the attempt's run records (their common
    parent), else <working dir>/runs/<group>, else <server state dir>/groups/<group>."""
    if runs:
        return Path(os.path.commonpath([str(run.dir.parent) for run in runs]))
    return root / "runs" / name if root else state_dir / "groups" / name
