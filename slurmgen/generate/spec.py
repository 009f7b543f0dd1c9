"""The job spec: the single, validated, frozen source of truth for every generated file.

Filled from a YAML file and CLI flags (see `specfile.py`) and written back resolved as
`out/job.yaml`. Defaults are chosen so that `nodes` and `gpus` alone give a working job.

The fields' types, ranges and choices are msgspec's (a struct and its `Meta`; msgspec loads in
~15 ms where pydantic took ~90 ms of every `create` and `launch`). The rules beyond a type are
plain functions registered below for their fields: a `before` rule turns what a user wrote into
the field's type (YAML reads `time: 90` as a number), an `after` rule checks the converted value,
and an `across` rule checks fields together once each is valid. `specfile.build_spec` runs them
all and words every problem with its field path.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, Literal, get_args

import msgspec
from msgspec import Meta, Struct

from slurmgen.contract import envvars, exitcodes, hangs, ports, retries, warm
from slurmgen.contract.backends import DEFAULT_BACKEND
from slurmgen.contract.strategies import DEFAULT_STRATEGY
from slurmgen.contract.world import min_nodes_refusal
from slurmgen.errors import SlurmgenError
from slurmgen.generate import slurm_values
from slurmgen.generate.hostlist import expand, is_host_name
from slurmgen.generate.written import as_written

DEFAULT_COMMAND = ("python", "-m", "slurmgen.train")

# The launch scripts own these variables; a user value would silently be overwritten, or
# (heartbeat directory, requeue, preemption signal) contradict the spec and quietly break hang
# detection or the requeue. The spec's own fields set them.
RESERVED_ENV = {
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    envvars.BACKEND,
    envvars.HEARTBEAT_DIR,
    envvars.HEARTBEAT_BASE,
    envvars.WARM_DIR,
    envvars.WARM_BASE,
    envvars.WARM_GENERATION,
    envvars.REQUEUE,
    envvars.PREEMPT_SIGNAL,
    envvars.SWEEP_INDEX,
    envvars.SWEEP_FILE,
    envvars.ATTEMPT,
    envvars.STRATEGY,
}
# Settings of launch_multi_node.sh, read from the environment it is started in before it exports
# the spec's env (`slurmgen launch` sets some of them for every node): in the spec they would
# either do nothing or silently override the launcher's.
LAUNCH_SETTINGS_ENV = {
    envvars.LINK,
    envvars.LINK_PORT,
    envvars.LINK_TOKEN,
    envvars.PYTHON,
    envvars.START_TIMEOUT,
    envvars.RANK_OFFSET,
    envvars.WORLD_SIZE,
    envvars.LOG_DIR,
    envvars.STOP_GRACE,
    envvars.FAIL_GRACE,
    envvars.EVENT_FD,
}
# sbatch options slurmgen writes itself, and the spec field to use instead.
MANAGED_SBATCH = {
    "--job-name": "job_name",
    "-J": "job_name",
    "--nodes": "nodes",
    "-N": "nodes",
    "--ntasks-per-node": "gpus",
    "--ntasks": "nodes and gpus",
    "-n": "nodes and gpus",
    "--gpus-per-node": "gpus, gpu_type and gpu_request",
    "--gres": "gpu_request and gpu_type",
    "--cpus-per-task": "cpus_per_task",
    "-c": "cpus_per_task",
    "--mem": "mem",
    "--mem-per-gpu": "mem_per_gpu",
    "--time": "time",
    "-t": "time",
    "--time-min": "time_min",
    "--partition": "partition",
    "-p": "partition",
    "--account": "account",
    "-A": "account",
    "--qos": "qos",
    "-q": "qos",
    "--constraint": "constraint",
    "-C": "constraint",
    "--exclusive": "exclusive",
    "--reservation": "reservation",
    "--nodelist": "nodelist",
    "-w": "nodelist",
    "--exclude": "exclude",
    "-x": "exclude",
    "--output": "log_dir",
    "-o": "log_dir",
    "--error": "log_dir",
    "-e": "log_dir",
    "--requeue": "requeue",
    "--no-requeue": "requeue",
    "--open-mode": "(always append)",
    "--array": "array or sweep",
    "-a": "array or sweep",
}

_NAME = re.compile(r"^[A-Za-z0-9_.+@:-]+$")  # partition, account, qos, reservation
_GPU_TYPE = re.compile(r"^[A-Za-z0-9_.+-]+$")  # a GRES type: gpu:TYPE:N, so no colon and no comma
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Port = Annotated[int, Meta(ge=1024, le=65535)]
SweepValue = str | int | float | bool  # msgspec keeps each as written: 3 stays an int, "3" text
_MAX_NODES = 100_000
# Slurm's default MaxArraySize is 1001 (indices 0-1000); sites raise it, hence a generous cap.
MAX_SWEEP_POINTS = 100_000


def _one_line(value: str, what: str = "value") -> str:
    if _CONTROL.search(value):
        raise ValueError(f"{what} must be one line without control characters")
    if not value.strip():
        raise ValueError(f"{what} must not be empty")
    return value


class Container(Struct, frozen=True, forbid_unknown_fields=True):
    """Run every process inside a container: pyxis (`srun --container-image`) or apptainer."""

    image: Annotated[str, Meta(description="Image reference, e.g. nvcr.io#nvidia/pytorch:24.05-py3 or a .sif file.")]
    runtime: Annotated[Literal["pyxis", "apptainer"], Meta(description="pyxis (Slurm plugin) or apptainer exec.")] = (
        "pyxis"
    )
    mounts: Annotated[list[str], Meta(description="SRC:DST[:FLAGS] bind mounts.")] = msgspec.field(default_factory=list)


class JobSpec(Struct, frozen=True, forbid_unknown_fields=True):
    """Everything slurmgen needs to write `run_slurm.sh` and `launch_multi_node.sh`."""

    job_name: Annotated[str, Meta(description="Slurm job name (%x in log names).")] = "slurmgen"
    nodes: Annotated[int, Meta(ge=1, le=_MAX_NODES, description="Number of nodes.")] = 1
    gpus: Annotated[int, Meta(ge=1, le=1024, description="Processes per node, one per GPU.")] = 1
    gpu_request: Annotated[
        Literal["auto", "gpus-per-node", "gres", "none"],
        Meta(description="How GPUs are asked for; auto = none for backend gloo, else --gpus-per-node."),
    ] = "auto"
    cpus_per_task: Annotated[Annotated[int, Meta(ge=1)] | None, Meta(description="CPUs per process.")] = None
    gpu_type: Annotated[
        str | None,
        Meta(description="GPU type, e.g. a100: --gpus-per-node=a100:4 or --gres=gpu:a100:4, as gpu_request says."),
    ] = None
    mem: Annotated[str | None, Meta(description="Memory per node, e.g. 64G (0 = all).")] = None
    mem_per_gpu: Annotated[str | None, Meta(description="Memory per GPU, e.g. 40G (instead of mem).")] = None
    time: Annotated[str | None, Meta(description="Time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.")] = None
    time_min: Annotated[
        str | None,
        Meta(description="Shortest acceptable time limit (sbatch --time-min): the job may start sooner with less."),
    ] = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: Annotated[str | None, Meta(description="Node features, e.g. a100&ib.")] = None
    exclusive: Annotated[bool, Meta(description="Ask for whole nodes.")] = False
    reservation: Annotated[str | None, Meta(description="Run in these reservations, comma-separated.")] = None
    nodelist: Annotated[str | None, Meta(description="Nodes the job must include, a hostlist: gpu[01-02].")] = None
    exclude: Annotated[str | None, Meta(description="Nodes the job must not run on, a hostlist: gpu[07,09].")] = None
    sbatch_extra: Annotated[list[str], Meta(description="Extra #SBATCH options, e.g. --mail-type=END.")] = (
        msgspec.field(default_factory=list)
    )
    setup: Annotated[list[str], Meta(description="Shell lines run before launching (module load, venv).")] = (
        msgspec.field(default_factory=list)
    )
    env: Annotated[dict[str, str], Meta(description="Environment for every process (NCCL_* ...).")] = msgspec.field(
        default_factory=dict
    )
    master_addr: Annotated[str | None, Meta(description="Rendezvous host; default: the job's first node.")] = None
    master_port: Annotated[Port | None, Meta(description=f"Rendezvous port; default {ports.JOB_PORT_RULE}.")] = None
    backend: Literal["auto", "nccl", "gloo"] = DEFAULT_BACKEND  # contract.backends.BACKENDS (a test keeps them equal)
    strategy: Annotated[
        Literal["ddp", "fsdp"],
        Meta(  # contract.strategies.STRATEGIES (a test keeps them equal)
            description="The bundled trainer's --strategy default (SLURMGEN_STRATEGY): ddp, a whole model per rank; "
            "fsdp, FSDP2 with sharded checkpoints, for models whose training state does not fit one GPU."
        ),
    ] = DEFAULT_STRATEGY
    launcher: Annotated[
        Literal["srun", "torchrun"],
        Meta(description="run_slurm.sh only: srun (one task per process) or torchrun (one per node)."),
    ] = "srun"
    bind: Annotated[
        Literal["none", "auto", "cores", "numa"],
        Meta(
            description="Bind each rank to cores of its own: cores (split evenly), numa (on its GPU's NUMA node), "
            "auto (where the node tells, else unbound, said once), none. srun mode through srun --cpu-bind; "
            "launch_multi_node.sh and slurmgen launch from the node's topology."
        ),
    ] = "none"
    container: Container | None = None
    output_dir: Annotated[str, Meta(description="Where the scripts and job.yaml are written.")] = "out"
    log_dir: Annotated[str | None, Meta(description="Job logs; default OUTPUT_DIR/logs.")] = None
    requeue: Annotated[
        bool | None,
        Meta(
            description="true: checkpoint and requeue on the time-limit warning (preempt_signal, sent signal_lead "
            "seconds before the end); false: never requeued, by Slurm or the trainer (--no-requeue); unset: the "
            "cluster's default (JobRequeue) decides."
        ),
    ] = None
    signal_lead: Annotated[
        int, Meta(ge=1, le=65535, description="Seconds before the time limit that preempt_signal arrives.")
    ] = 120
    preempt_signal: Annotated[
        Literal["USR2", "USR1"],
        Meta(
            description="The signal Slurm sends before the time limit (USR2: NCCL may use USR1); the trainer is told."
        ),
    ] = "USR2"
    command: Annotated[
        list[str],
        Meta(
            description="The program every process runs; in a sweep, {task} and {sweep.KEY} in it are filled per array "
            "task."
        ),
    ] = msgspec.field(default_factory=lambda: list(DEFAULT_COMMAND))
    array: Annotated[
        str | None, Meta(description="sbatch --array, e.g. 0-15%4; with a sweep only %N (a cap on tasks at once).")
    ] = None
    sweep: Annotated[
        dict[str, list[SweepValue]] | list[dict[str, SweepValue]] | None,
        Meta(description="Parameters: a grid {key: [values]} or a list of points; one array task per point."),
    ] = None
    sweep_args: Annotated[
        str | None,
        Meta(
            description="How each parameter is appended to the command, default '--{key} {value}'; {key} and {value} "
            "are replaced per word."
        ),
    ] = None
    # Jobs that heal (run_slurm.sh; see slurmgen/heal/).
    heartbeat_timeout: Annotated[
        Annotated[float, Meta(gt=0, le=86_400)] | None,
        Meta(description="Stop the job step when a rank's heartbeat file is older than this many seconds."),
    ] = None
    hang_factor: Annotated[
        float,
        Meta(
            ge=0,
            le=1000,
            description="With heartbeat_timeout: each rank also learns a timeout from its own step times, its "
            "heartbeat period + max(hang_floor, hang_factor x p99 step time), the fixed one staying the ceiling (0: "
            "off).",
        ),
    ] = hangs.DEFAULT_FACTOR
    hang_floor: Annotated[
        float, Meta(ge=0, le=86_400, description="Seconds below which a learned hang timeout never goes.")
    ] = hangs.DEFAULT_FLOOR
    retries: Annotated[
        int, Meta(ge=0, le=100, description="Requeue the job after a failure with a retry_on code, up to N times.")
    ] = 0
    retry_on: Annotated[
        list[int], Meta(description="Exit codes worth another attempt (a requeue, an in-job restart), e.g. [1, 124].")
    ] = msgspec.field(default_factory=list)
    exclude_failed_node: Annotated[
        bool, Meta(description="Exclude the node where the failure started before requeueing.")
    ] = False
    restarts: Annotated[
        int,
        Meta(
            ge=0,
            le=100,
            description="In-job restarts: after a failure another attempt would not repeat (a crashed or hung rank, a "
            "lost node), start a new job step in the same allocation, up to N times in all, before any requeue "
            "(retries); the program resumes from its latest checkpoint.",
        ),
    ] = 0
    spare_nodes: Annotated[
        int,
        Meta(
            ge=0,
            le=_MAX_NODES,
            description="Hot spare nodes: the job asks for nodes + K with --no-kill and runs on nodes; at an in-job "
            "restart a spare takes the place (the node rank) of the node where the failure started.",
        ),
    ] = 0
    min_nodes: Annotated[
        Annotated[int, Meta(ge=1, le=_MAX_NODES)] | None,
        Meta(
            description="A smaller world: at an in-job restart after a node is lost with no spare left, go on with "
            "the nodes still healthy while there are at least M of them (ranks stay dense, the world size follows); "
            "below M, a requeue (retries) or the end. Unset: never fewer than nodes.",
        ),
    ] = None
    restart_mode: Annotated[
        Literal["cold", "warm"],  # contract.warm.RESTART_MODES (a test keeps them equal)
        Meta(
            description="How an in-job restart (restarts) goes on after a rank fails: cold, a new job step of every "
            "rank; warm, the healthy ranks keep their processes and the failed rank alone starts anew "
            "(contract/warm.py: the bundled trainer, or a program using slurmgen.train.warm; launcher srun).",
        ),
    ] = "cold"
    preflight: Annotated[bool, Meta(description="Run `slurmgen doctor` on every node before the job step.")] = False
    chain: Annotated[
        int,
        Meta(
            ge=1,
            le=1000,
            description="Links of a run longer than the time limit: `submit` sbatches this many jobs, each resuming "
            "the last one's checkpoint; 1: no chain.",
        ),
    ] = 1

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
        return _without_none(msgspec.to_builtins(self))

    def digest(self) -> str:
        """A short, stable fingerprint of the resolved spec, printed in every script header."""
        canonical = json.dumps(self.resolved(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def json_schema() -> dict:
    """The spec's JSON schema (`slurmgen schema`, the reference page), JobSpec's fields at its top."""
    schema = msgspec.json.schema(JobSpec)
    definitions = schema.pop("$defs")
    for model in (JobSpec, Container):  # the same text from every msgspec: choices as declared, null last
        for name, prop in definitions[model.__name__]["properties"].items():
            if "enum" in prop:
                prop["enum"] = list(choices(model, name))
            prop.get("anyOf", []).sort(key=lambda option: option.get("type") == "null")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **definitions.pop("JobSpec"),
        "$defs": definitions,
    }


@cache
def fields(model: type[Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A struct's fields by name, in order (msgspec resolves the type hints anew at every call)."""
    return {info.name: info for info in msgspec.structs.fields(model)}


