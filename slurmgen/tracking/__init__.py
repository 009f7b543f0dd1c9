"""Run records for distributed training: local files first, other trackers as optional mirrors.

    from slurmgen import tracking

    run = tracking.init("runs/exp", config=hparams)           # rank 0 records; other ranks no-op
    run.log(type="train", metrics={"loss": 0.3}, step=100, epoch=1)
    ckpt = run.create_artifact("ckpt-100", "checkpoint")
    ckpt.add_file("runs/exp/ckpt-100.pt")                     # sha256 and size recorded
    run.mark_output(ckpt)
    run.finish()                                              # or: with tracking.init(...) as run:

One run per process in a shared group instead: `init(..., mode="per-process")` (job types
`node_{n}_rank_{r}` by default). See start.py for naming and resume, store.py for the files.

This package imports nothing heavy and nothing from the rest of slurmgen (no torch, no
generator): the trainer imports it on every rank, and user code may import it alone. Adapters
import their tracker's library only when asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .artifact import Artifact, create_artifact, sha256_of
from .errors import (
    ArtifactFileError,
    MetricValueError,
    RunStateError,
    TrackerUnavailableError,
    TrackingError,
    UnknownTypeError,
)
from .identity import Place
from .run import FINISHED, STATUSES, NoOpRun, Run, status_for_exit_code
from .start import init as _init
from .values import ARTIFACT_TYPES, METRIC_TYPES

__all__ = [
    "ARTIFACT_TYPES",
    "METRIC_TYPES",
    "STATUSES",
    "Artifact",
    "ArtifactFileError",
    "MetricValueError",
    "NoOpRun",
    "Place",
    "Run",
    "RunStateError",
    "TrackerUnavailableError",
    "TrackingError",
    "UnknownTypeError",
    "create_artifact",
    "finish",
    "init",
    "log",
    "run",
    "sha256_of",
    "status_for_exit_code",
]

run: Run | NoOpRun | None = None  # the run of the last init(), for the module-level shortcuts


def init(*args: Any, **kwargs: Any) -> Run | NoOpRun:
    global run
    run = _init(*args, **kwargs)
    return run


init.__doc__ = _init.__doc__


def _current(what: str) -> Run | NoOpRun:
    if run is None:
        raise RunStateError(what, "no run: call slurmgen.tracking.init() first", what, has_value=False)
    return run


def log(type: str, metrics: Mapping[str, Any], step: int | None = None, epoch: float | None = None) -> None:
    """`log` on the run of the last `init()`."""
    _current("log").log(type=type, metrics=metrics, step=step, epoch=epoch)


def finish(status: str = FINISHED, exit_code: int | None = None) -> None:
    """`finish` the run of the last `init()`."""
    _current("finish").finish(status, exit_code)
