"""How was this process started? One pure function turns an environment into a frozen answer.

`detect(environ, flags, cuda_count)` reads nothing but its arguments, so every launcher we
support is a row in a unit-test table instead of a guess tested on a cluster. No torch here:
the caller passes `cuda_count` (and the CLI can use this module before paying for torch).

Precedence, first match wins:

1. manual flags   `--rank R --world-size W [--master-addr A --master-port P]`
2. env://         RANK and WORLD_SIZE set (torchrun, our generated scripts, launch_multi_node.sh,
                  the trainer's own `--nproc-per-node` children). NODE_RANK is ours; plain
                  torchrun calls it GROUP_RANK.
3. plain srun     SLURM_PROCID and SLURM_NTASKS set by `srun` without the torchrun contract;
                  MASTER_ADDR/PORT from the environment, else the first host of the step's
                  nodelist and a port derived from the job id (`contract.ports.job_port`).
4. single process when nothing is set.

Classic mistakes become `EnvError` with one line naming the variable and its value:
RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, LOCAL_RANK >= visible GPUs, a missing
MASTER_ADDR in a multi-process run, a non-integer rank variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from slurmgen.contract import envvars
from slurmgen.contract.backends import BACKENDS, DEFAULT_BACKEND
from slurmgen.contract.ports import DEFAULT_MASTER_PORT, job_port

from .flags import count, flag

# A trainer started directly in the batch script sees SLURM_PROCID=0 and the job's
# SLURM_NTASKS (seen on Slurm 22.05) but no SLURM_STEP_ID, which srun sets for every task.
# Taking that for srun would wait for ranks that were never started. Some versions give the
# batch step an id: its number or "batch".
_SLURM_BATCH_STEP = {"", "4294967294", "batch"}


class EnvError(ValueError):
    """The environment describes an impossible or incomplete distributed job."""


@dataclass(frozen=True)
class LaunchFlags:
    """The command-line flags that can override the environment (None = not given), and how
    many processes to start when nothing else started them. --backend is TrainConfig's flag."""

    rank: int | None = flag(None, "manual launch: this process's global rank", type=count(0))
    world_size: int | None = flag(None, "manual launch: number of processes", type=count(1))
    local_rank: int | None = flag(None, "this process's rank on its node (default: $LOCAL_RANK)", type=count(0))
    master_addr: str | None = flag(None, "address of rank 0 (default: $MASTER_ADDR)")
    master_port: int | None = flag(None, "port of rank 0 (default: $MASTER_PORT)", type=count(1))
    backend: str = DEFAULT_BACKEND
    nproc_per_node: int = flag(1, "with no launcher: start N processes on this machine", type=count(1))


@dataclass(frozen=True)
class DistEnv:
    """Everything a rank needs to know about its place in the job. Rank 0 logs it."""

    rank: int
    local_rank: int
    node_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    backend: str  # resolved: "nccl" or "gloo"
    device: str  # "cpu" or "cuda:N"
    launcher: str  # torchrun | env | spawn | srun | manual | single
    note: str = ""  # something rank 0 should warn about (e.g. started in a batch shell)

    @property
    def distributed(self) -> bool:
        """A process group is needed only when there is somebody to talk to."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items() if k != "note")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (`gpu[07-09,11],cpu1` -> `gpu07`), zero padding kept.

    Only the first host is needed here, so this stays a few lines instead of depending on the
    generator's full expander (the trainer must run on nodes that only have the trainer).
    """
    text, depth = nodelist.strip(), 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            text = text[:i]
            break
    host = re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], text)
    if not host or "[" in host or "]" in host:
        raise EnvError(f"cannot read a host from the Slurm nodelist {nodelist!r}")
    return host


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Slurm's compressed SLURM_STEP_TASKS_PER_NODE (`2(x3),1`): how many tasks node_id runs."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise EnvError(f"cannot read SLURM_STEP_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise EnvError(
            f"SLURM_NODEID={node_id} but SLURM_STEP_TASKS_PER_NODE={tasks_per_node!r} lists {len(counts)} nodes"
        )
    return counts[node_id]


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name} must be an integer (got {raw!r})") from None


