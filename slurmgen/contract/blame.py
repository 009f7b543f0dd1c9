"""Hang blame: which rank of a job is the hung one, judged across nodes. Pure, import-free.

When one rank freezes, every other rank blocks in the next collective and stops beating within
about one beat of it, on every node: a judge that names its first stale rank blames a waiting
one. Of the ranks whose heartbeat is judged (contract/hangs.py: a step, or an evaluation or
checkpoint by what the rank learned of its earlier ones) and older than its limit:

- a rank whose process cannot run (stopped by SIGSTOP or a debugger) is named at once;
- any other only `defer_ms` later (a beat period plus a poll): the rank whose last beat is the
  oldest crosses it first, and a stopped rank whose last beat was newer still speaks first.

Among equals the older beat wins, then the lower rank. Ranks silent for over half the limit
are the ones that waited, those in a phase nothing bounds too (a first checkpoint's barrier:
never named, but they waited all the same). Python judges with it where it sees every node's beats (the launcher
of `slurmgen launch`, the coordinator's server); the Slurm watcher and launch_multi_node.sh
judge each node with the same rule in bash (templates/hang_judge.sh.j2, `judge_node`, which
orders its verdicts by the same deferral so the first to arrive is this one), and
tests/unit/contract/test_blame.py holds both to the same cases. The story is hang_story.sh.j2's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

STOPPED = "stopped"  # the one `why` a hang has besides "" (the oldest beat, no sign)


@dataclass(frozen=True)
class LastBeat:
    """A rank's last heartbeat as its node saw it: how old (the node's own clock), at which
    step (None: the beat had none), and whether the rank's process is stopped."""

    rank: int
    age_ms: int
    step: int | None = None
    stopped: bool = False
    node: str = ""
    limit_ms: int | None = None  # its own limit (a learned one, contract/hangs.py); None: the job's
    judged: bool = True  # False: a phase nothing bounds (contract/hangs.py); it may have waited, never hung


@dataclass(frozen=True)
class Hang:
    rank: int
    node: str
    step: int | None
    age_ms: int
    why: str  # STOPPED or ""
    waiting: tuple[int, ...]  # the other ranks silent for over half the limit


def defer_ms(limit_ms: int) -> int:
    """How much longer than the limit a quiet rank with no sign of being stuck waits to be
    named: long enough for a stopped rank, or one whose last beat is older by up to a beat
    period, to be named first; short enough that a job still ends soon after the limit. A
    quarter of the limit, between 0.25 and 2 s (2 s covers the bundled trainer's 1 s beats
    plus a 0.5 s poll)."""
    return max(250, min(2000, limit_ms // 4))


def judge(beats: Iterable[LastBeat], limit_ms: int, defer: int | None = None) -> Hang | None:
    """The hung rank of these beats (all of a job's quiet beats, any node), or None yet."""
    beats = sorted(beats, key=lambda b: b.rank)
    defer = defer_ms(limit_ms) if defer is None else defer
    due = [
        b
        for b in beats
        if b.judged and b.age_ms > _limit(b, limit_ms) and (b.stopped or b.age_ms > _limit(b, limit_ms) + defer)
    ]
    if not due:
        return None
    hung = max(due, key=lambda b: (b.stopped, b.age_ms))  # max keeps the first (lowest rank) of equals
    waiting = tuple(b.rank for b in beats if b.age_ms * 2 > _limit(b, limit_ms) and b.rank != hung.rank)
    return Hang(hung.rank, hung.node, hung.step, hung.age_ms, STOPPED if hung.stopped else "", waiting)


def _limit(beat: LastBeat, limit_ms: int) -> int:
    """A beat's own limit when its rank learned one (as judge_node's beat_limit), else the job's."""
    return beat.limit_ms or limit_ms


def rank_list(ranks: Iterable[int]) -> str:
    """Ranks as sorted ranges: "0-2, 5"."""
    parts: list[str] = []
    run: list[int] = []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [r]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(parts)


def story(hang: Hang) -> str:
    """The verdict in words, as hang_story.sh.j2 says it: "rank 3 on node2 stopped beating at
    step 220 (no heartbeat for 10.4 s, its process is stopped); ranks 0-2 waited in a collective"."""
    text = f"rank {hang.rank} on {hang.node} stopped beating"
    if hang.step is not None:
        text += f" at step {hang.step}"
    text += f" (no heartbeat for {hang.age_ms // 1000}.{hang.age_ms % 1000 // 100} s"
    text += ", its process is stopped)" if hang.why == STOPPED else ")"
    waiting = set(hang.waiting)
    if len(waiting) > 1:
        return text + f"; ranks {rank_list(waiting)} waited in a collective"
    if waiting:
        return text + f"; rank {rank_list(waiting)} waited in a collective"
    return text + "; the other ranks kept beating"


def stuck(frames: Iterable[str]) -> str:
    """What a story adds once the hung rank's stack is known, from its innermost frame
    ("FILE:LINE FUNCTION", as templates/hang_stack.sh.j2 gives them): "; stuck in
    /x/train.py:123 in step()", as launch_multi_node.sh says it; "" without a frame."""
    for frame in frames:
        where, _, function = frame.rpartition(" ")
        return f"; stuck in {where} in {function}()"
    return ""
