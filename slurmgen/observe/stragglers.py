"""Stragglers: a rank whose steps take longer than its peers' for long enough (pure).

In synchronous data parallel training every rank's step *ends* at the same time (the gradient
all-reduce waits for the slowest), so wall-clock step times cannot tell ranks apart. What
differs is the work a rank does before it waits: the step samples of the timeline (contract/
phases.py: `steps` events with `step` and `work`) carry it. A window between two samples of a
rank gives its work per step. One rule (`slow_ranks`), used by the page and `status` over the
timeline (`find`) and by the trainer's log over its logging windows (`Spells`): a rank is slow
at a step when its value is above FACTOR x the median of the OTHER ranks' values (in a world of
two, the other rank: only the slower one can be), and a straggler once it has been slow for at
least MIN_STEPS consecutive steps. With fewer than three ranks there is no majority to say which
rank is the normal one, so an attempt names at most one: the longest slow spell. Programs whose
ranks do not synchronise report wall time as work (slurmgen.beat).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmgen.contract import phases
from slurmgen.contract.attempts import attempt_number
from slurmgen.observe.timeline import judged_beat

FACTOR = 1.5
MIN_STEPS = 20

# (first step, last step, work per step) of one rank: the steps first..last took that long each.
Window = tuple[int, int, float]


def windows(events: Sequence[Mapping[str, Any]]) -> list[Window]:
    """One rank's windows in one attempt, from its first step and its step samples."""
    out: list[Window] = []
    prev = None
    for e in events:
        if e.get("event") == phases.FIRST_STEP and prev is None:
            prev = int(e["step"]) - 1
        elif e.get("event") == phases.STEPS and prev is not None and int(e["step"]) > prev:
            out.append((prev + 1, int(e["step"]), float(e.get("work") or 0.0) / (int(e["step"]) - prev)))
            prev = int(e["step"])
    return out


def _value(ws: Sequence[Window], step: int) -> float | None:
    for first, last, per_step in ws:
        if first <= step <= last:
            return per_step
    return None


def slow_ranks(values: Mapping[int, float], factor: float = FACTOR) -> dict[int, float]:
    """The one rule: each rank whose value is above `factor` x the median of the other ranks'
    values, with its ratio to that median; {} with fewer than two ranks."""
    if len(values) < 2:
        return {}
    ranked = sorted(values.items(), key=lambda rv: rv[1])
    ordered = [v for _, v in ranked]
    out = {}
    for i, (r, v) in enumerate(ranked):
        others = ordered[:i] + ordered[i + 1 :]
        median = statistics.median(others)
        if v > factor * median:
            out[r] = v / median if median > 0 else float("inf")
    return out


def _one_of_two(best: dict[int, dict[str, Any]], world: int) -> dict[int, dict[str, Any]]:
    """With fewer than three ranks, at most one straggler: the longest slow spell (a tie: none)."""
    if world >= 3 or len(best) < 2:
        return best
    longest = sorted(best.values(), key=lambda s: s["steps"], reverse=True)
    return {} if longest[0]["steps"] == longest[1]["steps"] else {longest[0]["rank"]: longest[0]}


def find(
    per_rank: Mapping[int, Sequence[Window]], factor: float = FACTOR, min_steps: int = MIN_STEPS
) -> list[dict[str, Any]]:
    """The stragglers among ranks' windows: [{"rank", "steps", "from_step", "to_step", "ratio"}],
    each rank's longest run of steps slow by `slow_ranks`, of at least `min_steps`."""
    bounds = sorted({b for ws in per_rank.values() for first, last, _ in ws for b in (first, last + 1)})
    runs: dict[int, list[float]] = {}  # rank -> [first step, steps, sum of ratios x steps]; the first two whole
    best: dict[int, dict[str, Any]] = {}
    for lo, hi in zip(bounds, bounds[1:]):  # steps lo..hi-1 have the same value on every rank
        slow = slow_ranks({r: v for r, ws in per_rank.items() if (v := _value(ws, lo)) is not None}, factor)
        for r in per_rank:
            if r not in slow:
                runs.pop(r, None)
                continue
            run = runs.setdefault(r, [lo, 0, 0.0])  # first step, steps, sum of ratios x steps
            run[1] += hi - lo
            run[2] += slow[r] * (hi - lo)
            if run[1] >= min_steps and run[1] > best.get(r, {}).get("steps", 0):
                best[r] = {
                    "rank": r,
                    "steps": int(run[1]),
                    "from_step": int(run[0]),
                    "to_step": hi - 1,
                    "ratio": round(run[2] / run[1], 2),
                }
    best = _one_of_two(best, len(per_rank))
    return [best[r] for r in sorted(best)]


