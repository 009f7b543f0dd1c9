"""Where the bundled trainer keeps a run's records: found by the group run_slurm.sh gives each job.

run_slurm.sh exports SLURMGEN_GROUP=slurm-<id> (slurm-<array id>_<task> for an array task); the
trainer's run record carries it. Records are looked for under the job's working directory
(`runs/`, and the directory of any `--out-dir` in the command). Pure rules over a command line,
shared by the registry, the launcher, the coordinator and the job commands; reading the records
of a job, here or on a login node, is jobs/remote_records.py's.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from slurmgen.contract import files


def group_of(job_id: str, task: str | None) -> str:
    return f"slurm-{job_id}_{task}" if task is not None else f"slurm-{job_id}"


def root_names(command: Sequence[str]) -> list[str]:
    """Where run records may be, relative to the job's working directory."""
    found = [files.RECORDS_DIR]
    words = unwrapped(command)
    for i, word in enumerate(words):
        if word == "--out-dir" and i + 1 < len(words):
            found.append(words[i + 1])
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


def unwrapped(command: Sequence[str]) -> list[str]:
    """The command's words with a shell's script (`bash -c 'cd x && python -m slurmgen.train ...'`)
    split into its own words as well: the trainer and its flags are found under a wrapper. Only
    for where its records are: whether signals reach the trainer (is_trainer) is the command's own
    first program's business, which a wrapping shell changes."""
    out = []
    for word in map(str, command):
        out.append(word)
        if any(c.isspace() for c in word):
            try:
                out.extend(shlex.split(word))
            except ValueError:  # an unbalanced quote: its words as they stand
                out.extend(word.split())
    return out


def track_root(workdir: str, command: Sequence[str], default_out: str = "runs/train") -> str | None:
    """The directory that holds a run's records, one directory per group, under the job's working
    directory: for the bundled trainer (under a wrapper included) --track-dir, else
    OUT_DIR/tracking (train/track.py), None with --track off; for any other program `runs`,
    where `slurmgen.tracking.init()` and the framework callbacks (slurmgen.integrations) write by
    default, so a Lightning or transformers program's curves are found as the trainer's are."""
    words = unwrapped(command)
    if not is_trainer(words):
        return str(Path(workdir) / files.RECORDS_DIR)
    if flag_value(words, "--track") == "off":
        return None
    track = flag_value(words, "--track-dir") or str(Path(flag_value(words, "--out-dir") or default_out) / "tracking")
    return str(Path(workdir) / track)


def record_dir(workdir: str, command: Sequence[str], run_id: str, default_out: str = "runs/train") -> str | None:
    """Where the bundled trainer keeps the run records of run `run_id` (its SLURMGEN_GROUP):
    TRACK_ROOT/RUN_ID (track_root)."""
    root = track_root(workdir, command, default_out)
    return str(Path(root) / run_id) if root is not None else None
