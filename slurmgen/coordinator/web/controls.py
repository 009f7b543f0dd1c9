"""The page's controls beyond cancel and checkpoint (run_detail.py): requeue a Slurm job, stop an
SSH launch, delete a group, forget a lost worker; and the group's command and env as shown.

Each is a POST behind the session and CSRF value (auth.guarded) that ends in a 303 to a page
with what happened (POST-redirect-GET). Each button that cannot apply is rendered disabled with
its reason, both as its title and as visible text it is described by; the POST checks again,
since a disabled button stops no one who posts by hand. The work goes through the layers the
CLI uses: `scontrol requeue` via jobs/stopping.requeue (an argv list, here or on the login node
the job was submitted through), a launch's stop channel (runs/stop_request.py), and the
coordinator's JSON API for groups and workers (DELETE, with its own 404/409 refusals).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Mapping
from enum import Enum
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slurmgen.contract.states import ACTIVE_WORDS
from slurmgen.errors import SlurmgenError
from slurmgen.runs import stop_request
from slurmgen.runs.model import get_row
from slurmgen.runs.registry import Registry

from . import api
from .auth import guarded, redirect_with
from .runs_page import registry_path
from .views import forget_refusal

router = APIRouter()
BY_PAGE = "from the page"


class RunControl(str, Enum):
    """What a user may do to a run, named once: the page's buttons and their paths
    (/ui/runs/SEQ/WORD), the JSON API's accepted words (run_api.py) and the buttons' labels."""

    REQUEUE = "requeue"
    STOP = "stop"
    CANCEL = "cancel"
    CHECKPOINT = "checkpoint"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    RunControl.REQUEUE: "Requeue",
    RunControl.STOP: "Stop launch",
    RunControl.CANCEL: "Cancel",
    RunControl.CHECKPOINT: "Checkpoint and stop",
}
RUN_ACTIONS = {"slurm": RunControl.REQUEUE, "launch": RunControl.STOP}  # beside a Slurm job's stops:
SLURM_STOPS = (RunControl.CANCEL, RunControl.CHECKPOINT)  # run_detail.py


# ---- what each button may do ------------------------------------------------------------------
def run_controls(row: Mapping[str, Any], slurm: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The run's own buttons (requeue a Slurm job, stop a launch): action, label and why it is
    disabled (None: enabled). `slurm` is `slurmgen status`'s view of a Slurm job ({}: none)."""
    from slurmgen.jobs.stopping import requeue_refusal

    kind = row.get("kind")
    if kind not in RUN_ACTIONS:
        return []
    action = RUN_ACTIONS[kind]
    if kind == "slurm":
        state = str(slurm.get("state") or "").split(" ")[0]
        why = requeue_refusal(state if slurm.get("state") and state != "UNKNOWN" else None)
    else:
        why = stop_request.why_not(dict(row))
    return [{"action": action.value, "label": action.label, "why": why}]


def delete_refusal(group: Mapping[str, Any]) -> str | None:
    state = str(group.get("state") or "").split(" ")[0]
    return f"the group is {state}: stop it before deleting it" if state in ACTIVE_WORDS else None


