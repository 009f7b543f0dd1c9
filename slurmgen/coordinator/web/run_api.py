"""The JSON equivalents of a run's own controls on the page, through the same entry (controls.act,
jobs/control.py): requeue a failed or preempted Slurm job, stop an SSH launch started on this
machine, cancel a Slurm job, or "checkpoint and stop" it (the preemption signal, so the bundled
trainer saves first).

`POST /api/runs/{seq}/actions` with `{"action": "requeue" | "stop" | "cancel" | "checkpoint"}`,
behind the API token as every /api/ path is (server.Gate answers 401 before the body is read).
The rules are the page's, checked by the same functions: 200 with what was done; 404 for a run
the registry does not hold; 409 with the reason when the rules refuse (a running or completed
job is not requeued, a launch is stopped only where it was started, a Slurm job is not
"stopped" but cancelled, an ended job is not cancelled again); 502 when Slurm did not answer;
422 naming the field for a body or path that does not fit.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from slurmgen.jobs.control import RunControl

from .controls import act
from .runs_page import registry_path

router = APIRouter()
BY_API = "through the API"  # the end of a stopped launch's cause: "stopped by you through the API"


class RunAction(BaseModel):
    """What to do to the run: every control of the page, by its one name (jobs/control.RunControl:
    the only accepted words; a 422 lists them); nothing else is accepted (a misspelt field is
    named, not ignored)."""

    model_config = ConfigDict(extra="forbid")
    action: RunControl


@router.post("/api/runs/{seq}/actions", name="api_run_action")
async def run_action(request: Request, seq: int, body: RunAction) -> JSONResponse:
    done = await asyncio.to_thread(act, registry_path(request.app), seq, body.action, BY_API)
    if not done.done:
        return JSONResponse({"detail": done.said}, status_code=done.status)
    return JSONResponse({"run": seq, "action": body.action.value, "said": done.said})
