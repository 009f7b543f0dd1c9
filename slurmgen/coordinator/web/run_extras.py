"""What a run's page shows beyond the run model (run_detail.py): where its time went (the
timeline, stragglers and goodput of `slurmgen status --timeline`), a Slurm job's nodes,
requeues and array tasks, and its curves' address. Kept apart from run_detail.py so that the
page's control and its content change in different files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slurmgen.contract.states import ACTIVE, State
from slurmgen.jobs.logs import array_tasks
from slurmgen.runs.model import RunRow

from .array_grid import slurm_facts
from .timeline_svg import time_report

LIVE = frozenset(s.value for s in ACTIVE | {State.PENDING})


def extras(row: RunRow, status: Mapping[str, Any], run: dict[str, Any], now: float) -> dict[str, Any]:
    """{"time", "facts"} for run.html from the run's `slurmgen status` view (a Slurm job's, or a
    launch's or group's own); an ended Slurm job whose end the registry does not know (Slurm's
    controller forgot it before anyone looked) shows the elapsed time Slurm gives."""
    slurm = status if row.get("kind") == "slurm" else {}
    facts = slurm_facts(slurm) if slurm else {"nodes": None, "requeued": 0, "elapsed": None, "tasks": []}
    if run.get("elapsed") == "—" and facts["elapsed"]:
        run["elapsed"] = facts["elapsed"]
    active = (row.get("state") or "") in LIVE
    return {
        "time": time_report(status, now if active else None) if status else None,
        "facts": facts,
        "log_tasks": log_tasks(row, facts["tasks"]),
    }


def log_tasks(row: Mapping[str, Any], cells: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The array tasks whose log the page offers ([]: no array): those Slurm listed, with their
    state, else those the job was submitted with (Slurm has forgotten an old array)."""
    if not (row.get("info") or {}).get("array"):
        return []
    if cells:
        return [{"task": str(c["task"]), "label": f"task {c['task']} ({c['state']})"} for c in cells]
    return [{"task": str(t), "label": f"task {t}"} for t in array_tasks(row.get("info") or {})]
