"""One entry for a run's controls (cancel, checkpoint and stop, requeue, stop a launch or a
group's run), called alike by `slurmgen cancel`, the run page's forms and the JSON API
(coordinator/web/controls.act), for every kind of run.

Three parts, so that each rule is written once and each side effect happens in one place:
- `Run`: the run as its controls see it, in one typed shape, read once from its registry row
  (`read`, `Run.from_row`) or made from the Slurm job the CLI resolved (`Run.of_job`);
- the decision, pure but for a launch's liveness (stop_request.why_not): `refusal`, why a control
  does not apply to this kind of run, said before anything is sent; `choices`, the controls the
  run's page offers and why each is disabled, from Slurm's view of the job;
- `perform`: the side effects at the edge (scancel and scontrol through the Slurm runner of
  the run, in stopping.py; the stop request file of a launch or a group's run,
  runs/stop_request.py), answered as an `Outcome` that the CLI prints, the page shows as its
  status line or alert and the API returns.
A group's run is stopped through the same stop channel as a launch: the `slurmgen serve` running
the group takes the request on its tick and stops the group (coordinator/service.py), so this
module needs neither the coordinator nor its address and token. The group itself (its start,
restart and Stop on its own page, `slurmgen group`) stays the coordinator's API's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from slurmgen.contract.states import SLURM_ENDED, STOP_ASKED, from_slurm
from slurmgen.errors import SlurmgenError
from slurmgen.jobs import chain, stopping
from slurmgen.jobs.resolve import reused_note
from slurmgen.jobs.slurm_runner import Runner
from slurmgen.runs import stop_request
from slurmgen.runs.model import RunRow, get_row, job_record
from slurmgen.runs.registry import JobRecord, Registry


class RunControl(str, Enum):
    """What a user may do to a run, named once: the page's buttons and their paths
    (/ui/runs/SEQ/WORD), the JSON API's accepted words and the buttons' labels."""

    REQUEUE = "requeue"
    STOP = "stop"
    CANCEL = "cancel"
    CHECKPOINT = "checkpoint"

    @property
    def label(self) -> str:
        return LABELS[self]


LABELS = {
    RunControl.REQUEUE: "Requeue",
    RunControl.STOP: "Stop launch",
    RunControl.CANCEL: "Cancel",
    RunControl.CHECKPOINT: "Checkpoint and stop",
}
SLURM_STOPS = (RunControl.CANCEL, RunControl.CHECKPOINT)  # scancel, with or without the preemption signal
STOPPABLE = tuple(stop_request.TAKERS)  # the kinds of run stopped through their stop channel (STOP)


def label(control: RunControl, kind: str) -> str:
    """A control's label on the page of a run of this kind: a group run's stop is "Stop"."""
    return "Stop" if control == RunControl.STOP and kind == "group" else control.label


class Status(IntEnum):
    """What a control did, as the JSON API answers it: done, no such run, refused by the rules (a
    running job is not requeued, a launch of another machine is not stopped) or not answered (its
    Slurm, or the login node, did not answer)."""

    DONE = 200
    NO_RUN = 404
    REFUSED = 409
    UNANSWERED = 502


@dataclass(frozen=True)
class Outcome:
    """What a control did or why it did nothing. `slurm`: a cancel's answer from stopping.cancel
    (job, state, exit_code, ended, ...), which `slurmgen cancel --json` prints; `warning`: said
    before a signal a program may die of; `error`: the error the CLI raises (a refusal or Slurm's
    silence), whose text `said` is."""

    status: Status
    said: str
    slurm: Mapping[str, Any] = field(default_factory=dict)
    warning: str | None = None
    error: SlurmgenError | None = None

    @property
    def done(self) -> bool:
        return self.status == Status.DONE


@dataclass(frozen=True)
class Run:
    """A run of the registry as its controls see it: which kind, which key (the Slurm job id, the
    launch id, GROUP.N), its state (a contract/states.py word), where it was started and where its
    Slurm commands run (`remote`: a login node; None: here). `job` is the Slurm job's record (kind
    slurm), which stopping.py takes and in which a cancel's signals are kept."""

    seq: int
    kind: str
    key: str
    state: str | None
    cluster: str
    remote: str | None
    info: Mapping[str, Any]
    job: JobRecord | None = None

    @classmethod
    def from_row(cls, row: RunRow) -> Run:
        """The run of a registry row as runs.get_row reads it."""
        job = job_record(row) if row["kind"] == "slurm" else None
        info = job.info if job is not None else dict(row.get("info") or {})
        return cls(
            row["seq"], row["kind"], row["job_id"], row["state"], row.get("cluster") or "", row["remote"], info, job
        )

    @classmethod
    def of_job(cls, record: JobRecord) -> Run:
        """The run of a Slurm job found by its id, name or directory (resolve.find)."""
        state = from_slurm(record.last_state, record.last_exit, STOP_ASKED in record.info)
        return cls(
            record.seq or 0,
            "slurm",
            record.job_id,
            state.value if state else None,
            record.cluster,
            record.remote,
            record.info,
            record,
        )

    def stop_row(self) -> dict[str, Any]:
        """The fields of the row runs/stop_request.py judges and writes to (the stop channel of a
        launch or a group's run)."""
        return {"kind": self.kind, "job_id": self.key, "state": self.state, "cluster": self.cluster, "info": self.info}