def field_type(model: type[Struct], name: str) -> Any:
    """A field's type without its `Meta`: `Literal["USR2", "USR1"]` for preempt_signal."""
    kind = fields(model)[name].type
    while getattr(kind, "__metadata__", None) is not None:  # Annotated[T, Meta(...)]
        kind = get_args(kind)[0]
    return kind


def choices(model: type[Struct], name: str) -> tuple[str, ...]:
    """The words a choice field accepts, in the order the spec lists them."""
    return get_args(field_type(model, name))


def default(model: type[Struct], name: str) -> Any:
    """A field's default value."""
    info = fields(model)[name]
    return info.default_factory() if info.default is msgspec.NODEFAULT else info.default


# ---- the rules beyond each field's type ---------------------------------------------------------
Rule = Callable[[Any], Any]


@dataclass
class Rules:
    """The checks of one struct beyond its types, in the order they run (see the module's docstring)."""

    before: dict[str, list[Rule]] = field(default_factory=lambda: defaultdict(list))
    after: dict[str, list[Rule]] = field(default_factory=lambda: defaultdict(list))
    across: list[Callable[[Any], None]] = field(default_factory=list)


RULES: dict[type[Struct], Rules] = {Container: Rules(), JobSpec: Rules()}


def before(model: type[Struct], *names: str) -> Callable[[Rule], Rule]:
    """Register a rule that takes the value as written and returns it ready for the field's type."""

    def register(rule: Rule) -> Rule:
        for name in names:
            RULES[model].before[name].append(rule)
        return rule

    return register