def from_events(
    by_rank: Mapping[int, Sequence[Mapping[str, Any]]], factor: float = FACTOR, min_steps: int = MIN_STEPS
) -> list[dict[str, Any]]:
    """The stragglers of one attempt, from its events grouped by rank (timeline.by_attempt)."""
    return find({r: windows(evs) for r, evs in by_rank.items()}, factor, min_steps)


def step_times(by_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, float]:
    """Each rank's mean work per step over the attempt (seconds), for `status`."""
    out = {}
    for r, evs in by_rank.items():
        ws = windows(evs)
        steps = sum(last - first + 1 for first, last, _ in ws)
        if steps:
            out[r] = round(sum((last - first + 1) * v for first, last, v in ws) / steps, 6)
    return out


def until_hang(
    by_rank: Mapping[int, Sequence[Mapping[str, Any]]], said: Mapping[str, Any]
) -> Mapping[int, Sequence[Mapping[str, Any]]]:
    """An attempt's events up to the hung rank's last beat (timeline.judged_beat), when its end
    `said` (timeline.attempt_bounds) names a hung rank: after it, its peers' steps are time spent
    waiting in a collective for it (8.9x-26x the median, flagged as stragglers), and its own are
    steps it took when woken to give its stack. Not a straggler's evidence, either of them."""
    hung = said.get("hung_rank")
    beat = judged_beat(by_rank.get(hung, ()), said.get("hung_step")) if hung is not None else None
    if beat is None:
        return by_rank
    return {r: [e for e in evs if e["time"] <= beat] for r, evs in by_rank.items()}


def all_attempts(
    grouped: Mapping[int, Mapping[int, Sequence[Mapping[str, Any]]]],
    factor: float = FACTOR,
    min_steps: int = MIN_STEPS,
    bounds: Mapping[int, Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every attempt's stragglers, each marked with its attempt; a hung attempt's judged on its
    steps before the hang (`bounds`: timeline.attempt_bounds, until_hang)."""
    return [
        {"attempt": n, **s}
        for n, ranks in sorted(grouped.items())
        for s in from_events(until_hang(ranks, (bounds or {}).get(n, {})), factor, min_steps)
    ]


class Spells:
    """The trainer's side of the rule, over its logging windows: each window's work per step (one
    value per rank, indexed by rank) judged by `slow_ranks`, each rank's consecutive slow steps
    counted, and a rank named once they reach `min_steps`, as `find` names it on the page."""

    def __init__(self, factor: float = FACTOR, min_steps: int = MIN_STEPS):
        self.factor, self.min_steps = factor, min_steps
        self.runs: dict[int, tuple[int, float]] = {}  # rank -> (slow steps in a row, sum of ratios x steps)

    def update(self, work: Sequence[float], steps: int) -> dict[str, Any] | None:
        """{"rank", "ratio", "steps"} of the straggler after this window of `steps` steps, else None."""
        slow = slow_ranks(dict(enumerate(work)), self.factor)
        self.runs = {
            r: (self.runs.get(r, (0, 0.0))[0] + steps, self.runs.get(r, (0, 0.0))[1] + ratio * steps)
            for r, ratio in slow.items()
        }
        named = [(n, r, total) for r, (n, total) in self.runs.items() if n >= self.min_steps]
        if not named:
            return None
        n, rank, total = max(named)
        return {"rank": rank, "ratio": round(total / n, 2), "steps": n}


def summary(found: Iterable[Mapping[str, Any]]) -> str:
    return "; ".join(
        f"rank {s['rank']} {s['ratio']}x the median for {s['steps']} steps "
        f"({s['from_step']}-{s['to_step']}, attempt {attempt_number(s)})"
        for s in found
    )
