"""A launch's entry in the run registry (jobs/runs.py): written at the start, updated per attempt
and at the end with the verdict, including when the launch fails or is interrupted.

The verdict itself is the attempt state machine's (attempt.py); this module only translates
its outcome (exit code, first failure, signals) into the run model's words.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmgen.contract import envvars, exitcodes
from slurmgen.contract.files import TIMELINE_NAME
from slurmgen.contract.states import State
from slurmgen.jobs.records import record_dir
from slurmgen.jobs.runs import Failure, NewRun, Recorder

if TYPE_CHECKING:
    from slurmgen.launch.plan import LaunchPlan


def timeline_file(workdir: str, log_dir: str, launch_id: str) -> str:
    """Where a launch's ranks and nodes append its timeline: beside the per-rank logs, named by
    the launch id, so `slurmgen status ID --timeline` reads the path from the registry's row."""
    return posixpath.join(workdir, log_dir, TIMELINE_NAME.format(job_id=launch_id))


def new_run(plan: LaunchPlan, name: str, command: list[str]) -> NewRun:
    """The run `plan` starts: keyed by its launch id, its run records by its group (SLURMGEN_GROUP)."""
    run_id = plan.env.get(envvars.GROUP) or None
    logs = posixpath.join(plan.workdir, plan.log_dir)
    return NewRun(
        kind="launch", key=plan.env.get(envvars.LAUNCH_ID) or run_id or "", name=name, workdir=plan.workdir,
        nodes=len(plan.nodes), ranks=plan.world_size, run_id=run_id,
        record_dir=record_dir(plan.workdir, command, run_id) if run_id else None,
        logs=[{"node": n.host, "path": logs} for n in plan.nodes],
        info={"command": command, "hosts": [n.host for n in plan.nodes], "pid": os.getpid(),
              "max_restarts": plan.max_restarts,
              **({"timeline": plan.env[envvars.TIMELINE_FILE]} if plan.env.get(envvars.TIMELINE_FILE) else {})})


def outcome(code: int, interrupted: bool) -> State:
    """The run state an attempt's (or the launch's) exit code means."""
    if code == exitcodes.OK:
        return State.SUCCEEDED
    if interrupted:
        return State.STOPPED
    if code == exitcodes.PREEMPTED:
        return State.PREEMPTED
    return State.FAILED


@dataclass
class LaunchRecord:
    """The launch's row: `Launcher` reports attempts, `runner.launch` the end."""

    recorder: Recorder
    run: int | None = None
    failure: Failure | None = None  # the first failure of the latest attempt
    timeline: str | None = None     # the run's timeline file (SLURMGEN_TIMELINE_FILE)

    @classmethod
    def start(cls, recorder: Recorder, plan: LaunchPlan, name: str, command: list[str]) -> LaunchRecord:
        return cls(recorder, recorder.started(new_run(plan, name, command)), timeline=plan.env.get(envvars.TIMELINE_FILE))

    def attempt_started(self, number: int) -> None:
        self.failure = None
        self.recorder.attempt_started(self.run, number)

    def attempt_ended(self, number: int, code: int, interrupted: bool, failure: Failure | None) -> None:
        self.failure = failure
        self.recorder.attempt_ended(self.run, number, outcome(code, interrupted), failure)

    def ended(self, code: int, interrupted: bool, failure: Failure | None = None) -> None:
        """The verdict: the last attempt's failure unless the launch failed outside an attempt."""
        self.recorder.ended(self.run, outcome(code, interrupted), code, failure or (self.failure if code else None))
        self.recorder.time_report(self.run, self.timeline)
