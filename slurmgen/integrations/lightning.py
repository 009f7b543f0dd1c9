"""`SlurmgenCallback` for Lightning's Trainer: heartbeats, the timeline's phases, the metrics of
`slurmgen status` and the page's curves for a Lightning program.

    from slurmgen.integrations.lightning import SlurmgenCallback
    trainer = Trainer(..., callbacks=[SlurmgenCallback()])

Lightning's own `Callback` is the base, from the package the program uses: `lightning.pytorch`
when it is imported (or the only one installed), else `pytorch_lightning`; Lightning's Trainer
accepts a callback of its own package only. Importing this module imports Lightning.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from slurmgen.contract import phases
from slurmgen.integrations.report import Reporter

if "lightning.pytorch" in sys.modules or importlib.util.find_spec("pytorch_lightning") is None:
    from lightning.pytorch import Callback
else:
    from pytorch_lightning import Callback


def _number(value: Any) -> float | None:
    """A loss as Lightning hands it: a tensor, a dict holding "loss", a number, or None."""
    if isinstance(value, dict):
        value = value.get("loss")
    if value is None:
        return None
    return float(value.item() if hasattr(value, "item") else value)


def _lr(trainer: Any) -> float | None:
    """The first optimizer's first group's learning rate, as the bundled trainer logs `lr`."""
    optimizers = trainer.optimizers or []
    groups = optimizers[0].param_groups if optimizers else []
    return float(groups[0]["lr"]) if groups else None


def _val_name(key: str) -> str:
    """ "val_loss" or "val/loss" -> "loss": a validation metric named as the bundled trainer's
    ("loss" of type val, beside the train loss on the page); any other key unchanged."""
    for prefix in ("val_", "val/"):
        if key.startswith(prefix):
            return key[len(prefix) :]
    return key


class SlurmgenCallback(Callback):
    """Every rank beats after each optimizer step (Lightning's `global_step`); rank 0 logs loss
    and lr every `log_every_n_steps` (Lightning's own cadence), and the validation metrics.

    records: where rank 0 keeps the run record ("runs", relative to the working directory, where
    `slurmgen status` looks), None for none. name: the record's run name.
    """

    def __init__(self, records: str | os.PathLike[str] | None = "runs", name: str | None = None):
        super().__init__()
        self.report = Reporter(records, name)
        self.last_step = -1

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.report.rendezvous()  # Lightning set up its process group before this hook

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        hparams = dict(getattr(pl_module, "hparams", {}) or {})
        self.report.start(trainer.global_step, hparams if trainer.is_global_zero else None)
        self.last_step = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self.last_step:  # accumulating gradients: no optimizer step yet
            return
        self.last_step = step
        self.report.step(step)
        if trainer.is_global_zero and step % max(trainer.log_every_n_steps, 1) == 0:
            self.report.logged(step, trainer.current_epoch, {"loss": _number(outputs), "lr": _lr(trainer)})

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self.report.phase("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        found = {_val_name(k): _number(v) for k, v in trainer.callback_metrics.items() if _val_name(k) != k}
        self.report.logged(trainer.global_step, trainer.current_epoch, found, "val")

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.report.phase(phases.CHECKPOINT)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.report.finish()