def config_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The group's command, working directory, env (values of secret-looking names hidden, as
    `slurmgen launch --dry-run` hides them) and limits, as the group page shows them."""
    from slurmgen.launch.plan import masked

    return {
        "command": shlex.join(config.get("argv") or []) or None,
        "cwd": config.get("cwd"),
        "env": [(k, masked(k, str(v))) for k, v in sorted((config.get("env") or {}).items())],
        **{
            k: f"{config[k]:g}" if isinstance(config.get(k), (int, float)) else "—"
            for k in ("max_restarts", "heartbeat_timeout", "stop_grace")
        },
    }


# ---- runs -------------------------------------------------------------------------------------
# What a run's control did, as the JSON API answers it: done, no such run, refused by the rules
# (a running job is not requeued, a launch of another machine is not stopped) or its Slurm
# unreachable. The page shows the text alone.
DONE, NO_RUN, REFUSED, UNANSWERED = 200, 404, 409, 502
Outcome = tuple[int, str]


def requeue_run(path: Any, seq: int) -> Outcome:
    from slurmgen.jobs.cli import Runners
    from slurmgen.jobs.stopping import requeue

    with Registry.open(path) as reg:
        row = get_row(reg, seq)
        if row is None:
            return NO_RUN, f"there is no run {seq} in this machine's registry: nothing was requeued"
        record = reg.by_seq(seq) if row["kind"] == "slurm" else None
        if record is None:
            return REFUSED, f"run {seq} is {row['kind']!r}, not a Slurm job: only a Slurm job is requeued"
        # Here, or the login node the job was submitted through, as `slurmgen status` and `cancel` do.
        runner = Runners(None, [])(record.remote, record.info.get("remote_setup"), record.info.get("ssh_config"))
        try:
            done, said = requeue(runner, reg, record)
            return (DONE if done else REFUSED), said
        except SlurmgenError as exc:
            return UNANSWERED, str(exc)
        finally:
            runner.close()


def stop_run(path: Any, seq: int, by: str = BY_PAGE) -> Outcome:
    """Ask a launch's launcher to stop; `by` ends the cause it records ("stopped by user from the page")."""
    with Registry.open(path) as reg:
        row = get_row(reg, seq)
    if row is None:
        return NO_RUN, f"there is no run {seq} in this machine's registry: nothing was stopped"
    if row["kind"] != "launch":
        return (
            REFUSED,
            f"run {seq} is {row['kind']!r}, not an SSH launch: only a launch is stopped (cancel a Slurm job)",
        )
    taken, said = stop_request.request(row, by)
    return (DONE if taken else REFUSED), said


@router.post(f"/ui/runs/{{seq}}/{RunControl.REQUEUE.value}", name="web_run_requeue")
@guarded("post")
async def requeue_action(request: Request, seq: int) -> Response:
    status, said = await asyncio.to_thread(requeue_run, registry_path(request.app), seq)
    return redirect_with(request, f"/ui/runs/{seq}", notice=said, done=status == DONE)


@router.post(f"/ui/runs/{{seq}}/{RunControl.STOP.value}", name="web_run_stop")
@guarded("post")
async def stop_action(request: Request, seq: int) -> Response:
    status, said = await asyncio.to_thread(stop_run, registry_path(request.app), seq)
    return redirect_with(request, f"/ui/runs/{seq}", notice=said, done=status == DONE)


# ---- groups and workers -------------------------------------------------------------------------
def _refusal(reply: api.Reply) -> str:
    detail = reply.body.get("detail") if isinstance(reply.body, dict) else reply.body
    return str(detail)


@router.post("/ui/groups/{name}/delete", name="web_group_delete")
@guarded("post")
async def delete_group(request: Request, name: str) -> Response:
    reply = await api.call(request.app, "DELETE", f"/api/groups/{name}")
    if not reply.ok:
        target = f"/ui/groups/{name}" if reply.status != 404 else "/ui/"
        return redirect_with(request, target, notice=f"Could not delete group {name!r}: {_refusal(reply)}")
    return redirect_with(request, "/ui/", notice=f"Deleted group {name!r}; its workers are free.", done=True)


@router.post("/ui/workers/{name}/forget", name="web_worker_forget")
@guarded("post")
async def forget_worker(request: Request, name: str) -> Response:
    workers = await api.get(request.app, "/api/workers")
    worker = next((w for w in workers if w["name"] == name), None)
    why = forget_refusal(worker) if worker else f"there is no worker {name!r}"
    if why:
        return redirect_with(request, "/ui/", notice=f"Did not forget worker {name!r}: {why}.")
    reply = await api.call(request.app, "DELETE", f"/api/workers/{name}")
    if not reply.ok:
        return redirect_with(request, "/ui/", notice=f"Could not forget worker {name!r}: {_refusal(reply)}")
    return redirect_with(request, "/ui/", notice=f"Forgot worker {name!r}.", done=True)
