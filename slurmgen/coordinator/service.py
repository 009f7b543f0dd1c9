"""The coordinator's behaviour behind the API: one lock, the store, and when agents were heard.

Every public method is one atomic change (a lock and a SQLite transaction), so the HTTP layer
only maps arguments and errors. Decisions come from the pure functions in `state`, `ranks` and
`agent_beat`; this module gathers their inputs from the store and writes their results back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any

from slurmgen.contract import exitcodes
from slurmgen.contract.attempts import from_restart_count
from slurmgen.contract.blame import stuck
from slurmgen.contract.states import STOPPED_BY_YOU, State, stopped_after
from slurmgen.contract.warm import WARM
from slurmgen.contract.world import fewer_nodes
from slurmgen.coordinator import agent_beat as hb
from slurmgen.coordinator import group_blame
from slurmgen.coordinator import state as st
from slurmgen.coordinator.changes import Changes
from slurmgen.coordinator.group_runs import GroupRuns, run_attempt, timeline_env
from slurmgen.coordinator.models import (
    AgentLines,
    AgentOrders,
    AgentReport,
    AttemptOut,
    GroupConfig,
    GroupDetail,
    GroupOut,
    LogLine,
    RankOut,
    StartOrder,
    StopOrder,
    WorkerOut,
    merged_config,
)
from slurmgen.coordinator.ranks import (
    fewer_nodes_allowed,
    on_spares,
    pick_spare,
    plan_ranks,
    rank_env,
    spare_hosts,
    without_nodes,
)
from slurmgen.coordinator.store import AttemptRow, GroupRow, Plan, Store, WorkerRow
from slurmgen.errors import SlurmgenError

DEFAULT_AGENT_TIMEOUT = 10.0


def own_end(worker: str, a: AttemptRow) -> dict[str, Any]:
    """How an ended attempt ended for one of its workers, as WorkerOut says it: the cause of the
    rank it failed on, or of a stop asked for; a rank still running when it failed on another
    was stopped after that one (`stopped_after`), its exit the stop's doing."""
    if a["state"] == State.FAILED and worker in a["stopped_workers"] and a["blamed"] in a["plan"]["ranks"]:
        rank = a["plan"]["ranks"][a["blamed"]]
        return {"stopped_after": rank, "cause": f"{stopped_after(rank)}: {a['reason']}"}
    if worker == a["blamed"] or (a["state"] == State.STOPPED and worker in a["stopped_workers"]):
        return {"cause": a["reason"]}
    return {}


@dataclass
class Layout:
    """Where an attempt's ranks run: its ranks, each node moved to a spare so far (node -> the
    spare holding its node rank), the spares left in the order they are taken, the moves made for
    it, in words, and the nodes a smaller world left out so far (GroupConfig.min_nodes)."""

    ranks: list[RankOut]
    moved: dict[str, str] = field(default_factory=dict)
    spares: list[str] = field(default_factory=list)
    moves: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def placed(base: list[RankOut], layout: Layout, slots: dict[str, list[int]]) -> list[RankOut]:
    """The ranks `layout` runs: the group's (`base`) with its moved nodes on their spares, then
    without the nodes a smaller world left out (dense again)."""
    ranks = on_spares(base, layout.moved, slots)
    return without_nodes(ranks, set(layout.dropped)) if layout.dropped else ranks


class NotFound(Exception):
    """HTTP 404."""


class Conflict(Exception):
    """HTTP 409: the request is valid but the current state refuses it."""


class Invalid(Exception):
    """HTTP 422: a value is wrong for this group (the body itself parsed)."""