def read(reg: Registry, seq: int) -> Run | None:
    """Run `seq` of the registry, read once (None: the registry holds no such run)."""
    row = get_row(reg, seq)
    return Run.from_row(row) if row is not None else None


# ---- the decision ----------------------------------------------------------------------------
def refusal(run: Run, control: RunControl) -> str | None:
    """Why `control` does not apply to this kind of run, said before anything is sent (None: it
    may; Slurm or the launcher may still refuse it, for their own reasons)."""
    if control in SLURM_STOPS and run.kind != "slurm":
        return f"run {run.seq} is not a Slurm job of this machine's registry: nothing was sent"
    if control == RunControl.REQUEUE and run.kind != "slurm":
        return f"run {run.seq} is {run.kind!r}, not a Slurm job: only a Slurm job is requeued"
    if control == RunControl.STOP and run.kind not in STOPPABLE:
        return (
            f"run {run.seq} is {run.kind!r}, not an SSH launch or a group's run: "
            "only those are stopped (cancel a Slurm job)"
        )
    return None


def choices(run: Run, slurm: Mapping[str, Any]) -> dict[RunControl, str | None]:
    """The controls the run's page offers, each with why it is disabled (None: it applies): only
    those of its kind (issue 33, item 9: a launch or a group run showed a Slurm job's two buttons,
    always disabled): cancel, checkpoint and requeue for a Slurm job (the first two disabled but
    while it is live), stop for a launch or a group's run. `slurm` is `slurmgen status`'s view of a
    Slurm job ({}: none)."""
    state = str(slurm.get("state") or "").split(" ")[0]
    if run.kind in STOPPABLE:
        return {RunControl.STOP: stop_request.why_not(run.stop_row())}
    if run.kind != "slurm":
        return {}
    if state in SLURM_ENDED or not slurm:
        why = f"the job has ended ({state or 'unknown to Slurm'})"
        offered: dict[RunControl, str | None] = {RunControl.CANCEL: why, RunControl.CHECKPOINT: why}
    else:
        offered = {
            RunControl.CANCEL: None,
            RunControl.CHECKPOINT: None if state == "RUNNING" else f"the job is {state}, not running: nothing to save",
        }
    known = state if slurm.get("state") and state != "UNKNOWN" else None
    offered[RunControl.REQUEUE] = stopping.requeue_refusal(known, STOP_ASKED in run.info)
    return offered


def no_run(seq: int, control: RunControl) -> Outcome:
    """The answer for a run the registry does not hold."""
    undone = {RunControl.REQUEUE: "nothing was requeued", RunControl.STOP: "nothing was stopped"}
    return Outcome(
        Status.NO_RUN, f"there is no run {seq} in this machine's registry: {undone.get(control, 'nothing was sent')}"
    )


