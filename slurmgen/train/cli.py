"""`python -m slurmgen.train` / `slurmgen train`: flags -> TrainConfig -> a run -> an exit code.

argparse, not Typer: this runs on every rank of every job and should import as little as
possible; flags are parsed and checked before torch is imported, so a typo costs milliseconds
and prints one line (exit 2), not a traceback after a 3-second import on 64 ranks.

In a multi-process run `main()` does not return: it leaves through `dist.finish()` (barrier,
destroy the process group, flush, os._exit) to avoid the gloo crash at interpreter exit.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Sequence

from .config import EXIT_FAILED, EXIT_PREEMPTED, EXIT_USAGE, PREEMPT_SIGNALS, ConfigError, TrainConfig
from .env import EnvError, LaunchFlags, detect

PROG = "slurmgen train"
EPILOG = f"""\
launchers: torchrun, srun (plain or from a slurmgen script), launch_multi_node.sh, manual
  flags (--rank/--world-size/--master-addr/--master-port), --nproc-per-node N on one machine,
  or a single process when nothing is set. Rank 0 logs what it detected.

environment: SLURMGEN_BACKEND is the default of --backend; SLURMGEN_REQUEUE=1/0 forces
  --requeue/--no-requeue; SLURMGEN_PREEMPT_SIGNAL is the default of --preempt-signal;
  RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK (or GROUP_RANK)
  MASTER_ADDR MASTER_PORT, else SLURM_PROCID SLURM_LOCALID SLURM_NODEID SLURM_NTASKS
  SLURM_JOB_NODELIST SLURM_JOB_ID.

run directory (--out-dir): checkpoints/ (ckpt-STEP.pt and a `latest` pointer), metrics.jsonl,
  heartbeats/node-HOST-N.json (every rank's last heartbeat, one file per node; ranks write theirs
  to $SLURMGEN_HEARTBEAT_DIR instead when a launcher sets it), tracking/GROUP/RUN/ (the run record:
  `slurmgen runs`, `slurmgen plot`). Only rank 0 writes checkpoints and metrics (and, unless
  --track per-process, the run record).

exit codes: 0 done; 1 the run failed; 2 bad flags or launch environment;
  {EXIT_PREEMPTED} preempted: the --preempt-signal or SIGTERM arrived, a checkpoint was written, run the same
  command again to resume (after the --preempt-signal, with --requeue under Slurm, the job has been
  requeued; SIGTERM never requeues: scancel must end the job).