def resolve_backend(requested: str, cuda_count: int) -> tuple[str, str]:
    """(backend, device kind). auto = nccl when a GPU is visible, else gloo."""
    if requested not in BACKENDS:
        raise EnvError(f"backend must be one of {', '.join(BACKENDS)} (got {requested!r})")
    if requested == "nccl" and cuda_count == 0:
        raise EnvError("backend nccl needs a CUDA GPU and none is visible (use --backend gloo)")
    backend = requested if requested != "auto" else ("nccl" if cuda_count > 0 else "gloo")
    return backend, ("cuda" if cuda_count > 0 else "cpu")


def detect(environ: Mapping[str, str], flags: LaunchFlags, cuda_count: int) -> DistEnv:
    """The one place that decides rank, world and master. Pure: same inputs, same answer."""
    found = _launched_by(environ, flags)
    _check_numbers(found.rank, found.world, found.local_rank, found.local_world, found.node_rank, found.port)
    backend, kind = resolve_backend(flags.backend, cuda_count)
    return DistEnv(
        rank=found.rank,
        local_rank=found.local_rank,
        node_rank=found.node_rank,
        world_size=found.world,
        local_world_size=found.local_world,
        master_addr=found.addr,
        master_port=found.port,
        backend=backend,
        device=_device(kind, found.local_rank, cuda_count, environ),
        launcher=found.launcher,
        note=found.note,
    )


@dataclass(frozen=True)
class _Found:
    """What one kind of launcher tells a process about its place, before the common checks."""

    launcher: str
    rank: int
    world: int
    local_rank: int
    local_world: int
    node_rank: int
    addr: str
    port: int
    note: str = ""


