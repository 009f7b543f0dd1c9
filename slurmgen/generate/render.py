"""Spec -> script text. Pure: no file is read but the packaged templates, none is written.

The Jinja environment quotes every `{{ ... }}` for bash by default (`finalize`), so a
template cannot forget to; deliberate shell code is built here as `ShellCode`. It is
strict: a misspelt variable fails the render instead of becoming an empty string.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import jinja2

from slurmgen import nodelink
from slurmgen.contract import attempts, blame, envvars, exitcodes, hangs, ports, retries, signals, warm
from slurmgen.contract import grid as sweeps
from slurmgen.contract.files import (
    ATTEMPTS_NAME,
    CHAIN_ENDED_NAME,
    CHAIN_JOBS_NAME,
    FINISHED_NAME,
    HEARTBEAT_GLOB,
    HEARTBEAT_NAME,
    LAUNCH_STACK_NAME,
    NCCL_TRACE_NAME,
    STACK_NAME,
    STACKS_NAME,
    TIMELINE_NAME,
    name_parts,
)
from slurmgen.contract.node_events import EVENT_TAG
from slurmgen.contract.version import VERSION as __version__
from slurmgen.generate import template_cache
from slurmgen.generate.shell import ShellCode, always_quoted, quote, sbatch_value, words

if TYPE_CHECKING:  # render_template alone needs no spec (nor msgspec)
    from slurmgen.generate.spec import JobSpec

SLURM_SCRIPT = "run_slurm.sh"
LAUNCH_SCRIPT = "launch_multi_node.sh"
SPEC_FILE = "job.yaml"
_TEMPLATES = {SLURM_SCRIPT: "run_slurm.sh.j2", LAUNCH_SCRIPT: "launch_multi_node.sh.j2"}


# A source checkout run without installing (`python -m slurmgen` in the repository) has the
# templates at the top level, where the wheel's package-dir mapping has not put them yet. They
# win when this slurmgen was imported from a checkout: otherwise a second checkout (a git
# worktree on PYTHONPATH) would render the templates of whichever checkout is installed.
_SOURCE_TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
_FROM_CHECKOUT = (_SOURCE_TEMPLATES.parent / "pyproject.toml").is_file()


def _load_template(name: str) -> str:
    if _FROM_CHECKOUT:
        return (_SOURCE_TEMPLATES / name).read_text()
    return resources.files("slurmgen.templates").joinpath(name).read_text()


_ENV = jinja2.Environment(
    loader=jinja2.FunctionLoader(_load_template),
    undefined=jinja2.StrictUndefined,
    finalize=quote,
    autoescape=False,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["sbatch"] = sbatch_value
_ENV.filters["words"] = words
# The hang watchers' stack request (contract/hangs.py) and the files they read and write
# (contract/files.py), the same in every template that judges.
_ENV.globals.update(
    stack_signal=hangs.STACK_SIGNAL,
    stack_wait_ms=round(hangs.STACK_WAIT * 1000),
    stack_name=STACK_NAME,
    launch_stack_name=LAUNCH_STACK_NAME.split("{rank}"),
    heartbeat_name=HEARTBEAT_NAME,
    heartbeat_glob=ShellCode(HEARTBEAT_GLOB),
)
# Compiled once per user and kept (template_cache.py); each installation or checkout apart.
template_cache.attach(_ENV, str(Path(__file__).resolve().parent))


@dataclass(frozen=True)
class Rendered:
    """The files of one `create`, by name, in the order they are written."""

    files: dict[str, str]
    spec: JobSpec


def _sbatch_options(spec: JobSpec) -> list[ShellCode]:
    """The `--opt=value` strings of the #SBATCH header, in sbatch's own order of importance."""
    per_node_tasks = 1 if spec.launcher == "torchrun" else spec.gpus
    # torchrun runs one task per node that owns the CPUs of all its workers: at least one each, as
    # srun mode's tasks have. Slurm's default of one CPU a task would hold a node's every worker to
    # one CPU wherever Slurm confines steps (cgroups, task/affinity; seen on the test cluster).
    cpus = (spec.cpus_per_task or 1) * spec.gpus if spec.launcher == "torchrun" else spec.cpus_per_task
    typed = f"{spec.gpu_type}:" if spec.gpu_type else ""  # a100:4, gpu:a100:4
    opts: list[tuple[str, object | None]] = [
        ("--job-name", spec.job_name),
        ("--nodes", spec.nodes + spec.spare_nodes),  # the spares idle until a restart needs one
        ("--ntasks-per-node", per_node_tasks),
        ("--cpus-per-task", cpus),
        ("--gpus-per-node", f"{typed}{spec.gpus}" if spec.gpu_style == "gpus-per-node" else None),
        ("--gres", f"gpu:{typed}{spec.gpus}" if spec.gpu_style == "gres" else None),
        ("--mem", spec.mem),
        ("--mem-per-gpu", spec.mem_per_gpu),
        ("--time", spec.time),
        ("--time-min", spec.time_min),
        ("--partition", spec.partition),
        ("--account", spec.account),
        ("--qos", spec.qos),
        ("--reservation", spec.reservation),
        ("--constraint", spec.constraint),
        ("--nodelist", spec.nodelist),
        ("--exclude", spec.exclude),
        ("--array", sweeps.array_option(len(sweeps.points(spec.sweep)), spec.array) if spec.sweep else spec.array),
        # An array task's log is named by the array and its index (%A_%a), as `slurmgen logs ID_N` finds it.
        ("--output", f"{spec.logs}/%x-%A_%a.out" if spec.sweep or spec.array else f"{spec.logs}/%x-%j.out"),
        ("--open-mode", "append"),
    ]
    lines = [ShellCode(f"{k}={sbatch_value(v)}") for k, v in opts if v is not None]
    if spec.exclusive:
        lines.append(ShellCode("--exclusive"))
    if spec.restarts:  # a node's failure ends a step, not the job: the next step runs without it
        lines.append(ShellCode("--no-kill"))
    if spec.requeue:
        lines += [ShellCode("--requeue"), ShellCode(f"--signal={spec.preempt_signal}@{spec.signal_lead}")]
    elif spec.retries:
        lines.append(ShellCode("--requeue"))  # `scontrol requeue` needs a requeueable job
    elif spec.requeue is False:
        # requeue: false means it: not requeued by Slurm either (JobRequeue=1, Slurm's default,
        # would requeue on preemption or node failure, and `scontrol requeue` would be allowed).
        # Unset, the cluster's JobRequeue decides, so PreemptMode=REQUEUE still brings a job back.
        lines.append(ShellCode("--no-requeue"))
    if spec.chain > 1:  # each link's warning before its time limit: the program checkpoints, the next link resumes
        lines.append(ShellCode(f"--signal={spec.preempt_signal}@{spec.signal_lead}"))
    for extra in spec.sbatch_extra:
        key, sep, value = extra.partition("=")
        lines.append(ShellCode(f"{key}={sbatch_value(value)}" if sep else key))
    return lines


