"""The hang timeout that learns: one rule, computed by the heartbeat writer, obeyed by every watcher.

A fixed --heartbeat-timeout must be generous enough for the slowest start-up, so a step that hangs
is caught only minutes later. The writer (observe/heartbeat.py) knows its own step times, so it
publishes in each beat `timeout`: the seconds after the beat's `time` by which its next beat is
due, learned per phase from the run's own durations (`learned_timeout`). Every watcher (the bash
judges of the generated scripts, `slurmgen launch`'s node bootstrap, the coordinator's agent)
applies `beat_limit` to the beat it reads and never recomputes the statistic:

  phase        status in the beat    limit
  start-up     running, no timeout   the fixed --heartbeat-timeout (nothing learned yet)
  step         running + timeout     min(timeout, fixed): the fixed one stays the ceiling
  evaluation   evaluating + timeout  timeout, learned from this run's earlier evaluations
  checkpoint   checkpointing+timeout timeout, learned from this run's earlier checkpoint stalls
  last write   checkpointing         none: the wait for a whole write at the end (or a first
                                     checkpoint) is the disk's, which nothing learned bounds
  any of these, its process stopped  as a step: min(timeout, fixed), the fixed one when nothing
                                     was learned. A process stopped by SIGSTOP or a debugger
                                     makes no progress in any phase: a rank stopped inside a
                                     checkpoint stood the whole job still, unjudged.

timeout = period + max(floor, factor x p99(recent durations), the longest one seen): `period`
because the writer rewrites its file at most every --heartbeat-every seconds, so a watcher sees
a beat that much later; `floor` so that a fast run is not judged on noise. A phase learns once
it has `least` samples; the first step of a process (compilation, warm-up) is start-up, not a
sample. factor 0 turns learning off.

Before a hung rank is killed its Python stack is taken: a writer that registered `faulthandler`
on STACK_SIGNAL says so with `"stack": true` in its beat, and dumps every thread into the file
STACK_NAME (contract/files.py) beside its heartbeat file when the watcher sends the signal (the
watcher continues a stopped process first: a pending signal is handled before any other code
runs, so the dump shows where it stopped). STACK_SIGNAL is neither preemption signal (USR1, USR2) and is ignored by
default, so a process that registered nothing is not killed by it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from slurmgen.contract import envvars

DEFAULT_FACTOR = 3.0
DEFAULT_FLOOR = 30.0
# Samples a phase needs before its timeout is learned, and how many recent ones count.
LEAST_STEPS = 20
LEAST_EVALS = 2
LEAST_CHECKPOINTS = 2
# The phases besides stepping that are judged only by what the rank learned of its own earlier
# ones (their status words in the beat): nothing else bounds an evaluation or a checkpoint stall.
EVALUATING, CHECKPOINTING = "evaluating", "checkpointing"
LEARNED_PHASES = (EVALUATING, CHECKPOINTING)
WINDOW = 256

STACK_SIGNAL = "URG"
# How long a watcher waits for the dump before it kills the rank anyway.
STACK_WAIT = 1.0


def p99(samples: Sequence[float]) -> float:
    """The 99th percentile by nearest rank: a value that occurred (the max below 100 samples)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def learned_timeout(
    samples: Sequence[float], factor: float, floor: float, period: float, least: int, longest: float = 0.0
) -> float | None:
    """Seconds after a beat by which the next one is due, or None while too little is known (or
    learning is off): period + max(floor, factor x p99(samples), longest), rounded up to the
    millisecond. `longest`: the longest duration this process ever saw, which the recent window
    may have forgotten (a slow step at each epoch's start is this run's normal, not a hang)."""
    if factor <= 0 or len(samples) < max(1, least):
        return None
    return math.ceil((period + max(floor, factor * p99(samples), longest)) * 1000 - 1e-6) / 1000


def beat_limit(beat: Mapping[str, object], fixed: float, stopped: bool = False) -> float | None:
    """The watcher's rule: seconds a beat may age before its rank counts as hung, None when it is
    not judged (an ended rank; an evaluation or checkpoint nothing was learned of, unless its
    process is `stopped`: it cannot run, so it cannot be waiting for a disk or a peer)."""
    timeout = beat.get("timeout")
    learned = (
        float(timeout) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0 else None
    )
    status = beat.get("status")
    if status == "running" or stopped and status in LEARNED_PHASES:
        return fixed if learned is None else min(fixed, learned)
    if status in LEARNED_PHASES:
        return learned
    return None


def settings(environ: Mapping[str, str]) -> tuple[float, float]:
    """(factor, floor) from the environment the launcher set, the defaults where unset or not a
    non-negative number (a rank must never fail over its heartbeat)."""

    def number(name: str, default: float) -> float:
        try:
            value = float(environ.get(name, ""))
        except ValueError:
            return default
        return value if math.isfinite(value) and value >= 0 else default

    return number(envvars.HANG_FACTOR, DEFAULT_FACTOR), number(envvars.HANG_FLOOR, DEFAULT_FLOOR)
