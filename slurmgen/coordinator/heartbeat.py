"""One agent heartbeat: record what the agent reports, judge the attempts it touches, and
answer with the orders that bring its slots to what they should run (see `state.reconcile`).
Called by `Coordinator.heartbeat` under its lock and transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmgen.coordinator import state as st
from slurmgen.coordinator.models import AgentOrders, AgentReport, StartOrder, StopOrder

if TYPE_CHECKING:
    from slurmgen.coordinator.service import Coordinator

DEFAULT_GRACE = 10.0


def apply_report(c: "Coordinator", report: AgentReport, now: float) -> AgentOrders:
    store = c.store
    known = {w["idx"] for w in store.workers(host=report.host)}
    for r in report.workers:
        if r.id not in known:
            store.add_worker(report.host, r.id)
    rows = {w["idx"]: w for w in store.workers(host=report.host)}
    active = {a["grp"]: a for a in store.active_attempts()}
    orders = AgentOrders()
    touched: dict[tuple[str, int], set] = {}  # attempts to judge -> hung workers

    for r in report.workers:
        w = rows[r.id]
        name = w["name"]
        run = (r.group, r.attempt) if r.group is not None else None
        a = active.get(w["grp"] or "")
        wanted = (a["grp"], a["number"]) if a and name in a["plan"]["ranks"] else None
        if r.state == "exited" and run is not None and r.exit_code is not None:
            _record_exit(c, run, name, r.exit_code, touched)
        if r.hung and run is not None and run == wanted:
            touched.setdefault(run, set()).add(name)
        if run == wanted and wanted is not None and r.state == "running" and w["state"] != "running":
            touched.setdefault(wanted, set())
        finished = wanted is not None and name in (store.attempt(*wanted) or {}).get("exit_codes", {})
        order = st.reconcile(r.state, run, wanted, finished)
        if order == "start":
            plan = store.attempt(*wanted)["plan"]
            orders.start.append(StartOrder(
                worker=r.id, group=wanted[0], attempt=wanted[1], rank=plan["ranks"][name],
                argv=plan["argv"], env=plan["env"][name], cwd=plan["cwd"],
                heartbeat_timeout=plan["heartbeat_timeout"]))
        elif order == "stop":
            ran = store.attempt(*run) if run else None
            orders.stop.append(StopOrder(worker=r.id, grace=ran["plan"]["stop_grace"] if ran else DEFAULT_GRACE))
        values = {"state": st.worker_state(r.state, run, wanted, lost=False), "pid": r.pid,
                  "exit_code": r.exit_code, "run_group": r.group, "run_attempt": r.attempt}
        if any(w[k] != v for k, v in values.items()):
            store.update_worker(name, **values)

    if report.lines:
        store.add_lines([(ln.group, ln.attempt, ln.rank, f"{report.host}-{ln.worker}", ln.time, ln.line)
                         for ln in report.lines])
    for run, hung in touched.items():
        a = store.attempt(*run)
        if a is not None:
            c._judge(a, now, hung)
    return orders


def _record_exit(c: "Coordinator", run: tuple, name: str, code: int, touched: dict[tuple[str, int], Any]) -> None:
    """Keep the first exit code each rank of an attempt reports (also after the attempt
    ended, so an attempt shows how every rank went down)."""
    a = c.store.attempt(*run)
    if a is None or name not in a["plan"]["ranks"] or name in a["exit_codes"]:
        return
    codes = {**a["exit_codes"], name: code}
    c.store.update_attempt(run[0], run[1], exit_codes=codes)
    touched.setdefault(tuple(run), set())
