"""One agent heartbeat, decided: what to record of the agent's report, which attempts to judge,
and the orders that bring its slots to what they should run (see `state.reconcile`).

Pure, like `launch/attempt.py:step`: `apply_report(report, known)` reads only its arguments
(the report, and what the store knew when it arrived) and returns `Decisions`: the orders to
answer with and typed actions, which `Coordinator.heartbeat` carries out in order under its
lock and transaction. So the rules of a heartbeat are tested without a store or a server, and
this module knows nothing of the service (it used to call the service's private `_judge`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmgen.contract import envvars
from slurmgen.contract import warm as protocol
from slurmgen.contract.states import State
from slurmgen.coordinator import state as st
from slurmgen.coordinator.models import (
    AgentOrders,
    AgentReport,
    ReportedLine,
    StartOrder,
    StopOrder,
    WorkerReport,
    WorldOrder,
)

if TYPE_CHECKING:  # the rows' shapes only: deciding on a report reads no SQL
    from slurmgen.coordinator.store import AttemptRow, Warm, WorkerRow

DEFAULT_GRACE = 10.0


# ---- input -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Known:
    """What the store holds when a report arrives (read in the same transaction)."""

    workers: Mapping[int, WorkerRow]  # slot id -> its worker row; every reported slot has one
    active: Mapping[str, AttemptRow]  # group -> its active attempt
    # (group, attempt) -> the attempt (None: no such attempt), for every run a reported slot
    # runs or ran and every active attempt
    attempts: Mapping[st.RunKey, AttemptRow | None]
    # (group, attempt) -> its worker judged hung, whose stack its agent takes before stopping it
    stacks: Mapping[st.RunKey, str] = field(default_factory=dict)


# ---- actions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordExits:
    """Store the attempt's exit codes: those it had plus the first code of a newly exited rank
    (in the order they arrived: the first failure wins)."""

    run: st.RunKey
    exit_codes: Mapping[str, int]


@dataclass(frozen=True)
class RecordRuns:
    """Store the run records an attempt's ranks announced (those it had plus the new ones)."""

    run: st.RunKey
    runs: tuple[str, ...]


@dataclass(frozen=True)
class UpdateWorker:
    name: str
    values: Mapping[str, Any]


@dataclass(frozen=True)
class KeepLines:
    rows: list[tuple[str, int, int, str, float, str]]  # (group, attempt, rank, worker, time, line)


def line_rows(host: str, lines: Sequence[ReportedLine]) -> list[tuple[str, int, int, str, float, str]]:
    """An agent's reported lines as the store keeps them (a heartbeat's, or those sent between beats)."""
    return [(ln.group, ln.attempt, ln.rank, f"{host}-{ln.worker}", ln.time, ln.line) for ln in lines]


@dataclass(frozen=True)
class Judge:
    """Decide the attempt's fate (`state.judge_attempt`) once everything above is stored."""

    run: st.RunKey
    hung: frozenset[str] = frozenset()  # its workers whose trainer heartbeat went stale


Action = RecordExits | RecordRuns | UpdateWorker | KeepLines | Judge


@dataclass(frozen=True)
class Decisions:
    orders: AgentOrders
    actions: list[Action] = field(default_factory=list)


# ---- the decision ----------------------------------------------------------------------------
def apply_report(report: AgentReport, known: Known) -> Decisions:
    """Go through the agent's slots in its order; an attempt is judged when a rank of it exited,
    hung or came up running, after its exit codes and the worker rows are stored."""
    orders, actions = AgentOrders(), []
    codes: dict[st.RunKey, Mapping[str, int]] = {
        run: a["exit_codes"] for run, a in known.attempts.items() if a is not None
    }
    runs = {run: tuple(a.get("runs") or ()) for run, a in known.attempts.items() if a is not None}
    touched: dict[st.RunKey, set[str]] = {}  # attempts to judge -> hung workers
    for r in report.workers:
        w = known.workers[r.id]
        name = w["name"]
        run = (r.group, r.attempt) if r.group is not None else None
        a = known.active.get(w["grp"] or "")
        wanted = (a["grp"], a["number"]) if a and name in a["plan"]["ranks"] else None
        if a and wanted and "warm" in a["plan"] and wanted not in orders.warm:
            orders.warm.append(wanted)
        generation = generation_of(known.attempts.get(run) if run else None, name)
        superseded = st.superseded(r.generation, generation)  # an exit of a process a warm restart replaced
        if r.state == "exited" and run is not None and r.exit_code is not None and not superseded:
            actions += _record_exit(known, codes, run, name, r.exit_code, touched)
        if r.runs and run is not None:
            actions += _record_runs(known, runs, run, r.runs)
        if r.hung and run == wanted and run is not None:
            touched.setdefault(run, set()).add(name)
        if run == wanted and wanted is not None and r.state == State.RUNNING.value != w["state"]:
            touched.setdefault(wanted, set())
        finished = wanted is not None and name in codes.get(wanted, {})
        order = st.reconcile(r.state, run, wanted, finished)
        if order is None and run == wanted and wanted is not None:
            order = "start" if st.start_anew(r.state, r.generation, generation) else None
            _tell_world(orders, known, wanted)
        _order(orders, known, r, name, run, wanted, order)
        values = {
            "state": st.worker_state(r.state, run, wanted, lost=False),
            "pid": r.pid,
            "exit_code": r.exit_code,
            "run_group": r.group,
            "run_attempt": r.attempt,
        }
        if any(w.get(k) != v for k, v in values.items()):
            actions.append(UpdateWorker(name, values))
    if report.lines:
        actions.append(KeepLines(line_rows(report.host, report.lines)))
    actions += [Judge(run, frozenset(hung)) for run, hung in touched.items()]
    return Decisions(orders, actions)