"""


class UsageError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block: the flag and value say it all
        raise UsageError(message)


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def _float_at_least(low: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, got {text}")
        return value

    return parse


def signal_name(text: str) -> str:
    """USR2, usr2 and SIGUSR2 all mean USR2 (sbatch --signal takes either form)."""
    name = text.strip().upper()
    return name[3:] if name.startswith("SIG") else name


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def default_out_dir(environ: Mapping[str, str]) -> str:
    """Where a run writes without --out-dir: one directory per Slurm job, named as its log is
    (%A_%a for an array task, so the tasks of a sweep never resume each other's checkpoints;
    a requeued job keeps its id and so resumes its own), else TrainConfig's default."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"runs/job-{array}_{task}"
    return f"runs/job-{environ['SLURM_JOB_ID']}" if environ.get("SLURM_JOB_ID") else TrainConfig().out_dir


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    d = TrainConfig()
    pos, nonneg, num = _int_at_least(1), _int_at_least(0), _float_at_least(0.0)
    default_out = default_out_dir(environ)
    p = _Parser(prog=PROG, description="Train a model with DDP on whatever launcher started this process.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("run")
    g.add_argument("--out-dir", default=default_out, help="run directory (default: runs/job-$SLURM_JOB_ID under Slurm, "
                   "runs/job-<array job id>_<task> in an array task, else %(default)s)")
    g.add_argument("--max-steps", type=pos, help=f"optimizer steps to train (default {100} unless --epochs)")
    g.add_argument("--epochs", type=pos, help="passes over the training set (instead of --max-steps)")
    g.add_argument("--seed", type=nonneg, default=d.seed, help="seed of data order, init and dropout (default %(default)s)")
    g.add_argument("--resume", default=d.resume, metavar="auto|never|PATH",
                   help="auto: continue from the latest checkpoint in --out-dir if any (default); never; or a checkpoint file or directory")
    g.add_argument("--save-every", type=nonneg, default=d.save_every, help="checkpoint every N steps, 0: only at the end and on preemption (default %(default)s)")
    g.add_argument("--checkpoint-async", action=argparse.BooleanOptionalAction, default=d.checkpoint_async,
                   help="write checkpoints in a background thread: training waits only for a copy of the state to CPU "
                        "memory, and for the previous write at the next checkpoint (default: on)")
    g.add_argument("--keep-last", type=pos, default=d.keep_last, help="checkpoints to keep (default %(default)s)")
    g.add_argument("--eval-every", type=nonneg, default=d.eval_every, help="evaluate every N steps, 0: only at the end (default %(default)s)")
    g.add_argument("--eval-iters", type=pos, default=d.eval_iters, help="batches per rank per evaluation (default %(default)s)")
    g.add_argument("--log-every", type=pos, default=d.log_every, help="progress line and metrics record every N steps (default %(default)s)")
    g.add_argument("--progress", choices=("auto", "bar", "lines", "none"), default=d.progress, help="rank 0's progress display; auto: a bar on a terminal, lines otherwise")
    g.add_argument("--heartbeat-every", type=_float_at_least(0.01), default=d.heartbeat_every, help="seconds between heartbeat file updates (default %(default)s)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--batch-size", type=pos, default=d.batch_size, help="samples per process per micro-step (default %(default)s)")
    g.add_argument("--grad-accum", type=pos, default=d.grad_accum, help="micro-steps per optimizer step; gradients sync on the last only (default %(default)s)")
    g.add_argument("--lr", type=num, default=d.lr, help="peak learning rate of AdamW (default %(default)s)")
    g.add_argument("--min-lr", type=num, help="final learning rate of the cosine decay (default: lr/10)")
    g.add_argument("--warmup-steps", type=nonneg, default=d.warmup_steps, help="linear warm-up steps (default %(default)s)")
    g.add_argument("--weight-decay", type=num, default=d.weight_decay, help="AdamW weight decay on matrices (default %(default)s)")
    g.add_argument("--grad-clip", type=num, default=d.grad_clip, help="clip the gradient norm, 0: off (default %(default)s)")
    g.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=d.dtype, help="autocast dtype; float16 uses a GradScaler (default %(default)s)")
    g = p.add_argument_group("model and data")
    g.add_argument("--model", choices=("gpt", "mlp"), default=d.model, help="bundled model (default %(default)s)")
    for name, help_text in (("n-layer", "GPT layers"), ("n-head", "GPT attention heads"), ("n-embd", "GPT width"),
                            ("block-size", "GPT context length"), ("mlp-in", "MLP inputs"), ("mlp-hidden", "MLP width"),
                            ("mlp-classes", "MLP classes")):
        g.add_argument(f"--{name}", type=pos, default=getattr(d, name.replace("-", "_")), help=f"{help_text} (default %(default)s)")
    g.add_argument("--vocab-size", type=_int_at_least(2), help="GPT vocabulary (default 256 synthetic, 50304 with --train-data)")
    g.add_argument("--dropout", type=num, default=d.dropout, help="dropout probability (default %(default)s)")
    g.add_argument("--train-data", help="nanoGPT token file (uint16, e.g. train.bin); default: synthetic data")
    g.add_argument("--val-data", help="nanoGPT token file for evaluation (e.g. val.bin)")
    g.add_argument("--synthetic-samples", type=pos, default=d.synthetic_samples, help="size of the synthetic training set (default %(default)s)")
    g = p.add_argument_group("distributed")
    g.add_argument("--backend", choices=("auto", "nccl", "gloo"), default=environ.get("SLURMGEN_BACKEND") or "auto",
                   help="auto: nccl with CUDA, else gloo (default: $SLURMGEN_BACKEND, else auto)")
    g.add_argument("--nproc-per-node", type=pos, default=1, help="with no launcher: start N processes on this machine")
    g.add_argument("--rank", type=nonneg, help="manual launch: this process's global rank")
    g.add_argument("--world-size", type=pos, help="manual launch: number of processes")
    g.add_argument("--local-rank", type=nonneg, help="this process's rank on its node (default: $LOCAL_RANK)")
    g.add_argument("--master-addr", help="address of rank 0 (default: $MASTER_ADDR)")
    g.add_argument("--master-port", type=_int_at_least(1), help="port of rank 0 (default: $MASTER_PORT)")
    g.add_argument("--init-timeout", type=_float_at_least(0.1), default=d.init_timeout, help="seconds to wait for all ranks to meet (default %(default)s)")
    g.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on Ampere+ GPUs")
    g.add_argument("--threads", type=nonneg, default=0, help="CPU threads per process, 0: cores / local processes")
    env_requeue = environ.get("SLURMGEN_REQUEUE", "").strip()
    g.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=_truthy(env_requeue) if env_requeue else None,
                   help="after the --preempt-signal under Slurm, run `scontrol requeue $SLURM_JOB_ID` (never after TERM; default: $SLURMGEN_REQUEUE, "
                        "else only if the job was submitted requeueable, as `scontrol show job` tells)")
    g.add_argument("--preempt-signal", type=signal_name, choices=PREEMPT_SIGNALS,
                   default=signal_name(environ.get("SLURMGEN_PREEMPT_SIGNAL") or d.preempt_signal),
                   help="besides TERM, the signal that means: checkpoint, stop with exit 75 (and requeue); match sbatch "
                        "--signal (default: $SLURMGEN_PREEMPT_SIGNAL, which generated scripts set, else %(default)s)")
    g = p.add_argument_group("run record (slurmgen runs / slurmgen plot read it)")
    g.add_argument("--track", choices=("rank0", "per-process", "off"), default=environ.get("SLURMGEN_TRACK") or d.track,
                   help="rank0: one run, written by rank 0; per-process: one run per process in one group; "
                        "off (default: $SLURMGEN_TRACK, else %(default)s)")
    g.add_argument("--tracker", default=environ.get("SLURMGEN_TRACKERS", d.tracker), metavar="LIST",
                   help="also send the run to: tensorboard,wandb,mlflow,swanlab (offline by default; each needs its "
                        "extra, e.g. pip install 'slurmgen[wandb]'; default: $SLURMGEN_TRACKERS)")
    g.add_argument("--track-dir", help="where run records go (default: OUT_DIR/tracking)")
    return p


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[TrainConfig, LaunchFlags, int]:
    """Flags and environment -> (config, launch flags, processes to spawn). Raises UsageError/ConfigError."""
    ns = build_parser(environ).parse_args(list(argv))
    if ns.backend not in ("auto", "nccl", "gloo"):
        raise UsageError(f"SLURMGEN_BACKEND must be auto, nccl or gloo (got {ns.backend!r})")
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
    launch = LaunchFlags(rank=ns.rank, world_size=ns.world_size, local_rank=ns.local_rank,
                         master_addr=ns.master_addr, master_port=ns.master_port, backend=ns.backend)
    fields = {k: v for k, v in vars(ns).items() if k not in
              ("nproc_per_node", "rank", "world_size", "local_rank", "master_addr", "master_port")}
    return TrainConfig.from_dict(fields), launch, ns.nproc_per_node


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
    if nproc > 1 and not os.environ.get("SLURMGEN_TRAIN_SPAWNED"):
        try:
            outer = detect(os.environ, LaunchFlags(rank=launch.rank, world_size=launch.world_size, backend="gloo"), 0)
        except EnvError as exc:
            _error(str(exc))
            return EXIT_USAGE
        if outer.world_size > 1:
            _error(f"--nproc-per-node {nproc} cannot be used when {outer.launcher} already started "
                   f"{outer.world_size} processes: drop one of the two")
            return EXIT_USAGE
        from .spawn import spawn

        return spawn(nproc, argv)
    return run(cfg, launch)


def run(cfg: TrainConfig, launch: LaunchFlags) -> int:
    """One rank's run; the heavy imports start here."""
    import logging

    import torch

    from . import api, dist
    from .checkpoint import CheckpointError
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
        torch.manual_seed(cfg.seed)  # identical initial weights everywhere, whatever DDP does
        model = build_model(cfg)
        train, val = build_datasets(cfg)
        log.info("model %s: %s parameters", cfg.model, f"{count_parameters(model):,}")
        code = Trainer(model, train, env, cfg, eval_dataset=val).fit().exit_code
    except (ConfigError, DataError) as exc:
        for line in getattr(exc, "problems", [str(exc)]):
            log.error("%s", line)
        code = EXIT_USAGE
    except CheckpointError as exc:  # the file exists but cannot be used: a failed run, not bad flags
        log.error("%s", exc)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        log.error("interrupted")
        code = 130
    except Exception:
        log.exception("training failed")
        code = EXIT_FAILED
    if dist.active():
        dist.finish(code)  # does not return
    return code
