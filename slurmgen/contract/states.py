"""One vocabulary of states for a run, its attempts and its ranks, and the words outside formats use.

Inside slurmgen a run that ended well is `SUCCEEDED`, whatever started it. Some stored or
public formats already spell states their own way and keep doing so, because files written by
earlier versions and programs that speak the heartbeat protocol must stay readable: a heartbeat
says `done`, a run record says `finished`. The mappings below are the only place where those
words meet the vocabulary.
"""

from __future__ import annotations

from enum import Enum

from slurmgen.contract.exitcodes import PREEMPTED as PREEMPTED_EXIT


class State(str, Enum):
    IDLE = "idle"  # a coordinator group with nothing to run
    PENDING = "pending"  # waiting for an allocation (Slurm) or to be started
    STARTING = "starting"  # processes being started, rendezvous not yet done
    RUNNING = "running"  # its processes run (a Slurm job: allocated, its batch script started)
    SUCCEEDED = "succeeded"  # every rank exited 0
    FAILED = "failed"  # a rank failed, hung or its node was lost: the first failure says which
    PREEMPTED = "preempted"  # stopped by a signal after a checkpoint; resumable
    STOPPING = "stopping"  # a stop was asked for (cancel, stop) and some of its ranks still run
    STOPPED = "stopped"  # stopped on request (cancel, stop)
    LOST = "lost"  # a worker or node that stopped answering

    def __str__(self) -> str:
        return self.value


# What every view shows for STOPPED, a run, attempt or rank stopped on a person's request (not
# the code its ranks died with, 75 or 143, which is the stop's doing and no failure): a neutral
# state of its own. Also the start of such a run's recorded cause ("stopped by you from the page",
# "... with slurmgen cancel"), so the page, the runs list and `slurmgen status` say it in one
# wording; its exit code is 128 + SIGTERM (exitcodes.TERMINATED), as for a SIGTERM.
STOPPED_BY_YOU = "stopped by you"


def stopped_after(rank: int) -> str:
    """How every view names a rank that only waited: its attempt failed on `rank`'s account (an
    exit, a hang, a lost node) while it still ran, and it was stopped then, whatever it died of
    (143, 137). A STOPPED, neutral, not a failure of its own: the failure is `rank`'s."""
    return f"{State.STOPPED.value} (after rank {rank})"


# The key of a Slurm job's registry info that records a person's "checkpoint and stop" (when, by
# whom): the job's exit with the preemption code after it is that person's stop, not a preemption.
STOP_ASKED = "stop_asked"

# The states a run of the registry can be in (the runs list's filter, `slurmgen jobs --state`):
# every state but IDLE, which is a coordinator group's or a worker's with nothing to run, never a run's.
RUN_STATES = tuple(s for s in State if s is not State.IDLE)

ENDED = frozenset({State.SUCCEEDED, State.FAILED, State.PREEMPTED, State.STOPPED})
ACTIVE = frozenset({State.STARTING, State.RUNNING, State.STOPPING})
ACTIVE_WORDS = frozenset(s.value for s in ACTIVE)  # as ENDED_WORDS, for states held as plain strings
ENDED_WORDS = frozenset(s.value for s in ENDED)  # for code that holds states as plain strings (SQLite, JSON)

# The heartbeat protocol's `status` field (any program may write it; see train/logs.py).
HEARTBEAT_WORD = {
    State.STARTING: "starting",
    State.RUNNING: "running",
    State.SUCCEEDED: "done",
    State.PREEMPTED: "preempted",
    State.FAILED: "failed",
}
# A run record's `status` (tracking/run.py; stored files of earlier versions say the same).
RUN_RECORD_WORD = {
    State.RUNNING: "running",
    State.SUCCEEDED: "finished",
    State.FAILED: "failed",
    State.PREEMPTED: "preempted",
}
# ...and an attempt's, once a later attempt of the run finds it still "running": it ended unrecorded.
RUN_RECORD_LOST = State.LOST.value


# Slurm's job states (scontrol, sacct), by the first word: "CANCELLED by 1000" is CANCELLED.
SLURM_STATE = {
    "PENDING": State.PENDING,
    "REQUEUED": State.PENDING,
    "REQUEUE_HOLD": State.PENDING,
    "REQUEUE_FED": State.PENDING,
    "CONFIGURING": State.STARTING,
    "RUNNING": State.RUNNING,
    "COMPLETING": State.RUNNING,
    "RESIZING": State.RUNNING,
    "SUSPENDED": State.RUNNING,
    "STOPPED": State.RUNNING,
    "COMPLETED": State.SUCCEEDED,
    "CANCELLED": State.STOPPED,
    "PREEMPTED": State.PREEMPTED,
    "FAILED": State.FAILED,
    "TIMEOUT": State.FAILED,
    "NODE_FAIL": State.FAILED,
    "OUT_OF_MEMORY": State.FAILED,
    "BOOT_FAIL": State.FAILED,
    "DEADLINE": State.FAILED,
}


# Slurm's words after which a job does not change again (a requeued job goes back to PENDING
# first): those of an ended state, and two slurmgen gives no state of its own (a job held after a
# special exit code; a federated sibling revoked because another cluster started the job).
SLURM_ENDED = frozenset({w for w, s in SLURM_STATE.items() if s in ENDED} | {"SPECIAL_EXIT", "REVOKED"})
# ...and those of a job still to run or running (held or requeued ones included).
SLURM_LIVE = frozenset(w for w, s in SLURM_STATE.items() if s not in ENDED)


def from_slurm(word: str | None, exit_code: int | None = None, stop_asked: bool = False) -> State | None:
    """The state a Slurm job state means; None for a word Slurm does not define (or none).

    Slurm calls every non-zero exit FAILED; a job that exited with the preemption code (the
    program saved a checkpoint on the warning signal and stopped: a preemption without requeue)
    is PREEMPTED, resumable, not failed; and STOPPED when a person asked for it (`stop_asked`:
    its registry info holds STOP_ASKED, after the page's or the API's "checkpoint and stop"),
    STOPPING while it still runs after that."""
    state = SLURM_STATE.get((word or "").split(" ")[0].upper()) if word else None
    if state is State.FAILED and exit_code == PREEMPTED_EXIT:
        return State.STOPPED if stop_asked else State.PREEMPTED
    return State.STOPPING if stop_asked and state in (State.STARTING, State.RUNNING) else state


def shown(word: str | None) -> str | None:
    """A state word as the views say it: STOPPED as STOPPED_BY_YOU, every other as itself."""
    return STOPPED_BY_YOU if word == State.STOPPED.value else word


def from_exit_code(code: int | None) -> State:
    """What the exit code of a process or a run that ended means: 0 succeeded, the preemption
    code preempted (checkpointed, resumable), any other code (or none) failed."""
    return State.SUCCEEDED if code == 0 else State.PREEMPTED if code == PREEMPTED_EXIT else State.FAILED


def from_heartbeat(word: str) -> State | None:
    """The state a heartbeat's status word means; None for a word the protocol does not define."""
    return _HEARTBEAT_STATE.get(word)


def from_run_record(word: str) -> State | None:
    return _RUN_RECORD_STATE.get(word)


_HEARTBEAT_STATE = {w: s for s, w in HEARTBEAT_WORD.items()}
_RUN_RECORD_STATE = {w: s for s, w in RUN_RECORD_WORD.items()}