def _container_srun_args(spec: JobSpec) -> list[ShellCode]:
    c = spec.container
    if c is None or c.runtime != "pyxis":
        return []
    args = [f"--container-image={c.image}"]
    if c.mounts:
        args.append(f"--container-mounts={','.join(c.mounts)}")
    return [always_quoted(a) for a in args]


# srun binds through Slurm's task plugin. No --gpu-bind=closest: it narrows each task's
# CUDA_VISIBLE_DEVICES to the GPUs near it, and LOCAL_RANK would no longer be the device index
# that the torchrun contract (and the bundled trainer's cuda:LOCAL_RANK) rely on; block
# distribution with bound cores already puts consecutive local ranks on consecutive cores.
_SRUN_BIND = {
    "none": [],
    "auto": ["--cpu-bind=cores"],  # Slurm binds where its task plugin can, else leaves the task unbound
    "cores": ["--cpu-bind=cores"],
    "numa": ["--cpu-bind=ldoms", "--mem-bind=local"],
}


def _srun_bind_args(spec: JobSpec) -> list[ShellCode]:
    """srun's binding options, in srun mode only: a torchrun agent's task holds all of a node's ranks."""
    return [ShellCode(a) for a in _SRUN_BIND[spec.bind]] if spec.launcher == "srun" else []


def _container_prefix(spec: JobSpec) -> list[str]:
    """`apptainer exec ...` words put before each process's command (empty for pyxis/none)."""
    c = spec.container
    if c is None or c.runtime != "apptainer":
        return []
    prefix = ["apptainer", "exec"]
    if spec.backend != "gloo":
        prefix.append("--nv")  # expose the host's NVIDIA driver and GPUs
    for mount in c.mounts:
        prefix += ["--bind", mount]
    return [*prefix, c.image]


_PYTHON = warm.PYTHON


