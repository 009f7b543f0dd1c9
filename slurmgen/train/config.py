"""The training configuration: one frozen dataclass shared by the CLI and the Python API.

The CLI turns flags into a `TrainConfig`; `train_ddp(config=...)` takes one directly (or a
dict of the same fields). Each field that is also a flag carries its help, form and choices
(`flags.flag`), so the CLI is built from these fields and says nothing of its own.
`validate()` collects every problem before failing, each naming the field the way a user
typed it (`--batch-size`), so the CLI can print one line per problem and exit 2 instead of
dying at step 300 with a shape error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmgen.contract import envvars, exitcodes
from slurmgen.contract.backends import BACKENDS, DEFAULT_BACKEND
from slurmgen.contract.strategies import DEFAULT_STRATEGY, STRATEGIES

from .flags import count, either, flag, from_env, number, truthy

# EXIT_PREEMPTED: the run stopped on a preemption signal after writing a checkpoint.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PREEMPTED = (
    exitcodes.OK,
    exitcodes.FAILED,
    exitcodes.BAD_INPUT,
    exitcodes.PREEMPTED,
)

DTYPES = ("float32", "float16", "bfloat16")
MODELS = ("gpt", "mlp")
TRACK_MODES = ("rank0", "per-process", "off")
PROGRESS_MODES = ("auto", "bar", "lines", "none")
# Where a sharded checkpoint is written while training goes on (train/checkpoint/sharded.py ShardedWriter).
CHECKPOINT_WRITERS = ("thread", "process")
DEFAULT_MAX_STEPS = 100
SYNTHETIC_VOCAB, TOKEN_FILE_VOCAB = 256, 50304  # the latter GPT-2's, padded to a multiple of 64
# Signals that may announce the end of a job (sbatch --signal), by their name without SIG.
# USR2 is the default because NCCL may install its own USR1 handler (submitit moved to USR2
# for that reason); KILL and STOP cannot be caught, and INT stays Ctrl-C.
PREEMPT_SIGNALS = ("USR2", "USR1", "URG", "HUP", "TERM")


def strategy_problems(strategy: str, dtype: str) -> list[str]:
    """What is wrong with --strategy, alone or with --dtype (one line each)."""
    if strategy not in STRATEGIES:
        return [f"--strategy must be {either(STRATEGIES)} (got {strategy!r})"]
    if strategy == "fsdp" and dtype == "float16":
        return [
            "--dtype float16 needs a gradient scaler that agrees across shards, not done for --strategy fsdp: "
            "use bfloat16 or float32"
        ]
    return []


def preempt_signal_ok(name: str) -> bool:
    return name in PREEMPT_SIGNALS


def signal_name(text: str) -> str:
    """USR2, usr2 and SIGUSR2 all mean USR2 (sbatch --signal takes either form)."""
    name = text.strip().upper()
    return name[3:] if name.startswith("SIG") else name


def default_out_dir(environ: Mapping[str, str]) -> str | None:
    """Where a run writes without --out-dir: one directory per Slurm job, named as its log is
    (%A_%a for an array task, so the tasks of a sweep never resume each other's checkpoints;
    a requeued job keeps its id and so resumes its own; a link of a chain, `submit --chain`, is
    named by its chain, SLURMGEN_CHAIN, the first link's id, and so resumes the link before it);
    outside Slurm None (the field's default)."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    chain = environ.get(envvars.CHAIN)
    if array and task:
        return f"runs/job-{chain or array}_{task}"
    return f"runs/job-{chain or environ['SLURM_JOB_ID']}" if environ.get("SLURM_JOB_ID") else None


def _requeue_from_env(value: str) -> bool | None:
    return truthy(value) if value.strip() else None


class ConfigError(ValueError):
    """One or more configuration problems; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


_DEFAULT = "(default %(default)s)"


def accumulation(global_batch: int, batch_size: int, world: int) -> int | None:
    """The micro-steps per optimizer step that make `global_batch` on `world` processes of
    `batch_size` samples each, or None when it does not divide. The trainer applies it at start
    and `slurmgen submit --shapes` refuses a shape with None, so no shape is found wrong on the nodes."""
    accum, rest = divmod(global_batch, batch_size * world)
    return accum if accum >= 1 and rest == 0 else None


def refit(global_batch: int, batch_size: int, world: int, accum: int) -> tuple[int, bool]:
    """The accumulation for `world` processes of `batch_size` samples each, after a checkpoint
    that trained `global_batch` samples per step on a world of another size (a smaller world
    after a lost node, `--min-nodes`; a requeue onto more nodes): the one that keeps the global
    batch where it divides (True), else `accum`, with the per-process batch as it is (False:
    the global batch changes). The optimizer's state and the schedule then mean what they meant."""
    fitted = accumulation(global_batch, batch_size, world)
    return (fitted, True) if fitted is not None else (accum, False)


def refit_line(before: tuple[int, int, int], after: tuple[int, int, int]) -> str:
    """The one log line of a refit: `before` and `after` as (processes, per-process batch,
    accumulation)."""
    (w0, b0, a0), (w1, b1, a1) = before, after
    was, now = w0 * b0 * a0, w1 * b1 * a1
    head = f"the world changed from {w0} to {w1} processes: "
    if was == now:
        return head + f"gradient accumulation {a0} -> {a1} keeps the global batch of {now} samples ({b1} x {w1} x {a1})"
    return head + (
        f"the global batch of {was} samples is not a multiple of {b1} per process x {w1} processes, so the "
        f"per-process batch stays {b1} with accumulation {a1}: the global batch changes {was} -> {now} samples"
    )


def world_problem(global_batch: int, batch_size: int, world: int) -> str:
    return (
        f"--global-batch {global_batch} is not a multiple of --batch-size {batch_size} x {world} processes "
        f"(= {batch_size * world}): no whole number of accumulation steps gives it"
    )


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run. Field `x_y` is flag `--x-y` (those declared with `flag`)."""

    out_dir: str = flag(
        "runs/train",
        "run directory (default: runs/job-$SLURM_JOB_ID under Slurm, runs/job-<array job "
        "id>_<task> in an array task, else %(default)s)",
        env=default_out_dir,
    )
    # model
    model: str = flag("gpt", f"bundled model {_DEFAULT}", choices=MODELS)
    n_layer: int = flag(2, f"GPT layers {_DEFAULT}", type=count(1))
    n_head: int = flag(2, f"GPT attention heads {_DEFAULT}", type=count(1))
    n_embd: int = flag(64, f"GPT width {_DEFAULT}", type=count(1))
    block_size: int = flag(64, f"GPT context length {_DEFAULT}", type=count(1))
    vocab_size: int | None = flag(
        None,
        f"GPT vocabulary (default {SYNTHETIC_VOCAB} synthetic, {TOKEN_FILE_VOCAB} with --train-data)",
        type=count(2),
    )
    dropout: float = flag(0.0, f"dropout probability {_DEFAULT}", type=number(0.0))
    mlp_in: int = flag(32, f"MLP inputs {_DEFAULT}", type=count(1))
    mlp_hidden: int = flag(128, f"MLP width {_DEFAULT}", type=count(1))
    mlp_classes: int = flag(10, f"MLP classes {_DEFAULT}", type=count(1))
    # data
    train_data: str | None = flag(None, "nanoGPT token file (uint16, e.g. train.bin); default: synthetic data")
    val_data: str | None = flag(None, "nanoGPT token file for evaluation (e.g. val.bin)")
    synthetic_samples: int = flag(4096, f"size of the synthetic training set {_DEFAULT}", type=count(1))
    # optimisation
    batch_size: int = flag(8, f"samples per process per micro-step {_DEFAULT}", type=count(1))
    grad_accum: int = flag(
        1, f"micro-steps per optimizer step; gradients sync on the last only {_DEFAULT}", type=count(1)
    )
    global_batch: int | None = flag(
        None,
        "samples per optimizer step over every process: --grad-accum follows the world size, so every "
        "shape of a job (2x4, 1x8, 4x2) trains the same batch",
        type=count(1),
    )
    lr: float = flag(1e-3, f"peak learning rate of AdamW {_DEFAULT}", type=number(0.0))
    min_lr: float | None = flag(None, "final learning rate of the cosine decay (default: lr/10)", type=number(0.0))
    warmup_steps: int = flag(10, f"linear warm-up steps {_DEFAULT}", type=count(0))
    weight_decay: float = flag(0.1, f"AdamW weight decay on matrices {_DEFAULT}", type=number(0.0))
    beta1: float = 0.9  # no flag: AdamW's betas are for the Python API
    beta2: float = 0.95
    grad_clip: float = flag(1.0, f"clip the gradient norm, 0: off {_DEFAULT}", type=number(0.0))
    dtype: str = flag("float32", f"autocast dtype; float16 uses a GradScaler {_DEFAULT}", choices=DTYPES)
    strategy: str = flag(
        DEFAULT_STRATEGY,
        f"ddp: a whole model per rank; fsdp: FSDP2, parameters, gradients and optimizer "
        f"state sharded, sharded checkpoints (default: ${envvars.STRATEGY}, else {DEFAULT_STRATEGY})",
        choices=STRATEGIES,
        env=from_env(envvars.STRATEGY),
    )
    max_steps: int | None = flag(
        None, f"optimizer steps to train (default {DEFAULT_MAX_STEPS} unless --epochs)", type=count(1)
    )
    epochs: int | None = flag(None, "passes over the training set (instead of --max-steps)", type=count(1))
    seed: int = flag(1337, f"seed of data order, init and dropout {_DEFAULT}", type=count(0))
    # evaluation, logging, checkpoints
    eval_every: int = flag(0, f"evaluate every N steps, 0: only at the end {_DEFAULT}", type=count(0))
    eval_iters: int = flag(10, f"batches per rank per evaluation {_DEFAULT}", type=count(1))
    log_every: int = flag(10, f"progress line and metrics record every N steps {_DEFAULT}", type=count(1))
    save_every: int = flag(
        100, f"checkpoint every N steps, 0: only at the end and on preemption {_DEFAULT}", type=count(0)
    )
    keep_last: int = flag(3, f"checkpoints to keep {_DEFAULT}", type=count(1))
    checkpoint_async: bool = flag(
        True,
        "write checkpoints in a background thread: training waits only for a copy of "
        "the state to CPU memory, and for the previous write at the next checkpoint "
        "(default: on)",
        action="on_off",
    )
    checkpoint_writer: str = flag(
        "thread",
        "with --strategy fsdp: where each rank's shard is written in the background; "
        "process: DCP's writer process per rank, with its own GIL, for a Python-bound "
        "loop whose steps slow down while a checkpoint is written (default: thread)",
        choices=CHECKPOINT_WRITERS,
    )
    resume: str = flag(
        "auto",
        "auto: continue from the latest checkpoint in --out-dir if any (default); never; or a "
        "checkpoint file or directory",
        metavar="auto|never|PATH",
    )
    heartbeat_every: float = flag(1.0, f"seconds between heartbeat file updates {_DEFAULT}", type=number(0.01))
    progress: str = flag(
        "auto", "rank 0's progress display; auto: a bar on a terminal, lines otherwise", choices=PROGRESS_MODES
    )
    # runtime
    backend: str = flag(
        DEFAULT_BACKEND,
        f"auto: nccl with CUDA, else gloo (default: ${envvars.BACKEND}, else {DEFAULT_BACKEND})",
        choices=BACKENDS,
        env=from_env(envvars.BACKEND),
    )
    init_timeout: float = flag(120.0, f"seconds to wait for all ranks to meet {_DEFAULT}", type=number(0.1))
    tf32: bool = flag(False, "allow TF32 matmuls on Ampere+ GPUs", action="store_true")
    # 0: cores / local processes, when OMP_NUM_THREADS is unset
    threads: int = flag(0, "CPU threads per process, 0: cores / local processes", type=count(0))
    requeue: bool | None = flag(
        None,
        "after the --preempt-signal under Slurm, run `scontrol requeue $SLURM_JOB_ID` "
        f"(never after TERM; default: ${envvars.REQUEUE}, else only if the job was submitted "
        "requeueable, as `scontrol show job` tells)",
        action="on_off",
        env=from_env(envvars.REQUEUE, _requeue_from_env),
    )
    preempt_signal: str = flag(
        "USR2",
        f"besides TERM, the signal that means: checkpoint, stop with exit {EXIT_PREEMPTED} "
        f"(and requeue); match sbatch --signal (default: ${envvars.PREEMPT_SIGNAL}, which "
        "generated scripts set, else %(default)s)",
        type=signal_name,
        choices=PREEMPT_SIGNALS,
        env=from_env(envvars.PREEMPT_SIGNAL, signal_name),
    )
    # run record (slurmgen.tracking)
    track: str = flag(
        "rank0",
        "rank0: one run, written by rank 0; per-process: one run per process in one group; "
        f"off (default: ${envvars.TRACK}, else %(default)s)",
        choices=TRACK_MODES,
        env=from_env(envvars.TRACK),
    )
    tracker: str = flag(
        "",
        "also send the run to: tensorboard,wandb,mlflow,swanlab (offline by default; each needs "
        "its extra, e.g. pip install 'slurmgen[wandb]'; default: "
        f"${envvars.TRACKERS})",
        metavar="LIST",
        env=from_env(envvars.TRACKERS),
    )
    track_dir: str | None = flag(None, "where run records go (default: OUT_DIR/tracking)")
    extra: Mapping[str, Any] = field(default_factory=dict)  # free-form, saved with checkpoints

    @property
    def effective_min_lr(self) -> float:
        return self.lr / 10 if self.min_lr is None else self.min_lr

    def effective_vocab(self) -> int:
        if self.vocab_size is not None:
            return self.vocab_size
        return TOKEN_FILE_VOCAB if self.train_data else SYNTHETIC_VOCAB

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from a mapping, rejecting unknown keys (a typo must not be silently ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError([f"unknown config key {k!r} (valid: {', '.join(sorted(names))})" for k in unknown])
        return cls(**dict(values)).validate()

    def at_world(self, world: int) -> TrainConfig:
        """This config for `world` processes: with --global-batch, the accumulation that keeps it."""
        if self.global_batch is None:
            return self
        accum = accumulation(self.global_batch, self.batch_size, world)
        if accum is None:
            raise ConfigError([world_problem(self.global_batch, self.batch_size, world)])
        return dataclasses.replace(self, grad_accum=accum)

    def validate(self) -> TrainConfig:
        """Return self, or raise ConfigError listing every problem."""
        p = self._bound_problems() + self._choice_problems() + self._setting_problems()
        if p:
            raise ConfigError(p)
        return self

    def _bound_problems(self) -> list[str]:
        """Numbers outside their range: sizes and counts at least 1, rates and steps at least 0."""
        p: list[str] = []

        def at_least(name: str, value: float | int | None, low: float, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if value is None or value < low:
                p.append(f"--{name.replace('_', '-')} must be at least {low} (got {value})")

        for name in (
            "n_layer",
            "n_head",
            "n_embd",
            "block_size",
            "mlp_in",
            "mlp_hidden",
            "synthetic_samples",
            "batch_size",
            "grad_accum",
            "keep_last",
            "eval_iters",
            "log_every",
        ):
            at_least(name, getattr(self, name), 1)
        at_least("mlp_classes", self.mlp_classes, 2)
        at_least("vocab_size", self.vocab_size, 2, allow_none=True)
        at_least("max_steps", self.max_steps, 1, allow_none=True)
        at_least("epochs", self.epochs, 1, allow_none=True)
        for name in ("warmup_steps", "eval_every", "save_every", "weight_decay", "grad_clip", "threads", "lr"):
            at_least(name, getattr(self, name), 0)
        at_least("min_lr", self.min_lr, 0, allow_none=True)
        if self.heartbeat_every <= 0 or self.init_timeout <= 0:
            p.append(
                "--heartbeat-every and --init-timeout must be positive "
                f"(got {self.heartbeat_every}, {self.init_timeout})"
            )
        if not 0 <= self.dropout < 1:
            p.append(f"--dropout must be in [0, 1) (got {self.dropout})")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            p.append(f"--beta1/--beta2 must be in [0, 1) (got {self.beta1}, {self.beta2})")
        return p

    def _choice_problems(self) -> list[str]:
        """Words that are not one of their field's choices."""
        p: list[str] = []
        if self.model not in MODELS:
            p.append(f"--model must be one of {', '.join(MODELS)} (got {self.model!r})")
        if self.dtype not in DTYPES:
            p.append(f"--dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        p += strategy_problems(self.strategy, self.dtype)
        if self.checkpoint_writer not in CHECKPOINT_WRITERS:
            p.append(f"--checkpoint-writer must be {either(CHECKPOINT_WRITERS)} (got {self.checkpoint_writer!r})")
        elif self.checkpoint_writer == "process" and (self.strategy != "fsdp" or not self.checkpoint_async):
            p.append(
                "--checkpoint-writer process needs --strategy fsdp and --checkpoint-async (the single-file "
                "checkpoint of ddp and a synchronous write have no writer process)"
            )
        if self.progress not in PROGRESS_MODES:
            p.append(f"--progress must be {either(PROGRESS_MODES)} (got {self.progress!r})")
        if self.backend not in BACKENDS:
            p.append(f"--backend must be {either(BACKENDS)} (got {self.backend!r})")
        return p

    def _setting_problems(self) -> list[str]:
        """Fields that exclude or need each other, empty values, the signal and the trackers."""
        p: list[str] = []
        if self.global_batch is not None and self.grad_accum != 1:
            p.append(f"--global-batch sets --grad-accum from the world size: drop --grad-accum {self.grad_accum}")
        if self.max_steps is not None and self.epochs is not None:
            p.append(f"--max-steps ({self.max_steps}) and --epochs ({self.epochs}) exclude each other: give one")
        if self.model == "gpt" and self.n_embd % self.n_head:
            p.append(f"--n-embd ({self.n_embd}) must be a multiple of --n-head ({self.n_head})")
        if not self.resume:
            p.append("--resume must be auto, never or a checkpoint path (got '')")
        if not self.out_dir:
            p.append("--out-dir must not be empty")
        if not preempt_signal_ok(self.preempt_signal):
            p.append(f"--preempt-signal must be one of {', '.join(PREEMPT_SIGNALS)} (got {self.preempt_signal!r})")
        if self.track not in TRACK_MODES:
            p.append(f"--track must be one of {', '.join(TRACK_MODES)} (got {self.track!r})")
        if self.tracker:
            from slurmgen.tracking.adapters import parse_trackers  # light: no tracker library is imported
            from slurmgen.tracking.errors import TrackingError

            try:
                parse_trackers(self.tracker)
            except TrackingError as exc:
                p.append(f"--{exc}")
        return p
