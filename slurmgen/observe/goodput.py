"""Goodput: how much of a run's allocation trained, across all its attempts, and where the rest
went (pure).

wall       the first allocation's start to the last attempt's end (or now): the time the run
           held, or waited to hold again, an allocation
queue      submission to the first allocation (shown, not part of wall)
startup    each attempt's allocation start to the first step done on every rank
checkpoint the checkpoint stalls (the slowest rank's, once per checkpoint)
lost       at each failure, the time spent on steps past the checkpoint the next attempt resumed
           from: those steps were done twice (`lost_steps` lists them); a last attempt that
           crashed loses its steps past its last checkpoint (no attempt redid them)
hung       an attempt that hung (its end says so: exit code 124, the hung rank): from its last
           step (the hung rank's last beat) to the attempt's end, no rank trained. Neither lost
           nor checkpoint counts any of that time again (the ranks may step on as they are
           stopped, and a rank frozen inside a checkpoint holds the others in it)
restart    a failed attempt's last step (a hung one's end) to the next attempt's allocation:
           failure detection, tear-down and the requeue's wait; and a warm restart's: its
           world's last step (the fault) to every rank stepping again in the new one
other      the last attempt's end after its last step (final evaluation, save, exit)
productive the rest: goodput = productive / wall

A warm restart (contract/warm.py) goes on inside its attempt: the healthy ranks keep their
processes, so no attempt ends and no allocation starts. Each of its worlds (the timeline's
`generation`, contract/phases.py) is accounted as an attempt is after a failure, and the
recovery is on that attempt: the steps past the checkpoint the new world resumed from are
lost (`lost_steps` names the generation that redid them), the fault to every rank's first step
in the new world is restart. An attempt's start-up is its first world's; its end (how it
ended, what followed) its last world's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slurmgen.contract import phases
from slurmgen.contract.exitcodes import HUNG, OK, PREEMPTED
from slurmgen.contract.states import State
from slurmgen.observe.timeline import attempt_bounds, by_attempt, judged_beat

# The breakdown's part for time spent on steps a later attempt did again: a word of this format
# (the page colours it), not the state of a lost worker.
LOST_PART = "lost"
# ... and for the time a hung rank held every rank after its last beat (until the attempt ended).
HUNG_PART = "hung"

Event = Mapping[str, Any]


def _attempt(ranks: Mapping[int, Sequence[Event]]) -> dict[str, Any]:
    """One attempt's facts: first step (all ranks), last step and its time, checkpoints."""
    firsts = [e for evs in ranks.values() for e in evs if e["event"] == phases.FIRST_STEP]
    stepped = [
        e
        for evs in ranks.values()
        for e in evs
        if isinstance(e.get("step"), int)
        and e["event"] in (phases.FIRST_STEP, phases.STEPS, phases.CHECKPOINT, phases.END)
    ]
    # step (None in a record without one) -> the slowest rank's stall (its own stalls at that step added)
    stalls: dict[int | None, dict[str, float]] = {}
    for evs in ranks.values():
        mine: dict[int | None, dict[str, float]] = {}
        for e in (e for e in evs if e["event"] == phases.CHECKPOINT):
            c = mine.setdefault(e.get("step"), {"time": e["time"], "stall": 0.0})
            c["stall"] += float(e.get("stall") or 0)
        for step, c in mine.items():
            if step not in stalls or c["stall"] > stalls[step]["stall"]:
                stalls[step] = c
    last = max(stepped, key=lambda e: (e["step"], e["time"])) if stepped else None
    every = [e["time"] for evs in ranks.values() for e in evs]
    return {
        "first": max(e["time"] for e in firsts) if firsts else None,
        "resumed_from": min(e["step"] for e in firsts) - 1 if firsts else None,
        "last_step": last["step"] if last else None,
        "last_time": last["time"] if last else None,
        "checkpoints": stalls,
        "began": min(every) if every else None,
        "seen": max(every) if every else None,
    }


def _redone(f: Mapping[str, Any], attempt: int, redo_from: int | None, hung: float | None = None) -> dict[str, Any]:
    """The work a failure lost: the attempt's steps past checkpoint `redo_from` (its first step
    when none), with the seconds they took; up to `hung` (a hang's judged beat) when it hung:
    the time after it is the hang's, though its ranks may have stepped on as they were stopped."""
    ckpt = f["checkpoints"].get(redo_from)
    since = ckpt["time"] if ckpt is not None else f["first"]
    until = f["last_time"] if hung is None else min(f["last_time"], hung)
    return {
        "attempt": attempt,
        "from_step": redo_from,
        "to_step": f["last_step"],
        "steps": max(0, f["last_step"] - (redo_from or 0)),
        "seconds": round(max(0.0, until - since), 3),
    }


def _stalls(f: Mapping[str, Any], hung: float | None = None) -> float:
    """A world's checkpoint stalls in seconds; up to `hung` (a hang's judged beat) when it hung:
    a rank frozen inside a checkpoint holds the others in it until they are stopped, and that
    time is the hang's."""
    return sum(
        c["stall"] if hung is None else max(0.0, min(c["time"], hung) - (c["time"] - c["stall"]))
        for c in f["checkpoints"].values()
    )