def runs_python(spec: JobSpec) -> bool:
    """Is the program a Python interpreter (python, python3.11, /opt/venv/bin/python)?

    Then torchrun mode runs that interpreter's `-m torch.distributed.run`: the torch the
    program imports, found without the venv on PATH. Not under apptainer, whose interpreter
    lives in the image while the agent runs outside it.
    """
    apptainer = spec.container is not None and spec.container.runtime == "apptainer"
    return not apptainer and bool(_PYTHON.match(PurePosixPath(spec.command[0]).name))


# How long an in-job restart waits for each node of the job to run `true` (in parallel) before it
# counts the node as lost: a node whose slurmd died is not marked by Slurm before SlurmdTimeout;
# and how long srun has to end after its step's first failure, every node of the step answering,
# before it is stopped (it waits for every node's report; a node that does not answer stops it at once).
_PROBE_SECONDS = 5
_STEP_GRACE = 10


def _heal(spec: JobSpec) -> dict[str, object]:
    """What both scripts need for hang detection, and run_slurm.sh for the retry policy and the
    attempts record."""
    heartbeat_ms = round(spec.heartbeat_timeout * 1000) if spec.heartbeat_timeout else 0
    return {
        "log_dir": spec.logs.rstrip("/") or ".",
        "attempts_name": name_parts(ATTEMPTS_NAME),
        "finished_name": name_parts(FINISHED_NAME),
        "timeline_name": name_parts(TIMELINE_NAME),
        "stacks_name": name_parts(STACKS_NAME),
        "nccl_trace_name": name_parts(NCCL_TRACE_NAME),
        "timeline_var": envvars.TIMELINE_FILE,
        "hang_factor_var": envvars.HANG_FACTOR,
        "hang_floor_var": envvars.HANG_FLOOR,
        "heartbeat_ms": heartbeat_ms,
        "defer_ms": blame.defer_ms(heartbeat_ms),
        "retries": spec.retries,
        "retry_codes": ShellCode(" ".join(str(code) for code in spec.retry_on)),
        "exclude_failed_node": spec.exclude_failed_node,
        "restarts": spec.restarts,
        "spare_nodes": spec.spare_nodes,
        "min_nodes": spec.min_nodes or spec.nodes,  # the fewest nodes a step may have (a smaller world)
        # warm restarts (templates/run_slurm_warm.sh.j2): the protocol's names and its settle time
        "warm": spec.restart_mode == warm.WARM,
        "warm_dir_var": envvars.WARM_DIR,
        "warm_base_var": envvars.WARM_BASE,
        "warm_generation_var": envvars.WARM_GENERATION,
        "warm_world": warm.WORLD_NAME,
        "warm_settle_us": round(warm.SETTLE * 1_000_000),
        "warm_waiting": warm.WAITING,
        "lost": exitcodes.LOST,
        "max_port": ports.MAX_PORT,
        "never": ShellCode(" ".join(str(code) for code in sorted(retries.NEVER))),
        "restart_port_stride": ports.RESTART_PORT_STRIDE,
        "probe_seconds": _PROBE_SECONDS,
        "step_grace": _STEP_GRACE,
        "ok": exitcodes.OK,
        "hung": exitcodes.HUNG,
        "first_attempt": attempts.FIRST,
    }


def _chain(spec: JobSpec) -> dict[str, object] | None:
    """run_slurm.sh's part in a chain (`submit --chain`, templates/run_slurm_chain.sh.j2): its
    files, and the codes after which it goes on (contract/retries.py's rule, plus the
    checkpoint before the time limit); None without a chain."""
    if spec.chain == 1:
        return None
    return {
        "links": spec.chain,
        "var": ShellCode(envvars.CHAIN),
        "jobs_name": name_parts(CHAIN_JOBS_NAME),
        "ended_name": name_parts(CHAIN_ENDED_NAME),
        "preempted": exitcodes.PREEMPTED,
        "never": ShellCode(" ".join(str(code) for code in sorted(retries.NEVER))),
        "retry_codes": ShellCode(" ".join(str(code) for code in spec.retry_on)),
    }


