"""`SlurmgenCallback` for transformers' Trainer: heartbeats, the timeline's phases, the metrics
of `slurmgen status` and the page's curves for a transformers program.

    from slurmgen.integrations.transformers import SlurmgenCallback
    trainer = Trainer(..., callbacks=[SlurmgenCallback()])

Every rank beats at each optimizer step (`state.global_step`); rank 0 keeps what the Trainer
logs (every `logging_steps`: loss, learning_rate as `lr`, grad_norm; eval_* as validation
metrics). Importing this module imports transformers.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from slurmgen.contract import phases
from slurmgen.integrations.report import Reporter

# The Trainer's log keys that are not metrics of a step (and the timing suffixes of its
# evaluation's), and its names for ours.
_NOT_METRICS = {"epoch", "step", "total_flos"}
_TIMINGS = ("runtime", "_per_second")
_RENAMED = {"learning_rate": "lr"}


def _metrics(logs: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of one Trainer log, named as slurmgen's records name them."""
    found = {}
    for key, value in logs.items():
        if key in _NOT_METRICS or key.endswith(_TIMINGS) or not key.startswith(prefix):
            continue
        if not isinstance(value, (int, float)):
            continue
        name = key[len(prefix) :]
        found[_RENAMED.get(name, name)] = float(value)
    return found


class SlurmgenCallback(TrainerCallback):
    """records: where rank 0 keeps the run record ("runs", relative to the working directory,
    where `slurmgen status` looks), None for none. name: the record's run name."""

    def __init__(self, records: str | os.PathLike[str] | None = "runs", name: str | None = None):
        self.report = Reporter(records, name)

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.report.rendezvous()  # TrainingArguments set up the process group before the Trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        config = args.to_sanitized_dict() if state.is_world_process_zero else None
        self.report.start(state.global_step, config)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.report.step(state.global_step)
        # The Trainer's own flow callback, first in line, has decided what follows this step:
        # a pause the hang watchers must not judge, said before it starts (the next step ends it).
        if control.should_evaluate:
            self.report.phase("eval")
        if control.should_save:
            self.report.phase(phases.CHECKPOINT)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        if any(key.startswith("eval_") for key in logs):
            self.report.logged(state.global_step, state.epoch, _metrics(logs, "eval_"), "val")
        elif "loss" in logs:
            self.report.logged(state.global_step, state.epoch, _metrics(logs))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.report.finish()