def after(model: type[Struct], *names: str) -> Callable[[Rule], Rule]:
    """Register a rule that checks a value of the field's type and returns it (or a cleaned copy)."""

    def register(rule: Rule) -> Rule:
        for name in names:
            RULES[model].after[name].append(rule)
        return rule

    return register


def across(model: type[Struct]) -> Callable[[Callable[[Any], None]], Callable[[Any], None]]:
    """Register a rule over several fields of a struct whose every field is valid."""

    def register(rule: Callable[[Any], None]) -> Callable[[Any], None]:
        RULES[model].across.append(rule)
        return rule

    return register


@after(Container, "image")
def _image(v: str) -> str:
    _one_line(v, "image")
    if any(c.isspace() for c in v):
        raise ValueError("an image reference has no spaces")
    return v


@after(Container, "mounts")
def _mounts(v: list[str]) -> list[str]:
    for m in v:
        _one_line(m, "a mount")
        if "," in m or ":" not in m:
            raise ValueError(f"mount {m!r} must look like SRC:DST[:FLAGS], without commas")
    return v


# Strict types, as the user wrote them: a number where text is expected is that text
# (`job_name: 2024`, `--lr 3e-4` in a command); a boolean is never a number, nor the reverse.
before(
    JobSpec,
    "job_name",
    "partition",
    "account",
    "qos",
    "constraint",
    "master_addr",
    "output_dir",
    "log_dir",
    "gpu_type",
    "reservation",
    "nodelist",
    "exclude",
)(as_written)