def _launched_by(env: Mapping[str, str], flags: LaunchFlags) -> _Found:
    """The precedence table of the module docstring: first match wins, one reader per kind."""
    if flags.rank is not None or flags.world_size is not None:
        return _manual(env, flags)
    if env.get("RANK", "").strip() and env.get("WORLD_SIZE", "").strip():
        return _env_contract(env, flags)
    if (
        env.get("SLURM_PROCID", "").strip()
        and (env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS"))
        and env.get("SLURM_STEP_ID", "").strip() not in _SLURM_BATCH_STEP
    ):
        return _srun(env, flags)
    return _single(env, flags)


def _manual(env: Mapping[str, str], flags: LaunchFlags) -> _Found:
    """`--rank R --world-size W`: the flags rule, the environment fills in the rest."""
    if flags.rank is None or flags.world_size is None:
        raise EnvError("--rank and --world-size must be given together")
    rank, world = flags.rank, flags.world_size
    local_rank = flags.local_rank if flags.local_rank is not None else _int(env, "LOCAL_RANK", 0)
    assert local_rank is not None  # for type checkers
    local_world = _int(env, "LOCAL_WORLD_SIZE", None) or max(1, local_rank + 1)
    node_rank = _int(env, "NODE_RANK", 0)
    assert node_rank is not None  # for type checkers
    addr = flags.master_addr or env.get("MASTER_ADDR") or ("127.0.0.1" if world == 1 else None)
    if addr is None:
        raise EnvError(f"--master-addr is needed with --world-size {world} (or set MASTER_ADDR)")
    port = flags.master_port or _int(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    assert port is not None  # for type checkers
    return _Found("manual", rank, world, local_rank, local_world, node_rank, addr, port)


def _env_contract(env: Mapping[str, str], flags: LaunchFlags) -> _Found:
    """env:// (RANK and WORLD_SIZE set): torchrun, our scripts, or the trainer's own children.
    NODE_RANK is ours, GROUP_RANK plain torchrun's; without either it follows from the rank."""
    if env.get("TORCHELASTIC_RUN_ID"):
        launcher = "torchrun"
    elif env.get(envvars.TRAIN_SPAWNED):
        launcher = "spawn"
    else:
        launcher = "env"
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    assert rank is not None and world is not None  # for type checkers: both are set (see above)
    local_rank: int | None
    if flags.local_rank is not None:
        local_rank = flags.local_rank
    else:
        local_rank = _int(env, "LOCAL_RANK", 0 if world == 1 else None)
    if local_rank is None:
        raise EnvError(f"RANK={rank} and WORLD_SIZE={world} are set but LOCAL_RANK is not")
    local_world = _int(env, "LOCAL_WORLD_SIZE", None) or world
    node_rank = _int(env, "NODE_RANK", None)
    if node_rank is None:
        node_rank = _int(env, "GROUP_RANK", None)
    if node_rank is None:
        node_rank = rank // local_world
    addr = flags.master_addr or env.get("MASTER_ADDR", "").strip()
    port = flags.master_port or _int(env, "MASTER_PORT", None)
    if world > 1 and not addr:
        raise EnvError(f"MASTER_ADDR is not set but WORLD_SIZE={world} needs a master to meet at")
    if world > 1 and port is None:
        raise EnvError(f"MASTER_PORT is not set but WORLD_SIZE={world} needs a master to meet at")
    return _Found(
        launcher, rank, world, local_rank, local_world, node_rank, addr or "127.0.0.1", port or DEFAULT_MASTER_PORT
    )


def _srun(env: Mapping[str, str], flags: LaunchFlags) -> _Found:
    """Plain srun without the torchrun contract: Slurm's task variables; the master is
    MASTER_ADDR/PORT, else the step's first host and the job's port (`contract.ports.job_port`)."""
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, "SLURM_STEP_NUM_TASKS", None) or _int(env, "SLURM_NTASKS")
    assert rank is not None and world is not None  # for type checkers: `_launched_by` saw both set
    local_rank = flags.local_rank if flags.local_rank is not None else _int(env, "SLURM_LOCALID", 0)
    assert local_rank is not None  # for type checkers
    node_rank = _int(env, "SLURM_NODEID", 0)
    assert node_rank is not None  # for type checkers
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    local_world = tasks_on_node(per_node, node_rank) if per_node else max(1, local_rank + 1)
    addr = flags.master_addr or env.get("MASTER_ADDR", "").strip()
    if not addr:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            if world > 1:
                raise EnvError("srun job without MASTER_ADDR and without SLURM_JOB_NODELIST")
            nodelist = "127.0.0.1"
        addr = first_host(nodelist)
    port = flags.master_port or _int(env, "MASTER_PORT", None)
    if port is None:
        job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
        port = job_port(job) if job else DEFAULT_MASTER_PORT
    return _Found("srun", rank, world, local_rank, local_world, node_rank, addr, port)


def _single(env: Mapping[str, str], flags: LaunchFlags) -> _Found:
    """Nothing set: one process. Started in a multi-task job's batch shell instead of by srun,
    it still runs alone, with a note for rank 0 to warn about."""
    note = ""
    tasks = env.get("SLURM_NTASKS", "").strip()
    if env.get("SLURM_PROCID", "").strip() and tasks not in ("", "1"):
        note = (
            f"started in the batch script of a job with SLURM_NTASKS={tasks}, not by srun: running ONE "
            "process; start the trainer with srun (or a slurmgen script) to use every task"
        )
    addr = flags.master_addr or env.get("MASTER_ADDR") or "127.0.0.1"
    port = flags.master_port or _int(env, "MASTER_PORT", DEFAULT_MASTER_PORT)
    assert port is not None  # for type checkers
    return _Found("single", 0, 1, 0, 1, 0, addr, port, note)


def _device(kind: str, local_rank: int, cuda_count: int, environ: Mapping[str, str]) -> str:
    """cpu, or this rank's GPU: one process per visible GPU at most."""
    if kind != "cuda":
        return "cpu"
    if local_rank >= cuda_count:
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise EnvError(
            f"LOCAL_RANK={local_rank} but only {cuda_count} GPU(s) are visible{shown}: "
            "start at most one process per GPU on each node"
        )
    return f"cuda:{local_rank}"


def _check_numbers(rank: int, world: int, local_rank: int, local_world: int, node_rank: int, port: int) -> None:
    if world < 1:
        raise EnvError(f"WORLD_SIZE must be at least 1 (got {world})")
    if not 0 <= rank < world:
        raise EnvError(f"RANK={rank} is not below WORLD_SIZE={world}: the ranks disagree on the world size")
    if not 0 <= local_rank < local_world:
        raise EnvError(f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}")
    if local_world > world:
        raise EnvError(f"LOCAL_WORLD_SIZE={local_world} is larger than WORLD_SIZE={world}")
    if node_rank < 0:
        raise EnvError(f"NODE_RANK must not be negative (got {node_rank})")
    if not 1 <= port <= 65535:
        raise EnvError(f"MASTER_PORT must be between 1 and 65535 (got {port})")
