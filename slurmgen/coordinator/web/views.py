"""API JSON -> what the templates show, and the live values the page's script refreshes.

Pure functions, so the page's rules (heartbeat colours, the attempt's text, which change needs
the region redrawn) are unit-tested without a server. A live value is keyed by a JSON list
(["w", worker, "state"]) that the template writes into `data-live` and the script matches.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmgen.contract.attempts import from_restart_count
from slurmgen.contract.backends import DEFAULT_BACKEND
from slurmgen.contract.ports import DEFAULT_MASTER_PORT
from slurmgen.contract.states import ACTIVE_WORDS, STOPPED_BY_YOU, State, shown, stopped_after

# A worker's agent heartbeats every second or so: amber after a few missed beats, red when
# the server is about to (or did) declare it lost.
HEARTBEAT_LATE = 5.0
HEARTBEAT_DEAD = 15.0


def dom_id(prefix: str, name: str) -> str:
    """An HTML id for any name (ids and selectors never see the name itself)."""
    return f"{prefix}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"


def heartbeat(seen_ago: float | None, state: str) -> tuple[str, str]:
    """(text, css class) for the time since a worker's agent last reported."""
    if seen_ago is None:
        return "never", "hb-dead"
    cls = (
        "hb-dead"
        if state == State.LOST.value or seen_ago >= HEARTBEAT_DEAD
        else "hb-late"
        if seen_ago >= HEARTBEAT_LATE
        else "hb-fresh"
    )
    return f"{seen_ago:.0f} s ago", cls


def state_class(state: str | None) -> str:
    """The CSS class of a state text: its first word ("failed 3" -> failed), and "exited 0"
    apart from other exits, since a clean exit is not a failure."""
    state = state or State.IDLE.value
    return "exited-ok" if state == "exited 0" else state.split(" ", 1)[0]


def moved_on(w: Mapping[str, Any]) -> bool:
    """Whether a worker's last run was another group's than the one it is in now (it was moved
    after it): that run's exit is not its new group's, for which it is idle."""
    return w.get("state") == "exited" and w.get("run_group") not in (None, w.get("group"))


def worker_state(w: Mapping[str, Any]) -> str:
    """ "exited 3"; or, when its rank's exit was the doing of a stop (its code 75, 137 or 143, not
    a failure of its own), "stopped by you" when its attempt was stopped on request and "stopped
    (after rank N)" when it was stopped because rank N failed: neutral, the failure is rank N's."""
    if moved_on(w):
        return State.IDLE.value
    if w.get("state") == "exited" and w.get("stopped"):
        return STOPPED_BY_YOU
    if w.get("state") == "exited" and w.get("stopped_after") is not None:
        return stopped_after(int(w["stopped_after"]))
    return (
        f"exited {w['exit_code']}"
        if w.get("state") == "exited" and w.get("exit_code") is not None
        else w.get("state", State.IDLE.value)
    )


def _text(value: Any) -> str:
    return "—" if value is None else str(value)


