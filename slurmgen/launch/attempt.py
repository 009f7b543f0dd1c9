"""One attempt of `slurmgen launch` as a state machine. Pure: no clock, no I/O, no threads.

The runner turns what happens into typed inputs (a session opened, a node event from the
event channel, a session ended, a signal, and a `ClockTick` on every pass of its loop) and calls
`step(state, input)`, which returns the next state and the actions the runner must carry out
(print a line, close a node's stdin, drop a connection). Every deadline is a comparison with
the input's time in `step`, so it is checked on every `ClockTick` however much output flows:

- connect: a node whose session has not opened `connect` seconds into the attempt is an error;
- keepalive: a host whose keepalive answer is `keepalive * keepalive_count` seconds overdue is
  lost (like ServerAliveInterval / ServerAliveCountMax);
- stop grace: after the first failure every node's stdin is closed except the failed node's,
  which stops its own ranks; if it has not ended `stop_grace` seconds later its stdin is
  closed too, and any node still without an exit status `stop_wait` seconds after that is
  counted lost;
- heartbeat: each node reports the beats of its quiet ranks (a `beats` event, read next to the
  files with the node's clock, templates/launch_bootstrap.sh.j2); every tick judges them across
  all nodes by the contract's hang rule (slurmgen/contract/blame.py), each aged by the time
  since its report, so the frozen rank is named and not a rank that waits for it elsewhere;
- stack: before it stops every node for a hang it asks the hung rank's node for that rank's
  Python stack (`AskStack`) and stops on the answer (its innermost frame joins the verdict) or
  `stack_wait` seconds later without one.

With warm restarts (`WarmPlan`, contract/warm.py) a rank that exits with a code worth a retry
stops nothing: the next generation's world goes to every node (`NewWorld`: the healthy ranks
wait for it in their processes) and the failed rank is started anew on its node, while the
plan's budget lasts. A second failure within `warm.SETTLE` seconds of a new world means the
program does not take part (its healthy ranks died of the first failure) or the world did not
form: then every node is stopped as without warm restarts, and the runner restarts them whole.

The first failure decides the exit code and the verdict (slurmgen/contract/verdict.py: every
failure and signal is kept as a verdict event, and `decide` names the first); later ones are
noted per node.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from slurmgen.contract import blame, exitcodes, retries, verdict, warm
from slurmgen.contract.node_events import KEEPALIVE_COUNT, KEEPALIVE_INTERVAL, NodeEvent
from slurmgen.contract.states import State
from slurmgen.contract.verdict import Event
from slurmgen.launch.display import NodeResult

STOPPED_CODES = (exitcodes.INTERRUPTED, 128 + signal.SIGKILL, exitcodes.TERMINATED)
# A node's state (its row of the summary): the contract's words, and a failure's cause where
# no state says it (hung, error). Plain strings, as the display's styles and the records hold them.
RUNNING, STOPPED, FAILED, LOST = (s.value for s in (State.RUNNING, State.STOPPED, State.FAILED, State.LOST))
HUNG, ERROR = verdict.HUNG, verdict.ERROR
FAILED_STATES = (FAILED, HUNG, ERROR, LOST)


# ---- inputs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionOpened:
    host: str
    at: float


@dataclass(frozen=True)
class StartFailed:
    host: str
    message: str
    at: float


@dataclass(frozen=True)
class Reported:
    host: str
    event: NodeEvent
    at: float


@dataclass(frozen=True)
class SessionEnded:
    host: str
    status: int | None  # None: the connection ended without an exit status
    at: float


@dataclass(frozen=True)
class Signalled:
    signum: int
    at: float
    reason: str = ""  # a stop request's words (runs/stop_request.py); "" for a real signal


@dataclass(frozen=True)
class ClockTick:
    at: float
    overdue: Mapping[str, float]  # host -> seconds its keepalive answer is overdue


Input = SessionOpened | StartFailed | Reported | SessionEnded | Signalled | ClockTick


# ---- actions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class CloseStdin:
    host: str


@dataclass(frozen=True)
class Disconnect:
    host: str


@dataclass(frozen=True)
class DisconnectAll:
    pass


@dataclass(frozen=True)
class AskStack:
    """Ask `host` for the Python stack of its hung `rank` (node_events.STACK_ASK)."""

    host: str
    rank: int


@dataclass(frozen=True)
class NewWorld:
    """Tell every node a warm restart's new world; `starts`: per host, its ranks to start anew."""

    world: warm.World
    starts: Mapping[str, tuple[int, ...]]
    what: str = ""  # the restart in words, for the run registry: "warm restart 1: rank 1 started anew after ..."


Action = Say | CloseStdin | Disconnect | DisconnectAll | AskStack | NewWorld


