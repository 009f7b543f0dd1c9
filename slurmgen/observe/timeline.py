"""The per-rank timeline of a run, computed from what each side recorded (pure).

Inputs: the ranks' timeline events (contract/phases.py: process start, imports, rendezvous,
first step, checkpoints, end), the attempts record of the batch script (heal/attempts.py:
when each allocation started and ended) and the time the job was submitted (the registry).
Output, per attempt: each rank's phases in seconds since the attempt started (a Slurm job's
attempt starts with its allocation; a launch's or a group's, when its launcher started it), its
checkpoints and their stall, and the slowest rank of each phase, the one everybody waited for.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmgen.contract import phases
from slurmgen.contract.attempts import attempt_number

Event = Mapping[str, Any]


def by_attempt(events: Iterable[Event]) -> dict[int, dict[int, list[Event]]]:
    """Events grouped by attempt, then rank, in time order; unknown words are skipped."""
    out: dict[int, dict[int, list[Event]]] = {}
    for e in sorted(events, key=lambda e: e.get("time") or 0):
        if (
            e.get("event") in phases.EVENTS
            and isinstance(e.get("rank"), int)
            and isinstance(e.get("time"), (int, float))
        ):
            out.setdefault(attempt_number(e), {}).setdefault(e["rank"], []).append(e)
    return out


# What an attempts record's end says of how the attempt ended, as the timeline keeps it: its
# state (a launch's, a group's: the registry's), its code, the rank that failed first and the
# rank that hung (heal/attempts.py's `exit_code`, `rank`, `hung_rank`; runs/model.attempt_bounds).
END_FACTS = ("state", "code", "rank", "hung_rank", "hung_step")


def attempt_bounds(attempts: Sequence[Event]) -> dict[int, dict[str, Any]]:
    """{attempt: {"start": t, "end": t, and END_FACTS}} from the attempts record (the batch
    node's clock): a stopped attempt's ranks read as stopped, a hung one's hung rank as hung."""
    out: dict[int, dict[str, Any]] = {}
    for a in attempts:
        if a.get("event") in ("start", "end") and isinstance(a.get("time"), (int, float)):
            out.setdefault(attempt_number(a), {})[a["event"]] = float(a["time"])
            if a["event"] == "end":
                said = {**a, "code": a.get("code", a.get("exit_code"))}
                out[attempt_number(a)].update({k: said[k] for k in END_FACTS if said.get(k) is not None})
    return out


def judged_beat(events: Sequence[Event], hung_step: int | None) -> float | None:
    """A hung rank's last beat: its last step up to the one the watchers judged it hung at (None:
    none recorded). Not its last step: woken to give its stack, it may step on until it is killed
    (and the ranks it held with it, writing their last steps as they die)."""
    steps = [
        e["time"] for e in events if isinstance(e.get("step"), int) and (hung_step is None or e["step"] <= hung_step)
    ]
    return max(steps) if steps else None


def rank_phases(events: Sequence[Event]) -> dict[str, Any]:
    """One rank's attempt: the first time of each phase, its checkpoints, its last step."""
    row: dict[str, Any] = {p: None for p in phases.PHASES}
    row.update(checkpoints=[], last_step=None, last_time=None, status=None, code=None, host=None)
    for e in events:
        name = e["event"]
        row["host"] = row["host"] or e.get("host")
        if name == phases.CHECKPOINT:  # the final wait for a write in flight adds to its checkpoint's stall
            same = [c for c in row["checkpoints"] if c["step"] == e.get("step")]
            if same:
                same[0]["stall"] += float(e.get("stall") or 0)
            else:
                row["checkpoints"].append(
                    {"step": e.get("step"), "time": e["time"], "stall": float(e.get("stall") or 0)}
                )
        elif name in phases.PHASES and row[name] is None:
            row[name] = e["time"]
        if name == phases.END:
            row["status"] = e.get("status")
            row["code"] = e.get("code", row["code"])  # the launcher's end: the rank's exit code
        if isinstance(e.get("step"), int) and e["step"] >= (row["last_step"] or 0):
            row["last_step"], row["last_time"] = e["step"], e["time"]
    return row


def build(events: Iterable[Event], attempts: Sequence[Event] = (), submitted: float | None = None) -> dict[str, Any]:
    """The timeline: {"submitted", "attempts": [{"attempt", "start", "end", "ranks": [...],
    "slowest": {phase: {"rank", "at"}}}]}; times in seconds since the attempt started (its
    allocation, for a Slurm job; its first event when the attempts record is missing)."""
    grouped, bounds = by_attempt(events), attempt_bounds(attempts)
    out: list[dict[str, Any]] = []  # the queue wait is the earliest attempt's, as goodput counts it
    for n in sorted(set(grouped) | set(bounds)):
        ranks = {r: rank_phases(evs) for r, evs in sorted(grouped.get(n, {}).items())}
        hung = bounds.get(n, {}).get("hung_rank")
        if hung in ranks:  # its bar is hung from the beat the watchers judged
            beat = judged_beat(grouped[n][hung], bounds[n].get("hung_step"))
            ranks[hung]["last_time"] = beat or ranks[hung]["last_time"]
        seen = [e["time"] for evs in grouped.get(n, {}).values() for e in evs]
        start = bounds.get(n, {}).get("start", min(seen) if seen else None)
        out.append(
            {
                "attempt": n,
                "start": start,
                "end": bounds.get(n, {}).get("end"),
                **{k: bounds.get(n, {}).get(k) for k in END_FACTS},
                "queued": None if submitted is None or start is None or out else round(start - submitted, 3),
                "ranks": [_relative(r, row, start) for r, row in ranks.items()],
                "slowest": slowest(ranks, start),
            }
        )
    return {"submitted": submitted, "attempts": out}


def _since(t: float | None, origin: float | None) -> float | None:
    return None if t is None or origin is None else round(t - origin, 3)


def _relative(rank: int, row: Mapping[str, Any], origin: float | None) -> dict[str, Any]:
    stalls = [c["stall"] for c in row["checkpoints"]]
    return {
        "rank": rank,
        "host": row["host"],
        **{p: _since(row[p], origin) for p in phases.PHASES},
        "status": row["status"],
        "code": row["code"],
        "last_step": row["last_step"],
        "last_at": _since(row["last_time"], origin),  # its last step seen: a hung rank's last beat
        "checkpoints": len(stalls),
        "checkpoint_stall": round(sum(stalls), 3),
        "checkpoint_list": [
            {"step": c["step"], "at": _since(c["time"], origin), "stall": round(c["stall"], 3)}
            for c in row["checkpoints"]
        ],
    }


def slowest(ranks: Mapping[int, Mapping[str, Any]], origin: float | None) -> dict[str, dict[str, Any]]:
    """Per phase, the rank that reached it last: the one the others waited for."""
    out = {}
    for p in phases.PHASES:
        reached = [(row[p], r) for r, row in ranks.items() if row[p] is not None]
        if reached:
            t, r = max(reached)
            out[p] = {"rank": r, "at": _since(t, origin)}
    return out


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def format_timeline(view: Mapping[str, Any]) -> list[str]:
    """The text table of `slurmgen status --timeline`: one block per attempt, a row per rank."""
    lines = []
    heads = ["rank", "host", *phases.PHASES, "ckpts", "stall"]
    for a in view.get("attempts", []):
        queued = f", queued {a['queued']:.1f}s" if a.get("queued") is not None else ""
        lines.append(f"attempt {a['attempt']} (seconds since the attempt started{queued}):")
        rows = [
            [r["rank"], r["host"], *(r[p] for p in phases.PHASES), r["checkpoints"], r["checkpoint_stall"]]
            for r in a["ranks"]
        ]
        rows.append(["slowest", "", *(a["slowest"].get(p, {}).get("rank") for p in phases.PHASES), "", ""])
        table = [heads] + [[_cell(c) for c in row] for row in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(heads))]
        lines += [
            "  " + "  ".join(c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in table
        ]
    return lines or ["no timeline recorded (the program wrote no phases: see `slurmgen.beat`)"]
