"""Tracker adapters: the same `log` / artifact / finish calls, also sent to another tracker.

Each adapter is an optional extra (`pip install 'slurmgen[wandb]'`) and off unless named in
`init(trackers=...)`, `SLURMGEN_TRACKERS` or the trainer's `--tracker`. The local run directory
is always written first and is the record of truth; an adapter is a mirror. So:

- asking for an adapter whose package is missing fails at `init`, with the extra to install
  (a run that silently logs nowhere is found out too late);
- an adapter that fails later (a full disk, a library bug) is switched off with one warning and
  training goes on: a mirror must never stop a job that is writing its own record.

Every adapter here writes locally by default (TensorBoard event files, W&B offline mode, an
MLflow file store, SwanLab's local/offline mode): nothing is sent to a server unless the user
configures that tracker to do so through its own settings.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from ..errors import TrackerUnavailableError, UnknownTypeError

# name -> (module, class, extra)
REGISTRY = {
    "tensorboard": ("to_tensorboard", "TensorBoardAdapter", "tensorboard"),
    "wandb": ("to_wandb", "WandbAdapter", "wandb"),
    "mlflow": ("to_mlflow", "MlflowAdapter", "mlflow"),
    "swanlab": ("to_swanlab", "SwanLabAdapter", "swanlab"),
}


class Adapter:
    """Base class: every hook is optional. `start` returns what to keep for a resumed run
    (e.g. the tracker's own run id); it gets it back as `state` on the next attempt."""

    name = "adapter"
    package = ""  # the import name of the tracker's library
    extra = ""

    def __init__(self, run_dir, root):
        self.run_dir, self.root = run_dir, root

    def start(
        self, info: dict[str, Any], hparams: dict[str, Any], state: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        return None

    def log(self, type: str, step: int, epoch: float | int | None, metrics: dict[str, float | int]) -> None:
        pass

    def artifact(self, record: dict[str, Any]) -> None:
        pass

    def finish(self, status: str) -> None:
        pass

    def need(self, module: str):
        """Import the tracker's library, or fail with the extra that provides it."""
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise TrackerUnavailableError(
                "tracker",
                f"needs the {module} package ({exc.msg}); install it with: pip install 'slurmgen[{self.extra}]'",
                self.name,
            ) from None


def parse_trackers(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """'tensorboard,wandb' or ['tensorboard'] -> validated names, in order, without repeats.
    '', 'none' and 'off' mean none."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UnknownTypeError("tracker", f"must be one of {', '.join(REGISTRY)}", item)
        name = item.strip().lower()
        if name in ("", "none", "off"):
            continue
        if name not in REGISTRY:
            raise UnknownTypeError("tracker", f"must be one of {', '.join(REGISTRY)}", item.strip())
        if name not in names:
            names.append(name)
    return tuple(names)


def create(name: str, run_dir, root) -> Adapter:
    module, cls, _extra = REGISTRY[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(run_dir, root)
