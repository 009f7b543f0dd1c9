"""The bundled trainer and the rank probe: the only part of slurmgen that imports torch.

Nothing here imports torch at module import time, so `python -m slurmgen.train.probe`
and `python -m slurmgen.train` pay for torch only once they run. The public names below are
loaded on first use (PEP 562 `__getattr__`):

    from slurmgen.train import train_ddp, Trainer, TrainConfig, finish, EXIT_PREEMPTED

This subpackage imports nothing else from slurmgen at run time but slurmgen.tracking (the run
record, itself free of torch and of the generator; not imported at all with --track off) and
the stdlib-only slurmgen.contract and slurmgen.observe (the heartbeat and timeline writer it
shares with `slurmgen.beat`): a node that only has the trainer installed can run it.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "train_ddp": "api",
    "finish": "api",
    "setup": "api",
    "Trainer": "trainer",
    "TrainResult": "trainer",
    "TrainConfig": "config",
    "ConfigError": "config",
    "EXIT_PREEMPTED": "config",
    "DistEnv": "env",
    "detect": "env",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'slurmgen.train' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
