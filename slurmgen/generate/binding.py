"""Which CPUs each rank of a node gets under `bind: cores | numa`, for `slurmgen ranks` to show.

The node itself decides when the job starts (templates/bind_cores.sh.j2's `bind_plan`, in bash,
from the node's `lscpu -p` and the CPUs it may use): this is the same rule in Python, applied to
a topology given as that command's output, so a plan can be seen before the job runs.
tests/unit/generate/test_binding.py runs both on the same topologies and holds them equal. Pure,
but for `here` and `plan_here`, which read this machine's topology.

cores: the cores in lscpu's order, split evenly (whole cores, never shared; the rest unused);
numa: the NUMA nodes in order, rank r on node `r * nodes // ranks` (the GPU's node where
nvidia-smi tells, which only the node knows), each node's cores split evenly among its ranks.
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
    """`plan` on this machine's topology, `auto` as the node does it (numa, else unbound)."""
    planned = plan(read_lscpu(here()), ranks, "numa" if mode == "auto" else mode)
    return "unbound (" + planned + ")" if mode == "auto" and isinstance(planned, str) else planned


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
