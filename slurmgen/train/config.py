"""The training configuration: one frozen dataclass shared by the CLI and the Python API.

The CLI turns flags into a `TrainConfig`; `train_ddp(config=...)` takes one directly (or a
dict of the same fields). `validate()` collects every problem before failing, each naming the
field the way a user typed it (`--batch-size`), so the CLI can print one line per problem and
exit 2 instead of dying at step 300 with a shape error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from slurmgen.contract import exitcodes

# EXIT_PREEMPTED: the run stopped on a preemption signal after writing a checkpoint.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PREEMPTED = exitcodes.OK, exitcodes.FAILED, exitcodes.BAD_INPUT, exitcodes.PREEMPTED

DTYPES = ("float32", "float16", "bfloat16")
MODELS = ("gpt", "mlp")
TRACK_MODES = ("rank0", "per-process", "off")
DEFAULT_MAX_STEPS = 100
# Signals that may announce the end of a job (sbatch --signal), by their name without SIG.
# USR2 is the default because NCCL may install its own USR1 handler (submitit moved to USR2
# for that reason); KILL and STOP cannot be caught, and INT stays Ctrl-C.
PREEMPT_SIGNALS = ("USR2", "USR1", "URG", "HUP", "TERM")


def preempt_signal_ok(name: str) -> bool:
    return name in PREEMPT_SIGNALS


class ConfigError(ValueError):
    """One or more configuration problems; `problems` holds one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a training run. Field `x_y` is flag `--x-y`."""

    out_dir: str = "runs/train"
    # model
    model: str = "gpt"
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    block_size: int = 64
    vocab_size: int | None = None  # None: 256 for synthetic data, 50304 (GPT-2, padded) for a token file
    dropout: float = 0.0
    mlp_in: int = 32
    mlp_hidden: int = 128
    mlp_classes: int = 10
    # data
    train_data: str | None = None
    val_data: str | None = None
    synthetic_samples: int = 4096
    # optimisation
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float | None = None  # None: lr / 10
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    dtype: str = "float32"
    max_steps: int | None = None  # None with epochs None: DEFAULT_MAX_STEPS
    epochs: int | None = None
    seed: int = 1337
    # evaluation, logging, checkpoints
    eval_every: int = 0
    eval_iters: int = 10
    log_every: int = 10
    save_every: int = 100
    keep_last: int = 3
    checkpoint_async: bool = True  # write in a background thread; training waits only for a copy to CPU
    resume: str = "auto"  # auto | never | PATH
    heartbeat_every: float = 1.0
    progress: str = "auto"  # auto | bar | lines | none
    # runtime
    backend: str = "auto"
    init_timeout: float = 120.0
    tf32: bool = False
    threads: int = 0  # 0: cores / local processes, when OMP_NUM_THREADS is unset
    requeue: bool | None = None  # None: requeue if Slurm says the job is requeueable
    preempt_signal: str = "USR2"  # besides TERM, the signal that means "checkpoint and stop"
    # run record (slurmgen.tracking)
    track: str = "rank0"  # rank0 | per-process | off
    tracker: str = ""  # adapters to mirror to, comma-separated: tensorboard,wandb,mlflow,swanlab
    track_dir: str | None = None  # None: OUT_DIR/tracking
    extra: Mapping[str, Any] = field(default_factory=dict)  # free-form, saved with checkpoints

    @property
    def effective_min_lr(self) -> float:
        return self.lr / 10 if self.min_lr is None else self.min_lr

    def effective_vocab(self) -> int:
        if self.vocab_size is not None:
            return self.vocab_size
        return 50304 if self.train_data else 256

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "TrainConfig":
        """Build from a mapping, rejecting unknown keys (a typo must not be silently ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError([f"unknown config key {k!r} (valid: {', '.join(sorted(names))})" for k in unknown])
        return cls(**dict(values)).validate()

    def validate(self) -> "TrainConfig":
        """Return self, or raise ConfigError listing every problem."""
        p: list[str] = []

        def at_least(name: str, value: float | int | None, low: float, allow_none: bool = False) -> None:
            if value is None and allow_none:
                return
            if value is None or value < low:
                p.append(f"--{name.replace('_', '-')} must be at least {low} (got {value})")

        for name in ("n_layer", "n_head", "n_embd", "block_size", "mlp_in", "mlp_hidden",
                     "synthetic_samples", "batch_size", "grad_accum", "keep_last", "eval_iters", "log_every"):
            at_least(name, getattr(self, name), 1)
        at_least("mlp_classes", self.mlp_classes, 2)
        at_least("vocab_size", self.vocab_size, 2, allow_none=True)
        at_least("max_steps", self.max_steps, 1, allow_none=True)
        at_least("epochs", self.epochs, 1, allow_none=True)
        for name in ("warmup_steps", "eval_every", "save_every", "weight_decay", "grad_clip", "threads", "lr"):
            at_least(name, getattr(self, name), 0)
        at_least("min_lr", self.min_lr, 0, allow_none=True)
        if self.heartbeat_every <= 0 or self.init_timeout <= 0:
            p.append(f"--heartbeat-every and --init-timeout must be positive (got {self.heartbeat_every}, {self.init_timeout})")
        if not 0 <= self.dropout < 1:
            p.append(f"--dropout must be in [0, 1) (got {self.dropout})")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            p.append(f"--beta1/--beta2 must be in [0, 1) (got {self.beta1}, {self.beta2})")
        if self.model not in MODELS:
            p.append(f"--model must be one of {', '.join(MODELS)} (got {self.model!r})")
        if self.dtype not in DTYPES:
            p.append(f"--dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        if self.progress not in ("auto", "bar", "lines", "none"):
            p.append(f"--progress must be auto, bar, lines or none (got {self.progress!r})")
        if self.backend not in ("auto", "nccl", "gloo"):
            p.append(f"--backend must be auto, nccl or gloo (got {self.backend!r})")
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
        if p:
            raise ConfigError(p)
        return self