# ---- state -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    connect: float = 10.0
    keepalive: float = KEEPALIVE_INTERVAL
    keepalive_count: int = KEEPALIVE_COUNT
    stop_grace: float = 1.0
    stop_wait: float = 5.0
    heartbeat_ms: int = 0  # the hang limit (0: ranks are not judged)
    stack_wait: float = 0.0  # how long to wait for a hung rank's stack before stopping (0: no asking)


@dataclass(frozen=True)
class WarmPlan:
    """The warm restarts an attempt may order: how many, and the rendezvous whose port they move."""

    budget: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class AttemptState:
    attempt: int
    started_at: float
    launched_at: float
    world_size: int
    limits: Limits
    nodes: Mapping[str, NodeResult]  # in node-rank order
    pending: frozenset[str]  # hosts without a final state yet
    opened: frozenset[str] = frozenset()
    seen: tuple[Event, ...] = ()  # every failure and signal, in order (`verdict` is a property here)
    stop_at: float | None = None
    spared: str | None = None  # the failed node, stopping its own ranks
    signals: tuple[int, ...] = ()
    stop_reason: str = ""  # why the first signal came, when a person asked for the stop
    all_running: bool = False
    # host -> the beats of its quiet ranks in its last `beats` report, and when that arrived
    beats: Mapping[str, tuple[tuple[blame.LastBeat, ...], float]] = field(default_factory=dict)
    asked: tuple[str, int, float] | None = None  # (host, rank, until when): a hung rank's stack is awaited
    warm_plan: WarmPlan | None = None  # None: a failure stops every node
    generation: int = 0  # warm restarts ordered in this attempt
    warm_at: float | None = None  # when the last one was

    @property
    def done(self) -> bool:
        return not self.pending

    @property
    def first(self) -> tuple[str, str] | None:
        """(host, verdict) of the first failure; None also when a signal came first."""
        first = verdict.decide(self.seen).first
        if first is None or first.cause == verdict.SIGNALLED:
            return None
        return str(first.node), first.detail

    @property
    def first_rank(self) -> int | None:
        """The rank the first failure names, where the launcher judged it (a hang)."""
        first = verdict.decide(self.seen).first
        return first.rank if first is not None else None

    @property
    def code(self) -> int:
        """The attempt's exit code: the first failure's (128 + the signal's when a signal came
        first), else exitcodes.OK."""
        return verdict.decide(self.seen).code or exitcodes.OK

    @property
    def verdict(self) -> str:
        if self.signals and self.first is None:
            return self.stop_reason or f"interrupted by {signal.Signals(self.signals[0]).name}"
        if self.first is not None:
            return _where(self.first[1], self.first[0])
        return "all ranks succeeded"


def initial(
    nodes: list[NodeResult],
    attempt: int,
    at: float,
    launched_at: float,
    world_size: int,
    limits: Limits,
    warm_plan: WarmPlan | None = None,
) -> AttemptState:
    return AttemptState(
        attempt,
        at,
        launched_at,
        world_size,
        limits,
        {n.host: n for n in nodes},
        frozenset(n.host for n in nodes),
        warm_plan=warm_plan,
    )


Step = tuple[AttemptState, list[Action]]


def _node(s: AttemptState, host: str, **changes: Any) -> AttemptState:
    return replace(s, nodes={**s.nodes, host: replace(s.nodes[host], **changes)})


def _end(s: AttemptState, host: str, at: float) -> AttemptState:
    node = s.nodes[host]
    s = _node(s, host, ended=at, started=node.started if node.started is not None else s.started_at)
    return replace(s, pending=s.pending - {host})


def _stop(s: AttemptState, reason: str, at: float, spare: str | None = None) -> Step:
    if s.stop_at is not None:
        return s, []
    actions: list[Action] = [Say(f"stopping all nodes: {reason}")]
    actions += [CloseStdin(h) for h in s.nodes if h in s.opened and h in s.pending and h != spare]
    return replace(s, stop_at=at, spared=spare), actions


# A node's state after a failure -> the verdict's cause.
CAUSES = {FAILED: verdict.EXITED, HUNG: verdict.HUNG, ERROR: verdict.ERROR, LOST: verdict.LOST}


def _where(what: str, host: str) -> str:
    """A failure's phrase and its host, unless the phrase names it (a hang story does)."""
    return what if what.startswith("rank ") and f" on {host} " in what else f"{what} on {host}"