def context(spec: JobSpec) -> dict[str, object]:
    """Everything the templates see. Values are plain data; only ShellCode skips quoting."""
    out = spec.output_dir.rstrip("/") or "."
    return {
        "version": __version__,
        "digest": spec.digest(),
        "spec_path": f"{out}/{SPEC_FILE}",
        "slurm_script": f"{out}/{SLURM_SCRIPT}",
        "launch_script": f"{out}/{LAUNCH_SCRIPT}",
        "spec": spec,
        "sbatch_options": _sbatch_options(spec),
        "setup": [ShellCode(line) for line in spec.setup],
        "env": sorted(spec.env.items()),
        "nccl": spec.backend != "gloo",
        "command": [*_container_prefix(spec), *spec.command],
        "srun_container": _container_srun_args(spec),
        "srun_bind": _srun_bind_args(spec),
        "pyxis": spec.container is not None and spec.container.runtime == "pyxis",
        "manual_port": spec.master_port or ports.DEFAULT_MASTER_PORT,
        "job_port_base": ports.JOB_PORT_BASE,
        "job_port_span": ports.JOB_PORT_SPAN,
        "max_port": ports.MAX_PORT,  # and the node link's port beside MASTER_PORT: ports.link_port
        "event_tag": EVENT_TAG,
        **_sweep(spec),
        "sweep_file": f"{out}/{sweeps.SWEEP_FILE}",
        "torchrun_python": runs_python(spec),
        "warning_signals": ShellCode(" ".join(signals.WARNINGS)),
        "heal": _heal(spec),
        "chain": _chain(spec),
        "warm": _warm(spec),
        **_link_context(),
    }


def _sweep(spec: JobSpec) -> dict[str, object]:
    """Per array task, the words it appends to the command; or, when the command names `{task}`
    or `{sweep.KEY}`, its whole command filled with its own values (`sweep_fills`)."""
    fills = sweeps.has_placeholders(spec.command)
    tasks = []
    for task, point in enumerate(sweeps.points(spec.sweep)):
        args = sweeps.task_words(point, spec.sweep_args or sweeps.DEFAULT_ARGS)
        tasks.append([*_container_prefix(spec), *sweeps.fill(spec.command, point, task), *args] if fills else args)
    return {"sweep": tasks, "sweep_fills": fills}


def _warm(spec: JobSpec) -> dict[str, object]:
    """launch_multi_node.sh's part in a warm restart (contract/warm.py): where the launcher's word
    is, and the order to start a failed rank anew."""
    return {
        "dir_var": ShellCode(envvars.WARM_DIR),
        "generation_var": ShellCode(envvars.WARM_GENERATION),
        "world": warm.WORLD_NAME,
        "start": warm.START_PREFIX,
        # A warm spare process (train/spare.py) needs the program's own Python.
        "spare": runs_python(spec),
        "spare_tag": warm.SPARE_TAG,
    }


def _link_context() -> dict[str, object]:
    """launch_multi_node.sh's link between nodes: the agent's code, and the exit codes both scripts use."""
    return {
        "link_agent": ShellCode(nodelink.source().rstrip("\n")),
        "first_attempt": attempts.FIRST,
        "heredoc_end": nodelink.HEREDOC_END,
        "failed": exitcodes.FAILED,
        "hung": exitcodes.HUNG,
        "bad_input": exitcodes.BAD_INPUT,
        "lost": exitcodes.LOST,
        "interrupted": exitcodes.INTERRUPTED,
        "terminated": exitcodes.TERMINATED,
    }


def render_template(name: str, **values: object) -> str:
    """One template with `values` (quoted for bash like every other rendered value)."""
    return _ENV.get_template(name).render(values)


def launch_script(spec: JobSpec) -> str:
    """launch_multi_node.sh alone, as `render` writes it: what `slurmgen launch` sends to every
    node (neither run_slurm.sh nor job.yaml, whose YAML writer is ~15 ms of imports)."""
    return _ENV.get_template(_TEMPLATES[LAUNCH_SCRIPT]).render(context(spec))


def render(spec: JobSpec) -> Rendered:
    """All files of a `create`: the two scripts, the resolved spec and, for a sweep, its grid."""
    from slurmgen.generate.specfile import dump_yaml

    ctx = context(spec)
    files = {
        SLURM_SCRIPT: _ENV.get_template(_TEMPLATES[SLURM_SCRIPT]).render(ctx),
        LAUNCH_SCRIPT: _ENV.get_template(_TEMPLATES[LAUNCH_SCRIPT]).render(ctx),
        SPEC_FILE: dump_yaml(spec),
    }
    if spec.sweep:
        files[sweeps.SWEEP_FILE] = sweeps.grid_jsonl(sweeps.points(spec.sweep))
    return Rendered(files=files, spec=spec)
