"""The bundled trainer's run records of a job, read where the job ran (runs/trainer_records.py
says where they are).

Here with the tracking library's reader, on a login node with one `find` over the command's SSH
connection, which sends back each run's run.json and the ends of its metrics and artifacts files
(`REMOTE_FIND`, the sh program of templates/remote_find.sh.j2). In jobs/, not runs/, because it
runs that `find` through a Slurm runner (jobs/slurm_runner.py) that the services below may not import.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgen.jsonl import objects
from slurmgen.runs.trainer_records import group_of, root_names

if TYPE_CHECKING:
    from slurmgen.jobs.slurm_runner import Runner
    from slurmgen.tracking.records import RunRecord

# The newest metrics hold the last step and loss: enough of the file to find them, whatever its length.
TAIL_LINES = 200
_MARK = "\x1e"  # starts a header line of REMOTE_FIND's output (\036 in its template); JSON text never holds it raw
REMOTE_FIND_TEMPLATE = "remote_find.sh.j2"


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