def _record_exit(
    known: Known,
    codes: dict[st.RunKey, Mapping[str, int]],
    run: st.RunKey,
    name: str,
    code: int,
    touched: dict[st.RunKey, set[str]],
) -> list[Action]:
    """Keep the first exit code each rank of an attempt reports (also after the attempt
    ended, so an attempt shows how every rank went down). `codes` follows what is recorded."""
    a = known.attempts.get(run)
    if a is None or name not in a["plan"]["ranks"] or name in codes[run]:
        return []
    codes[run] = {**codes[run], name: code}
    touched.setdefault(tuple(run), set())
    return [RecordExits(run, codes[run])]


def _record_runs(
    known: Known, runs: dict[st.RunKey, tuple[str, ...]], run: st.RunKey, announced: list[str]
) -> list[Action]:
    """Add the run records a rank of `run` announced that the attempt does not list yet."""
    if known.attempts.get(run) is None:
        return []
    new = tuple(d for d in announced if d not in runs[run])
    if not new:
        return []
    runs[run] = runs[run] + new
    return [RecordRuns(run, runs[run])]


def _order(
    orders: AgentOrders,
    known: Known,
    r: WorkerReport,
    name: str,
    run: st.RunKey | None,
    wanted: st.RunKey | None,
    order: st.Order | None,
) -> None:
    """Spell out `reconcile`'s order for one slot: what to start with its rank's environment,
    or how long a stopping run gets (its own stop grace)."""
    if order == "start":
        assert wanted is not None  # reconcile starts only a wanted run
        attempt = known.attempts[wanted]
        assert attempt is not None  # for type checkers: a wanted run is an active attempt, which Known holds
        plan = attempt["plan"]
        start = StartOrder(
            worker=r.id,
            group=wanted[0],
            attempt=wanted[1],
            rank=plan["ranks"][name],
            argv=plan["argv"],
            env=plan["env"][name],
            cwd=plan["cwd"],
            heartbeat_timeout=plan["heartbeat_timeout"],
        )
        orders.start.append(_warm_start(start, plan["warm"], name) if "warm" in plan else start)
    elif order == "stop":
        ran = known.attempts.get(run) if run else None
        orders.stop.append(
            StopOrder(
                worker=r.id,
                grace=ran["plan"]["stop_grace"] if ran else DEFAULT_GRACE,
                stack=run is not None and known.stacks.get(run) == name,
            )
        )


# ---- warm restarts (GroupConfig.restart_mode warm, contract/warm.py) ---------------------------
def generation_of(attempt: AttemptRow | None, name: str) -> int:
    """The generation worker `name`'s rank was last started in by `attempt`'s warm restarts
    (0: the attempt's first, or no warm restarts)."""
    if attempt is None or "warm" not in attempt["plan"]:
        return 0
    return attempt["plan"]["warm"]["workers"].get(name, 0)


def _tell_world(orders: AgentOrders, known: Known, run: st.RunKey) -> None:
    """Add the attempt's current world to the orders (once per answer) once a warm restart made
    one: the agent writes it where its ranks of the attempt wait (its write is idempotent, so
    every answer may carry it while the attempt runs, and an agent that missed one answer is
    told again)."""
    attempt = known.attempts.get(run)
    warm = attempt["plan"].get("warm") if attempt else None
    if attempt is None or not warm or not warm["generation"] or any((w.group, w.attempt) == run for w in orders.worlds):
        return
    env = next(iter(attempt["plan"]["env"].values()))
    orders.worlds.append(
        WorldOrder(
            group=run[0],
            attempt=run[1],
            generation=warm["generation"],
            master_addr=env["MASTER_ADDR"],
            master_port=protocol.port_for(int(env["MASTER_PORT"]), warm["generation"]),
            world_size=len(attempt["plan"]["ranks"]),
        )
    )


def _warm_start(order: StartOrder, warm: Warm, name: str) -> StartOrder:
    """A start of a group that restarts warm: the agent gives the rank its warm dir; a rank started
    anew by a warm restart joins that generation's world (its port, contract/warm.py) and is told
    which it is (SLURMGEN_WARM_GENERATION)."""
    generation = warm["workers"].get(name, 0)
    if not generation:
        return order.model_copy(update={"warm": True})
    port = protocol.port_for(int(order.env["MASTER_PORT"]), generation)
    env = {**order.env, "MASTER_PORT": str(port), envvars.WARM_GENERATION: str(generation)}
    return order.model_copy(update={"warm": True, "generation": generation, "env": env})