class Coordinator:
    def __init__(
        self,
        store: Store,
        agent_timeout: float = DEFAULT_AGENT_TIMEOUT,
        clock: Callable[[], float] = time.time,
        runs: GroupRuns | None = None,
    ):
        self.store = store
        self.runs = runs  # the run registry of this machine (`slurmgen jobs` lists groups from it)
        self.agent_timeout = agent_timeout
        self.clock = clock
        self.lock = threading.Lock()
        # host -> (last heard, agent instance). In memory only: after a restart every agent
        # gets a full timeout from `boot` before it counts as lost.
        self.seen: dict[str, tuple[float, str]] = {}
        self.boot = clock()
        self.changes = Changes()
        # worker -> its rank's last quiet heartbeat, as its agent reported it (group_blame.py)
        self.quiet: dict[str, group_blame.SlotReport] = {}
        # (group, attempt) -> its workers whose rank met its peers, as their agents reported
        # (WorkerReport.met; state.warm_restart). In memory only: after a restart the agents say
        # it again at their next beat, and a failure before that restarts whole, the safe side.
        self.met: dict[st.RunKey, set[str]] = {}
        # (group, attempt) -> its worker judged hung, until its agent reports the rank's stack
        self.stacks: dict[st.RunKey, str] = {}
        # Set when the server begins to shut down: agents cannot reach it from then on, which
        # must not count as their silence.
        self.closing = False

    def _atomic(self):
        return _Atomic(self)

    # --- reading ----------------------------------------------------------------------------
    def _silent_for(self, host: str, now: float) -> float:
        return now - self.seen.get(host, (self.boot, ""))[0]

    def _worker_out(self, w: WorkerRow, now: float, plans: dict[str, Plan]) -> WorkerOut:
        silent = self._silent_for(w["host"], now)
        plan = plans.get(w["grp"] or "")
        a = self.store.attempt(w["run_group"], w["run_attempt"]) if w["run_group"] and w["run_attempt"] else None
        last = a if w["state"] == "exited" and w["run_group"] == w["grp"] else None  # its group's, once it exited
        return WorkerOut(
            name=w["name"],
            host=w["host"],
            id=w["idx"],
            group=w["grp"],
            state=State.LOST.value if silent > self.agent_timeout else w["state"],
            exit_code=w["exit_code"],
            pid=w["pid"],
            attempt=w["run_attempt"],
            run_group=w["run_group"],
            rank=plan["ranks"].get(w["name"]) if plan else None,
            seen_ago=round(silent, 3) if w["host"] in self.seen else None,
            stopped=last is not None and last["state"] == State.STOPPED,
            **(own_end(w["name"], last) if last else {}),
        )

    def _shown_state(self, g: GroupRow) -> str:
        """The group's state as the API says it: STOPPING from a stop until the last rank of the
        stopped attempt has exited or its agent is lost (the store says STOPPED at once: the
        attempt is over and its ranks are told to stop, and a new start may follow, whose agents
        stop the old ranks first), then STOPPED."""
        if g["state"] != State.STOPPED or g["attempt"] is None:
            return g["state"]
        now = self.clock()
        still = [
            w
            for w in self.store.workers(group=g["name"])
            if w["state"] == State.RUNNING
            and (w["run_group"], w["run_attempt"]) == (g["name"], g["attempt"])
            and self._silent_for(w["host"], now) <= self.agent_timeout
        ]
        return State.STOPPING.value if still else g["state"]

    def _plans(self) -> dict[str, Plan]:
        plans: dict[str, Plan] = {}
        for g in self.store.groups():
            a = self.store.attempt(g["name"], g["attempt"]) if g["attempt"] else None
            if a:
                plans[g["name"]] = a["plan"]
        return plans

    def workers(self) -> list[WorkerOut]:
        with self._atomic() as now:
            plans = self._plans()
            return [self._worker_out(w, now, plans) for w in self.store.workers()]

    def _group_row(self, name: str) -> GroupRow:
        g = self.store.group(name)
        if g is None:
            raise NotFound(f"group {name!r} does not exist")
        return g

    def _group_out(self, g: GroupRow, members: int) -> GroupOut:
        a = self.store.attempt(g["name"], g["attempt"]) if g["attempt"] is not None else None
        return GroupOut(
            name=g["name"],
            state=self._shown_state(g),
            config=GroupConfig(**g["config"]),
            members=members,
            attempt=g["attempt"],
            restarts=g["restarts"],
            run_attempt=from_restart_count(g["restarts"]) if g["attempt"] else None,
            warm_restarts=self._warm_used(a, g["restarts"]) if a is not None else 0,
            world_size=len(a["plan"]["ranks"]) if a is not None else None,
            reason=g["reason"],
            exit_code=g["exit_code"],
        )

    @staticmethod
    def _took(a: AttemptRow) -> list[str]:
        """Beside each warm restart of `a`, where its rank went on ('' while not known)."""
        warm = a["plan"].get("warm")
        if warm is None:
            return []
        took = warm.get("took", {})
        return [took.get(str(g), "") for g in range(1, 1 + len(warm["told"]))]

    def groups(self) -> list[GroupOut]:
        with self._atomic():
            counts = self.store.member_counts()
            return [self._group_out(g, counts.get(g["name"], 0)) for g in self.store.groups()]

    def group(self, name: str) -> GroupOut:
        with self._atomic():
            return self._group_out(self._group_row(name), len(self.store.workers(group=name)))

    def detail(self, name: str) -> GroupDetail:
        with self._atomic() as now:
            g = self._group_row(name)
            members = self.store.workers(group=name)
            plans = self._plans()
            attempts = [
                AttemptOut(
                    number=a["number"],
                    state=a["state"],
                    started=a["started"],
                    ended=a["ended"],
                    reason=a["reason"],
                    exit_code=a["exit_code"],
                    exit_codes={str(a["plan"]["ranks"][w]): c for w, c in a["exit_codes"].items()},
                    runs=a["runs"],
                    run_attempt=run_attempt(a["plan"]),
                    moved=a["plan"].get("moves", []),
                    warm=a["plan"]["warm"]["told"] if "warm" in a["plan"] else [],
                    took=self._took(a),
                )
                for a in self.store.attempts(name)
            ]
            return GroupDetail(
                group=self._group_out(g, len(members)),
                attempts=attempts,
                workers=[self._worker_out(w, now, plans) for w in members],
            )

    def ranks(self, name: str) -> list[RankOut]:
        """The ranks of the running attempt (its nodes moved to spares included) while the group
        runs; otherwise those a start would run."""
        with self._atomic():
            g = self._group_row(name)
            config = GroupConfig(**g["config"])
            a = self.store.attempt(name, g["attempt"]) if g["attempt"] and not st.can_start(g["state"]) else None
            return self._layout_of(a, config)[1].ranks if a else self._plan(config, name, Conflict)

    def _plan(self, config: GroupConfig, name: str, error: type) -> list[RankOut]:
        try:
            return plan_ranks(config, self._members(name))
        except SlurmgenError as e:
            raise error(str(e)) from None

    def _members(self, name: str) -> list[tuple[str, int]]:
        return [(w["host"], w["idx"]) for w in self.store.workers(group=name)]

    def logs(
        self, name: str, rank: int | None, attempt: int | None, after: int, limit: int, tail: bool = False
    ) -> tuple[list[LogLine], str]:
        """(the lines, how many lines after `after` the limit left out: with `tail`, the older
        ones, which a reader that follows says it skipped; "N+" when the server had let some go
        unread, so N is a lower bound), read at one moment."""
        with self._atomic():
            self._group_row(name)
            rows = self.store.lines(name, rank, attempt, after, limit, tail)
            skipped = self.store.count_lines(name, rank, attempt, after) - limit if len(rows) == limit else 0
            more = "+" if after and self.store.trimmed_after(name, after) else ""
            return [
                LogLine(
                    id=r["id"], attempt=r["attempt"], rank=r["rank"], worker=r["worker"], time=r["time"], line=r["line"]
                )
                for r in rows
            ], f"{skipped}{more}"

    # --- changing groups and workers ---------------------------------------------------------
    def create_group(self, name: str) -> GroupOut:
        with self._atomic():
            if self.store.group(name):
                raise Conflict(f"group {name!r} already exists")
            self.store.add_group(name, GroupConfig().model_dump())
            return self._group_out(self._group_row(name), 0)

    def delete_group(self, name: str) -> None:
        with self._atomic():
            g = self._group_row(name)
            if not st.can_start(g["state"]):
                raise Conflict(f"group {name!r} is {g['state']}; stop it first")
            self.store.delete_group(name)

    def configure(self, name: str, config: GroupConfig) -> GroupOut:
        """PUT: the whole config replaced (a field left out takes its default)."""
        with self._atomic():
            return self._configure(self._group_row(name), config)

    def update_config(self, name: str, changes: dict[str, Any]) -> GroupOut:
        """PATCH: only the fields given change (`models.merged_config`), read and written in one
        transaction so two partial updates never undo each other."""
        with self._atomic():
            g = self._group_row(name)
            return self._configure(g, merged_config(g["config"], changes))

    def _configure(self, g: GroupRow, config: GroupConfig) -> GroupOut:
        """Every way a config is set (PUT, PATCH: `slurmgen group config`, the settings form) comes
        here, and only here is a warm restart refused to a program that cannot take part (its script
        read now, under `cwd` where this machine has it: generate/preflight.py), never when a saved
        config is loaded again."""
        from slurmgen.generate.preflight import warm_refusal

        name = g["name"]
        if not st.can_start(g["state"]):
            raise Conflict(f"group {name!r} is {g['state']}; stop it before changing its config")
        refused = warm_refusal(config.restart_mode, config.argv, config.cwd)
        if refused:
            raise Invalid(refused)
        members = self.store.workers(group=name)
        if members:  # checked against today's members; start checks again
            self._plan(config, name, Invalid)
        self.store.update_group(name, config=config.model_dump())
        return self._group_out(self._group_row(name), len(members))

    def move(self, names: list[str], group: str | None) -> list[WorkerOut]:
        with self._atomic() as now:
            if group is not None:
                target = self._group_row(group)
                if not st.can_start(target["state"]):
                    raise Conflict(f"group {group!r} is {target['state']}; stop it before moving workers into it")
            plans = self._plans()
            rows = []
            for name in names:
                w = self.store.worker(name)
                if w is None:
                    raise NotFound(f"worker {name!r} is not registered (see slurmgen workers)")
                if w["grp"] and self._is_active(w["grp"]):
                    raise Conflict(f"worker {name!r} belongs to group {w['grp']!r}, which is running; stop it first")
                rows.append(w)
            for w in rows:
                self.store.update_worker(w["name"], grp=group)
                w["grp"] = group
            return [self._worker_out(w, now, plans) for w in rows]

    def forget_worker(self, name: str) -> None:
        with self._atomic():
            w = self.store.worker(name)
            if w is None:
                raise NotFound(f"worker {name!r} is not registered")
            if w["grp"] and self._is_active(w["grp"]):
                raise Conflict(f"worker {name!r} belongs to group {w['grp']!r}, which is running")
            self.store.delete_worker(name)

    def _is_active(self, group: str) -> bool:
        g = self.store.group(group)
        return g is not None and not st.can_start(g["state"])

    def start(self, name: str) -> GroupOut:
        with self._atomic() as now:
            g = self._group_row(name)
            if not st.can_start(g["state"]):
                raise Conflict(f"group {name!r} is already {g['state']} (attempt {from_restart_count(g['restarts'])})")
            config = GroupConfig(**g["config"])
            if not config.argv:
                raise Conflict(f"group {name!r} has no command (set one: slurmgen group config {name} -- CMD ...)")
            layout = Layout(self._plan(config, name, Conflict), spares=spare_hosts(config, self._members(name)))
            self._check_heard(layout.ranks, now)
            self._new_attempt(name, (g["attempt"] or 0) + 1, config, layout, now, restarts=0)
            return self._group_out(self._group_row(name), len(self.store.workers(group=name)))

    def _check_heard(self, ranks: list[RankOut], now: float) -> None:
        lost = sorted(r.worker for r in ranks if self._silent_for(r.host, now) > self.agent_timeout)
        if lost:
            raise Conflict(f"worker {lost[0]!r} is lost (its agent is silent)")

    def _layout_of(self, a: AttemptRow, config: GroupConfig) -> tuple[list[RankOut], Layout, dict[str, list[int]]]:
        """The group's ranks with no node moved, where `a` ran them, and each member node's worker ids."""
        slots: dict[str, list[int]] = {}
        for host, idx in self._members(a["grp"]):
            slots.setdefault(host, []).append(idx)
        base = self._plan(config, a["grp"], Conflict)
        moved, dropped = dict(a["plan"].get("moved", {})), list(a["plan"].get("dropped", []))
        layout = Layout([], moved, list(a["plan"].get("spares", [])), dropped=dropped)
        layout.ranks = placed(base, layout, slots)
        return base, layout, slots

    def _move(
        self,
        layout: Layout,
        base: list[RankOut],
        hosts: list[str],
        slots: dict[str, list[int]],
        lost: set[str],
        addr: str | None,
    ) -> None:
        """Move each of `hosts` that runs ranks to the first spare that fits and whose agent is
        heard, while spares last; a node moved out goes to the end of the spares (back, it may
        take over later)."""
        for host in hosts:
            spare = pick_spare(layout.ranks, host, layout.spares, slots, lost, addr)
            if spare is None:
                continue
            node = next(r.node_rank for r in layout.ranks if r.host == host)
            layout.moved[next((o for o, on in layout.moved.items() if on == host), host)] = spare
            layout.spares = [*(s for s in layout.spares if s != spare), host]
            layout.ranks = placed(base, layout, slots)
            layout.moves.append(f"node {node} moved from {host} to the spare host {spare}")

    def _lost_hosts(self, hosts: Iterable[str], now: float) -> set[str]:
        return {h for h in hosts if self._silent_for(h, now) > self.agent_timeout}

    def _next_layout(self, a: AttemptRow, config: GroupConfig, blamed: str | None, now: float) -> Layout:
        """Where the attempt after `a` runs: where `a` ran, except that the node its failure is
        blamed on (`state.node_to_blame`) and every node whose agent is lost move to spares; with
        no spare left for them, a smaller world goes on without them while `min_nodes` allows
        (`ranks.fewer_nodes_allowed`). Raises Conflict when a node it needs is lost and neither
        can do without it."""
        base, layout, slots = self._layout_of(a, config)
        lost = self._lost_hosts(slots, now)
        running = {r.host for r in layout.ranks}
        hosts = [h for h in dict.fromkeys([blamed or "", *sorted(lost)]) if h in running]
        self._move(layout, base, hosts, slots, lost, config.master_addr)
        left = [h for h in hosts if h in {r.host for r in layout.ranks}]  # no spare took them
        if fewer_nodes_allowed(layout.ranks, set(left), config.min_nodes, config.master_addr):
            before = len({r.host for r in layout.ranks})
            layout.dropped += left
            layout.ranks = without_nodes(layout.ranks, set(left))
            after = len({r.host for r in layout.ranks})
            layout.moves.append(fewer_nodes(before, after, ",".join(left), config.min_nodes or 0))
        self._check_heard(layout.ranks, now)
        return layout

    def _swap_lost(self, a: AttemptRow, outcome: st.Outcome, now: float) -> bool:
        """A starting attempt whose lost nodes never started its ranks goes on with spares in their
        place (its plan changed in place), instead of failing and restarting: every rank, node
        rank and the master stay, so the ranks already started wait for the spares' in the
        rendezvous. A failure the restart just before could not see coming: the others' ranks
        exit at once when a peer's node dies, its agent counts as lost only later. Node 0 stays
        (its ranks' MASTER_ADDR would change under the others); False when nothing was swapped."""
        if a["state"] != State.STARTING or outcome.exit_code != exitcodes.LOST:
            return False
        g = self._group_row(a["grp"])
        config = GroupConfig(**g["config"])
        base, layout, slots = self._layout_of(a, config)
        lost = self._lost_hosts(slots, now)
        hosts = sorted({r.host for r in layout.ranks if r.host in lost})
        started = {
            w["host"]
            for w in self.store.workers(group=a["grp"])
            if (w["run_group"], w["run_attempt"]) == (a["grp"], a["number"])
        }
        if started & set(hosts) or any(r.node_rank == 0 and r.host in lost for r in layout.ranks):
            return False
        self._move(layout, base, hosts, slots, lost, config.master_addr)
        if any(r.host in lost for r in layout.ranks):
            return False
        before = a["plan"].get("moves", [])
        plan = self._plan_for(
            config, a["grp"], a["number"], g["restarts"], replace(layout, moves=before + layout.moves)
        )
        self.store.update_attempt(a["grp"], a["number"], plan=plan)
        if self.runs:
            for what in layout.moves:
                self.runs.recovered(a["grp"], a["number"], g["restarts"], what)
        self.store.update_group(a["grp"], reason="; ".join(filter(None, [g["reason"], *layout.moves])))
        self.changes.bump()
        return True

    def _plan_for(self, config: GroupConfig, name: str, number: int, restarts: int, layout: Layout) -> Plan:
        ranks = layout.ranks
        master = next(r.host for r in ranks if r.node_rank == 0)  # the master's node, or the spare it moved to
        plan: Plan = {
            "ranks": {r.worker: r.rank for r in ranks},
            "env": {
                r.worker: {**rank_env(config, name, r, master), **timeline_env(config, name, number, restarts)}
                for r in ranks
            },
            "argv": config.argv,
            "cwd": config.cwd,
            "stop_grace": config.stop_grace,
            "heartbeat_timeout": config.heartbeat_timeout,
            "moved": layout.moved,
            "spares": layout.spares,
            "moves": layout.moves,
            "dropped": layout.dropped,
        }
        if config.restart_mode == WARM:  # generation 0, no warm restart yet (a cold group's plans stay as they were)
            plan["warm"] = {"generation": 0, "at": None, "workers": {}, "told": []}
        return plan

    def _new_attempt(
        self,
        name: str,
        number: int,
        config: GroupConfig,
        layout: Layout,
        now: float,
        restarts: int,
        reason: str | None = None,
    ) -> None:
        self.store.add_attempt(name, number, now, self._plan_for(config, name, number, restarts, layout))
        if self.runs:
            self.runs.attempt_started(name, number, restarts, config, layout.ranks, self.store.path)
            for what in layout.moves:
                self.runs.recovered(name, number, restarts, what)
        self.changes.bump()
        self.store.update_group(
            name, state=State.STARTING.value, attempt=number, restarts=restarts, reason=reason, exit_code=None
        )

    def stop(self, name: str) -> GroupOut:
        with self._atomic() as now:
            g = self._group_row(name)
            if not st.can_start(g["state"]):
                a = self.store.attempt(name, g["attempt"]) if g["attempt"] is not None else None
                assert a is not None  # for type checkers: an active group has its attempt
                self._end(a, st.Outcome(State.STOPPED.value, STOPPED_BY_YOU), now)
            return self._group_out(self._group_row(name), len(self.store.workers(group=name)))

    # --- judging attempts ---------------------------------------------------------------------
    def _judge(self, a: AttemptRow, now: float, hung: AbstractSet[str] = frozenset()) -> None:
        """The attempt's fate. A hang is the server's to judge across every agent's reports
        (group_blame.py): `hung`, what one agent saw alone, only asks for a judgement."""
        ranks = a["plan"]["ranks"]
        rows = {w["name"]: w for w in self.store.workers(group=a["grp"]) if w["name"] in ranks}
        running = {
            n
            for n, w in rows.items()
            if w["state"] == State.RUNNING and (w["run_group"], w["run_attempt"]) == (a["grp"], a["number"])
        }
        lost = {
            n: self._silent_for(w["host"], now)
            for n, w in rows.items()
            if self._silent_for(w["host"], now) > self.agent_timeout
        }
        lost.update({n: float("inf") for n in ranks if n not in rows})
        found = group_blame.judge(
            {n: q for n, q in self.quiet.items() if n in running}, ranks, a["plan"]["heartbeat_timeout"], now
        )
        stories = dict([found]) if found else {}
        outcome = st.judge_attempt(a["state"], ranks, a["exit_codes"], running, set(stories), lost, stories)
        if outcome.state == a["state"]:
            return
        if outcome.ended and self._swap_lost(a, outcome, now):
            return
        if outcome.ended and self._warm_restart(a, outcome, set(lost) | set(stories), now):
            return
        if outcome.ended:
            if found and outcome.reason == found[1]:
                self.stacks[(a["grp"], a["number"])] = found[0]  # its stop order asks for the stack
            self._end(a, outcome, now)
        else:
            self.store.update_attempt(a["grp"], a["number"], state=outcome.state)
            self.store.update_group(a["grp"], state=outcome.state)

    def _end(self, a: AttemptRow, outcome: st.Outcome, now: float) -> None:
        """End the attempt as judged; its ranks still running are stopped by its end (the agents'
        orders follow from it), which it keeps, with the worker it failed on, for each rank's truth."""
        name = a["grp"]
        self.met.pop((name, a["number"]), None)
        self.store.update_attempt(
            name,
            a["number"],
            state=outcome.state,
            ended=now,
            reason=outcome.reason,
            exit_code=outcome.exit_code,
            blamed=outcome.worker,
            stopped_workers=[w for w in a["plan"]["ranks"] if w not in a["exit_codes"] and w != outcome.worker],
        )
        self.changes.bump()
        g = self._group_row(name)
        if self.runs:
            self.runs.attempt_ended(name, a, g["restarts"], outcome)
        config = GroupConfig(**g["config"])
        if st.restart_after(outcome, g["restarts"] + self._warm_used(a, g["restarts"]), config.max_restarts):
            try:
                layout = self._next_layout(a, config, st.node_to_blame(outcome), now)
            except Conflict as e:
                outcome = st.Outcome(
                    State.FAILED.value, f"{outcome.reason}; no restart: {e}", outcome.exit_code, outcome.worker
                )
            else:
                return self._new_attempt(
                    name,
                    a["number"] + 1,
                    config,
                    layout,
                    now,
                    g["restarts"] + 1,
                    reason="; ".join([f"restart {g['restarts'] + 1} after: {outcome.reason}", *layout.moves]),
                )
        self.store.update_group(name, state=outcome.state, reason=outcome.reason, exit_code=outcome.exit_code)
        if self.runs:
            self.runs.ended(name, a, g["restarts"], outcome)

    def _warm_used(self, a: AttemptRow, restarts: int) -> int:
        """The warm restarts of `a`'s run so far (its attempts since its first, `a` itself with
        them): each counts against max_restarts, as the restarts that began a new attempt do."""
        first = a["number"] - restarts
        return sum(
            len(b["plan"].get("warm", {}).get("told", []))
            for b in self.store.attempts(a["grp"])
            if first <= b["number"] <= a["number"]
        )

    def _warm_restart(self, a: AttemptRow, outcome: st.Outcome, troubled: set[str], now: float) -> bool:
        """A failed attempt of a group that restarts warm goes on instead (`state.warm_restart`
        decides): the failed rank's exit is taken back, its plan says the next generation, whose
        world the agents write for the ranks waiting in their processes and in which the failed
        rank's agent starts it anew (agent_beat.py); the group's reason and the run record say so.
        False when it ends as without warm restarts."""
        warm = a["plan"].get("warm")
        if warm is None:
            return False
        g = self._group_row(a["grp"])
        config = GroupConfig(**g["config"])
        decided = st.warm_restart(
            outcome,
            a["state"],
            a["plan"]["ranks"],
            a["exit_codes"],
            troubled,
            self.met.get((a["grp"], a["number"]), set()),
            (warm["generation"], warm["at"]),
            now,
            (g["restarts"] + self._warm_used(a, g["restarts"]), config.max_restarts),
            int(next(iter(a["plan"]["env"].values()))["MASTER_PORT"]),
        )
        if decided is None:
            return False
        warm = {
            "generation": decided.generation,
            "at": now,
            "workers": {**warm["workers"], decided.worker: decided.generation},
            "told": [*warm["told"], decided.what],
        }
        codes = {w: c for w, c in a["exit_codes"].items() if w != decided.worker}
        self.store.update_attempt(a["grp"], a["number"], plan={**a["plan"], "warm": warm}, exit_codes=codes)
        self.store.update_group(a["grp"], reason=decided.what)
        if self.runs:
            self.runs.recovered(a["grp"], a["number"], g["restarts"], decided.what)
        self.changes.bump()
        return True

    def tick(self) -> None:
        """Stop the groups whose runs were asked to stop, fail attempts whose agents went silent,
        and trim the output lines the heartbeats since the last tick brought (the server calls
        this twice a second: a timer, so no heartbeat judges silence or trims)."""
        if self.closing:
            return
        with self._atomic() as now:
            self._take_stop_requests(now)
            for a in self.store.active_attempts():
                self._judge(a, now)
            self.store.trim_lines()

    def _take_stop_requests(self, now: float) -> None:
        """Stop each group whose run a person asked to stop through a run's controls
        (jobs/control.py: the run page, `slurmgen cancel GROUP.N`, the JSON API), as its group's
        Stop does; the run records who asked. One stat per active group when no one did."""
        if not self.runs:
            return
        for a in self.store.active_attempts():
            g = self._group_row(a["grp"])
            asked = self.runs.stop_asked(a["grp"], a["number"], g["restarts"])
            if asked is not None:
                self._end(a, st.Outcome(State.STOPPED.value, asked), now)

    # --- agents ----------------------------------------------------------------------------------
    def heartbeat(self, report: AgentReport) -> AgentOrders:
        """Decide on the report (`agent_beat.apply_report`, pure), carry out what it decided,
        answer with its orders: all in one transaction."""
        with self._atomic() as now:
            last, instance = self.seen.get(report.host, (0.0, report.instance))
            if instance != report.instance and now - last <= self.agent_timeout:
                raise Conflict(
                    f"host {report.host!r} already has a live agent (heard {now - last:.1f} s ago); one agent per node"
                )
            self.seen[report.host] = (now, report.instance)
            known = self._known_for(report)
            self._note_quiet(report, known, now)
            self._note_met(report, known)
            self._note_took(report, known)
            self._note_stacks(report, known)
            decisions = hb.apply_report(report, known)
            self._carry_out(decisions.actions, now)
            return decisions.orders.model_copy(update={"agent_timeout": self.agent_timeout})

    def lines(self, report: AgentLines) -> None:
        """Keep the lines an agent sent between its beats: from the host's live agent only, as a
        heartbeat is (a second agent's are refused while the first one beats); it does not
        count as the agent being heard, which only its heartbeat says."""
        with self._atomic() as now:
            last, instance = self.seen.get(report.host, (0.0, report.instance))
            if instance != report.instance and now - last <= self.agent_timeout:
                raise Conflict(f"host {report.host!r} has another live agent (heard {now - last:.1f} s ago)")
            if report.lines:
                self.store.add_lines(hb.line_rows(report.host, report.lines))

    def _note_quiet(self, report: AgentReport, known: hb.Known, now: float) -> None:
        """Keep each reported slot's quiet beat (or forget it: its rank beats again)."""
        for r in report.workers:
            name = known.workers[r.id]["name"]
            if r.beat is None or r.state != State.RUNNING:
                self.quiet.pop(name, None)
            else:
                self.quiet[name] = group_blame.SlotReport(
                    report.host, r.beat.age, r.beat.step, r.beat.stopped, now, r.beat.limit, r.beat.judged
                )

    def _note_met(self, report: AgentReport, known: hb.Known) -> None:
        """Keep which ranks of each active attempt have met their peers (a warm restart needs all)."""
        for r in report.workers:
            if r.met and r.group is not None and r.attempt is not None:
                self.met.setdefault((r.group, r.attempt), set()).add(known.workers[r.id]["name"])

    def _note_took(self, report: AgentReport, known: hb.Known) -> None:
        """Keep, once, where a warm restart's rank went on when its agent says it took its node's
        warm spare (WorkerReport.spare): the attempts table names it beside the warm restart."""
        for r in report.workers:
            if not (r.spare and r.group is not None and r.attempt is not None and r.state == State.RUNNING):
                continue
            a = self.store.attempt(r.group, r.attempt)
            warm = a["plan"].get("warm") if a is not None else None
            name = known.workers[r.id]["name"]
            if a is None or warm is None or warm["workers"].get(name) != r.generation:
                continue
            took: dict[str, str] = dict(warm.get("took", {}))
            if str(r.generation) not in took:
                took[str(r.generation)] = f"{report.host}'s warm spare (pid {r.pid})"
                self.store.update_attempt(r.group, r.attempt, plan={**a["plan"], "warm": {**warm, "took": took}})
                self.changes.bump()

    def _note_stacks(self, report: AgentReport, known: hb.Known) -> None:
        """The stack a hung worker's agent took: the attempt's reason (and its group's, and the
        run registry's) says where the rank was stuck, as the other launchers' verdicts do."""
        for r in report.workers:
            run = (r.group or "", r.attempt or 0)
            if r.stack is None or self.stacks.get(run) != known.workers[r.id]["name"]:
                continue
            del self.stacks[run]
            a = self.store.attempt(*run)
            if not r.stack or a is None or not a["reason"]:
                continue
            reason = a["reason"] + stuck(r.stack)
            self.store.update_attempt(run[0], run[1], reason=reason)
            g = self._group_row(run[0])
            if g["attempt"] == run[1] and g["reason"] == a["reason"]:
                self.store.update_group(run[0], reason=reason)
            if self.runs and g["attempt"] is not None:  # (the second: for type checkers; a run has one)
                self.runs.retold(run[0], run[1], g["attempt"], g["restarts"], a["reason"], reason)
            self.changes.bump()

    def _known_for(self, report: AgentReport) -> hb.Known:
        """Give every slot the agent reports for the first time its row, then read what a
        decision on the report needs: the agent's workers and the attempts they touch."""
        rows = self.store.workers(host=report.host)
        known = {w["idx"] for w in rows}
        new = [r.id for r in report.workers if r.id not in known]
        for idx in new:
            self.store.add_worker(report.host, idx)
        if new:  # read once more only when a slot was added (once per slot, ever)
            rows = self.store.workers(host=report.host)
        active = self.store.active_attempts()
        attempts: dict[st.RunKey, AttemptRow | None] = {(a["grp"], a["number"]): a for a in active}
        for r in report.workers:
            if r.group is not None and (r.group, r.attempt) not in attempts:
                # (an attempt of None names no row: SQL's `number = NULL` matches none)
                attempts[(r.group, r.attempt)] = (
                    self.store.attempt(r.group, r.attempt) if r.attempt is not None else None
                )
        return hb.Known(
            workers={w["idx"]: w for w in rows},
            active={a["grp"]: a for a in active},
            attempts=attempts,
            stacks=dict(self.stacks),
        )

    def _carry_out(self, actions: list[hb.Action], now: float) -> None:
        for action in actions:
            if isinstance(action, hb.RecordExits):
                self.store.update_attempt(action.run[0], action.run[1], exit_codes=dict(action.exit_codes))
            elif isinstance(action, hb.RecordRuns):
                self.store.update_attempt(action.run[0], action.run[1], runs=list(action.runs))
            elif isinstance(action, hb.UpdateWorker):
                self.store.update_worker(action.name, **action.values)
            elif isinstance(action, hb.KeepLines):
                self.store.add_lines(action.rows)
            elif isinstance(action, hb.Judge):
                a = self.store.attempt(*action.run)
                if a is not None:
                    self._judge(a, now, action.hung)


class _Atomic:
    """`with coordinator._atomic() as now:` the lock plus one SQLite transaction."""

    def __init__(self, c: Coordinator):
        self.c = c
        self.tx = c.store.transaction()

    def __enter__(self) -> float:
        self.c.lock.acquire()
        try:
            self.tx.__enter__()
        except BaseException:
            self.c.lock.release()
            raise
        return self.c.clock()

    def __exit__(self, *exc) -> None:
        try:
            self.tx.__exit__(*exc)
        finally:
            self.c.lock.release()


__all__ = ["Coordinator", "Conflict", "Invalid", "NotFound", "StartOrder", "StopOrder"]
