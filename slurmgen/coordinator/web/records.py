"""A group's run records (slurmgen.tracking) and their curves, for the page and status.html.

Ranks started by the coordinator carry SLURMGEN_GROUP=<group>, so their run records name the
group; they are found under the group's working directory. A group without one runs wherever
each agent was started, which the server cannot see: no records, and status.html goes beside
the server's database instead (never a walk through the server's own working directory).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from slurmgen.tracking.plot import order, series
from slurmgen.tracking.records import RunRecord, find_runs


def search_root(config: Mapping[str, Any]) -> Path | None:
    return Path(config["cwd"]) if config.get("cwd") else None


def group_runs(name: str, root: Path | None) -> list[RunRecord]:
    return [run for run in find_runs(root) if run.get("group") == name] if root and root.is_dir() else []


def curves_of(runs: list[RunRecord]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """metric -> series label -> (steps, values); the label is the metric type (train/val/test),
    with the run's job type when the group has several runs."""
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for run in runs:
        suffix = f" {run.get('job_type') or run.dir.name}" if len(runs) > 1 else ""
        for metric, kinds in series(run).items():
            for kind, points in kinds.items():
                out.setdefault(metric, {})[f"{kind}{suffix}"] = points
    return {metric: out[metric] for metric in order(list(out))}


def group_curves(name: str, root: Path | None) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    return curves_of(group_runs(name, root))


def status_dir(name: str, root: Path | None, runs: list[RunRecord], state_dir: Path) -> Path:
    """Where status.html goes: the directory holding the group's run records (their common
    parent), else <working dir>/runs/<group>, else <server state dir>/groups/<group>."""
    if runs:
        return Path(os.path.commonpath([str(run.dir.parent) for run in runs]))
    return root / "runs" / name if root else state_dir / "groups" / name
