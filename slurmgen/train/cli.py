"""`python -m slurmgen.train` / `slurmgen train`: flags -> TrainConfig -> a run -> an exit code.

argparse, not Typer: this runs on every rank of every job and should import as little as
possible; flags are parsed and checked before torch is imported, so a typo costs milliseconds
and prints one line (exit 2), not a traceback after a 3-second import on 64 ranks.

Every flag is a field of `TrainConfig` or `LaunchFlags`, declared there with its help, form,
choices and default (`flags.flag`); this module only lays them out in groups (`LAYOUT`) and
adds the checks that need more than one flag or the file system.

In a multi-process run `main()` does not return: it leaves through `dist.finish()` (barrier,
destroy the process group, flush, os._exit) to avoid the gloo crash at interpreter exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

from slurmgen.contract import envvars, exitcodes
from slurmgen.contract.backends import BACKENDS

from .config import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE, ConfigError, TrainConfig
from .env import EnvError, LaunchFlags, detect
from .flags import FLAG, add_flag, either

PROG = "slurmgen train"
EPILOG = f"""\
launchers: torchrun, srun (plain or from a slurmgen script), launch_multi_node.sh, manual
  flags (--rank/--world-size/--master-addr/--master-port), --nproc-per-node N on one machine,
  or a single process when nothing is set. Rank 0 logs what it detected.

environment: {envvars.BACKEND} is the default of --backend; {envvars.REQUEUE}=1/0 forces
  --requeue/--no-requeue; {envvars.PREEMPT_SIGNAL} is the default of --preempt-signal;
  RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK (or GROUP_RANK)
  MASTER_ADDR MASTER_PORT, else SLURM_PROCID SLURM_LOCALID SLURM_NODEID SLURM_NTASKS
  SLURM_JOB_NODELIST SLURM_JOB_ID.

run directory (--out-dir): checkpoints/ (ckpt-STEP.pt and a `latest` pointer), metrics.jsonl,
  heartbeats/node-HOST-N.json (every rank's last heartbeat, one file per node; ranks write theirs
  to ${envvars.HEARTBEAT_DIR} instead when a launcher sets it), tracking/GROUP/RUN/ (the run record:
  `slurmgen runs`, `slurmgen plot`). Only rank 0 writes checkpoints and metrics (and, unless
  --track per-process, the run record).

exit codes: {EXIT_OK} done; {EXIT_FAILED} the run failed; {EXIT_USAGE} bad flags or launch environment;
  {EXIT_PREEMPTED} preempted: the --preempt-signal or SIGTERM arrived, a checkpoint was written, run the same
  command again to resume (after the --preempt-signal, with --requeue under Slurm, the job has been
  requeued; SIGTERM never requeues: scancel must end the job).
