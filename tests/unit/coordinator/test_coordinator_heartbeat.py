"""`heartbeat.apply_report` alone: a report and what the store knew in, orders and typed actions
out. No store, no server (the API tests drive the same rules through `Coordinator`)."""

from __future__ import annotations

import copy

from slurmgen.coordinator.agent_beat import (
    DEFAULT_GRACE,
    Judge,
    KeepLines,
    Known,
    RecordExits,
    UpdateWorker,
    apply_report,
)
from slurmgen.coordinator.models import AgentReport


def worker(idx: int, grp: str | None = "exp", state: str = "idle", run: tuple | None = None) -> dict:
    return {
        "name": f"gn6-{idx}",
        "host": "gn6",
        "idx": idx,
        "grp": grp,
        "state": state,
        "pid": None,
        "exit_code": None,
        "run_group": run[0] if run else None,
        "run_attempt": run[1] if run else None,
    }


def attempt(number: int = 1, exit_codes: dict | None = None, grp: str = "exp", stop_grace: float = 3.0) -> dict:
    ranks = {"gn6-0": 0, "gn6-1": 1}
    return {
        "grp": grp,
        "number": number,
        "state": "running",
        "exit_codes": exit_codes or {},
        "plan": {
            "ranks": ranks,
            "env": {w: {"RANK": str(r)} for w, r in ranks.items()},
            "argv": ["train"],
            "cwd": None,
            "stop_grace": stop_grace,
            "heartbeat_timeout": 30.0,
        },
    }


def known(workers: list[dict], active: list[dict], others: list[dict] = ()) -> Known:
    return Known(
        workers={w["idx"]: w for w in workers},
        active={a["grp"]: a for a in active},
        attempts={(a["grp"], a["number"]): a for a in [*active, *others]},
    )


def report(*workers: dict, lines: list[dict] = ()) -> AgentReport:
    return AgentReport(host="gn6", instance="i1", workers=list(workers), lines=list(lines))


def test_an_idle_slot_of_an_active_attempt_is_started_with_its_rank():
    got = apply_report(report({"id": 1, "state": "idle"}), known([worker(1)], [attempt()]))
    [start] = got.orders.start
    assert (start.worker, start.group, start.attempt, start.rank, start.env) == (1, "exp", 1, 1, {"RANK": "1"})
    assert got.orders.stop == []
    assert got.actions == [
        UpdateWorker(
            "gn6-1", {"state": "starting", "pid": None, "exit_code": None, "run_group": None, "run_attempt": None}
        )
    ]


def test_a_failed_rank_is_recorded_once_then_its_attempt_judged():
    a = attempt(exit_codes={"gn6-0": 0})
    exited = {"id": 1, "state": "exited", "group": "exp", "attempt": 1, "exit_code": 3}
    got = apply_report(report(exited), known([worker(1, state="running", run=("exp", 1))], [a]))
    assert got.actions == [
        RecordExits(("exp", 1), {"gn6-0": 0, "gn6-1": 3}),  # arrival order kept: the first failure wins
        UpdateWorker("gn6-1", {"state": "exited", "pid": None, "exit_code": 3, "run_group": "exp", "run_attempt": 1}),
        Judge(("exp", 1), frozenset()),
    ]
    assert got.orders.start == [], "a slot whose code is recorded is not started again"
    again = apply_report(
        report({**exited, "exit_code": 9}),
        known([worker(1, state="exited", run=("exp", 1))], [attempt(exit_codes={"gn6-1": 3})]),
    )
    assert not any(isinstance(x, (RecordExits, Judge)) for x in again.actions), "only the first code counts"


def test_a_stale_run_is_stopped_with_its_own_grace_else_the_default():
    old = attempt(number=1, stop_grace=7.0)
    running = {"id": 0, "state": "running", "group": "exp", "attempt": 1, "pid": 42}
    got = apply_report(report(running), known([worker(0, state="running", run=("exp", 1))], [attempt(2)], [old]))
    assert [(s.worker, s.grace) for s in got.orders.stop] == [(0, 7.0)]
    gone = apply_report(report({**running, "attempt": 5}), known([worker(0, grp=None)], [], []))
    assert [(s.worker, s.grace) for s in gone.orders.stop] == [(0, DEFAULT_GRACE)]


def test_the_stop_order_of_the_worker_judged_hung_asks_for_its_stack():
    """The server judged gn6-1 hung in attempt 1 (Known.stacks): its agent takes the rank's stack
    before stopping it; gn6-0 of the same attempt, and gn6-1 in another attempt, are only stopped."""
    old = attempt(number=1)
    runs = [{"id": i, "state": "running", "group": "exp", "attempt": 1, "pid": 40 + i} for i in (0, 1)]
    workers = [worker(i, state="running", run=("exp", 1)) for i in (0, 1)]
    got = apply_report(
        report(*runs),
        Known(
            workers={w["idx"]: w for w in workers},
            active={"exp": attempt(2)},
            attempts={("exp", 1): old, ("exp", 2): attempt(2)},
            stacks={("exp", 1): "gn6-1", ("exp", 7): "gn6-0"},
        ),
    )
    assert [(s.worker, s.stack) for s in got.orders.stop] == [(0, False), (1, True)]


def test_hung_and_newly_running_ranks_are_judged_and_lines_kept():
    w0 = worker(0, state="starting", run=("exp", 1))
    w1 = worker(1, state="running", run=("exp", 1))
    line = {"worker": 1, "group": "exp", "attempt": 1, "rank": 1, "time": 5.0, "line": "loss 1.0"}
    got = apply_report(
        report(
            {"id": 0, "state": "running", "group": "exp", "attempt": 1},
            {"id": 1, "state": "running", "group": "exp", "attempt": 1, "hung": True},
            lines=[line],
        ),
        known([w0, w1], [attempt()]),
    )
    assert got.actions[-2:] == [
        KeepLines([("exp", 1, 1, "gn6-1", 5.0, "loss 1.0")]),
        Judge(("exp", 1), frozenset({"gn6-1"})),
    ]
    assert got.orders.start == got.orders.stop == []


def test_the_inputs_are_left_as_they_were():
    k = known([worker(1, state="running", run=("exp", 1))], [attempt(exit_codes={"gn6-0": 0})])
    before = copy.deepcopy(k)
    apply_report(report({"id": 1, "state": "exited", "group": "exp", "attempt": 1, "exit_code": 1}), k)
    assert k == before
