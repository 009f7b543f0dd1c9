"""The page's controls: a run's (`act`, for the run page's forms and the JSON API alike; its
requeue and stop routes here, cancel and checkpoint in run_detail.py), delete a group, forget a
lost worker; and the group's command and env as shown.

Each is a POST behind the session and CSRF value (auth.guarded) that ends in a 303 to a page
with what happened (POST-redirect-GET). Each button that cannot apply is rendered disabled with
its reason, both as its title and as visible text it is described by; the POST checks again,
since a disabled button stops no one who posts by hand. The work goes through the layers the
CLI uses: a run's controls through jobs/control.py (`slurmgen cancel`'s entry: scancel and
`scontrol requeue` here or on the login node the job was submitted through, a launch's stop
channel), and the coordinator's JSON API for groups and workers (DELETE, with its own 404/409
refusals).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from slurmgen.contract.states import ACTIVE_WORDS
from slurmgen.contract.warm import COLD
from slurmgen.jobs import control
from slurmgen.jobs.control import Outcome, RunControl
from slurmgen.runs.registry import Registry

from . import api
from .auth import guarded, redirect_with
from .runs_page import registry_path
from .views import forget_refusal

router = APIRouter()
BY_PAGE = "from the page"


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
            for k in ("max_restarts", "spare_nodes", "min_nodes", "heartbeat_timeout", "stop_grace")
        },
        "restart_mode": config.get("restart_mode") or COLD,
    }


# ---- runs -------------------------------------------------------------------------------------
def act(path: Any, seq: int, what: RunControl, by: str = BY_PAGE) -> Outcome:
    """A run's control from the page or the JSON API: the run read once and the control done or
    refused by the jobs layer's one entry (jobs/control.perform), with the Slurm commands run here
    or on the login node the job was submitted through, as `slurmgen status` and `cancel` do."""
    from slurmgen.jobs.cli_shared import Runners

    with Registry.open(path) as reg:
        run = control.read(reg, seq)
        if run is None:
            return control.no_run(seq, what)
        runners = Runners(None, [])
        try:
            return control.perform(reg, run, what, runners, by)
        finally:
            runners.close()


@router.post(f"/ui/runs/{{seq}}/{RunControl.REQUEUE.value}", name="web_run_requeue")
@guarded("post")
async def requeue_action(request: Request, seq: int) -> Response:
    done = await asyncio.to_thread(act, registry_path(request.app), seq, RunControl.REQUEUE)
    return redirect_with(request, f"/ui/runs/{seq}", notice=done.said, done=done.done)


@router.post(f"/ui/runs/{{seq}}/{RunControl.STOP.value}", name="web_run_stop")
@guarded("post")
async def stop_action(request: Request, seq: int) -> Response:
    done = await asyncio.to_thread(act, registry_path(request.app), seq, RunControl.STOP)
    return redirect_with(request, f"/ui/runs/{seq}", notice=done.said, done=done.done)


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