@before(JobSpec, "command")
def _command(v: object) -> object:
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
            raise ValueError(
                f"the first word is the program to run, not an option (got {v[0]!r}); e.g. python train.py --lr 3e-4"
            )
    return v


@before(JobSpec, "command", "setup", "sbatch_extra")
def _words(v: object) -> object:
    return [as_written(item) for item in v] if isinstance(v, list) else as_written(v)


def _no_boolean(kind: str) -> Rule:
    def number(v: object) -> object:
        if isinstance(v, bool):
            raise ValueError(f"expected {kind}, not true/false")
        return v

    return number


before(
    JobSpec,
    "nodes",
    "gpus",
    "cpus_per_task",
    "master_port",
    "signal_lead",
    "retries",
    "restarts",
    "spare_nodes",
    "min_nodes",
)(_no_boolean("a whole number"))
before(JobSpec, "heartbeat_timeout", "hang_floor")(_no_boolean("a number of seconds"))
before(JobSpec, "hang_factor")(_no_boolean("a number"))


# YAML 1.2 (yaml12) reads `exclusive: yes` as text; the words YAML 1.1 and the shell use still mean a boolean.
_BOOLEAN_WORDS = {
    **dict.fromkeys(("true", "t", "yes", "y", "on", "1"), True),
    **dict.fromkeys(("false", "f", "no", "n", "off", "0"), False),
}


