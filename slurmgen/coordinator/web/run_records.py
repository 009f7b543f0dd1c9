"""A run's own records (slurmgen.tracking), found by the registry's identity of the run, never by
matching names, and the connection that reads them: for the run's curves (curves.py), its log
(run_logs.py), its page (run_detail.py) and the last loss the runs list shows.

A run whose registry row names its record directory (`record_dir`: a Slurm job of the bundled
trainer, a launch, the trainer under a shell wrapper included) has the runs in it, or, when it
resumed another run's checkpoint, the runs beside it whose attempts name it. An array job is a
sweep: each task's record carries `sweep: {"id": "slurm-<array id>", "task", "params"}`, under
each task's own directory unless --out-dir gave them one. Records on another machine (a job
submitted with --remote) are read there, over the job's SSH connection (the last lines of each
metrics file), as `slurmgen status` reads them; the runs list does not: it shows what is here.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from slurmgen.errors import SlurmgenError
from slurmgen.jobs.logs import array_tasks
from slurmgen.runs.model import RunRow
from slurmgen.runs.registry import JobRecord
from slurmgen.runs.trainer_records import is_trainer, track_root, unwrapped
from slurmgen.tracking.records import RunRecord, find_runs

# The runs list asks every second for up to a page of runs: a run's last loss is read again at most
# this often (an ended run's never), from the last LOSS_TAIL bytes of each metrics file.
LOSS_FRESH = 5.0
LOSS_TAIL = 64 * 1024
_LOSSES: OrderedDict[tuple[Any, ...], tuple[float, str]] = OrderedDict()
_LOSSES_KEPT = 4096


def runner_for(record: JobRecord | None) -> Any:
    """Here, or the login node the job was submitted through (as `slurmgen status` does); None:
    here (a run of this machine without a Slurm job, e.g. a launch's log)."""
    from slurmgen.jobs.cli_shared import Runners

    if record is None:
        return Runners(None, [])(None, None, None)
    return Runners(None, [])(record.remote, record.info.get("remote_setup"), record.info.get("ssh_config"))


def sweep_id(row: RunRow) -> str | None:
    """The sweep an array job's task records name (run_slurm.sh: slurm-<array id>)."""
    return f"slurm-{row['job_id']}" if row["kind"] == "slurm" and (row.get("info") or {}).get("array") else None


def _under(path: str | None) -> list[RunRecord]:
    return list(find_runs(path)) if path and Path(path).is_dir() else []


def _remote_records(row: RunRow, record: JobRecord | None) -> tuple[list[RunRecord], str | None]:
    """A job submitted with --remote: its records read on the login node, as `slurmgen status`
    reads them and as its log is read (the job's SSH connection; the last TAIL_LINES metrics
    lines of each record, so a long run's curve starts late)."""
    from slurmgen.jobs.remote_records import TAIL_LINES, remote_runs

    info = row.get("info") or {}
    if record is None:
        return [], f"the run records are on {row['remote']}"
    runner = runner_for(record)
    try:
        found = [
            run for run, _ in remote_runs(runner, info.get("workdir") or "", info.get("command") or [], row["job_id"])
        ]
    except (OSError, SlurmgenError) as exc:
        return [], f"the run records on {row['remote']} could not be read: {exc}"
    finally:
        runner.close()
    wanted = sweep_id(row)
    runs = [r for r in found if wanted is None or (r.sweep or {}).get("id") == wanted]
    note = f"read on {row['remote']} (at most the last {TAIL_LINES} metric lines of each record)" if runs else None
    return sorted(runs, key=lambda r: (int((r.sweep or {}).get("task") or 0), str(r.dir))), note


def run_records(row: RunRow, record: JobRecord | None = None) -> tuple[list[RunRecord], str | None]:
    """(the run's records, why there are none, or what to know of them, when worth saying).
    `record`: the job's registry record, for a --remote job's connection."""
    if row.get("remote"):
        return _remote_records(row, record)
    wanted = sweep_id(row)
    if wanted is None:
        return _under(row.get("record_dir")) or _continued(row), None
    runs = [r for root in _sweep_roots(row) for r in _under(root) if (r.sweep or {}).get("id") == wanted]
    return sorted(runs, key=lambda r: (int((r.sweep or {}).get("task") or 0), str(r.dir))), None


def _sweep_roots(row: RunRow) -> list[str]:
    """Where a sweep's tasks keep their records: one track root for every task with --out-dir or
    --track-dir, else each task's own (runs/job-<array id>_<task>, train/config.default_out_dir)."""
    info = row.get("info") or {}
    workdir, command = info.get("workdir") or "", info.get("command") or []
    tasks = array_tasks(info) or [0]  # a spec not read: the shared root of --out-dir is still found
    roots = [track_root(workdir, command, f"runs/job-{row['job_id']}_{task}") for task in tasks]
    return list(dict.fromkeys(root for root in roots if root))


# The attempt field of a run record that names the run of the registry which wrote it (tracking/start.py).
_ATTEMPT_OF = {"launch": "launch_id", "slurm": "slurm_job_id"}


def _continued(row: RunRow) -> list[RunRecord]:
    """A run that resumed another run's checkpoint (a second launch in the same --out-dir) goes on
    writing that run's record (the trainer keeps the checkpoint's group, train/track.py), so its
    own record directory is empty: its records are those beside it whose attempts name this run
    (its launch id, its Slurm job id), each with every attempt's steps."""
    field = _ATTEMPT_OF.get(row["kind"])
    command = (row.get("info") or {}).get("command") or []
    if field is None or not row.get("record_dir") or not is_trainer(unwrapped(command)):
        return []  # another program's records are under its own group (RECORDS_DIR), or nowhere
    return [
        run
        for run in _under(str(Path(str(row["record_dir"])).parent))
        if any(str(a.get(field)) == row["job_id"] for a in run.get("attempts") or [] if isinstance(a, dict))
    ]


def _loss_of(runs: list[RunRecord], sweep: bool) -> str:
    """The last training loss of a run's records: its first record's ("—": none logged), or a
    sweep's lowest over its tasks ("0.2 (best of 3)")."""
    last = [(run, run.last_in_tail("loss", "train", LOSS_TAIL)) for run in runs]
    values = [v for _, v in last if v is not None]
    if not values:
        return "—"
    if not sweep:
        return f"{values[0]:.4g}"
    tasks = {(run.sweep or {}).get("task") for run, v in last if v is not None}
    return f"{min(values):.4g} (best of {len(tasks)})"


def last_loss(row: RunRow) -> str:
    """What the runs list shows as the run's last loss (see _loss_of), kept LOSS_FRESH seconds."""
    if row.get("remote") or not (row.get("record_dir") or sweep_id(row)):
        return "—"  # read over SSH on its page only; no record here
    key, now = (row["seq"], row["kind"], row["job_id"], row.get("record_dir"), row.get("state")), time.monotonic()
    kept = _LOSSES.get(key)
    if kept is not None and (row.get("ended") is not None or now - kept[0] < LOSS_FRESH):
        return kept[1]
    runs, _ = run_records(row)
    _LOSSES[key] = (now, _loss_of(runs, sweep_id(row) is not None))
    _LOSSES.move_to_end(key)
    while len(_LOSSES) > _LOSSES_KEPT:
        _LOSSES.popitem(last=False)
    return _LOSSES[key][1]
