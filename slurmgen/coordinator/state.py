"""State transitions of workers, attempts and groups, as pure functions of what was observed.

The server never orders "do X" from memory of what it said before: at each heartbeat it
compares what a slot should run (its group's active attempt) with what the agent reports,
and `reconcile` derives the order. That is what makes a restarted server and a reconnecting
agent safe without a replay log. `judge_attempt` decides an attempt's fate (fail as one: the
first non-zero exit, stale trainer heartbeat or silent agent ends it for every rank), by the
contract's verdict (slurmgen/contract/verdict.py) over what was observed.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Literal

from slurmgen.contract import exitcodes, retries, verdict, warm
from slurmgen.contract.states import ACTIVE_WORDS, ENDED_WORDS, State

Order = Literal["start", "stop"]
RunKey = tuple  # (group, attempt)


def reconcile(reported: str, reported_run: RunKey | None, wanted: RunKey | None, finished: bool) -> Order | None:
    """The order for one slot: `reported` is idle|running|exited, `reported_run` the
    (group, attempt) it runs or ran, `wanted` the run it should be part of now (None: none),
    `finished` whether that run already has this slot's exit code recorded."""
    if reported == State.RUNNING:
        return None if reported_run == wanted else "stop"
    if wanted is not None and reported_run != wanted and not finished:
        return "start"
    return None


def worker_state(reported: str, reported_run: RunKey | None, wanted: RunKey | None, lost: bool) -> str:
    """What people see for a worker: lost beats everything, a wanted slot not yet running
    is starting."""
    if lost:
        return State.LOST.value
    if reported == State.RUNNING:
        return State.RUNNING.value
    if wanted is not None and reported_run != wanted:
        return State.STARTING.value
    return reported


@dataclass(frozen=True)
class Outcome:
    state: str  # a GroupState
    reason: str | None = None
    exit_code: int | None = None
    worker: str | None = None  # the worker whose rank failed, hung or was lost first (the verdict's)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_WORDS


def judge_attempt(
    state: str,
    ranks: Mapping[str, int],
    exits: Mapping[str, int],
    running: set,
    hung: set,
    lost: Mapping[str, float],
    stories: Mapping[str, str] | None = None,
) -> Outcome:
    """The attempt's state after new observations. `ranks` maps worker -> rank; `exits`
    holds the recorded exit codes in the order they arrived; `running`/`hung` are workers;
    `lost` maps each silent worker to the seconds since its agent was heard. Judged at every
    report, so what this report brought is seen at once: exits first (in their order), then
    stale heartbeats and silent agents in rank order, and the contract's verdict takes the
    first failure of that list. `stories` tells a hung worker's hang in words (group_blame.py)."""
    if state not in ACTIVE_WORDS:
        return Outcome(state)
    seen = verdict.decide(attempt_events(ranks, exits, hung, lost, stories or {}), expected=len(ranks))
    if seen.first is not None:
        return Outcome(State.FAILED.value, seen.first.detail, seen.first.code, seen.first.node)
    if seen.ended:
        return Outcome(State.SUCCEEDED.value, "every rank exited 0", exitcodes.OK)
    if state == State.STARTING and set(ranks) <= running | set(exits):
        return Outcome(State.RUNNING.value)
    return Outcome(state)


def attempt_events(
    ranks: Mapping[str, int], exits: Mapping[str, int], hung: set, lost: Mapping[str, float], stories: Mapping[str, str]
) -> list[verdict.Event]:
    """What the coordinator observed of one attempt, as verdict events, each worded as the
    coordinator reports it."""
    events = [
        verdict.exited(
            code,
            worker,
            ranks[worker],
            detail=f"rank {ranks[worker]} ({worker}) exited with code {exitcodes.with_meaning(code)}",
        )
        for worker, code in exits.items()
    ]
    events += [
        verdict.failure(
            verdict.HUNG,
            worker,
            ranks[worker],
            stories.get(worker, f"rank {ranks[worker]} ({worker}): trainer heartbeat went stale"),
        )
        for worker in sorted(hung, key=ranks.__getitem__)
    ]
    return events + [
        verdict.failure(
            verdict.LOST,
            worker,
            ranks[worker],
            f"rank {ranks[worker]} ({worker}): its agent has been silent for {lost[worker]:.0f} s",
        )
        for worker in sorted(lost, key=ranks.__getitem__)
    ]