@before(JobSpec, "exclusive", "requeue", "exclude_failed_node", "preflight")
def _boolean(v: object) -> object:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        raise ValueError("expected true or false, not a number")
    return _BOOLEAN_WORDS.get(v.strip().lower(), v) if isinstance(v, str) else v


@after(JobSpec, "job_name", "output_dir", "log_dir")
def _single_line(v: str | None) -> str | None:
    return None if v is None else _one_line(v)


@after(JobSpec, "partition", "account", "qos")
def _slurm_name(v: str | None) -> str | None:
    if v is not None and not _NAME.match(v):
        raise ValueError("use letters, digits and _ . + @ : - only")
    return v


@after(JobSpec, "constraint")
def _constraint(v: str | None) -> str | None:
    if v is not None and (_one_line(v, "constraint") and any(c.isspace() for c in v)):
        raise ValueError("a constraint has no spaces (combine features with & or |)")
    return v


@before(JobSpec, "mem")
def _mem(v: object) -> object:
    return v if v is None or isinstance(v, bool) else slurm_values.memory(str(as_written(v)))  # `mem: 0` is an int


@before(JobSpec, "time")
def _time(v: object) -> object:
    if v is None:
        return v
    if isinstance(v, bool):
        raise ValueError("expected a time limit, not true/false")
    text = str(as_written(v))  # YAML reads `time: 90` as an int
    slurm_values.time_limit_seconds(text)
    return text


