"""A run's page (/ui/runs/SEQ) and the control of a Slurm job from it.

The run model comes from the registry (runs.get_row, runs.attempts_of); a Slurm job's live
status (state, pending reason and eligible time, first failure) is `slurmgen status`'s own
(jobs/commands.status), and the last lines of the first failed rank's log come through
jobs/logs.py from the job's log_dir when that file is readable from here. "Cancel" and
"Checkpoint and stop" are `slurmgen cancel` and `slurmgen cancel --signal PREEMPT_SIGNAL`
(jobs/control.py, through controls.act); each is a POST behind the session and CSRF value that
ends in a redirect to the run's page with what Slurm said. A button that cannot apply is
disabled with its reason in a title (jobs/control.choices).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slurmgen.contract.attempts import attempt_number
from slurmgen.contract.states import ENDED, STOP_ASKED, STOPPED_BY_YOU, State, from_exit_code, from_slurm
from slurmgen.errors import SlurmgenError
from slurmgen.jobs import chain, control
from slurmgen.jobs.control import SLURM_STOPS, RunControl
from slurmgen.runs.model import RunRow, attempts_of, get_row, recoveries_of
from slurmgen.runs.registry import JobRecord, Registry

from .auth import guarded, redirect_with
from .controls import act
from .render import flash_notice, render, take_flash
from .run_extras import LIVE, extras
from .run_live import live_run
from .run_records import runner_for
from .run_stacks import stacks_of
from .runs_page import registry_path, run_view
from .views import clock, stop_question

router = APIRouter()
LOG_LINES = 30  # lines of the failed rank's log shown under the first failure


def _log_tail(runner: Any, record: JobRecord, rank: int | None) -> list[str]:
    """The failed rank's last lines, when its log is readable from here ([] otherwise)."""
    from slurmgen.jobs.logs import log_path, tail

    if rank is None or "log_dir" not in record.info:
        return []
    try:
        data = runner.read(log_path(record, None))
    except (OSError, SlurmgenError):
        return []
    lines, _ = tail(data, None, LOG_LINES, {rank}, record.info.get("launcher") == "torchrun")
    return [line.text for line in lines]


def _joined(*parts: Any) -> str | None:
    """An attempt row's `next`: what happened in it and after it, in order; None for nothing."""
    return "; ".join(str(p) for p in parts if p) or None


def slurm_attempts(
    records: list[dict[str, Any]], job: State | None = None, end: float | None = None
) -> list[dict[str, Any]]:
    """The job's attempts file (heal/attempts.py) as attempt rows: one per start, its end's cause,
    numbered as the file numbers them (contract/attempts.py), as the timeline is.

    Each row's state is a word of the run's vocabulary, as a launch's or group's attempts are: the
    last attempt of a job that has ended (`job`) takes the job's state (a cancel is `stopped`,
    though the script's end line saw only the 143 of its TERM, and its cause STOPPED_BY_YOU:
    not the 'preempted' of a "checkpoint and stop"'s 75); another attempt's comes from its end
    line's exit code (`preempted` for one a requeue ended, whose end is derived: see
    heal/attempts.py), or is `lost` when none was written (its node failed under it); the
    last one of a job still live is `running` until it ends. A start skipped because the job had
    already finished stays `skipped`. The last attempt of an ended job that wrote no end line (a
    cancel kills the batch shell before it can) ends when Slurm says the job ended (`end`).
    An attempt that ended in an in-job restart says where the next one went on (`next`: "restarted
    on node1,node3 (node2 left out, spare node3 took its place)"), and each warm restart inside it
    ("warm restart 1: rank 1 started anew after ..."), as `slurmgen status` does."""
    from slurmgen.heal.attempts import RECOVERY, cause, first_failure, where_next

    rows: list[dict[str, Any]] = []
    for i, r in enumerate(records):
        if r.get("event") == RECOVERY and rows:  # a warm restart: the attempt went on
            rows[-1]["next"] = _joined(rows[-1]["next"], r.get("what"))
            continue
        if r.get("event") in ("start", "skipped") or not rows:
            rows.append(
                {
                    "number": attempt_number(r),
                    "state": "skipped" if r.get("event") == "skipped" else State.LOST.value,
                    "started": clock(r.get("time")),
                    "ended": None,
                    "cause": None,
                    "rank": None,
                    "node": r.get("host"),
                    "code": None,
                    "next": None,
                }
            )
        if r.get("event") == "end":
            rows[-1].update(
                # An end a requeue made (derived, no code) is the next attempt's to resume: preempted.
                state=(State.PREEMPTED if r.get("derived") else from_exit_code(r.get("exit_code"))).value,
                ended=clock(r.get("time")),
                cause=cause(r),
                rank=first_failure(r).rank,  # the hung rank when the watchers judged a hang, as the cause names
                node=r.get("node") or rows[-1]["node"],
                code=r.get("exit_code"),
                next=_joined(rows[-1]["next"], r.get("action") == "restart" and f"restarted{where_next(records, i)}"),
            )
    if rows and job in ENDED:
        rows[-1]["state"] = job.value
        if job is State.STOPPED:  # its end line saw the stop's 75 or 143, which a person's stop caused
            rows[-1]["cause"] = STOPPED_BY_YOU
        rows[-1]["ended"] = rows[-1]["ended"] or clock(end)
    elif rows and rows[-1]["ended"] is None and rows[-1]["state"] != "skipped":
        rows[-1]["state"] = State.RUNNING.value
    return rows


