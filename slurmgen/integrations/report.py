"""What a framework's callback tells slurmgen, framework-neutral: one `Reporter` per process.

It writes through the two writers any program has: `slurmgen.beat` (observe/helper.py: the
heartbeat file the hang watchers read, the rank's timeline, rank 0's metrics line beside the
timeline) and `slurmgen.tracking` (rank 0's run record under `records`, which `slurmgen status`
and the run page read for the last step, loss and the curves, as they do the bundled trainer's).
Every rank beats; only rank 0 keeps metrics and a record, so a callback hands over a loss only
on rank 0 (`is_main`) and the other ranks never pay for turning one into a number.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from slurmgen import tracking
from slurmgen.contract import files, phases
from slurmgen.observe.helper import beat


class Reporter:
    """One process's reports: phases, steps with their metrics, and the run record on rank 0.

    records: the directory of the run records (relative to the working directory, `runs` by
      default, where `slurmgen status` of a Slurm job looks), None for none.
    name: the run's name in its record (default $SLURMGEN_RUN_NAME, else the record's default).
    """

    def __init__(self, records: str | os.PathLike[str] | None = files.RECORDS_DIR, name: str | None = None):
        self.records, self.name = records, name
        self.run: tracking.Run | None = None
        self.rendezvous_said = False
        # The program has done its imports and built what it trains once it builds the callback:
        # the timeline's `imports` is then exact instead of inferred from slurmgen's import.
        beat(phase=phases.IMPORTS)

    def rendezvous(self) -> None:
        """The process group is up (the framework initialised it): said once."""
        import torch.distributed as dist

        if not self.rendezvous_said and dist.is_available() and dist.is_initialized():
            self.rendezvous_said = True
            beat(phase=phases.RENDEZVOUS)

    def start(self, step: int, config: Mapping[str, Any] | None = None) -> None:
        """Training starts at `step` (0, or the step a checkpoint resumed): rank 0's run record
        opens, continuing the run of an earlier attempt of the same job (same $SLURMGEN_GROUP)."""
        self.rendezvous()
        if self.records is None or self.run is not None:
            return
        run = tracking.init(self.records, name=self.name, config=config, resume_step=step or None)
        self.run = run if isinstance(run, tracking.Run) else None

    @staticmethod
    def step(step: int) -> None:
        """Step `step` is done (steps counted from 1): the heartbeat and the timeline's samples."""
        beat(step=step)

    def logged(self, step: int, epoch: float | None, metrics: Mapping[str, float | None], split: str = "train") -> None:
        """Metrics of step `step` (rank 0; loss, lr, ...), split "train" or "val": the metrics line
        beside the timeline (train only, as `slurmgen.beat` writes it) and the run record."""
        values = {k: float(v) for k, v in metrics.items() if v is not None}
        if not values:
            return
        if split == "train":
            loss = values.pop("loss", None)
            beat(None, loss, None, **values)  # no step: the heartbeat is the step's own, said once
            values = {"loss": loss, **values} if loss is not None else values
        if self.run is not None:
            self.run.log(type=split, metrics=values, step=step, epoch=epoch)

    @staticmethod
    def phase(name: str) -> None:
        """`checkpoint` before a save, `eval` before an evaluation: a pause the hang watchers
        must not judge; the next step's beat ends it."""
        beat(phase=name)

    def finish(self) -> None:
        """Training ended normally; a crash is recorded at exit by the writers' own hooks."""
        if self.run is not None:
            self.run.finish()
            self.run = None