@before(JobSpec, "mem_per_gpu")
def _mem_per_gpu(v: object) -> object:
    if v is None or isinstance(v, bool):
        return v
    size = slurm_values.memory(str(as_written(v)))
    if int(size.rstrip("KMGT")) == 0:
        raise ValueError("a memory per GPU is above 0; use e.g. 40G (mem: 0 asks for all of a node's memory)")
    return size


@before(JobSpec, "time_min")
def _time_min(v: object) -> object:
    text = _time(v)
    if text is not None and slurm_values.time_limit_seconds(str(text)) is None:
        raise ValueError(f"a shortest time limit is a time, not unlimited; use {slurm_values.TIME_FORMS}")
    return text


@before(JobSpec, "gpus")
def _gpus_with_type(v: object) -> object:
    """`gpus: a100:4` (sbatch's --gpus-per-node form) names the type apart, in gpu_type."""
    kind, sep, count = str(v).rpartition(":") if isinstance(v, str) else ("", "", "")
    if sep and count.strip().isdigit():
        raise ValueError(
            f"give the GPU type apart: gpus: {count.strip()} and gpu_type: {kind.removeprefix('gpu:')} "
            f"(--gpus {count.strip()} --gpu-type {kind.removeprefix('gpu:')})"
        )
    return v


@after(JobSpec, "gpu_type")
def _gpu_type(v: str | None) -> str | None:
    if v is not None and not _GPU_TYPE.match(v):
        raise ValueError("expected a GPU type as the cluster names it, e.g. a100 (letters, digits and _ . + - only)")
    return v


@after(JobSpec, "reservation")
def _reservation(v: str | None) -> str | None:
    if v is not None and not all(_NAME.match(name) for name in v.split(",")):
        raise ValueError("expected reservation names, comma-separated, of letters, digits and _ . + @ : - only")
    return v


@after(JobSpec, "nodelist", "exclude")
def _hostlist(v: str | None) -> str | None:
    if v is not None:
        hosts(v)
    return v


def hosts(expr: str) -> list[str]:
    """The host names of a `nodelist` or `exclude` hostlist; ValueError naming the expected form."""
    try:
        return expand(expr)
    except SlurmgenError as exc:
        raise ValueError(f"expected a Slurm hostlist, e.g. gpu[01-04],gpu07 ({exc})") from None


@after(JobSpec, "master_addr")
def _master_addr(v: str | None) -> str | None:
    if v is not None and not is_host_name(v):
        raise ValueError("expected a host name (letters, digits and _ . - only) or an IP address")
    return v


@after(JobSpec, "sbatch_extra")
def _sbatch_extra(v: list[str]) -> list[str]:
    for line in v:
        _one_line(line, "an #SBATCH option")
        option = line.split("=", 1)[0].split()[0]
        if not option.startswith("-"):
            raise ValueError(f"{line!r} is not an sbatch option (they start with - or --)")
        if option == "--signal":
            raise ValueError(_signal_advice(line))
        if option in MANAGED_SBATCH:
            raise ValueError(f"{option} is written by slurmgen; set {MANAGED_SBATCH[option]} instead")
    return v


def _signal_advice(line: str) -> str:
    """Why sbatch's --signal is refused, and what gives it: `--signal=SIGUSR1@90` (Lightning's
    documented line) becomes the flags and fields that write that very option, with a requeue."""
    m = re.fullmatch(r"--signal[= ](?:[RB]+:)?(?:SIG)?(?P<sig>[A-Z0-9]+)(?:@(?P<lead>\d+))?", line.strip())
    sig = m["sig"] if m and m["sig"] in ("USR1", "USR2") else "USR2"
    lead = f" --signal-lead {m['lead']}" if m and m["lead"] else ""
    field = f", signal_lead: {m['lead']}" if m and m["lead"] else ""
    return (
        f"--signal is written by slurmgen (the rank wrappers and the trainer must know the signal): give "
        f"--requeue --preempt-signal {sig}{lead} (in a spec: requeue: true, preempt_signal: {sig}{field})"
        + ("" if m and m["sig"] == sig else "; preempt_signal is USR2 or USR1")
    )


