"""A Slurm job's own facts on its page: an array's tasks as a grid (each with its sweep
parameters, state, exit code, nodes, requeues and last loss), and the nodes and requeue count of
a single job (pure).

The input is `slurmgen status`'s view (jobs/commands.status): scontrol and sacct for the
states, the sweep file for the parameters, the run records for the loss. A task's state is shown
in Slurm's word and coloured by the one vocabulary (contract/states.py), so a task that exited
with the preemption code reads "preempted", not "failed".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmgen.contract.states import from_slurm


def _word(state: str | None, code: int | None) -> str:
    found = from_slurm(state, code)
    return found.value if found else "unknown"


def task_cells(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One cell per array task, in task order."""
    cells = []
    for t in view.get("tasks") or []:
        loss = (t.get("run") or {}).get("loss")
        cells.append(
            {
                "task": str(t["job"]).rpartition("_")[2],
                "job": t["job"],
                "slurm": t.get("state") or "UNKNOWN",
                "state": _word(t.get("state"), t.get("exit_code")),
                "exit_code": t.get("exit_code"),
                "params": [f"{k}={v}" for k, v in (t.get("params") or {}).items()],
                "nodes": t.get("nodes"),
                "restarts": t.get("restarts") or 0,
                "loss": f"{loss:.4g}" if isinstance(loss, (int, float)) else None,
            }
        )
    return cells


def slurm_facts(view: Mapping[str, Any]) -> dict[str, Any]:
    """Nodes, requeue count and Slurm's elapsed time of a job (an array: summed over its tasks)."""
    tasks = view.get("tasks") or []
    if tasks:
        nodes = sorted({t["nodes"] for t in tasks if t.get("nodes")})
        return {
            "nodes": ", ".join(nodes) or None,
            "requeued": sum(int(t.get("restarts") or 0) for t in tasks),
            "elapsed": None,
            "tasks": task_cells(view),
        }
    return {
        "nodes": view.get("nodes"),
        "requeued": int(view.get("restarts") or 0),
        "elapsed": view.get("elapsed"),
        "tasks": [],
    }
