"""`slurmgen cancel`'s and the page's requeue work: scancel a job (or send it a signal) and wait until
Slurm says it ended; `scontrol requeue` a failed or preempted one.

Apart from commands.py (submit, wait, status) since stopping a job is its own conversation with
Slurm: a job that already ended is left alone, a requeue is not an end, and a warning signal is
sent only after saying whether the job's program declared that it handles it. Like
commands.py, each function takes plain values and a `Runner` and returns data; `cli.py` prints it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from slurmgen.contract import envvars
from slurmgen.contract.exitcodes import FAILED
from slurmgen.contract.states import SLURM_LIVE, STOP_ASKED
from slurmgen.errors import SlurmgenError
from slurmgen.jobs import signals
from slurmgen.jobs.commands import POLL, all_tasks
from slurmgen.jobs.query import ask
from slurmgen.jobs.slurm import QueryResult, SlurmJob
from slurmgen.jobs.slurm_runner import Runner
from slurmgen.jobs.view import overall
from slurmgen.runs.model import mark_slurm_stopping
from slurmgen.runs.registry import JobRecord, Registry
from slurmgen.runs.trainer_records import is_trainer

# A cancelled job ends within Slurm's KillWait (30 s by default) after the signal.
CANCEL_WAIT = 90.0


def preempt_signal(record: JobRecord) -> str:
    """The signal the job's program takes as the preemption warning: its spec's preempt_signal
    (the trainer's USR2 when the spec named none). `checkpoint` sends it."""
    return record.info.get("preempt_signal") or "USR2"


def handles(record: JobRecord, signal: str) -> bool:
    """Does the job's program take `signal` as the preemption warning (checkpoint, exit 75)?

    The bundled trainer does for its preempt_signal; any other program only if its spec
    declared the contract (env SLURMGEN_PREEMPT_CONTRACT=1, README: the heartbeat protocol)."""
    wanted = signals.number(preempt_signal(record))
    if wanted is None or signals.number(signal) != wanted:
        return False
    return is_trainer(record.info.get("command") or []) or bool(record.info.get("preempt_contract"))


def signal_warning(record: JobRecord, signal: str) -> str | None:
    """What to say before sending a warning signal to a program that may die of it.

    slurmgen's own processes around the program (the batch shell, the rank wrappers and their
    labellers, torchrun's agent) trap both warnings and wait on, so the job's fate is the
    program's: the bundled trainer handles only its preempt_signal and dies of the other one;
    any other program dies of it only if it installed no handler (Lightning's SLURMEnvironment
    requeues the job on USR1, its default), which cannot be known from here."""
    num = signals.number(signal)
    label = signals.name(num) if num is not None else None
    if num is None or label not in signals.WARNINGS or handles(record, signal):
        return None
    command = record.info.get("command") or []
    words = " ".join(command) or "its program"
    head = f"job {record.job_id} runs `{words}`, which did not declare that it handles {label}"
    around = f"slurmgen's own processes ignore {label} and the program gets it"
    if is_trainer(command):
        preempt = record.info.get("preempt_signal") or "USR2"
        return (
            f"{head} (the bundled trainer takes only its preempt_signal, {preempt}): {around} and dies of it, "
            f"exit code {128 + num}"
        )
    return (
        f"{head} (env {envvars.PREEMPT_CONTRACT}=1 declares it): {around}; it dies of it (exit code {128 + num}) "
        f"only if it installed no handler for it (Lightning's SLURMEnvironment, for one, requeues the job on USR1)"
    )


def _mine(runner: Runner, record: JobRecord, task: str | None, accounting: bool) -> tuple[list[SlurmJob], QueryResult]:
    snap = ask(runner, [record.job_id], accounting=accounting)
    return [j for j in all_tasks(snap, record) if task is None or j.array_task == task], snap


def cancel(
    runner: Runner,
    registry: Registry,
    record: JobRecord,
    task: str | None,
    signal: str | None,
    timeout: float = CANCEL_WAIT,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """scancel the job (or one array task); without a signal, wait until Slurm says it ended.

    A job that had already ended is left alone and said so, with its state: scancel on it
    succeeds silently, and a job Slurm forgot is not thereby cancelled. The result's `ended`
    is False when the job did not end (requeued instead, or still ending at the timeout)."""
    target = f"{record.job_id}_{task}" if task is not None else record.job_id
    before, snap = _mine(runner, record, task, accounting=True)
    if snap.unanswered:  # scancel would wait as long, and nothing would be cancelled
        raise SlurmgenError(f"cancel: {snap.unanswered}; nothing was cancelled", exit_code=FAILED)
    asked = not any(n.startswith("scontrol failed") for n in snap.notes)  # else Slurm may know more than it said
    if asked and (not before or all(j.ended for j in before)):
        state, code = overall(before) if before else (record.last_state or "UNKNOWN", record.last_exit)
        known = "" if before else "Slurm no longer knows it; last seen "
        said = f"job {target} had already ended: {known}{state}" + (f", exit code {code}" if code is not None else "")
        return {"job": target, "state": state, "exit_code": code, "ended": True, "already_ended": True, "said": said}
    res = runner.run(["scancel", *([f"--signal={signal}"] if signal else []), target], timeout=30)
    if res.code != 0:
        raise SlurmgenError(f"scancel: {' '.join(res.err.split()) or f'exit code {res.code}'}", exit_code=FAILED)
    if signal:
        record.info.setdefault("signals", []).append({"signal": signal, "time": time.time(), "task": task})
        registry.update_info(record)
        return {"job": target, "signal": signal, "said": f"sent {signal} to {target}"}
    return _until_ended(runner, record, task, target, max((j.restarts for j in before), default=0), timeout, sleep)


def _until_ended(
    runner: Runner,
    record: JobRecord,
    task: str | None,
    target: str,
    restarts: int,
    timeout: float,
    sleep: Callable[[float], None],
) -> dict[str, Any]:
    """Poll after scancel: the final state, or why there is none yet."""
    deadline = time.monotonic() + timeout
    while True:
        jobs, _ = _mine(runner, record, task, accounting=False)
        if not jobs:  # forgotten at once (MinJobAge 0?): ask accounting for the final state
            jobs, _ = _mine(runner, record, task, accounting=True)
            if not jobs:
                return {
                    "job": target,
                    "state": "UNKNOWN",
                    "exit_code": None,
                    "ended": True,
                    "said": f"job {target}: ended (Slurm no longer knows its final state)",
                }
        state, code = overall(jobs)
        if all(j.ended for j in jobs):
            return {"job": target, "state": state, "exit_code": code, "ended": True, "said": f"job {target}: {state}"}
        if state == "PENDING" and max(j.restarts for j in jobs) > restarts:
            return {
                "job": target,
                "state": state,
                "exit_code": None,
                "ended": False,
                "said": f"job {target}: requeued instead of ending (PENDING); scancel it again",
            }
        if time.monotonic() > deadline:
            return {
                "job": target,
                "state": state,
                "exit_code": None,
                "ended": False,
                "said": f"job {target}: still {state} {timeout:g} s after scancel (Slurm's KillWait gives the "
                f"processes time to stop); `slurmgen status {target}` tells when it has ended",
            }
        sleep(POLL)


def keep_from_requeue(runner: Runner, registry: Registry, record: JobRecord, by: str) -> str | None:
    """Before a person's "checkpoint and stop" sends its signal: the job is kept from being
    requeued (Requeue=0, which every requeue path obeys, since Slurm refuses `scontrol requeue` of
    such a job: the trainer's after its checkpoint, run_slurm.sh's retries, a framework's own),
    and the stop is recorded as theirs (STOP_ASKED), so that its end reads "stopped by you", not
    preempted. Why it could not be (None: done); then nothing is to be sent, since a checkpoint
    that requeues the job would not stop it."""
    res = runner.run(["scontrol", "update", f"JobId={record.job_id}", "Requeue=0"], timeout=30)
    if res.code != 0:
        said = " ".join(res.err.split()) or f"exit code {res.code}"
        return f"job {record.job_id} could not be kept from requeueing (scontrol: {said}); nothing was sent"
    record.info[STOP_ASKED] = {"time": time.time(), "by": by}
    registry.update_info(record)
    if record.seq is not None:
        mark_slurm_stopping(registry, record.seq)
    return None


# Slurm states a job may be requeued from by a person: it failed or was preempted. A running job
# is cancelled (or checkpointed) instead; a completed or cancelled one is submitted again.
REQUEUABLE = frozenset({"FAILED", "PREEMPTED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


def requeue_refusal(state: str | None, stop_asked: bool = False) -> str | None:
    """Why a job in Slurm state `state` (None: unknown to Slurm) cannot be requeued (None: it can).
    `stop_asked`: a person's checkpoint and stop ended it (keep_from_requeue), after which Slurm
    refuses to requeue it ("presently disabled", even after `scontrol update Requeue=1`, which
    Slurm does not apply to an ended job)."""
    if stop_asked and state not in (None, *SLURM_LIVE):
        return "you stopped it (checkpoint and stop), after which Slurm does not requeue it: submit it again to resume"
    if not state:
        return "Slurm no longer knows the job (it keeps ended jobs for MinJobAge): submit it again"
    if state in REQUEUABLE:
        return None
    if state in ("COMPLETED", "CANCELLED"):
        return f"the job is {state}: only a failed or preempted job is requeued (submit it again)"
    return f"the job is {state}, not ended: only a failed or preempted job is requeued"


def requeue(runner: Runner, registry: Registry, record: JobRecord) -> tuple[bool, str]:
    """`scontrol requeue` a failed or preempted job (every task of an array), after asking Slurm
    for its state; (requeued, what Slurm said or why nothing was sent), as a launch's stop
    request answers (stop_request.request), so the page and the JSON API tell a refusal apart."""
    jobs, snap = _mine(runner, record, None, accounting=True)
    if snap.unanswered:
        raise SlurmgenError(f"requeue: {snap.unanswered}; nothing was requeued", exit_code=FAILED)
    state = overall(jobs)[0] if jobs else None
    refusal = requeue_refusal(state, STOP_ASKED in record.info)
    if refusal:
        return False, f"job {record.job_id} was not requeued: {refusal}"
    res = runner.run(["scontrol", "requeue", record.job_id], timeout=30)
    if res.code != 0:
        said = " ".join(res.err.split()) or f"exit code {res.code}"
        return False, f"job {record.job_id} was not requeued: scontrol: {said}"
    record.info.setdefault("requeued", []).append({"time": time.time(), "from": state})
    registry.update_info(record)
    return True, f"requeued job {record.job_id} (it was {state}); Slurm starts it again when it is eligible"
