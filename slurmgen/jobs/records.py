"""The bundled trainer's run records of a job: found by the group run_slurm.sh gives each job.

run_slurm.sh exports SLURMGEN_GROUP=slurm-<id> (slurm-<array id>_<task> for an array task); the
trainer's run record carries it. Records are looked for under the job's working directory
(`runs/`, and the directory of any `--out-dir` in the command): here with the tracking
library's reader, on a login node with one `find` over the command's SSH connection, which
sends back each run's run.json and the ends of its metrics and artifacts files (`REMOTE_FIND`,
the sh program of templates/remote_find.sh.j2).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgen.jsonl import objects

if TYPE_CHECKING:
    from slurmgen.jobs.runner import Runner
    from slurmgen.tracking.records import RunRecord

# The newest metrics hold the last step and loss: enough of the file to find them, whatever its length.
TAIL_LINES = 200
_MARK = "\x1e"  # starts a header line of REMOTE_FIND's output (\036 in its template); JSON text never holds it raw
REMOTE_FIND_TEMPLATE = "remote_find.sh.j2"


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


def _flag(command: Sequence[str], flag: str) -> str | None:
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
    if not is_trainer(command) or _flag(command, "--track") == "off":
        return None
    track = _flag(command, "--track-dir") or str(Path(_flag(command, "--out-dir") or default_out) / "tracking")
    return str(Path(workdir) / track / run_id)


def summary(run: RunRecord, artifacts: Iterable[Any]) -> dict[str, Any]:
    """{step, loss, checkpoint, status, dir} of one run: what `slurmgen status` shows of it."""
    saved = [a for a in artifacts if isinstance(a, dict) and a.get("type") in ("checkpoint", "model")]
    files = (saved[-1].get("files") or [{}]) if saved else [{}]
    return {
        "step": run.steps,
        "loss": run.last("loss"),
        "status": run.get("status"),
        "dir": str(run.dir),
        "checkpoint": files[0].get("path") or (saved[-1].get("name") if saved else None),
    }


def by_group(
    runner: Runner, workdir: str, command: Sequence[str], job_id: str, groups: set[str]
) -> dict[str, dict[str, Any]]:
    """group -> summary of the newest run of each wanted group of job `job_id`, here or on the login node."""
    found = _local(workdir, command) if runner.where == "local" else remote_runs(runner, workdir, command, job_id)
    return {
        run.get("group"): summary(run, run.artifacts if artifacts is None else artifacts)
        for run, artifacts in found
        if run.get("group") in groups
    }


def _local(workdir: str, command: Sequence[str]) -> Iterable[tuple[RunRecord, None]]:
    """Every run under the roots here; their artifacts are read from disk only for the wanted ones."""
    from slurmgen.tracking.records import find_runs

    for name in root_names(command):
        root = Path(workdir) / name
        if root.is_dir():
            yield from ((run, None) for run in find_runs(root))


@functools.cache
def remote_find_script() -> str:
    """REMOTE_FIND, the sh program of templates/remote_find.sh.j2: the same for every job (what
    differs travels as its arguments), so it is rendered once."""
    from slurmgen.generate.render import render_template
    from slurmgen.tracking.records import SKIP_DIRS

    return render_template(REMOTE_FIND_TEMPLATE, skip_dirs=sorted(SKIP_DIRS), tail_lines=TAIL_LINES)


def remote_find_argv(workdir: str, command: Sequence[str], job_id: str) -> list[str]:
    """`sh -c REMOTE_FIND` for the login node: every run.json of the job's groups under its roots."""
    return ["sh", "-c", remote_find_script(), "sh", workdir, group_of(job_id, None), *root_names(command)]


def remote_runs(
    runner: Runner, workdir: str, command: Sequence[str], job_id: str
) -> list[tuple[RunRecord, list[Any] | None]]:
    """The job's run records on the login node (each with the last TAIL_LINES lines of its
    metrics and artifacts), in one `sh -c` over the runner's connection; [] when it fails."""
    res = runner.run(remote_find_argv(workdir, command, job_id), timeout=60)
    return parse_found(res.out) if res.code == 0 else []


def parse_found(text: str) -> list[tuple[RunRecord, list[Any] | None]]:
    """REMOTE_FIND's output back into runs (a damaged run.json, or a line cut by a writer, is skipped)."""
    from slurmgen.tracking.records import RunRecord

    found: list[dict[str, Any]] = []  # per run: its dir and the lines of each of its three files
    for line in text.split("\n"):  # not splitlines(), which also splits at the mark itself
        if line.startswith(_MARK):
            kind, _, where = line[1:].partition(" ")
            if kind == "run":
                found.append({"dir": where})
            if found:
                found[-1][kind] = []
        elif found and len(found[-1]) > 1:
            found[-1][list(found[-1])[-1]].append(line)
    runs: list[tuple[RunRecord, list[Any] | None]] = []
    for run in found:
        try:
            meta = json.loads("\n".join(run.get("run", [])))
        except ValueError:
            continue
        if isinstance(meta, dict):
            metrics, artifacts = (list(objects(run.get(kind, []))) for kind in ("metrics", "artifacts"))
            runs.append((RunRecord(Path(run["dir"]), meta, metrics), artifacts))
    return runs