def attempt_text(g: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The group's attempt within its current run (contract/attempts.py: 1 after every start), as
    the attempts table, the CLI and the server's messages number it ("already running (attempt
    2)"), with the restart budget beside it when the group has one: its warm restarts spend it
    too, inside their attempt ("1 (restart 1 of 3, 1 warm)")."""
    if not g.get("attempt"):
        return "none yet"
    budget, whole, warm = int(config.get("max_restarts") or 0), int(g.get("restarts") or 0), g.get("warm_restarts")
    of_them = f", {warm} warm" if warm else ""
    restarts = f" (restart {whole + int(warm or 0)} of {budget}{of_them})" if budget else ""
    return f"{from_restart_count(whole)}{restarts}"


def stop_question(label: str, what: str, ranks: int | None, nodes: int | None) -> str | None:
    """The question asked before a control that stops ranks on more than one node ("Stop run
    exp.1: 4 ranks on 2 nodes?", issue 33 item 10: a click could end hours of a whole cluster's
    work); None for one node, where the click alone is the ask. The script asks it (app.js)."""
    if not nodes or nodes < 2:
        return None
    return f"{label} {what}: {ranks if ranks else 'all'} ranks on {nodes} nodes?"


def group_refusals(state: str, members: Sequence[str], started: bool) -> dict[str, str | None]:
    """Why each of a group's buttons cannot act (None: it can), for its title: nothing runs
    without a worker, a group that does not run has nothing to stop, and one never started
    nothing to restart. (Start on a running group stays: the server's refusal names its attempt.)"""
    if not members:
        why = "no worker has joined this group yet: move workers to it on the overview first"
        return {"start": why, "stop": why, "restart": why}
    restart = None if started else "the group has not started yet: use Start"
    return {"start": None, "stop": _stop_refusal(state, started), "restart": restart}


def _stop_refusal(state: str, started: bool) -> str | None:
    """Why a group's Stop cannot act (None: it can): only a running group has ranks to stop."""
    word = state.split(" ", 1)[0]
    if not started:
        return "the group has not started: nothing to stop"
    if word == State.STOPPING.value:
        return "the group is stopping already"
    if word in ACTIVE_WORDS:
        return None
    return f"the group is not running ({state}): nothing to stop"


def group_view(g: Mapping[str, Any], members: list[str]) -> dict[str, Any]:
    config = g.get("config") or {}
    nodes = sorted({m.rpartition("-")[0] for m in members})
    master = config.get("master_addr") or config.get("master") or (nodes[0] if nodes else None)
    state = shown(g.get("state")) or State.IDLE.value
    if g.get("exit_code") not in (None, 0) and state == State.FAILED.value:
        state = f"failed {g['exit_code']}"
    return {
        "name": g["name"],
        "dom_id": dom_id("g", g["name"]),
        "state": state,
        "started": bool(g.get("attempt")),
        "refusals": group_refusals(state, members, bool(g.get("attempt"))),
        # Restart stops the ranks only of a group that runs; Stop is enabled only then.
        "asks": {
            action: stop_question(label, f"group {g['name']}", len(members), len(nodes))
            for action, label in (("stop", "Stop"), ("restart", "Restart"))
            if state.split(" ", 1)[0] in ACTIVE_WORDS
        },
        # The running (or last) attempt's world, which a smaller world made smaller; before the
        # first start, what a start would run.
        "world_size": g.get("world_size") or config.get("world_size") or g.get("members", len(members)) or None,
        "master": master,
        "port": config.get("master_port", DEFAULT_MASTER_PORT),
        "backend": config.get("backend", DEFAULT_BACKEND),
        "attempt": attempt_text(g, config),
        "reason": g.get("reason"),
        "workers": members,
        "nodes": nodes,
        "config": config,
    }


def forget_refusal(worker: Mapping[str, Any]) -> str | None:
    """Why the page will not forget a worker (None: it may): only a lost one goes, since a live
    one's agent would register it again within a second."""
    if worker.get("state") == State.LOST.value:
        return None
    return f"its agent still reports it ({worker.get('state')}): only a lost worker can be forgotten"


def worker_view(w: Mapping[str, Any]) -> dict[str, Any]:
    state = worker_state(w)
    hb_text, hb_class = heartbeat(w.get("seen_ago"), w.get("state", State.IDLE.value))
    return {
        "name": w["name"],
        "dom_id": dom_id("w", w["name"]),
        "node": w.get("host", ""),
        "group": w.get("group"),
        "state": state,
        "heartbeat": hb_text,
        "heartbeat_class": hb_class,
        "pid": w.get("pid"),
        "exit_code": None if moved_on(w) else w.get("exit_code"),
        "rank": w.get("rank"),
        "cause": w.get("cause"),
        "forget_why": forget_refusal(w),
    }


def overview(groups: Iterable[Mapping[str, Any]], workers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    workers = sorted((worker_view(w) for w in workers), key=lambda w: (w["node"], w["name"]))
    members: dict[str, list[str]] = {}
    for w in workers:
        if w["group"]:
            members.setdefault(w["group"], []).append(w["name"])
    group_views = [group_view(g, members.get(g["name"], [])) for g in sorted(groups, key=lambda g: g["name"])]
    return {"groups": group_views, "workers": workers, "shape": shape(group_views, workers)}


def shape(groups: Sequence[Mapping[str, Any]], workers: Sequence[Mapping[str, Any]]) -> str:
    """Changes only when the page's structure does (groups, membership, a group's state or
    attempt, a worker becoming lost or coming back: its Forget button): then the script
    redraws the region; everything else is a live value."""
    parts = [f"g {g['name']} {g['state']} {g['attempt']}" for g in groups]
    parts += [f"w {w['name']} {w['group']} {w['forget_why'] is None}" for w in workers]
    return digest(parts)


def digest(parts: Iterable[str]) -> str:
    """A live page's shape, from the lines that make it: short, and the same for the same lines. The
    page keeps the one it was drawn with and redraws its region when a poll answers another (the
    overview, the runs list, a run page)."""
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def live_fields(view: Mapping[str, Any]) -> list[list[Any]]:
    """[key, text, class] for every live value of an overview."""
    fields: list[list[Any]] = []
    for g in view["groups"]:
        fields.append([["g", g["name"], "state"], g["state"], state_class(g["state"])])
        for key in ("world_size", "master", "port", "backend", "attempt", "reason"):
            fields.append([["g", g["name"], key], _text(g[key]), ""])
    for w in view["workers"]:
        fields.append([["w", w["name"], "state"], w["state"], state_class(w["state"])])
        fields.append([["w", w["name"], "heartbeat"], w["heartbeat"], w["heartbeat_class"]])
        for key in ("pid", "exit_code", "rank", "cause"):
            fields.append([["w", w["name"], key], _text(w[key]), ""])
    return fields


def clock(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def attempts_view(attempts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for a in sorted(attempts, key=lambda a: a["number"], reverse=True):
        codes = a.get("exit_codes") or {}
        out.append(
            {
                "number": a.get("run_attempt") or a["number"],
                "started": clock(a.get("started")),
                "ended": clock(a.get("ended")),
                "state": shown(a.get("state")) or "",
                "cause": a.get("reason"),
                "moved": a.get("moved") or [],  # the nodes moved to a spare before it started
                # the warm restarts inside it, each with where its rank went on when known
                "warm": [f"{w}; it went on in {t}" if t else w for w, t in zip(a.get("warm") or [], _took(a))],
                "exit_codes": ", ".join(f"rank {r}: {c}" for r, c in sorted(codes.items(), key=lambda rc: int(rc[0]))),
            }
        )
    return out


def _took(a: Mapping[str, Any]) -> list[str]:
    """Where each warm restart's rank went on ('' when not known), as long as the warm restarts."""
    took = list(a.get("took") or [])
    return took + [""] * (len(a.get("warm") or []) - len(took))


def rank_rows(
    ranks: Iterable[Mapping[str, Any]], workers: Mapping[str, Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    rows = []
    for r in sorted(ranks, key=lambda r: r["rank"]):
        w = (workers or {}).get(r["worker"], {})
        rows.append(
            {
                "worker": r["worker"],
                "node": r.get("host", ""),
                "rank": r["rank"],
                "local_rank": r["local_rank"],
                "node_rank": r["node_rank"],
                "state": worker_state(w) if w else State.IDLE.value,
                "exit_code": None if moved_on(w) else w.get("exit_code"),
                "cause": w.get("cause"),
            }
        )
    return rows