@after(JobSpec, "setup")
def _setup(v: list[str]) -> list[str]:
    return [line for line in v if line.strip()]


@before(JobSpec, "env")
def _env(v: object) -> object:
    if isinstance(v, dict):
        for key, value in v.items():
            if not isinstance(key, str) or not _ENV_KEY.match(key):
                raise ValueError(f"{key!r} is not a valid variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"{key} is set by the launch scripts; use the spec's fields instead")
            if key in LAUNCH_SETTINGS_ENV:
                raise ValueError(
                    f"{key} is a setting of launch_multi_node.sh, read from the environment "
                    "it is started in; export it there instead"
                )
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ValueError(f"{key}: give a string or a number (got {value!r}); quote 'true' to pass the word")
        return {k: str(as_written(val)) for k, val in v.items()}
    return v


@after(JobSpec, "array")
def _array(v: str | None) -> str | None:
    from slurmgen.contract.grid import ARRAY, LIMIT

    if v is not None and not (ARRAY.match(v) or LIMIT.match(v)):
        raise ValueError("expected sbatch's --array form, e.g. 0-15, 1,3,5-7, 0-15%4, or %4 with a sweep")
    return v


@after(JobSpec, "sweep")
def _sweep(v: Any) -> Any:
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


@after(JobSpec, "sweep_args")
def _sweep_args(v: str | None) -> str | None:
    if v is not None and "{value}" not in _one_line(v, "sweep_args"):
        raise ValueError("must contain {value}, e.g. '--{key} {value}' or '{key}={value}'")
    return v


@before(JobSpec, "retry_on")
def _retry_on(v: object) -> object:
    if isinstance(v, (str, int)) and not isinstance(v, bool):  # "1,124,143" from the CLI, 3 from YAML
        v = [part.strip() for part in str(v).split(",") if part.strip()]
    if isinstance(v, list):
        for code in v:
            if isinstance(code, bool) or not str(code).strip().isdigit() or not 1 <= int(code) <= 255:
                raise ValueError(f"{code!r} is not an exit code: give whole numbers 1-255, comma-separated")
            if int(code) == exitcodes.PREEMPTED:
                raise ValueError(f"{exitcodes.PREEMPTED} means preempted: that job requeues itself (requeue: true)")
            if int(code) in retries.NEVER:  # contract/retries.py: bad input fails the same way again
                raise ValueError(f"{int(code)} is not worth a retry ({exitcodes.describe(int(code))})")
        return sorted({int(code) for code in v})
    return v


@across(JobSpec)
def _array_with_sweep(spec: JobSpec) -> None:
    from slurmgen.contract.grid import LIMIT

    if spec.sweep is not None and spec.array is not None and not LIMIT.match(spec.array):
        raise ValueError(
            f"array: with a sweep, give only %N to cap the tasks running at once; the indices come from "
            f"the sweep (got {spec.array!r})"
        )
    if spec.sweep is None and spec.array is not None and LIMIT.match(spec.array):
        raise ValueError(
            f"array: {spec.array!r} caps a sweep's tasks; without a sweep give indices, e.g. 0-15{spec.array}"
        )


@across(JobSpec)
def _command_placeholders(spec: JobSpec) -> None:
    from slurmgen.contract.grid import placeholder_problem, points

    problem = placeholder_problem(spec.command, points(spec.sweep))
    if problem:
        raise ValueError(problem)


@across(JobSpec)
def _retry_policy(spec: JobSpec) -> None:
    if spec.retries and not spec.retry_on:
        raise ValueError("retries needs retry_on: the exit codes worth another attempt, e.g. 1,124,143")
    if not spec.retries and spec.exclude_failed_node:
        raise ValueError("exclude_failed_node needs retries: N (the most requeues)")
    if not spec.retries and not spec.restarts and spec.retry_on:
        raise ValueError("retry_on needs retries: N (the most requeues) or restarts: N (the most in-job restarts)")


@across(JobSpec)
def _restart_policy(spec: JobSpec) -> None:
    """In-job restarts and spares (templates/run_slurm_restart.sh.j2): a spare is only ever used
    by an in-job restart, as is a smaller world (min_nodes, at most nodes), the allocation is
    nodes + spare_nodes, each restart's rendezvous takes the next port after a given master_port, and a
    warm restart (restart_mode) is an in-job restart under srun."""
    if spec.spare_nodes and not spec.restarts:
        raise ValueError(
            f"spare_nodes: {spec.spare_nodes} spare(s) take a failed node's place at an in-job restart; "
            "give restarts: N"
        )
    refused = min_nodes_refusal(
        spec.min_nodes, spec.nodes, spec.restarts, restart="an in-job restart", give="restarts: N"
    )
    if refused:
        raise ValueError(refused)
    if spec.restart_mode == warm.WARM and not spec.restarts:
        raise ValueError("restart_mode: warm restarts are in-job restarts; give restarts: N (each counts as one)")
    if spec.restart_mode == warm.WARM and spec.launcher == "torchrun":
        raise ValueError(
            "restart_mode: warm needs launcher srun (torchrun's agent stops every worker when one fails); "
            "use launcher: srun, or restart_mode: cold with torchrun"
        )
    if spec.nodes + spec.spare_nodes > _MAX_NODES:
        raise ValueError(
            f"spare_nodes: nodes ({spec.nodes}) + spare_nodes ({spec.spare_nodes}) is more than {_MAX_NODES} nodes"
        )
    if spec.master_port and spec.master_port + spec.restarts > ports.MAX_PORT:
        raise ValueError(
            f"restarts: {spec.restarts} restarts take the ports after master_port {spec.master_port}, "
            f"past {ports.MAX_PORT}"
        )


@across(JobSpec)
def _signal_before_end(spec: JobSpec) -> None:
    limit = slurm_values.time_limit_seconds(spec.time) if spec.time else None
    if spec.requeue and limit is not None and spec.signal_lead >= limit:
        raise ValueError(f"signal_lead ({spec.signal_lead}s) must be shorter than the time limit ({limit}s)")


@across(JobSpec)
def _request_fields(spec: JobSpec) -> None:
    if spec.mem is not None and spec.mem_per_gpu is not None:
        raise ValueError("mem_per_gpu: give mem (per node) or mem_per_gpu, not both: sbatch takes one")
    for name in ("gpu_type", "mem_per_gpu"):
        if getattr(spec, name) is not None and spec.gpu_style == "none":
            raise ValueError(
                f"{name}: this job asks for no GPUs (gpu_request {spec.gpu_request}, backend {spec.backend}); "
                "set gpu_request: gpus-per-node or gres"
            )
    limit = slurm_values.time_limit_seconds(spec.time) if spec.time else None
    least = slurm_values.time_limit_seconds(spec.time_min) if spec.time_min else None
    if least is not None and limit is not None and least > limit:
        raise ValueError(f"time_min: {spec.time_min} is longer than the time limit {spec.time}")
    named = hosts(spec.nodelist) if spec.nodelist else []
    if len(set(named)) > spec.nodes + spec.spare_nodes:
        raise ValueError(
            f"nodelist: {spec.nodelist} names {len(set(named))} nodes, more than nodes: {spec.nodes}"
            + (f" + spare_nodes: {spec.spare_nodes}" if spec.spare_nodes else "")
        )
    both = sorted(set(named) & set(hosts(spec.exclude) if spec.exclude else []))
    if both:
        raise ValueError(f"exclude: {', '.join(both)} is also in nodelist: a node cannot be both")


# ---- chains (submit --chain) ----
before(JobSpec, "chain")(_no_boolean("a whole number"))


@across(JobSpec)
def _chain_needs_a_time_limit(spec: JobSpec) -> None:
    """A chain's links end at the time limit, warned signal_lead seconds before it (the trainer
    checkpoints and exits, the next link resumes): without a limit there is nothing to chain,
    and a link that requeued itself (requeue: true) would run again instead of the next one."""
    if spec.chain == 1:
        return
    limit = slurm_values.time_limit_seconds(spec.time) if spec.time else None
    if limit is None:  # none given, or UNLIMITED
        raise ValueError(f"chain: {spec.chain} links need a time limit (time), at which each link hands on to the next")
    if spec.requeue:
        raise ValueError("chain: the next link resumes the run; requeue: true would run the same link again (drop one)")
    if spec.signal_lead >= limit:
        raise ValueError(f"chain: signal_lead ({spec.signal_lead}s) must be shorter than the time limit ({limit}s)")
