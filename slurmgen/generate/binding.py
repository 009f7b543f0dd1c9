"""Which CPUs each rank of a node gets under `bind: cores | numa`, for `slurmgen ranks`, `create`
and `--dry-run` to show.

The node itself decides when the job starts (templates/bind_cores.sh.j2's `bind_plan`, in bash,
from the node's `lscpu -p` and the CPUs it may use): this is the same rule in Python, applied to
a topology given as that command's output, so a plan can be seen before the job runs.
tests/unit/generate/test_binding.py runs both on the same topologies and holds them equal. Pure,
but for `here` and `plan_here`, which read this machine's topology.

cores: the cores in lscpu's order, split evenly (whole cores, never shared; the rest unused);
numa: the NUMA nodes in order, rank r on node `r * nodes // ranks` (the GPU's node where
nvidia-smi tells, which only the node knows), each node's cores split evenly among its ranks.

srun mode (`srun_plan`): Slurm binds, not the script. `--cpu-bind=cores` with block distribution
gives each task its own `--cpus-per-task` CPUs' worth of whole cores of the job's CPUs on the
node, socket by socket: `plan` of those cores; `--cpu-bind=ldoms` (numa) widens each task to the NUMA
node(s) of its cores. Which cores the job holds on a node is Slurm's choice when it starts: shown
for a job holding the node's first cores. torchrun mode (`task_plan`): run_slurm.sh's task on a
node, before its agent starts, applies bind_cores.sh.j2's rule within the CPUs Slurm gave it (its
`--cpus-per-task`, the ranks' together), and each worker binds itself by LOCAL_RANK.
tests/integration/test_bind_slurm.py holds these to the CPUs each rank reads on the test cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LSCPU = ["lscpu", "-p=CPU,CORE,SOCKET,NODE"]  # the command both read


@dataclass(frozen=True)
class Core:
    node: int  # NUMA node
    cpus: tuple[int, ...]  # its hardware threads


def read_lscpu(text: str, allowed: set[int] | None = None) -> list[Core]:
    """`lscpu -p=CPU,CORE,SOCKET,NODE` to cores in order of first appearance, keeping the CPUs in
    `allowed` (a node's Cpus_allowed_list; None: all)."""
    cpus: dict[str, list[int]] = {}
    nodes: dict[str, int] = {}
    for line in text.splitlines():
        cells = line.strip().split(",")
        if len(cells) < 4 or not cells[0].isdigit() or (allowed is not None and int(cells[0]) not in allowed):
            continue
        cpu, core, socket, node = cells[:4]
        key = f"{socket or 0}:{core or cpu}"
        cpus.setdefault(key, []).append(int(cpu))
        nodes[key] = int(node or 0)
    return [Core(nodes[key], tuple(found)) for key, found in cpus.items()]


def plan(cores: Sequence[Core], ranks: int, mode: str) -> list[tuple[int, ...]] | str:
    """Each local rank's CPUs, or why the node cannot give them (the words bind_cores.sh.j2 says)."""
    if not cores:
        return "lscpu -p lists none of the CPUs"
    if mode == "cores":
        if len(cores) < ranks:
            return f"{len(cores)} core(s) for {ranks} ranks"
        return _split(cores, ranks)
    nodes = list(dict.fromkeys(c.node for c in cores))
    rank_node = [nodes[r * len(nodes) // ranks] for r in range(ranks)]
    out: list[tuple[int, ...]] = [() for _ in range(ranks)]
    for node in nodes:
        mine = [r for r in range(ranks) if rank_node[r] == node]
        here = [c for c in cores if c.node == node]
        if not mine:
            continue
        if len(here) < len(mine):
            return f"NUMA node {node} has {len(here)} core(s) for {len(mine)} ranks"
        for r, cpus in zip(mine, _split(here, len(mine)), strict=True):
            out[r] = cpus
    return out


def here() -> str:
    """This machine's `lscpu -p` output, or '' where lscpu cannot run."""
    import subprocess

    try:
        return subprocess.run(LSCPU, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def plan_here(ranks: int, mode: str) -> list[tuple[int, ...]] | str:
    """`node_plan` on this machine's topology."""
    return node_plan(read_lscpu(here()), ranks, mode)


def node_plan(cores: Sequence[Core], ranks: int, mode: str) -> list[tuple[int, ...]] | str:
    """`plan`, `auto` as launch_multi_node.sh does it (numa, else unbound)."""
    planned = plan(cores, ranks, "numa" if mode == "auto" else mode)
    return "unbound (" + planned + ")" if mode == "auto" and isinstance(planned, str) else planned


def task_plan(cores: Sequence[Core], ranks: int, mode: str, cpus_per_task: int) -> list[tuple[int, ...]] | str:
    """run_slurm.sh's torchrun mode: `node_plan` within the whole cores of a node's one task,
    `cpus_per_task` CPUs a rank, taken socket by socket as Slurm allocates them (the node's first)."""
    if not cores:
        return node_plan(cores, ranks, mode)
    held = -(-(cpus_per_task * ranks) // len(cores[0].cpus))  # Slurm allocates whole cores (CR_Core)
    return node_plan(sorted(cores, key=lambda core: core.node)[:held], ranks, mode)


def srun_plan(cores: Sequence[Core], ranks: int, mode: str, cpus_per_task: int) -> list[tuple[int, ...]] | str:
    """Each task's CPUs under srun's binding (`bind` cores, auto: --cpu-bind=cores; numa:
    --cpu-bind=ldoms), or why the node cannot hold the job's tasks."""
    if not cores:
        return "lscpu -p lists none of the CPUs"
    per = -(-cpus_per_task // len(cores[0].cpus))  # Slurm allocates whole cores (CR_Core)
    if len(cores) < ranks * per:
        return f"{len(cores)} core(s) for {ranks} tasks of {per} core(s)"
    in_order = sorted(cores, key=lambda core: core.node)  # Slurm counts cores socket by socket
    planned = plan(in_order[: ranks * per], ranks, "cores")
    if mode != "numa" or isinstance(planned, str):
        return planned
    node_of = {cpu: core.node for core in cores for cpu in core.cpus}
    return [
        tuple(cpu for core in cores if core.node in {node_of[c] for c in mine} for cpu in core.cpus) for mine in planned
    ]


def preview(launcher: str, bind: str, ranks: int, cpus_per_task: int | None, topology: str) -> str:
    """What `create` and `--dry-run` say of a job's binding on a node with `topology` (`lscpu -p`
    output), in the launcher's own rule; '' for bind none."""
    if bind == "none":
        return ""
    cores = read_lscpu(topology)
    if launcher == "srun":
        flag = "--cpu-bind=ldoms" if bind == "numa" else "--cpu-bind=cores"
        head = f"bind {bind}: Slurm binds each task (srun {flag}) within the job's CPUs on its node"
        planned = srun_plan(cores, ranks, bind, cpus_per_task or 1)
        where = "on a node like this machine, the job holding its first cores"
    else:
        head = f"bind {bind}: run_slurm.sh's task on each node binds each worker from the node's lscpu -p when it"
        head += " starts, within the task's CPUs (launch_multi_node.sh: within the CPUs it may use)"
        planned = task_plan(cores, ranks, bind, cpus_per_task or 1)
        where = "on a node like this machine, the task holding its first cores"
    if isinstance(planned, str):
        return f"{head}; {where}: {planned}"
    return f"{head}; {where}: " + ", ".join(f"local rank {r} CPUs {cpu_list(cpus)}" for r, cpus in enumerate(planned))


def _split(cores: Sequence[Core], ranks: int) -> list[tuple[int, ...]]:
    per = len(cores) // ranks
    return [tuple(cpu for core in cores[r * per : (r + 1) * per] for cpu in core.cpus) for r in range(ranks)]


def cpu_list(cpus: Sequence[int]) -> str:
    """CPUs as a list taskset takes, in ranges: 0-3,8-11."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
