"""Stragglers: a rank whose steps take longer than its peers' for long enough (pure).

In synchronous data parallel training every rank's step *ends* at the same time (the gradient
all-reduce waits for the slowest), so wall-clock step times cannot tell ranks apart. What
differs is the work a rank does before it waits: the step samples of the timeline (contract/
phases.py: `steps` events with `step` and `work`) carry it. A window between two samples of a
rank gives its work per step; at every step the ranks' values are compared with their median,
and a rank whose value stays above FACTOR x median for at least MIN_STEPS consecutive steps is
a straggler. Programs whose ranks do not synchronise report wall time as work (slurmgen.beat).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmgen.contract import phases
from slurmgen.contract.attempts import attempt_number

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


def find(
    per_rank: Mapping[int, Sequence[Window]], factor: float = FACTOR, min_steps: int = MIN_STEPS
) -> list[dict[str, Any]]:
    """The stragglers among ranks' windows: [{"rank", "steps", "from_step", "to_step", "ratio"}],
    each rank's longest run of steps above factor x the median of all ranks at that step."""
    bounds = sorted({b for ws in per_rank.values() for first, last, _ in ws for b in (first, last + 1)})
    runs: dict[int, list[float]] = {}  # rank -> [first step, steps, sum of ratios x steps]; the first two whole
    best: dict[int, dict[str, Any]] = {}
    for lo, hi in zip(bounds, bounds[1:]):  # steps lo..hi-1 have the same value on every rank
        values = {r: v for r, ws in per_rank.items() if (v := _value(ws, lo)) is not None}
        median = statistics.median(values.values()) if len(values) > 1 else None
        for r in per_rank:
            v = values.get(r)
            if median is None or v is None or v <= factor * median:
                runs.pop(r, None)
                continue
            run = runs.setdefault(r, [lo, 0, 0.0])  # first step, steps, sum of ratios x steps
            run[1] += hi - lo
            run[2] += (v / median if median > 0 else float("inf")) * (hi - lo)
            if run[1] >= min_steps and run[1] > best.get(r, {}).get("steps", 0):
                best[r] = {
                    "rank": r,
                    "steps": int(run[1]),
                    "from_step": int(run[0]),
                    "to_step": hi - 1,
                    "ratio": round(run[2] / run[1], 2),
                }
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


def all_attempts(
    grouped: Mapping[int, Mapping[int, Sequence[Mapping[str, Any]]]], factor: float = FACTOR, min_steps: int = MIN_STEPS
) -> list[dict[str, Any]]:
    """Every attempt's stragglers, each marked with its attempt."""
    return [{"attempt": n, **s} for n, ranks in sorted(grouped.items()) for s in from_events(ranks, factor, min_steps)]


def slowest_of(work: Sequence[float], factor: float = FACTOR) -> dict[str, Any] | None:
    """{"rank", "ratio"}: the rank whose work per step (one value per rank, indexed by rank) is
    over `factor` x the median of all ranks', over one window (the trainer's log line); else None."""
    if len(work) < 2:
        return None
    median = statistics.median(work)
    rank = max(range(len(work)), key=lambda r: work[r])
    if median <= 0 or work[rank] <= factor * median:
        return None
    return {"rank": rank, "ratio": round(work[rank] / median, 2)}


def summary(found: Iterable[Mapping[str, Any]]) -> str:
    return "; ".join(
        f"rank {s['rank']} {s['ratio']}x the median for {s['steps']} steps "
        f"({s['from_step']}-{s['to_step']}, attempt {attempt_number(s)})"
        for s in found
    )