def _fail(
    s: AttemptState,
    host: str,
    state: str,
    code: int,
    what: str,
    at: float,
    rank: int | None = None,
    spare: bool | None = None,
) -> Step:
    """Count a failure of `host`; the first one stops every node, sparing a node that stops
    its own ranks (it saw the failure itself) until the stop grace. A hang the launcher judged
    (`spare` False, a rank) first asks for the rank's stack, when the limits say so."""
    event = Event(CAUSES[state], code, host, rank, detail=what)
    s = replace(_node(s, host, state=state, code=code), seen=(*s.seen, event))
    if verdict.decide(s.seen).first is event:
        s = _node(s, host, note="first failure: " + what)
        if spare is False and rank is not None and s.limits.stack_wait > 0:
            return replace(s, asked=(host, rank, at + s.limits.stack_wait)), [AskStack(host, rank)]
        spare = state in (FAILED, HUNG) if spare is None else spare
        return _stop(s, _where(what, host), at, spare=host if spare else None)
    if not s.nodes[host].note:
        s = _node(s, host, note="after the first failure" if s.first else "while stopping")
    return s, []


def _stack_told(s: AttemptState, frames: tuple[str, ...], at: float) -> Step:
    """Stop every node now that the hung rank's stack came (`frames`, innermost first) or did
    not in time (none): its innermost frame joins the verdict, as launch_multi_node.sh says it."""
    first = verdict.decide(s.seen).first
    if first is None or s.asked is None:
        return replace(s, asked=None), []
    told = replace(first, detail=first.detail + blame.stuck(frames))
    s = replace(s, asked=None, seen=tuple(told if e is first else e for e in s.seen))
    s = _node(s, str(first.node), note="first failure: " + told.detail)
    return _stop(s, _where(told.detail, str(first.node)), at)


def _reported(s: AttemptState, host: str, event: NodeEvent, at: float) -> Step:
    if event.kind == "started":
        s = _node(s, host, state=RUNNING, started=at)
        if s.all_running or any(n.state != RUNNING for n in s.nodes.values()):
            return s, []
        return replace(s, all_running=True), [
            Say(
                f"all {len(s.nodes)} node(s) running {s.world_size} rank(s) {at - s.started_at:.2f}s after the start "
                f"of attempt {s.attempt} ({at - s.launched_at:.2f}s after launch)"
            )
        ]
    if event.kind == "exited":
        code, what = event.value or exitcodes.FAILED, f"rank {event.rank} exited with code {event.value}"
        if event.rank is not None and _warm_fits(s, code, at):
            return _new_world(s, host, event.rank, what, at)
        since = at - s.warm_at if s.warm_at is not None else None
        if since is not None and s.stop_at is None and since <= warm.SETTLE:
            said = f"{what} on {host} {since:.1f}s after warm restart {s.generation}: restarting whole"
            s, more = _fail(s, host, FAILED, code, what, at, spare=False)
            return s, [Say(said), *more]
        return _fail(s, host, FAILED, code, what, at, spare=False if s.warm_plan else None)
    if event.kind == "beats":
        beats = tuple(replace(b, node=host) for b in event.beats)
        return replace(s, beats={**s.beats, host: (beats, at)}), []
    if event.kind == "stack":
        asked = s.asked is not None and s.asked[:2] == (host, event.rank)
        return _stack_told(s, event.frames, at) if asked else (s, [])
    if event.kind == HUNG:
        return _fail(
            s,
            host,
            HUNG,
            exitcodes.HUNG,
            f"rank {event.rank} hung (no heartbeat for {(event.value or 0) / 1000:.1f} s)",
            at,
        )
    return _fail(s, host, ERROR, exitcodes.FAILED, event.message, at)


def _warm_fits(s: AttemptState, code: int, at: float) -> bool:
    """Whether a rank's exit with `code` is answered by a warm restart: asked for, budget left,
    nothing stopping, a code worth a retry, and not right after the last one (contract/warm.py)."""
    p = s.warm_plan
    return (
        p is not None
        and s.generation < p.budget
        and s.stop_at is None
        and s.asked is None
        and retries.worth_retry(code)
        and (s.warm_at is None or at - s.warm_at > warm.SETTLE)
    )


def _new_world(s: AttemptState, host: str, rank: int, what: str, at: float) -> Step:
    """The next generation's world, told to every node; `rank` is started anew on `host`."""
    assert s.warm_plan is not None
    generation = s.generation + 1
    p = s.warm_plan
    world = warm.World(generation, p.master_addr, warm.port_for(p.master_port, generation), s.world_size)
    s = replace(s, generation=generation, warm_at=at)
    s = _node(s, host, note=f"warm restart {generation}: {what}")
    said = (
        f"{_where(what, host)}: warm restart {generation} of at most {p.budget}; rank {rank} starts anew, "
        f"the others wait in their processes (rendezvous {world.master_addr}:{world.master_port})"
    )
    told = f"warm restart {generation}: rank {rank} started anew after {_where(what, host)}"
    return s, [Say(said), NewWorld(world, {host: (rank,)}, told)]