def task_attempts(slurm: Mapping[str, Any], task: str | None) -> tuple[str | None, list[dict[str, Any]]]:
    """An array job's attempts are its tasks' own (each task is requeued alone): those of the task
    the page shows (?task=N, as its log view does; else the first). (None, []) for any other job."""
    tasks = slurm.get("tasks") or []
    if not tasks:
        return None, []
    shown = next((t for t in tasks if t["job"].split("_", 1)[-1] == task), tasks[0])
    return shown["job"].split("_", 1)[-1], slurm_attempts(
        shown.get("attempts") or [],
        from_slurm(shown.get("state"), shown.get("exit_code"), bool(slurm.get("stop_asked"))),
    )


def slurm_status(reg: Registry, seq: int) -> dict[str, Any]:
    """`slurmgen status`'s view of the job, the pending text and the failed rank's log tail."""
    from slurmgen.jobs.commands import status
    from slurmgen.jobs.view import pending_text

    record = reg.by_seq(seq)
    if record is None:
        return {}
    runner = runner_for(record)
    try:
        view = status(runner, reg, record, None, with_timeline=True)
        failure = view.get("first_failure") or {}
        view["pending"] = pending_text(view, None) if view.get("reason") else None
        view["log_tail"] = _log_tail(runner, record, failure.get("rank"))
        if chain.links_of(record):  # a link of a chain: every link, as `slurmgen status` shows them
            view["chain"] = chain.view(runner, reg, record)
        view["stop_asked"] = STOP_ASKED in record.info  # a person's checkpoint and stop: its end is theirs
        row = get_row(reg, seq)  # status() kept Slurm's end time of the job in it
        job = from_slurm(view.get("state"), view.get("exit_code"), view["stop_asked"])
        view["attempts"] = slurm_attempts(view.get("attempts") or [], job, row["ended"] if row is not None else None)
        ended_as(view.get("timeline") or {}, job)
    finally:
        runner.close()
    return view


def ended_as(timeline: Mapping[str, Any], job: State | None) -> None:
    """A Slurm job's last attempt on its timeline ends as the job did (its attempts record, written
    by the batch script, cannot know that a person's "checkpoint and stop" ended it), as its row in
    the attempts table does (slurm_attempts): so its ranks read as the run, not as the launcher's
    "failed" for every non-zero exit (timeline_svg.rank_status)."""
    attempts = timeline.get("attempts") or []
    if attempts and job in ENDED:
        attempts[-1]["state"] = job.value


def own_status(reg: Registry, row: RunRow) -> dict[str, Any]:
    """A launch's or group's `slurmgen status --timeline` (its timeline file, which its row
    names, read where the nodes' file system is shared); {} when it recorded none."""
    from slurmgen.jobs.commands import run_status

    view = run_status(reg, row, True) if (row.get("info") or {}).get("timeline") else {}
    if row["kind"] == "group":
        named_as_workers(view, row["info"].get("workers") or [])
    return view