def _worlds(ranks: Mapping[int, Sequence[Event]]) -> list[tuple[int, dict[str, Any]]]:
    """An attempt's worlds that stepped, in order: (generation, its facts; its first step is the
    last rank's). Only the first world without warm restarts; none when the attempt never stepped."""
    by_generation: dict[int, dict[int, list[Event]]] = {}
    for rank, evs in ranks.items():
        for e in evs:
            g = e.get(phases.GENERATION)
            by_generation.setdefault(g if isinstance(g, int) else 0, {}).setdefault(rank, []).append(e)
    worlds = [(g, _attempt(r)) for g, r in sorted(by_generation.items())]
    return [(g, f) for g, f in worlds if f["first"] is not None]


def _warm_restarts(
    worlds: Sequence[tuple[int, Mapping[str, Any]]], attempt: int, parts: dict[str, float]
) -> list[dict[str, Any]]:
    """The recoveries inside an attempt, each world to the next: its checkpoint stalls, the steps
    the next world redid (lost) and the fault to every rank stepping again (restart), added to
    `parts`; the lost steps, each with the generation that redid them."""
    lost_steps = []
    for (_, f), (generation, later) in zip(worlds, worlds[1:]):
        parts["checkpoint"] += _stalls(f)
        lost = {**_redone(f, attempt, later["resumed_from"]), "generation": generation}
        parts[LOST_PART] += lost["seconds"]
        parts["restart"] += max(0.0, later["first"] - f["last_time"])
        lost_steps.append(lost)
    return lost_steps


def compute(
    events: Sequence[Event], attempts: Sequence[Event] = (), submitted: float | None = None, now: float | None = None
) -> dict[str, Any] | None:
    """{"goodput", "wall", "breakdown": {...}, "lost_steps": [...]}; None with no step recorded."""
    grouped, bounds = by_attempt(events), attempt_bounds(attempts)
    numbers = sorted(set(grouped) | set(bounds))
    facts = {n: _attempt(grouped.get(n, {})) for n in numbers}  # the whole attempt: its first and last line
    worlds = {n: _worlds(grouped.get(n, {})) for n in numbers}
    if not any(worlds.values()):
        return None
    start = {n: bounds.get(n, {}).get("start", facts[n]["began"]) for n in numbers}
    end = {n: bounds.get(n, {}).get("end") or (now if n == numbers[-1] and now else facts[n]["seen"]) for n in numbers}
    parts = dict.fromkeys(("startup", "checkpoint", LOST_PART, HUNG_PART, "restart", "other"), 0.0)
    lost_steps = []
    for i, n in enumerate(numbers):
        later = numbers[i + 1] if i + 1 < len(numbers) else None
        nxt = None if later is None else worlds[later][0][1] if worlds[later] else facts[later]
        if not worlds[n]:  # never stepped: all of it was start-up (or waiting for a restart)
            parts["startup"] += max(0.0, (end[n] or start[n]) - start[n])
            continue
        parts["startup"] += worlds[n][0][1]["first"] - start[n]
        lost_steps += _warm_restarts(worlds[n], n, parts)
        f = worlds[n][-1][1]  # the attempt's last world: how it ended
        said = bounds.get(n, {})
        stopped = f["last_time"]  # when training stopped: a hung attempt's last beat
        hung_from = None
        if said.get("code") == HUNG or said.get("hung_rank") is not None:
            hung = grouped.get(n, {}).get(said["hung_rank"], ()) if said.get("hung_rank") is not None else ()
            stopped = hung_from = judged_beat(hung, said.get("hung_step")) or stopped
            parts[HUNG_PART] += max(0.0, (end[n] or stopped) - stopped)
            stopped = max(stopped, end[n] or stopped)
        parts["checkpoint"] += _stalls(f, hung_from)
        crashed = said.get("code") not in (None, OK, PREEMPTED, HUNG) and said.get("state") != State.STOPPED.value
        if nxt is None and not crashed:
            parts["other"] += max(0.0, end[n] - stopped)
            continue
        # a failure: the steps past the checkpoint resumed from (a crash that ended the run: past its last one)
        resumed = nxt["resumed_from"] if nxt is not None else None
        lost = _redone(f, n, resumed if resumed is not None else max(f["checkpoints"], default=None), hung_from)
        parts[LOST_PART] += lost["seconds"]
        lost_steps.append(lost)
        if later is None:
            parts["other"] += max(0.0, end[n] - stopped)
        else:
            parts["restart"] += max(0.0, start[later] - stopped)
    wall = max(1e-9, end[numbers[-1]] - start[numbers[0]])
    productive = max(0.0, wall - sum(parts.values()))
    queue = None if submitted is None else round(start[numbers[0]] - submitted, 3)
    return {
        "goodput": round(productive / wall, 4),
        "wall": round(wall, 3),
        "queue": queue,
        "breakdown": {"productive": round(productive, 3), **{k: round(v, 3) for k, v in parts.items()}},
        "lost_steps": lost_steps,
    }


def summary(g: Mapping[str, Any]) -> str:
    """'goodput 83.2% of 412s (startup 31s, checkpoint 4s, lost 22s over 40 steps, ...)'."""
    b = g["breakdown"]
    lost = sum(x["steps"] for x in g["lost_steps"])
    rest = ", ".join(
        f"{k} {v:.1f}s" + (f" over {lost} steps" if k == LOST_PART and lost else "")
        for k, v in b.items()
        if k != "productive" and v
    )
    queue = f"; queued {g['queue']:.1f}s before" if g.get("queue") is not None else ""
    return f"goodput {100 * g['goodput']:.1f}% of {g['wall']:.1f}s" + (f" ({rest})" if rest else "") + queue