def restart_after(outcome: Outcome, restarts_used: int, max_restarts: int) -> bool:
    """Whether an ended attempt is followed by a fresh one (`--max-restarts`): a failure the
    retry rule (contract/retries.py) finds worth another, while the budget lasts. A stop on
    request ends the attempt as stopped, not failed."""
    return outcome.state == State.FAILED and retries.worth_retry(outcome.exit_code) and restarts_used < max_restarts


def node_to_blame(outcome: Outcome) -> str | None:
    """The node a failed attempt's restart moves to a spare (GroupConfig.spare_nodes): the one
    whose agent went silent, whose rank hung, or whose rank was killed by a signal. Not one whose
    rank exited with an error of its own: when a peer dies the others' collectives fail and they
    exit 1, often before the dead peer is known, so such an exit names no culprit."""
    if outcome.state != State.FAILED or not outcome.worker or outcome.exit_code is None:
        return None
    if outcome.exit_code in (exitcodes.LOST, exitcodes.HUNG) or exitcodes.by_signal(outcome.exit_code):
        return outcome.worker.rpartition("-")[0]
    return None


def can_start(group_state: str) -> bool:
    return group_state not in ACTIVE_WORDS


# ---- warm restarts (GroupConfig.restart_mode warm, contract/warm.py) ---------------------------
@dataclass(frozen=True)
class WarmRestart:
    """A warm restart decided: the generation it begins, the worker whose rank starts anew in it
    (the others keep their processes and wait for that world), the world's rendezvous port, and
    the restart in words for the records."""

    generation: int
    worker: str
    rank: int
    port: int
    what: str


def warm_restart(
    outcome: Outcome,
    attempt_state: str,
    ranks: Mapping[str, int],
    exits: Mapping[str, int],
    troubled: AbstractSet[str],
    met: AbstractSet[str],
    last: tuple[int, float | None],
    now: float,
    budget: tuple[int, int],
    base_port: int,
) -> WarmRestart | None:
    """Whether a failed running attempt goes on in a next generation instead of ending, and in
    which: the failure is a rank's exit (in `exits`, the attempt's recorded codes; `ranks` maps
    worker -> rank) with a code the retry rule finds worth another, no worker hangs or is lost (`troubled`: those ranks'
    processes cannot wait for a new world), a restart is left (`budget`: (used, max_restarts);
    each warm restart counts), and the last one (`last`: (generation, when)) is more than
    warm.SETTLE seconds ago: a failure that soon means the program does not take part, or the
    world did not form, and the attempt restarts whole as before. An attempt still starting
    restarts whole too, and so does one whose ranks have not all met (`met`: the workers whose
    rank said its process group formed, contract/warm.py MET_PREFIX), however long its processes
    have run: a rank that failed before the rendezvous leaves the others in it, where no new world
    reaches them (they would wait until --init-timeout), and a program that never says so does not
    take part."""
    worker, code = outcome.worker, outcome.exit_code
    generation, at = last
    used, most = budget
    if (
        outcome.state != State.FAILED
        or attempt_state != State.RUNNING
        or worker is None
        or worker not in ranks
        or exits.get(worker) != code
        or troubled
        or not set(ranks) <= met
        or not retries.worth_retry(code)
        or used >= most
        or (at is not None and now - at <= warm.SETTLE)
    ):
        return None
    nxt, rank = generation + 1, ranks[worker]
    told = f"warm restart {nxt}: rank {rank} started anew after {outcome.reason}"
    return WarmRestart(nxt, worker, rank, warm.port_for(base_port, nxt), told)


def start_anew(reported: str, reported_generation: int, wanted_generation: int) -> bool:
    """Whether a slot of the attempt it should run, whose rank is not running, starts it again:
    a warm restart gave the rank a generation after the one its last process was started in."""
    return reported != State.RUNNING and reported_generation < wanted_generation


def superseded(reported_generation: int, wanted_generation: int) -> bool:
    """Whether a rank's reported exit belongs to a process a warm restart has replaced (its
    generation is older than the one the rank was started anew in): not a failure to judge again."""
    return reported_generation < wanted_generation
