"""Who is this process in the job, and which run does it write? Pure: reads only its arguments.

Every rank on every node must arrive at the same group, and each rank at the same run after a
requeue or restart, without talking to the others: a tracker that needed a collective to pick
a name would tie the tracking library to torch.distributed and fail exactly when the job is
half up. So the group comes from what the launcher already gave every process alike, first
match wins:

1. `SLURMGEN_GROUP` (the generated scripts and `slurmgen launch` set it);
2. a Slurm array task: `slurm-<array job id>_<task id>`; a Slurm job: `slurm-<job id>`
   (a requeued job keeps its id, so it keeps its group);
3. `SLURMGEN_LAUNCH_ID` (one `slurmgen launch`): `launch-<id>`;
4. torchrun's `TORCHELASTIC_RUN_ID` (its `--rdzv-id`), unless it is the default `none`;
5. several processes with a rendezvous: `rdzv-<MASTER_ADDR>-<MASTER_PORT>`;
6. a single process: `local-<time>-<host>-<pid>` (nobody to agree with).

The run directory is `<root>/<group>/<key>`: key = the job type in rank-0 mode (`main`), and
in per-process mode the job type too when it is the default `node_{n}_rank_{r}`, else the job
type plus `-rank{r}` so that `worker` on eight ranks is still eight runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from slurmgen.contract import envvars

from .errors import TrackingError

MODES = ("rank0", "per-process")
DEFAULT_JOB_TYPE = "node_{node}_rank_{rank}"
_SLUG = re.compile(r"[^A-Za-z0-9_.=+-]+")


def slug(text: str, limit: int = 96) -> str:
    """A path component from any text: unsafe characters become '-', never empty, never '..'."""
    out = _SLUG.sub("-", text).strip("-.") or "run"
    return out[:limit]


@dataclass(frozen=True)
class Place:
    """Where this process sits in the job, as the launcher described it in the environment."""

    rank: int = 0
    local_rank: int = 0
    node_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    backend: str | None = None

    @property
    def nodes(self) -> int:
        return max(1, -(-self.world_size // max(1, self.local_world_size)))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["nodes"] = self.nodes
        return d


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    for name in names:
        raw = (environ.get(name) or "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise TrackingError(name, "must be an integer", raw) from None
    return default


def place_from_env(environ: Mapping[str, str]) -> Place:
    """The torchrun contract (RANK, LOCAL_RANK, ...), else what srun gives each task."""
    rank = _int(environ, "RANK", "SLURM_PROCID", default=0)
    world = _int(environ, "WORLD_SIZE", "SLURM_NTASKS", default=1)
    local_world = _int(environ, "LOCAL_WORLD_SIZE", default=None)
    if local_world is None:  # srun: "4" or "2(x3),1"; the first node's count is good enough here
        m = re.match(r"\s*(\d+)", environ.get("SLURM_NTASKS_PER_NODE", ""))
        local_world = int(m.group(1)) if m else world
    return Place(
        rank=rank or 0,
        local_rank=_int(environ, "LOCAL_RANK", "SLURM_LOCALID", default=0) or 0,
        node_rank=_int(environ, "NODE_RANK", "GROUP_RANK", "SLURM_NODEID", default=0) or 0,
        world_size=world or 1,
        local_world_size=local_world or 1,
        master_addr=environ.get("MASTER_ADDR") or None,
        master_port=_int(environ, "MASTER_PORT"),
        backend=environ.get(envvars.BACKEND) or None,
    )


def default_group(environ: Mapping[str, str], place: Place, host: str, pid: int, now: float | None = None) -> str:
    """The group every process of this job computes alike (the module docstring's order)."""
    if environ.get(envvars.GROUP, "").strip():
        return environ[envvars.GROUP].strip()
    array, task = environ.get("SLURM_ARRAY_JOB_ID", "").strip(), environ.get("SLURM_ARRAY_TASK_ID", "").strip()
    if array and task:
        return f"slurm-{array}_{task}"
    if environ.get("SLURM_JOB_ID", "").strip():
        return f"slurm-{environ['SLURM_JOB_ID'].strip()}"
    if environ.get(envvars.LAUNCH_ID, "").strip():
        return f"launch-{environ[envvars.LAUNCH_ID].strip()}"
    rdzv = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if rdzv and rdzv != "none":
        return f"torchrun-{rdzv}"
    if place.world_size > 1 and place.master_addr:
        return f"rdzv-{place.master_addr}-{place.master_port or 0}"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"local-{stamp}-{host}-{pid}"


def job_type_for(mode: str, place: Place, template: str | None) -> tuple[str, bool]:
    """(job type, whether it is the default per-rank one). `template` may use {rank},
    {local_rank}, {node} and {role} (main on rank 0, worker elsewhere)."""
    if template is None:
        if mode == "rank0":
            return "main", False
        template = DEFAULT_JOB_TYPE
    fields = {
        "rank": place.rank,
        "local_rank": place.local_rank,
        "node": place.node_rank,
        "role": "main" if place.rank == 0 else "worker",
    }
    try:
        value = template.format(**fields)
    except (KeyError, IndexError, ValueError) as exc:
        raise TrackingError(
            "job_type", f"unknown placeholder {exc} (use {{rank}}, {{local_rank}}, {{node}}, {{role}})", template
        ) from None
    return value, template == DEFAULT_JOB_TYPE


def run_key(mode: str, job_type: str, is_default: bool, rank: int) -> str:
    """The run's directory name inside its group directory."""
    if mode == "per-process" and not is_default:
        return slug(f"{job_type}-rank{rank}")
    return slug(job_type)


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise TrackingError("mode", f"must be one of {', '.join(MODES)}", mode)
    return str(mode)
