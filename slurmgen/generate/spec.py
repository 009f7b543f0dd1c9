"""The job spec: the single, validated, frozen source of truth for every generated file.

Filled from a YAML file and CLI flags (see `config.py`), validated here with pydantic so
that every problem comes back with its field path, and written back resolved as
`out/job.yaml`. Defaults are chosen so that `nodes` and `gpus` alone give a working job.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from slurmgen.contract import envvars, exitcodes, hangs, ports
from slurmgen.contract.backends import DEFAULT_BACKEND
from slurmgen.contract.strategies import DEFAULT_STRATEGY
from slurmgen.generate import slurm_values
from slurmgen.generate.hostlist import is_host_name
from slurmgen.generate.written import as_written

DEFAULT_COMMAND = ("python", "-m", "slurmgen.train")

# The launch scripts own these variables; a user value would silently be overwritten, or
# (heartbeat directory, requeue, preemption signal) contradict the spec and quietly break hang
# detection or the requeue. The spec's own fields set them.
RESERVED_ENV = {
    "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", envvars.BACKEND, envvars.HEARTBEAT_DIR, envvars.HEARTBEAT_BASE,
    "SLURMGEN_REQUEUE", "SLURMGEN_PREEMPT_SIGNAL", "SLURMGEN_SWEEP_INDEX", "SLURMGEN_SWEEP_FILE",
    "SLURMGEN_ATTEMPT", envvars.STRATEGY,
}
# Settings of launch_multi_node.sh, read from the environment it is started in before it exports
# the spec's env (`slurmgen launch` sets some of them for every node): in the spec they would
# either do nothing or silently override the launcher's.
LAUNCH_SETTINGS_ENV = {
    "SLURMGEN_LINK", "SLURMGEN_LINK_PORT", "SLURMGEN_LINK_TOKEN", "SLURMGEN_PYTHON", "SLURMGEN_START_TIMEOUT",
    "SLURMGEN_RANK_OFFSET", "SLURMGEN_WORLD_SIZE", "SLURMGEN_LOG_DIR", "SLURMGEN_STOP_GRACE",
    "SLURMGEN_FAIL_GRACE", "SLURMGEN_EVENT_FD",
}
# sbatch options slurmgen writes itself, and the spec field to use instead.
MANAGED_SBATCH = {
    "--job-name": "job_name", "-J": "job_name", "--nodes": "nodes", "-N": "nodes",
    "--ntasks-per-node": "gpus", "--ntasks": "nodes and gpus", "-n": "nodes and gpus",
    "--gpus-per-node": "gpus and gpu_request", "--gres": "gpu_request",
    "--cpus-per-task": "cpus_per_task", "-c": "cpus_per_task", "--mem": "mem",
    "--time": "time", "-t": "time", "--partition": "partition", "-p": "partition",
    "--account": "account", "-A": "account", "--qos": "qos", "-q": "qos",
    "--constraint": "constraint", "-C": "constraint", "--exclusive": "exclusive",
    "--output": "log_dir", "-o": "log_dir", "--error": "log_dir", "-e": "log_dir",
    "--requeue": "requeue", "--no-requeue": "requeue", "--signal": "requeue, signal_lead and preempt_signal",
    "--open-mode": "(always append)", "--array": "array or sweep", "-a": "array or sweep",
}

_NAME = re.compile(r"^[A-Za-z0-9_.+@:-]+$")        # partition, account, qos
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Port = Annotated[int, Field(ge=1024, le=65535)]
SweepValue = Annotated[str | int | float | bool, Field(union_mode="left_to_right")]
# Slurm's default MaxArraySize is 1001 (indices 0-1000); sites raise it, hence a generous cap.
MAX_SWEEP_POINTS = 100_000


def _one_line(value: str, what: str = "value") -> str:
    if _CONTROL.search(value):
        raise ValueError(f"{what} must be one line without control characters")
    if not value.strip():
        raise ValueError(f"{what} must not be empty")
    return value


class Container(BaseModel):
    """Run every process inside a container: pyxis (`srun --container-image`) or apptainer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(description="Image reference, e.g. nvcr.io#nvidia/pytorch:24.05-py3 or a .sif file.")
    runtime: Literal["pyxis", "apptainer"] = Field("pyxis", description="pyxis (Slurm plugin) or apptainer exec.")
    mounts: list[str] = Field(default_factory=list, description="SRC:DST[:FLAGS] bind mounts.")

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        _one_line(v, "image")
        if any(c.isspace() for c in v):
            raise ValueError("an image reference has no spaces")
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            _one_line(m, "a mount")
            if "," in m or ":" not in m:
                raise ValueError(f"mount {m!r} must look like SRC:DST[:FLAGS], without commas")
        return v


