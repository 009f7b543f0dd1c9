"""Where the bundled trainer keeps a run's records: found by the group run_slurm.sh gives each job.

run_slurm.sh exports SLURMGEN_GROUP=slurm-<id> (slurm-<array id>_<task> for an array task); the
trainer's run record carries it. Records are looked for under the job's working directory
(`runs/`, and the directory of any `--out-dir` in the command). Pure rules over a command line,
shared by the registry, the launcher, the coordinator and the job commands; reading the records
of a job, here or on a login node, is jobs/remote_records.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def group_of(job_id: str, task: str | None) -> str:
    return f"slurm-{job_id}_{task}" if task is not None else f"slurm-{job_id}"


def root_names(command: Sequence[str]) -> list[str]:
    """Where run records may be, relative to the job's working directory."""
    found = ["runs"]
    for i, word in enumerate(command):
        if word == "--out-dir" and i + 1 < len(command):
            found.append(command[i + 1])
        elif word.startswith("--out-dir="):
            found.append(word.split("=", 1)[1])
    return list(dict.fromkeys(found))


def flag_value(command: Sequence[str], flag: str) -> str | None:
    """The value of `--flag VALUE` or `--flag=VALUE` in a command (the last one given)."""
    found = None
    for i, word in enumerate(command):
        if word == flag and i + 1 < len(command):
            found = command[i + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def is_trainer(command: Sequence[str]) -> bool:
    """Is this the bundled trainer (`python -m slurmgen.train`, `slurmgen train`)?"""
    words = [str(w) for w in command]
    return any(a == "-m" and b == "slurmgen.train" for a, b in zip(words, words[1:])) or any(
        Path(a).name == "slurmgen" and b == "train" for a, b in zip(words, words[1:])
    )


def record_dir(workdir: str, command: Sequence[str], run_id: str, default_out: str = "runs/train") -> str | None:
    """Where the bundled trainer keeps the run records of run `run_id` (its SLURMGEN_GROUP):
    TRACK_DIR/RUN_ID, TRACK_DIR being --track-dir, else OUT_DIR/tracking (train/track.py).
    None for another program, or with --track off: where it writes is its own business."""
    if not is_trainer(command) or flag_value(command, "--track") == "off":
        return None
    track = flag_value(command, "--track-dir") or str(
        Path(flag_value(command, "--out-dir") or default_out) / "tracking"
    )
    return str(Path(workdir) / track / run_id)
