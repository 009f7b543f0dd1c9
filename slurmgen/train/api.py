"""The Python API: bring your own model and data, get the same launch, checkpoints and logs.

    from slurmgen.train import TrainConfig, finish, train_ddp

    result = train_ddp(model=MyNet(), train_dataset=train, eval_dataset=val,
                       config=TrainConfig(out_dir="runs/mine", max_steps=1000, batch_size=32))
    finish(result.exit_code)   # barrier, destroy the process group, os._exit (see dist.finish)

Start the script like the bundled trainer: torchrun, srun, a slurmgen-generated script, or
plain `python` for one process. The model follows `model(inputs, targets) -> loss`, or pass
`loss_fn(outputs, targets)`. Data sets yield `(inputs, targets)` (see data.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import torch
from torch import nn

from slurmgen.contract import phases
from slurmgen.observe.timeline_writer import rank_started

from . import compat, dist, fsdp
from .config import TrainConfig
from .env import DistEnv, EnvError, LaunchFlags, detect
from .logs import setup_logging
from .trainer import Trainer, TrainResult

log = logging.getLogger("slurmgen.train")


def setup(config: TrainConfig, flags: LaunchFlags | None = None, environ: Mapping[str, str] | None = None) -> DistEnv:
    """Detect the launcher, configure threads/devices, join the process group; rank 0 logs it."""
    flags = flags or LaunchFlags(backend=config.backend)
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = detect(os.environ if environ is None else environ, flags, cuda)
    setup_logging(env.rank)
    too_old, risky = compat.check(torch.__version__, cuda > 0)
    if too_old:
        raise EnvError(too_old)
    if risky and env.is_main:
        log.warning("%s", risky)
    timeline = rank_started(env.rank)  # the timeline's imports phase: torch is loaded
    dist.configure_runtime(env, config.threads, config.tf32)
    dist.init(env, config.init_timeout)
    if timeline is not None:
        timeline.write(phases.RENDEZVOUS)
    log.info("slurmgen.train: %s", env.describe())
    if env.note:
        log.warning("%s", env.note)
    return env


def train_ddp(
    model: nn.Module,
    train_dataset: Any,
    eval_dataset: Any = None,
    config: TrainConfig | Mapping[str, Any] | None = None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    shard_units: fsdp.Units = None,
    **overrides: Any,
) -> TrainResult:
    """Train `model` with DDP, or FSDP2 with `strategy="fsdp"`, on whatever launcher started
    this process.

    `config` is a TrainConfig or a dict of its fields; keyword overrides win. Under fsdp the
    model is sharded per unit and at the root; `shard_units` names the units: a module class
    or a list of them (every submodule of those classes, e.g. `[MyBlock]`), or a function
    `model -> modules`; by default the entries of a `blocks`, `layers` or `h` ModuleList
    (fsdp.units_of). It is ignored under ddp, so one script runs either way. The process group
    is left up for the caller (evaluation, more collectives); end the script with
    `finish(result.exit_code)`. Preemption (--preempt-signal or SIGTERM) returns exit_code 75 after a
    checkpoint (only the --preempt-signal requeues a Slurm job); call `train_ddp` again with the
    same out_dir to resume.
    """
    if config is None:
        config = TrainConfig()
    base = config.to_dict() if isinstance(config, TrainConfig) else dict(config)
    cfg = TrainConfig.from_dict({**base, **overrides})
    env = setup(cfg)
    cfg = cfg.at_world(env.world_size)  # global_batch: the accumulation that keeps it on this world
    return Trainer(
        model, train_dataset, env, cfg, eval_dataset=eval_dataset, loss_fn=loss_fn, shard_units=shard_units
    ).fit()


def finish(code: int = 0) -> NoReturn:
    """End the process with `code`, the safe way: never returns.

    After a distributed run: barrier, destroy the process group, flush, os._exit (dist.finish).
    With no process group (a single process) it is `sys.exit(code)`, so a script that ends
    with `finish(...)` behaves the same under `python` and under any launcher.
    """
    if dist.active():
        dist.finish(code)
    logging.shutdown()
    raise SystemExit(code)
