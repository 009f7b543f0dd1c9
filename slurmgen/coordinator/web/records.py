"""A group's run records (slurmgen.tracking) and their curves, for the page and status.html.

Ranks started by the coordinator carry SLURMGEN_GROUP=<group>, so their run records name the
group; they are found under the group's working directory (the server's when it has none).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from slurmgen.tracking.plot import order, series
from slurmgen.tracking.records import RunRecord, find_runs


def search_root(config: Mapping[str, Any]) -> Path:
    return Path(config.get("cwd") or os.getcwd())


def group_runs(name: str, root: Path) -> list[RunRecord]:
    return [run for run in find_runs(root) if run.get("group") == name] if root.is_dir() else []


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


def group_curves(name: str, root: Path) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    return curves_of(group_runs(name, root))


def status_dir(name: str, root: Path, runs: list[RunRecord]) -> Path:
    """Where status.html goes: the directory holding the group's run records (their common
    parent), else <root>/runs/<group>."""
    if runs:
        return Path(os.path.commonpath([str(run.dir.parent) for run in runs]))
    return root / "runs" / name