# ---- the side effects ------------------------------------------------------------------------
# How a runner is opened for a run: (login node or None, its setup lines, its ssh config), as
# cli_shared.Runners is called; the caller closes the runners it opened.
OpenRunner = Callable[[str | None, list[str] | None, str | None], Runner]


def perform(
    reg: Registry,
    run: Run,
    control: RunControl,
    runners: OpenRunner,
    by: str,
    task: str | None = None,
    signal: str | None = None,
) -> Outcome:
    """Do `control` to `run`, or say why not. `by` ends the cause a stopped launch records
    ("stopped by you from the page"); `task` (an array task) and `signal` (sent instead of
    ending the job) are a cancel's, as `slurmgen cancel` takes them; a checkpoint sends the
    job's preempt_signal. Slurm's silence (or the login node's) is an UNANSWERED outcome, never
    an exception; its error is kept for the CLI to raise as it is."""
    why = refusal(run, control)
    if why is not None:
        return Outcome(Status.REFUSED, why)
    if control == RunControl.STOP:
        taken, said = stop_request.request(run.stop_row(), by)
        return Outcome(Status.DONE if taken else Status.REFUSED, said)
    assert run.job is not None  # refusal() let only a Slurm job through
    if control == RunControl.REQUEUE:
        return _requeue(reg, run.job, runners)
    if control == RunControl.CHECKPOINT:  # a stop: the job is kept from requeueing after its checkpoint
        return _cancel(reg, run.job, runners, task, stopping.preempt_signal(run.job), stop_by=by)
    return _cancel(reg, run.job, runners, task, signal)


def _runner(record: JobRecord, runners: OpenRunner) -> Runner:
    """Here, or the login node the job was submitted through, as `slurmgen status` does."""
    return runners(record.remote, record.info.get("remote_setup"), record.info.get("ssh_config"))


def _requeue(reg: Registry, record: JobRecord, runners: OpenRunner) -> Outcome:
    try:
        done, said = stopping.requeue(_runner(record, runners), reg, record)
    except SlurmgenError as exc:
        return Outcome(Status.UNANSWERED, str(exc), error=exc)
    return Outcome(Status.DONE if done else Status.REFUSED, said)


def _cancel(
    reg: Registry,
    record: JobRecord,
    runners: OpenRunner,
    task: str | None,
    signal: str | None,
    stop_by: str | None = None,
) -> Outcome:
    """scancel the job (or send it `signal`), unless its id now names a later job. An ended job
    is left alone and said so: a refusal, since Slurm was not asked to act. A link of a chain
    (jobs/chain.py) stands for its chain: the signal goes to the chain's live link, and a cancel
    ends every link, the live one waited for. `stop_by`: a person's checkpoint and stop, whose
    job is first kept from requeueing (stopping.keep_from_requeue; refused when it cannot be)."""
    reused = reused_note(reg, record)
    if reused:  # scancel ID would hit the later job that has the id now
        error = SlurmgenError(f"cancel: {reused}; nothing was cancelled")
        return Outcome(Status.REFUSED, str(error), error=error)
    warning = stopping.signal_warning(record, signal) if signal else None
    others: list[str] = []
    try:
        runner = _runner(record, runners)
        if chain.links_of(record) and task is None:  # a chain: its live link, and without a signal every link
            record = chain.live_link(runner, reg, record)
            others = chain.cancel_others(runner, record) if signal is None else []
        kept = stopping.keep_from_requeue(runner, reg, record, stop_by) if stop_by else None
        if kept is not None:
            return Outcome(Status.REFUSED, kept)
        done = stopping.cancel(runner, reg, record, task, signal)
    except SlurmgenError as exc:
        return Outcome(Status.UNANSWERED, str(exc), warning=warning, error=exc)
    said = str(done["said"]) + (f" (and the chain's other links: {' '.join(others)})" if others else "")
    ended = done.get("already_ended") and not others
    return Outcome(
        Status.REFUSED if ended else Status.DONE, said, {**done, **({"chain_links": others} if others else {})}, warning
    )
