"""The bundled trainer's run records of a job: found by the group run_slurm.sh gives each job.

run_slurm.sh exports SLURMGEN_GROUP=slurm-<id> (slurm-<array id>_<task> for an array task); the
trainer's run record carries it. Records are looked for under the job's working directory
(`runs/`, and the directory of any `--out-dir` in the command), on this machine only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def group_of(job_id: str, task: str | None) -> str:
    return f"slurm-{job_id}_{task}" if task is not None else f"slurm-{job_id}"


def roots(workdir: str, command: Sequence[str]) -> list[Path]:
    base = Path(workdir)
    found = [base / "runs"]
    for i, word in enumerate(command):
        if word == "--out-dir" and i + 1 < len(command):
            found.append(base / command[i + 1])
        elif word.startswith("--out-dir="):
            found.append(base / word.split("=", 1)[1])
    return [p for p in dict.fromkeys(found) if p.is_dir()]


def by_group(workdir: str, command: Sequence[str], groups: set[str]) -> dict[str, dict[str, Any]]:
    """group -> {step, loss, checkpoint, status, dir} for the newest run of each wanted group."""
    from slurmgen.tracking.records import find_runs

    out: dict[str, dict[str, Any]] = {}
    for root in roots(workdir, command):
        for run in find_runs(root):
            group = run.get("group")
            if group not in groups:
                continue
            saved = [a for a in run.artifacts if isinstance(a, dict) and a.get("type") in ("checkpoint", "model")]
            files = (saved[-1].get("files") or [{}]) if saved else [{}]
            out[group] = {"step": run.steps, "loss": run.last("loss"), "status": run.get("status"), "dir": str(run.dir),
                          "checkpoint": files[0].get("path") or (saved[-1].get("name") if saved else None)}
    return out