def named_as_workers(view: dict[str, Any], workers: list[str]) -> None:
    """A group run's ranks on the nodes its workers (`<host>-<id>`, in rank order) name, as the rest
    of the page and the group's page do: a rank writes its timeline under its machine's own
    hostname, which is not the agent's name for it (every node of the test cluster says `vm`)."""
    for attempt in (view.get("timeline") or {}).get("attempts") or []:
        for r in attempt.get("ranks") or []:
            if isinstance(r.get("rank"), int) and 0 <= r["rank"] < len(workers):
                r["host"] = workers[r["rank"]].rpartition("-")[0]


def read_run(path: Any, seq: int, task: str | None = None) -> dict[str, Any] | None:
    with Registry.open(path) as reg:
        row = get_row(reg, seq)
        if row is None:
            return None
        slurm = slurm_status(reg, seq) if row["kind"] == "slurm" else {}
        row = (get_row(reg, seq) or row) if slurm else row  # status() stored the state Slurm gave
        own = own_status(reg, row) if row["kind"] != "slurm" else {}
        recorded = attempts_of(reg, seq)
        stacks = stacks_of(row, reg.by_seq(seq) if row["kind"] == "slurm" else None, recorded)
        recovered = recoveries_of(row.get("info") or {})  # a launch's warm restarts and spare hosts
        attempts = [
            {
                **a,
                "started": clock(a["started"]),
                "ended": clock(a["ended"]),
                "next": "; ".join(recovered.get(a["number"], [])),
            }
            for a in recorded
        ]
        attempts += slurm.get("attempts") or []
        attempts_task, of_task = task_attempts(slurm, task)
        attempts += of_task
    now = time.time()
    run = run_view(row, now)
    live = live_run(path, seq, now) or {}  # what the page's script compares its polls with
    offered = control.choices(control.Run.from_row(row), slurm)
    return {
        "run": run,
        "row": row,
        "shape": live.get("shape"),
        "report_period": live.get("report"),  # the time report's: redrawn when the poll's differs
        "live": run["state"] in LIVE,  # its state and elapsed time move, as run_live.live_run judges
        "attempts": attempts,
        "attempts_task": attempts_task,
        "slurm": slurm,
        # live: the page asks again (not over SSH every few seconds for a job of a login node)
        "stacks": {**stacks, "live": (row.get("state") or "") in LIVE and not row.get("remote")},
        "disabled": {c.value: why for c, why in offered.items()},
        "stops": [(c.value, c.label) for c in SLURM_STOPS if c in offered],  # a Slurm job's alone
        # every control offered but requeue stops the run's ranks: asked first on several nodes
        "asks": {
            c.value: stop_question(control.label(c, row["kind"]), f"run {row['job_id']}", row["ranks"], row["nodes"])
            for c in offered
            if c != RunControl.REQUEUE
        },
        "controls": [
            {"action": c.value, "label": control.label(c, row["kind"]), "why": why}
            for c, why in offered.items()
            if c not in SLURM_STOPS
        ],
        **extras(row, slurm or own, run, now),
    }


@router.get("/ui/runs/{seq}", name="web_run")
@guarded("page")
async def run_page(request: Request, seq: int) -> Response:
    try:
        data = await asyncio.to_thread(read_run, registry_path(request.app), seq, request.query_params.get("task"))
    except SlurmgenError as exc:
        return redirect_with(request, "/ui/runs", notice=str(exc))
    if data is None:  # said where it was asked, with its status: a redirect would hide the address's mistake
        return render(request, "no_run.html", {"seq": seq}, status=404)
    # `task`: the array task whose log the log view starts on (a task cell's link: its log).
    return render(
        request,
        "run.html",
        {
            **data,
            **flash_notice(take_flash(request)),
            "chosen_task": request.query_params.get("task"),
            "page_url": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        },
    )


@router.post("/ui/runs/{seq}/{action}", name="web_run_action")
@guarded("post")
async def run_action(request: Request, seq: int, action: str) -> Response:
    if action not in {c.value for c in SLURM_STOPS}:
        expected = " or ".join(c.value for c in SLURM_STOPS)
        return redirect_with(request, f"/ui/runs/{seq}", notice=f"Unknown action {action!r} (expected {expected}).")
    done = await asyncio.to_thread(act, registry_path(request.app), seq, RunControl(action))
    return redirect_with(request, f"/ui/runs/{seq}", notice=done.said, done=done.done)