class JobSpec(BaseModel):
    """Everything slurmgen needs to write `run_slurm.sh` and `launch_multi_node.sh`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_name: str = Field("slurmgen", description="Slurm job name (%x in log names).")
    nodes: int = Field(1, ge=1, le=100_000, description="Number of nodes.")
    gpus: int = Field(1, ge=1, le=1024, description="Processes per node, one per GPU.")
    gpu_request: Literal["auto", "gpus-per-node", "gres", "none"] = Field(
        "auto", description="How GPUs are asked for; auto = none for backend gloo, else --gpus-per-node.")
    cpus_per_task: int | None = Field(None, ge=1, description="CPUs per process.")
    mem: str | None = Field(None, description="Memory per node, e.g. 64G (0 = all).")
    time: str | None = Field(None, description="Time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = Field(None, description="Node features, e.g. a100&ib.")
    exclusive: bool = Field(False, description="Ask for whole nodes.")
    sbatch_extra: list[str] = Field(default_factory=list, description="Extra #SBATCH options, e.g. --mail-type=END.")
    setup: list[str] = Field(default_factory=list, description="Shell lines run before launching (module load, venv).")
    env: dict[str, str] = Field(default_factory=dict, description="Environment for every process (NCCL_* ...).")
    master_addr: str | None = Field(None, description="Rendezvous host; default: the job's first node.")
    master_port: Port | None = Field(None, description=f"Rendezvous port; default {ports.JOB_PORT_RULE}.")
    backend: Literal["auto", "nccl", "gloo"] = DEFAULT_BACKEND  # contract.backends.BACKENDS (a test keeps them equal)
    strategy: Literal["ddp", "fsdp"] = Field(  # contract.strategies.STRATEGIES (a test keeps them equal)
        DEFAULT_STRATEGY, description="The bundled trainer's --strategy default (SLURMGEN_STRATEGY): ddp, a whole model per rank; "
                           "fsdp, FSDP2 with sharded checkpoints, for models whose training state does not fit one GPU.")
    launcher: Literal["srun", "torchrun"] = Field("srun", description="run_slurm.sh only: srun (one task per process) or torchrun (one per node).")
    container: Container | None = None
    output_dir: str = Field("out", description="Where the scripts and job.yaml are written.")
    log_dir: str | None = Field(None, description="Job logs; default OUTPUT_DIR/logs.")
    requeue: bool | None = Field(None, description="true: checkpoint and requeue on the time-limit warning (preempt_signal, sent "
                                                "signal_lead seconds before the end); false: never requeued, by Slurm or the "
                                                "trainer (--no-requeue); unset: the cluster's default (JobRequeue) decides.")
    signal_lead: int = Field(120, ge=1, le=65535, description="Seconds before the time limit that preempt_signal arrives.")
    preempt_signal: Literal["USR2", "USR1"] = Field(
        "USR2", description="The signal Slurm sends before the time limit (USR2: NCCL may use USR1); the trainer is told.")
    command: list[str] = Field(default_factory=lambda: list(DEFAULT_COMMAND), description="The program every process runs; in a sweep, {task} and {sweep.KEY} in it are filled per array task.")
    array: str | None = Field(None, description="sbatch --array, e.g. 0-15%4; with a sweep only %N (a cap on tasks at once).")
    sweep: dict[str, list[SweepValue]] | list[dict[str, SweepValue]] | None = Field(
        None, description="Parameters: a grid {key: [values]} or a list of points; one array task per point.")
    sweep_args: str | None = Field(None, description="How each parameter is appended to the command, default '--{key} {value}'; {key} and {value} are replaced per word.")
    # Jobs that heal (run_slurm.sh; see slurmgen/heal/).
    heartbeat_timeout: float | None = Field(
        None, gt=0, le=86_400, description="Stop the job step when a rank's heartbeat file is older than this many seconds.")
    hang_factor: float = Field(
        hangs.DEFAULT_FACTOR, ge=0, le=1000,
        description="With heartbeat_timeout: each rank also learns a timeout from its own step times, its heartbeat period "
                    "+ max(hang_floor, hang_factor x p99 step time), the fixed one staying the ceiling (0: off).")
    hang_floor: float = Field(hangs.DEFAULT_FLOOR, ge=0, le=86_400,
                              description="Seconds below which a learned hang timeout never goes.")
    retries: int = Field(0, ge=0, le=100, description="Requeue the job after a failure with a retry_on code, up to N times.")
    retry_on: list[int] = Field(default_factory=list, description="Exit codes that requeue the job, e.g. [1, 124, 143].")
    exclude_failed_node: bool = Field(False, description="Exclude the node where the failure started before requeueing.")
    preflight: bool = Field(False, description="Run `slurmgen doctor` on every node before the job step.")

    # Strict types, as the user wrote them: a number where text is expected is that text
    # (`job_name: 2024`, `--lr 3e-4` in a command); a boolean is never a number, nor the reverse.
    @field_validator("job_name", "partition", "account", "qos", "constraint", "master_addr", "output_dir",
                     "log_dir", mode="before")
    @classmethod
    def _text(cls, v: object) -> object:
        return as_written(v)

    @field_validator("command", "setup", "sbatch_extra", mode="before")
    @classmethod
    def _words(cls, v: object) -> object:
        return [as_written(item) for item in v] if isinstance(v, list) else as_written(v)

    @field_validator("nodes", "gpus", "cpus_per_task", "master_port", "signal_lead", "heartbeat_timeout", "retries",
                     "hang_factor", "hang_floor", mode="before")
    @classmethod
    def _number(cls, v: object, info: ValidationInfo) -> object:
        if isinstance(v, bool):
            kind = {"heartbeat_timeout": "a number of seconds", "hang_floor": "a number of seconds",
                    "hang_factor": "a number"}.get(info.field_name or "", "a whole number")
            raise ValueError(f"expected {kind}, not true/false")
        return v

    @field_validator("exclusive", "requeue", "exclude_failed_node", "preflight", mode="before")
    @classmethod
    def _boolean(cls, v: object) -> object:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError("expected true or false, not a number")
        return v

    @field_validator("job_name", "output_dir", "log_dir")
    @classmethod
    def _single_line(cls, v: str | None) -> str | None:
        return None if v is None else _one_line(v)

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError("use letters, digits and _ . + @ : - only")
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v: str | None) -> str | None:
        if v is not None and (_one_line(v, "constraint") and any(c.isspace() for c in v)):
            raise ValueError("a constraint has no spaces (combine features with & or |)")
        return v

    @field_validator("mem", mode="before")
    @classmethod
    def _mem(cls, v: object) -> object:
        return v if v is None or isinstance(v, bool) else slurm_values.memory(str(as_written(v)))  # `mem: 0` is an int

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, v: object) -> object:
        if v is None:
            return v
        if isinstance(v, bool):
            raise ValueError("expected a time limit, not true/false")
        text = str(as_written(v))  # YAML reads `time: 90` as an int
        slurm_values.time_limit_seconds(text)
        return text

    @field_validator("master_addr")
    @classmethod
    def _master_addr(cls, v: str | None) -> str | None:
        if v is not None and not is_host_name(v):
            raise ValueError("expected a host name (letters, digits and _ . - only) or an IP address")
        return v

    @field_validator("sbatch_extra")
    @classmethod
    def _sbatch_extra(cls, v: list[str]) -> list[str]:
        for line in v:
            _one_line(line, "an #SBATCH option")
            option = line.split("=", 1)[0].split()[0]
            if not option.startswith("-"):
                raise ValueError(f"{line!r} is not an sbatch option (they start with - or --)")
            if option in MANAGED_SBATCH:
                raise ValueError(f"{option} is written by slurmgen; set {MANAGED_SBATCH[option]} instead")
        return v

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        return [line for line in v if line.strip()]

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: object) -> object:
        if isinstance(v, dict):
            for key, value in v.items():
                if not isinstance(key, str) or not _ENV_KEY.match(key):
                    raise ValueError(f"{key!r} is not a valid variable name")
                if key in RESERVED_ENV:
                    raise ValueError(f"{key} is set by the launch scripts; use the spec's fields instead")
                if key in LAUNCH_SETTINGS_ENV:
                    raise ValueError(f"{key} is a setting of launch_multi_node.sh, read from the environment "
                                     "it is started in; export it there instead")
                if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                    raise ValueError(f"{key}: give a string or a number (got {value!r}); quote 'true' to pass the word")
            return {k: str(as_written(val)) for k, val in v.items()}
        return v

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError as exc:
                raise ValueError(f"cannot split into words: {exc}") from None
        if isinstance(v, list) and not v:
            raise ValueError("the command must not be empty")
        if isinstance(v, list) and v and isinstance(v[0], str):
            if not v[0].strip():
                raise ValueError("the program (first word) must not be empty, e.g. [python, train.py]")
            if v[0].startswith("-"):
                raise ValueError(f"the first word is the program to run, not an option (got {v[0]!r}); "
                                 "e.g. python train.py --lr 3e-4")
        return v

    @field_validator("array")
    @classmethod
    def _array(cls, v: str | None) -> str | None:
        from slurmgen.contract.grid import ARRAY, LIMIT

        if v is not None and not (ARRAY.match(v) or LIMIT.match(v)):
            raise ValueError("expected sbatch's --array form, e.g. 0-15, 1,3,5-7, 0-15%4, or %4 with a sweep")
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: Any) -> Any:
        from slurmgen.contract.grid import KEY, points

        if v is None:
            return v
        keys = list(v) if isinstance(v, dict) else [k for p in v for k in p]
        bad = [k for k in keys if not KEY.match(k)]
        if bad:
            raise ValueError(f"parameter name {bad[0]!r} must look like lr, batch_size or model.depth")
        if isinstance(v, dict) and any(not values for values in v.values()):
            raise ValueError("every parameter needs at least one value")
        if isinstance(v, list) and any(not p for p in v):
            raise ValueError("every point needs at least one parameter")
        count = len(points(v))
        if not 1 <= count <= MAX_SWEEP_POINTS:
            raise ValueError(f"a sweep has 1 to {MAX_SWEEP_POINTS} points (this one has {count})")
        values = [x for vs in v.values() for x in vs] if isinstance(v, dict) else [x for p in v for x in p.values()]
        for value in values:
            _one_line(str(value), "a sweep value")
        return v

    @field_validator("sweep_args")
    @classmethod
    def _sweep_args(cls, v: str | None) -> str | None:
        if v is not None and "{value}" not in _one_line(v, "sweep_args"):
            raise ValueError("must contain {value}, e.g. '--{key} {value}' or '{key}={value}'")
        return v

    @model_validator(mode="after")
    def _array_with_sweep(self) -> JobSpec:
        from slurmgen.contract.grid import LIMIT

        if self.sweep is not None and self.array is not None and not LIMIT.match(self.array):
            raise ValueError(f"array: with a sweep, give only %N to cap the tasks running at once; the indices come from the sweep (got {self.array!r})")
        if self.sweep is None and self.array is not None and LIMIT.match(self.array):
            raise ValueError(f"array: {self.array!r} caps a sweep's tasks; without a sweep give indices, e.g. 0-15{self.array}")
        return self

    @model_validator(mode="after")
    def _command_placeholders(self) -> JobSpec:
        from slurmgen.contract.grid import placeholder_problem, points

        problem = placeholder_problem(self.command, points(self.sweep))
        if problem:
            raise ValueError(problem)
        return self

    @field_validator("retry_on", mode="before")
    @classmethod
    def _retry_on(cls, v: object) -> object:
        if isinstance(v, (str, int)) and not isinstance(v, bool):  # "1,124,143" from the CLI, 3 from YAML
            v = [part.strip() for part in str(v).split(",") if part.strip()]
        if isinstance(v, list):
            for code in v:
                if isinstance(code, bool) or not str(code).strip().isdigit() or not 1 <= int(code) <= 255:
                    raise ValueError(f"{code!r} is not an exit code: give whole numbers 1-255, comma-separated")
                if int(code) == exitcodes.PREEMPTED:
                    raise ValueError(f"{exitcodes.PREEMPTED} means preempted: that job requeues itself (requeue: true)")
            return sorted({int(code) for code in v})
        return v

    @model_validator(mode="after")
    def _retry_policy(self) -> JobSpec:
        if self.retries and not self.retry_on:
            raise ValueError("retries needs retry_on: the exit codes worth another attempt, e.g. 1,124,143")
        if not self.retries and (self.retry_on or self.exclude_failed_node):
            raise ValueError("retry_on and exclude_failed_node need retries: N (the most requeues)")
        return self

    @model_validator(mode="after")
    def _signal_before_end(self) -> JobSpec:
        limit = slurm_values.time_limit_seconds(self.time) if self.time else None
        if self.requeue and limit is not None and self.signal_lead >= limit:
            raise ValueError(f"signal_lead ({self.signal_lead}s) must be shorter than the time limit ({limit}s)")
        return self

    # ---- derived values, computed, never stored ----
    @property
    def logs(self) -> str:
        return self.log_dir if self.log_dir is not None else f"{self.output_dir.rstrip('/')}/logs"

    @property
    def gpu_style(self) -> str:
        """The effective GPU request: `auto` resolved against the backend."""
        if self.gpu_request != "auto":
            return self.gpu_request
        return "none" if self.backend == "gloo" else "gpus-per-node"

    def resolved(self) -> dict:
        """The spec as written to job.yaml: every field, unset optional ones left out."""
        return self.model_dump(mode="json", exclude_none=True)

    def digest(self) -> str:
        """A short, stable fingerprint of the resolved spec, printed in every script header."""
        canonical = json.dumps(self.resolved(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]