"""
# The flags in --help order, by group; each is a field of TrainConfig or LaunchFlags, which
# hold its help, form and default (flags.flag).
LAYOUT = (
    (
        "run",
        (
            "out_dir",
            "max_steps",
            "epochs",
            "seed",
            "resume",
            "save_every",
            "checkpoint_async",
            "checkpoint_writer",
            "keep_last",
            "eval_every",
            "eval_iters",
            "log_every",
            "progress",
            "heartbeat_every",
        ),
    ),
    (
        "optimisation",
        (
            "batch_size",
            "grad_accum",
            "global_batch",
            "lr",
            "min_lr",
            "warmup_steps",
            "weight_decay",
            "grad_clip",
            "dtype",
        ),
    ),
    (
        "model and data",
        (
            "model",
            "n_layer",
            "n_head",
            "n_embd",
            "block_size",
            "mlp_in",
            "mlp_hidden",
            "mlp_classes",
            "vocab_size",
            "dropout",
            "train_data",
            "val_data",
            "synthetic_samples",
        ),
    ),
    (
        "distributed",
        (
            "strategy",
            "backend",
            "nproc_per_node",
            "rank",
            "world_size",
            "local_rank",
            "master_addr",
            "master_port",
            "init_timeout",
            "tf32",
            "threads",
            "requeue",
            "preempt_signal",
        ),
    ),
    ("run record (slurmgen runs / slurmgen plot read it)", ("track", "tracker", "track_dir")),
)


def flag_fields() -> dict[str, dataclasses.Field]:
    """Every field declared as a flag, by name."""
    return {f.name: f for cls in (TrainConfig, LaunchFlags) for f in dataclasses.fields(cls) if FLAG in f.metadata}


class UsageError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block: the flag and value say it all
        raise UsageError(message)


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The parser, from the fields' declarations; defaults that the environment sets come from `environ`."""
    p = _Parser(
        prog=PROG,
        description="Train a model with DDP on whatever launcher started this process.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    fields = flag_fields()
    for title, names in LAYOUT:
        group = p.add_argument_group(title)
        for name in names:
            add_flag(group, fields[name], environ)
    return p


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[TrainConfig, LaunchFlags, int]:
    """Flags and environment -> (config, launch flags, processes to spawn). Raises UsageError/ConfigError."""
    ns = build_parser(environ).parse_args(list(argv))
    if ns.backend not in BACKENDS:
        raise UsageError(f"{envvars.BACKEND} must be {either(BACKENDS)} (got {ns.backend!r})")
    for flag in ("train_data", "val_data"):
        path = getattr(ns, flag)
        if path is not None and not os.path.isfile(path):
            raise UsageError(f"argument --{flag.replace('_', '-')}: no such file: {path!r}")
    if ns.track == "off" and ns.tracker:
        raise UsageError(f"argument --tracker: {ns.tracker!r} needs a run record: drop --track off")
    if ns.track != "off" and ns.tracker:
        missing = _missing_trackers(ns.tracker)
        if missing:
            raise UsageError(missing)
    launch_names = {f.name for f in dataclasses.fields(LaunchFlags)}
    launch = LaunchFlags(**{name: getattr(ns, name) for name in launch_names})
    launch_only = launch_names - {f.name for f in dataclasses.fields(TrainConfig)}
    fields = {k: v for k, v in vars(ns).items() if k not in launch_only}
    return TrainConfig.from_dict(fields), launch, launch.nproc_per_node


def _missing_trackers(value: str) -> str | None:
    """One line naming the first tracker whose package is not installed (checked before torch
    is imported, so a missing extra costs milliseconds, not a failed start on every rank)."""
    import importlib.util

    from slurmgen.tracking.adapters import REGISTRY, parse_trackers
    from slurmgen.tracking.errors import TrackingError

    try:
        names = parse_trackers(value)
    except TrackingError as exc:
        return f"argument --{exc}"
    for name in names:
        extra = REGISTRY[name][2]
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"argument --tracker: {name} is not installed: pip install 'slurmgen[{extra}]'"
    return None


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m slurmgen.train` and `slurmgen train`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg, launch, nproc = parse(argv, os.environ)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except (UsageError, ConfigError) as exc:
        for line in getattr(exc, "problems", [str(exc)]):
            _error(line)
        return EXIT_USAGE
    if nproc > 1 and not os.environ.get(envvars.TRAIN_SPAWNED):
        try:
            outer = detect(os.environ, LaunchFlags(rank=launch.rank, world_size=launch.world_size, backend="gloo"), 0)
        except EnvError as exc:
            _error(str(exc))
            return EXIT_USAGE
        if outer.world_size > 1:
            _error(
                f"--nproc-per-node {nproc} cannot be used when {outer.launcher} already started "
                f"{outer.world_size} processes: drop one of the two"
            )
            return EXIT_USAGE
        from .spawn import spawn

        return spawn(nproc, argv)
    return run(cfg, launch)


def run(cfg: TrainConfig, launch: LaunchFlags) -> int:
    """One rank's run; the heavy imports start here."""
    import logging

    import torch

    from . import api, dist
    from .checkpoint.files import CheckpointError
    from .data import DataError, build_datasets
    from .models import build_model, count_parameters
    from .trainer import Trainer

    log = logging.getLogger("slurmgen.train")
    try:
        env = api.setup(cfg, launch)
    except EnvError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except dist.DistSetupError as exc:
        _error(str(exc))
        return EXIT_FAILED
    try:
        cfg = cfg.at_world(env.world_size)
        torch.manual_seed(cfg.seed)  # identical initial weights everywhere, whatever DDP does
        model = build_model(cfg)
        train, val = build_datasets(cfg)
        log.info("model %s: %s parameters", cfg.model, f"{count_parameters(model):,}")
        code = Trainer(model, train, env, cfg, eval_dataset=val).fit().exit_code
    except (ConfigError, DataError) as exc:
        for line in getattr(exc, "problems", [str(exc)]):
            log.error("%s", line)
        code = EXIT_USAGE
    except CheckpointError as exc:  # a file that cannot be used, or a full disk: a failed run, not bad flags
        log.error("%s", exc)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        log.error("interrupted")
        code = exitcodes.INTERRUPTED
    except Exception:
        log.exception("training failed")
        code = EXIT_FAILED
    if dist.active() or env.distributed:
        # A rank that left its world (stopped while it waited for a new one, train/warm.py) ends
        # as quickly as one in it: the interpreter's teardown (torch's) can outlast a stop grace.
        dist.finish(code)  # does not return
    return code
