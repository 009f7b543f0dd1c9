"""`slurmgen jobs`: every run of the registry, newest first, whatever started it.

The registry answers in one SELECT (runs.list_rows); only a Slurm job's state is asked of Slurm
(one scontrol call per cluster, refresh.ask_slurm, which keeps what Slurm said and when). A launch or a
group keeps its state in the registry itself: what its launcher last wrote.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from slurmgen.contract.states import ACTIVE, STOP_ASKED, State, from_slurm
from slurmgen.jobs.refresh import ask_slurm
from slurmgen.jobs.slurm import SlurmJob
from slurmgen.jobs.slurm_runner import Runner
from slurmgen.jobs.view import attempt, exit_code, overall
from slurmgen.runs.model import RunRow, chain_label, job_record, list_rows
from slurmgen.runs.outcome import failure_of, stop_of
from slurmgen.runs.registry import JobRecord, Registry

ACTIVE_WORDS = frozenset({State.PENDING.value, *(s.value for s in ACTIVE)})


def list_jobs(
    runner_for: Callable[..., Runner],
    registry: Registry,
    limit: int | None,
    only: str | None = None,
    kinds: Sequence[str] = (),
    states: Sequence[str] = (),
    note: Callable[[str], None] = lambda text: None,
) -> list[dict[str, Any]]:
    """Every run in the registry (Slurm jobs, launches, groups), newest first, with its state.

    The registry answers in one SELECT (runs.list_rows); a Slurm job's state comes from Slurm
    (one scontrol call per cluster). `only`: just the runs submitted through that login node.
    `kinds`, `states`: only these (state words of contract/states.py, after asking Slurm). `note`
    hears at once of a cluster whose controller does not answer (its jobs then show the state
    last seen)."""
    listed = list_rows(registry, kinds, states, None if states else limit, or_active=bool(states))
    rows = [r for r in listed if only is None or r["remote"] == only]
    slurm = {r["seq"]: job_record(r) for r in rows if r["kind"] == "slurm"}
    live = ask_slurm(runner_for, registry, list(slurm.values()), note)
    out = []
    for r in rows:
        row = _slurm_row(r, slurm[r["seq"]], live.get(r["seq"])) if r["kind"] == "slurm" else _run_row(r)
        if not states or row["run_state"] in states:
            out.append(row)
    return out[:limit] if limit else out


def _common(r: RunRow) -> dict[str, Any]:
    """The run model's fields, the same for every kind."""
    return {
        "kind": r["kind"],
        "nodes": r["nodes"],
        "ranks": r["ranks"],
        "started": r["started"],
        "ended": r["ended"],
        "attempts": r["attempts"],
        # a person's stop is no failure: said as such, with its raw code (runs/outcome.py)
        "first_failure": failure_of(r["state"], r["failure"]),
        "stopped": stop_of(r["state"], r["last_exit"], r["failure"]),
        "run_id": r["run_id"],
        "record_dir": r["record_dir"],
        "logs": r["logs"],
        "state_seen": r["state_seen"],
    }


def _slurm_row(r: RunRow, record: JobRecord, live: tuple[list[SlurmJob], bool] | None) -> dict[str, Any]:
    jobs, reused = live or ([], False)
    array = bool(record.info.get("array"))
    state, code = overall(jobs) if array else ((jobs[0].state, exit_code(jobs[0])) if jobs else (None, None))
    state = state or record.last_state or "UNKNOWN"
    word = from_slurm(state, code if jobs else record.last_exit, STOP_ASKED in record.info)
    number = attempt(jobs)  # what Slurm says now (kept in the row by _slurm_states), else what was kept
    return {
        "job": record.job_id,
        "name": record.name,
        "state": state,
        "exit_code": code if jobs else record.last_exit,
        "live": bool(jobs),
        "tasks": len(jobs) if array else None,
        "remote": record.remote,
        "output_dir": record.output_dir,
        "submitted": record.submitted,
        "id_reused": reused,
        "chain": chain_label(record.info),
        **_common(r),
        "attempts": r["attempts"] if number is None else number,
        "run_state": word.value if word else None,
    }


def _run_row(r: RunRow) -> dict[str, Any]:
    """A launch or a group: the registry is where its state lives. A launch of this machine whose
    process is gone without a verdict (killed -9, the machine rebooted) is shown lost."""
    state = r["state"]
    pid = r["info"].get("pid")
    if (
        r["kind"] == "launch"
        and state in ACTIVE_WORDS
        and r["cluster"] == socket.gethostname()
        and isinstance(pid, int)
        and not _alive(pid)
    ):
        state = State.LOST.value
    return {
        "job": r["job_id"],
        "name": r["name"],
        "state": state,
        "exit_code": r["last_exit"],
        "live": True,
        "tasks": None,
        "remote": r["remote"],
        "output_dir": r["output_dir"],
        "submitted": r["submitted"],
        "id_reused": False,
        **_common(r),
        "run_state": state,
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
