"""`submit --shapes 2x4,1x8,4x2 --earliest`: the shape of a job that Slurm expects to start first.

The same model trains on 2 nodes x 4 GPUs, 1 x 8 or 4 x 2, but on a busy cluster one may start
hours before another. Each shape's run_slurm.sh is rendered as `create` would render it and put
to `sbatch --test-only` (jobs/test_only.py); the table says when each would start and why not
sooner, and the soonest is submitted (ties: the first one given). The bundled trainer keeps its
batch across shapes with `--global-batch N` (train/config.py's `accumulation`): a shape whose
processes do not divide it is refused here rather than on the nodes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from slurmgen.errors import SlurmgenError, show
from slurmgen.jobs.test_only import Estimate
from slurmgen.runs.trainer_records import flag_value, is_trainer

_SHAPE = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")
NOW = 60.0  # seconds: an expected start this close to the clock is "now" (the scheduler's cycle)


@dataclass(frozen=True)
class Shape:
    nodes: int
    gpus: int  # processes (GPUs) per node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus}"


def parse(text: str) -> list[Shape]:
    """'2x4,1x8,4x2' to shapes, each given once; one line naming the bad one otherwise."""
    words = [w.strip() for w in text.split(",")]
    bad = [w for w in words if not _SHAPE.match(w)]
    if not text.strip() or bad:
        raise SlurmgenError(
            f"shapes: expected NODESxGPUS[,NODESxGPUS...], e.g. 2x4,1x8,4x2 (got {show(bad[0] if bad else text)})"
        )
    shapes = [Shape(*map(int, _SHAPE.match(w).groups())) for w in words]  # type: ignore[union-attr]
    if len(set(shapes)) < len(shapes):
        raise SlurmgenError(f"shapes: each shape once (got {show(text)})")
    return shapes


def batch_notes(command: Sequence[str], shapes: Sequence[Shape]) -> list[str]:
    """How the bundled trainer's global batch fares across the shapes: refused (exit 2) where a
    shape's processes do not divide --global-batch; else what keeps it, or that nothing does."""
    from slurmgen.train.config import TrainConfig, accumulation, world_problem

    if not is_trainer(command):
        return []
    worlds = sorted({s.nodes * s.gpus for s in shapes})
    given, size = flag_value(command, "--global-batch"), flag_value(command, "--batch-size")
    if given is None:
        if len(worlds) == 1:
            return []
        return [f"the shapes run {', '.join(map(str, worlds))} processes and the trainer has no --global-batch: "
                "its global batch changes with the shape (give --global-batch N to keep it)"]  # fmt: skip
    try:
        total, each = int(given), int(size) if size is not None else TrainConfig.batch_size
    except ValueError:
        return []  # the trainer says what is wrong with its own flags
    bad = [f"shapes: {s}: {world_problem(total, each, s.nodes * s.gpus)}" for s in shapes
           if accumulation(total, each, s.nodes * s.gpus) is None]  # fmt: skip
    if bad:
        raise SlurmgenError(*bad)
    steps = ", ".join(f"{accumulation(total, each, s.nodes * s.gpus)} on {s}" for s in shapes)
    return [f"the trainer keeps its global batch of {total} on every shape: accumulation steps {steps}"]


@dataclass(frozen=True)
class Row:
    shape: Shape
    estimate: Estimate


def soonest(rows: Sequence[Row]) -> Row | None:
    """The row Slurm expects to start first (the first given of equals); None when none can start."""
    able = [r for r in rows if r.estimate.start is not None]
    return min(able, key=lambda r: r.estimate.start or datetime.max) if able else None


def never(rows: Sequence[Row]) -> SlurmgenError:
    """The refusal when no shape can start: each one's reason."""
    return SlurmgenError(
        "shapes: Slurm can start none of them: " + "; ".join(f"{r.shape}: {r.estimate.error}" for r in rows)
    )


def why(estimate: Estimate, now: datetime | None) -> str:
    """Why a shape does not start sooner, or never."""
    if estimate.start is None:
        return f"never: {estimate.error}"
    if now is not None and (estimate.start - now).total_seconds() <= NOW:
        return "free now"
    return "its nodes are busy until then (Slurm's estimate from the running jobs' time limits)"


def table(rows: Sequence[Row], now: datetime | None, chosen: Row | None) -> list[str]:
    """The shapes as aligned text lines, the chosen one marked."""
    cells = [("shape", "partition", "expected start", "why not sooner")]
    for r in rows:
        start = r.estimate.start.isoformat(sep=" ") if r.estimate.start else "-"
        mark = " *" if r is chosen else ""
        cells.append((f"{r.shape}{mark}", r.estimate.partition or "-", start, why(r.estimate, now)))
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return ["  ".join([*(c[i].ljust(widths[i]) for i in range(3)), c[3]]).rstrip() for c in cells]
