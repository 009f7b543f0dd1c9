"""Which rank of a group's attempt is hung, judged across every agent's reports.

Each agent reports, per slot, the last trainer heartbeat of a rank silent for over half the
limit (its age on the node's own clock, its step, whether the process is stopped). The server
keeps the latest report of each worker and judges the attempt with the contract's hang rule
(slurmgen/contract/blame.py) over all of them, each aged by the time since it arrived: one
agent alone would blame its own rank that waits in a collective for a rank frozen elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurmgen.contract import blame as rule


@dataclass(frozen=True)
class SlotReport:
    """A worker's quiet beat as its agent reported it, and when (the server's clock)."""

    host: str
    age: float  # seconds, on the node's clock
    step: int | None
    stopped: bool
    at: float
    limit: float | None = None  # seconds: the rank's own (learned) limit; None: the group's
    judged: bool = True  # False: a phase nothing bounds (contract/blame.py)


def judge(
    quiet: Mapping[str, SlotReport], ranks: Mapping[str, int], limit: float, now: float
) -> tuple[str, str] | None:
    """(worker, story) of the hung rank among the attempt's workers (`ranks`: worker -> rank),
    or None yet."""
    by_rank = {ranks[w]: w for w in ranks if w in quiet}
    beats = [
        rule.LastBeat(
            ranks[w],
            round((q.age + now - q.at) * 1000),
            q.step,
            q.stopped,
            q.host,
            round(q.limit * 1000) if q.limit else None,
            q.judged,
        )
        for w, q in quiet.items()
        if w in ranks
    ]
    found = rule.judge(beats, int(limit * 1000))
    return None if found is None else (by_rank[found.rank], rule.story(found))