def _ended(s: AttemptState, host: str, status: int | None, at: float) -> Step:
    state = s.nodes[host].state
    s = _end(s, host, at)
    if state in FAILED_STATES:
        return s, []  # already counted from its event; keep the rank's code
    if status is None:
        return _fail(s, host, LOST, exitcodes.LOST, f"lost the connection to {host}", at)
    if status == exitcodes.OK:
        return _node(s, host, state="ok", code=status), []
    if s.stop_at is not None and status in STOPPED_CODES:
        note = s.nodes[host].note or ("stopped by slurmgen" if s.first or s.signals else "")
        return _node(s, host, state=STOPPED, code=status, note=note), []
    return _fail(s, host, FAILED, status, f"node exited with code {status}", at)


def _signalled(s: AttemptState, signum: int, at: float, reason: str = "") -> Step:
    """Ctrl-C, SIGTERM or a person's stop request (`reason`, given as a SIGTERM): every node
    stops; a second one closes every connection at once."""
    s = replace(
        s,
        signals=(*s.signals, signum),
        seen=(*s.seen, verdict.signalled(signum, reason)),
        stop_reason=s.stop_reason or (reason if not s.signals else ""),
    )
    name = reason or f"got {signal.Signals(signum).name}"
    if len(s.signals) > 1:
        return s, [Say(f"{name} again: closing every connection now"), DisconnectAll()]
    return _stop(s, name, at)


def _tick(s: AttemptState, at: float, overdue: Mapping[str, float]) -> Step:
    lim, actions = s.limits, []
    for host in [h for h in s.nodes if h in s.pending]:
        if overdue.get(host, 0.0) > lim.keepalive * lim.keepalive_count:
            silent = lim.keepalive * (lim.keepalive_count + 1)
            s, more = _fail(
                _end(s, host, at), host, LOST, exitcodes.LOST, f"no answer from {host} for {silent:.0f}s", at
            )
            actions += [*more, Disconnect(host)]
        elif host not in s.opened and at - s.started_at > lim.connect:
            s, more = _fail(
                _end(s, host, at), host, ERROR, exitcodes.FAILED, f"no session on {host} within {lim.connect:g}s", at
            )
            actions += [*more, Disconnect(host)]
    stop_at = s.stop_at
    if stop_at is None:
        if s.asked is not None:
            s, more = _stack_told(s, (), at) if at >= s.asked[2] else (s, [])
        else:
            s, more = _judge_hang(s, at)
        return s, actions + more
    if s.spared in s.pending and at >= stop_at + lim.stop_grace:
        actions.append(CloseStdin(s.spared))  # it did not stop by itself
        s = replace(s, spared=None)
    if at >= stop_at + lim.stop_grace + lim.stop_wait:
        for host in [h for h in s.nodes if h in s.pending]:
            s = _node(_end(s, host, at), host, state=LOST, note="no exit status after the stop")
            actions.append(Disconnect(host))
    return s, actions


def _judge_hang(s: AttemptState, at: float) -> Step:
    """The contract's hang rule over every node's last report, each beat aged by the time
    since it arrived. The launcher decides, so no node is spared: every one is stopped."""
    if not s.limits.heartbeat_ms:
        return s, []
    beats = [
        replace(b, age_ms=b.age_ms + round((at - seen) * 1000))
        for host, (reported, seen) in s.beats.items()
        if host in s.pending
        for b in reported
    ]
    found = blame.judge(beats, s.limits.heartbeat_ms)
    if found is None:
        return s, []
    return _fail(s, found.node, HUNG, exitcodes.HUNG, blame.story(found), at, rank=found.rank, spare=False)


def step(s: AttemptState, event: Input) -> Step:
    """The next state and what to do, for one input. Inputs about hosts that already have a
    final state (a late exit status after a keepalive loss, say) change nothing."""
    if isinstance(event, ClockTick):
        return _tick(s, event.at, event.overdue)
    if isinstance(event, Signalled):
        return _signalled(s, event.signum, event.at, event.reason)
    if event.host not in s.pending:
        return s, []
    if isinstance(event, SessionOpened):
        s = replace(s, opened=s.opened | {event.host})
        stopping = s.stop_at is not None and event.host != s.spared
        return s, [CloseStdin(event.host)] if stopping else []
    if isinstance(event, StartFailed):
        return _fail(_end(s, event.host, event.at), event.host, ERROR, exitcodes.FAILED, event.message, event.at)
    if isinstance(event, Reported):
        return _reported(s, event.host, event.event, event.at)
    return _ended(s, event.host, event.status, event.at)


def restart_after(code: int, stopped: bool, attempt: int, attempts: int) -> bool:
    """Whether `slurmgen launch` starts every node again after attempt `attempt` (of at most
    `attempts`) ended with `code`: the retry rule (contract/retries.py) while the budget lasts.
    `stopped`: the launcher got a signal or a person's stop request (taken as SIGTERM)."""
    return attempt < attempts and retries.worth_retry(code, stopped)
