"""Facts about the process a run records once per attempt: versions, git commit, Slurm ids, host.

Versions come from `importlib.metadata`, never from importing the package: importing torch
here would cost seconds on every rank and tie this library to the trainer's dependencies.
The git commit is read with a short `git` call; a working tree that is not a repository, or a
node without git, simply records none (tracking must never stop a job).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from slurmgen.contract import envvars

SLURM_VARS = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "job_name": "SLURM_JOB_NAME",
    "nodelist": "SLURM_JOB_NODELIST",
    "partition": "SLURM_JOB_PARTITION",
    "restart_count": "SLURM_RESTART_COUNT",
    "step_id": "SLURM_STEP_ID",
}


def version_of(dist: str) -> str | None:
    from importlib import metadata  # here, not at the top: `slurmgen --help` imports this package (runs, plot)

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {"python": platform.python_version(), "torch": version_of("torch"), "slurmgen": version_of("slurmgen")}


def git_info(cwd: str | None = None, timeout: float = 5.0) -> dict[str, object] | None:
    """{'commit': sha, 'dirty': bool} of the working tree at `cwd`, or None when there is none."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def slurm_info(environ: Mapping[str, str]) -> dict[str, str]:
    """The Slurm variables that identify the job (only those that are set)."""
    return {key: environ[var] for key, var in SLURM_VARS.items() if environ.get(var)}


def sweep_info(environ: Mapping[str, str]) -> dict[str, object] | None:
    """Which sweep this process is a task of, and with which parameters; None outside a sweep.

    run_slurm.sh runs a sweep as one Slurm array and gives each task SLURMGEN_SWEEP_INDEX and
    SLURMGEN_SWEEP_FILE (the grid beside the script, relative to the submit directory). The
    sweep is named like its tasks' groups without the task: `slurm-<array job id>`, so that
    `slurmgen runs` shows the tasks as one sweep and `slurmgen plot slurm-<id>` compares them.
    A grid that cannot be read leaves the parameters out; it never stops the run.
    """
    array, index = environ.get("SLURM_ARRAY_JOB_ID", "").strip(), environ.get(envvars.SWEEP_INDEX, "").strip()
    if not array or not index.isdigit():
        return None
    params = None
    grid = environ.get(envvars.SWEEP_FILE, "").strip()
    if grid:
        from slurmgen.contract.grid import parse_grid

        try:
            text = (Path(environ.get("SLURM_SUBMIT_DIR") or ".") / grid).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        params = parse_grid(text).get(int(index))
    return {"id": f"slurm-{array}", "task": int(index), "params": params}


def hostname() -> str:
    return socket.gethostname()


def command() -> list[str]:
    return [sys.executable, *sys.argv]


def process() -> dict[str, object]:
    return {"host": hostname(), "pid": os.getpid(), "cwd": os.getcwd()}
