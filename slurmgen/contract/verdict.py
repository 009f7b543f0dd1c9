"""One verdict: an attempt's outcome from the events seen, the first failure wins.

Every launcher watches the same kinds of event (a rank exits, a rank hangs, a node or its
connection is lost, the launcher gets a signal, a node never shows up or cannot start) and
must give one answer: did the attempt fail, and if so what failed first, on which node and
rank, with which exit code. `decide` is that answer, written once; `slurmgen launch`
(launch/attempt.py), the coordinator (coordinator/state.py), `slurmgen status` (jobs/view.py)
and the healing record (heal/attempts.py) turn what they saw into `Event`s and ask it. The
node link's agent (nodelink/agent.py) runs where slurmgen is not installed and keeps its own
copy of the rule; tests/unit/contract/test_verdict.py runs the same event sequences through both.

The rule: the first event that is not a clean exit decides the outcome and its code; later
failures are only noted by whoever saw them (they are usually the consequence of stopping the
others). A signal to the launcher counts as a failure here: a run stopped by Ctrl-C did not
succeed, and a rank that fails while everything is being stopped is not the cause. Without a
failure, the attempt ended well once `expected` parties exited 0.

Pure and import-free but for the contract: every rank, the node bootstrap and the page's
server may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurmgen.contract import exitcodes

# What an event is about (its cause).
EXITED = "exited"  # a rank (or the program of a node, an srun task) ended; code 0 ends well
HUNG = "hung"  # a rank's heartbeat went stale
LOST = "lost"  # a node, its launcher or the connection to it is gone
SIGNALLED = "signalled"  # the launcher got SIGINT or SIGTERM
ABSENT = "absent"  # a node never showed up before the start timeout
MISMATCH = "mismatch"  # a node was started with another shape of the job (another node count)
ERROR = "error"  # a node could not start, or said something its launcher did not expect
CAUSES = (EXITED, HUNG, LOST, SIGNALLED, ABSENT, MISMATCH, ERROR)

# The exit code each cause gives when the event does not carry its own (an exit always does;
# a signal is 128 + its number, as a shell reports a process ended by it).
CODES = {
    HUNG: exitcodes.HUNG,
    LOST: exitcodes.LOST,
    ABSENT: exitcodes.HUNG,
    MISMATCH: exitcodes.BAD_INPUT,
    ERROR: exitcodes.FAILED,
}


@dataclass(frozen=True)
class Event:
    """One thing a launcher saw. `node` and `rank` say where (None: not known or not one);
    `task` is the Slurm task id where Slurm reported it; `detail` is the launcher's own phrase
    for it, kept so that each launcher words its verdict as it always has. `code` None: a
    failure reported without a code (srun's report of a task ended by a signal)."""

    cause: str
    code: int | None
    node: str | None = None
    rank: int | None = None
    task: int | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.cause != EXITED or self.code != exitcodes.OK


def exited(
    code: int | None, node: str | None = None, rank: int | None = None, task: int | None = None, detail: str = ""
) -> Event:
    return Event(EXITED, code, node, rank, task, detail)


def failure(
    cause: str, node: str | None = None, rank: int | None = None, detail: str = "", code: int | None = None
) -> Event:
    """A failure of `cause` with the code of CODES unless it carries its own."""
    return Event(cause, CODES[cause] if code is None else code, node, rank, None, detail)


def signalled(signum: int, detail: str = "") -> Event:
    return Event(SIGNALLED, 128 + signum, detail=detail)


@dataclass(frozen=True)
class Verdict:
    """The outcome so far. `first` is the first failure (None: none yet). `code` is the
    attempt's exit code: the first failure's, exitcodes.OK once every expected party ended
    well, None while neither."""

    first: Event | None
    code: int | None

    @property
    def ended(self) -> bool:
        return self.code is not None or self.first is not None

    @property
    def failed(self) -> bool:
        return self.first is not None


def decide(events: Iterable[Event], expected: int = 0) -> Verdict:
    """The verdict on `events`, in the order they were seen: the first failure wins, with its
    code; without one the attempt ended well (exitcodes.OK) once `expected` events were clean
    exits (0: no failure is success), else it is undecided (code None). A failure after every
    party ended well still fails: a launcher that stops listening once it has an answer (the
    node link's master) simply never passes the later events."""
    clean = 0
    for event in events:
        if event.failed:
            return Verdict(event, event.code)
        clean += 1
    return Verdict(None, exitcodes.OK if clean >= expected else None)


def summary(event: Event) -> str:
    """One phrase for a failure, as the job commands print it: 'hung (rank 3 on node2)',
    'exit 3 (rank 5 on node2)', 'exit 3 (task 1 on node2)', or 'exit 3' when no node is known."""
    if event.code is None:
        return "unknown"
    text = exitcodes.describe(event.code)
    if event.cause == HUNG and event.rank is not None:
        return f"{text} (rank {event.rank} on {event.node})"
    if not event.node:
        return text
    if event.rank is not None:
        who = f"rank {event.rank} on "
    else:
        who = f"task {event.task} on " if event.task is not None else ""
    return f"{text} ({who}{event.node})"
