"""What `slurmgen status` shows about where a run's time went, from its records (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slurmgen.jsonl import objects
from slurmgen.observe import goodput, stragglers, timeline


def analyse(
    timeline_text: str,
    attempts: Sequence[Mapping[str, Any]],
    submitted: float | None,
    now: float | None,
    factor: float = stragglers.FACTOR,
    min_steps: int = stragglers.MIN_STEPS,
) -> dict[str, Any]:
    """{"timeline", "stragglers", "step_work", "goodput"} from the timeline file's text and the
    attempts record; empty when the program recorded nothing. `now` ends a run still going (None:
    its last line does, for a file read with nothing else known of the run)."""
    events = list(objects(timeline_text.splitlines()))
    if not events:
        return {}
    grouped = timeline.by_attempt(events)
    last = grouped[max(grouped)] if grouped else {}
    return {
        "timeline": timeline.build(events, attempts, submitted),
        "stragglers": stragglers.all_attempts(grouped, factor, min_steps, timeline.attempt_bounds(attempts)),
        "step_work": {str(r): t for r, t in sorted(stragglers.step_times(last).items())},
        "goodput": goodput.compute(events, attempts, submitted, now),
    }


def lines(view: Mapping[str, Any]) -> list[str]:
    """The lines `status` adds: stragglers and goodput, when known."""
    out = []
    if view.get("stragglers"):
        out.append(f"  stragglers: {stragglers.summary(view['stragglers'])}")
    if view.get("goodput"):
        out.append(f"  {goodput.summary(view['goodput'])}")
    return out
