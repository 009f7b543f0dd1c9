"""The rank table: which process gets which RANK, LOCAL_RANK and NODE_RANK. Pure.

Rules (the same for `slurmgen ranks`, the generated scripts and the SSH launcher):
- the master node comes first, NODE_RANK 0; the other nodes follow in natural order of
  their names (node2 before node10, as Slurm orders SLURM_NODEID, which is why run_slurm.sh
  always follows it), or in plain alphabetical order (gn39 < gn40 < gn7, the product brief's
  rule and the default of `slurmgen ranks`, `launch` and the coordinator) with
  `order="alphabetical"`;
- inside a node, workers (slots, usually GPU indices) are ordered by their numeric id and
  LOCAL_RANK counts from 0;
- RANK = the slots of all nodes before this one + LOCAL_RANK, so nodes may differ in size.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from slurmgen.errors import SlurmgenError, show


@dataclass(frozen=True)
class Host:
    """A node and the ids of the worker slots it offers (GPU indices, usually 0..n-1)."""

    name: str
    slots: tuple[int, ...]

    @classmethod
    def with_count(cls, name: str, count: int) -> Host:
        return cls(name, tuple(range(count)))


@dataclass(frozen=True)
class RankEntry:
    """One process of the job and its identity under the torchrun contract."""

    host: str
    rank: int
    local_rank: int
    node_rank: int
    local_world_size: int
    world_size: int
    slot: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def natural_key(name: str) -> tuple:
    """Sort key that orders embedded numbers by value: gn2 < gn10."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


ORDERS: dict[str, Callable[[str], Any]] = {"natural": natural_key, "alphabetical": str}


def order_hosts(hosts: Sequence[Host], master: str | None = None, order: str = "natural") -> list[Host]:
    """Master first (default: the first host given), then the rest by name in `order`."""
    if order not in ORDERS:
        raise SlurmgenError(f"order: expected {' or '.join(ORDERS)} (got {show(order)})")
    if not hosts:
        raise SlurmgenError("hosts: no hosts given")
    names = [h.name for h in hosts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SlurmgenError(
            f"hosts: {show(dupes[0])} is listed more than once", hint="give each host once, with its slot count"
        )
    master = master if master is not None else hosts[0].name
    if master not in names:
        raise SlurmgenError(f"master: {show(master)} is not one of the hosts {names}")
    key = ORDERS[order]
    rest = sorted((h for h in hosts if h.name != master), key=lambda h: key(h.name))
    return [hosts[names.index(master)], *rest]


def rank_table(ordered: Sequence[Host], world_size: int | None = None) -> list[RankEntry]:
    """Number the workers of hosts already in node order (see `order_hosts`).

    `world_size` smaller than the slots available takes the first workers in rank order;
    nodes left without a worker drop out. Larger is an error naming both numbers.
    """
    available = sum(len(h.slots) for h in ordered)
    wanted = available if world_size is None else world_size
    if wanted < 1:
        raise SlurmgenError(f"world_size: must be at least 1 (got {wanted})")
    if wanted > available:
        raise SlurmgenError(
            f"world_size: {wanted} processes asked for, but the hosts offer only {available} slots",
            hint="add hosts or slots, or ask for fewer processes",
        )
    plan: list[tuple[str, list[int]]] = []
    remaining = wanted
    for host in ordered:
        slots = sorted(host.slots)
        if len(set(slots)) != len(slots) or any(s < 0 for s in slots):
            raise SlurmgenError(f"slots: host {show(host.name)} has bad slot ids {slots}")
        take = slots[:remaining]
        remaining -= len(take)
        if take:
            plan.append((host.name, take))
    table: list[RankEntry] = []
    for node_rank, (name, slots) in enumerate(plan):
        for local_rank, slot in enumerate(slots):
            table.append(
                RankEntry(
                    host=name,
                    rank=len(table),
                    local_rank=local_rank,
                    node_rank=node_rank,
                    local_world_size=len(slots),
                    world_size=wanted,
                    slot=slot,
                )
            )
    return table


def anonymous_hosts(nodes: int, per_node: int) -> list[Host]:
    """`nodes` unnamed nodes of `per_node` workers, already in node order (node0, node1, ...)."""
    if nodes < 1:
        raise SlurmgenError(f"nodes: must be at least 1 (got {nodes})")
    if per_node < 1:
        raise SlurmgenError(f"gpus: must be at least 1 process per node (got {per_node})")
    return [Host.with_count(f"node{i}", per_node) for i in range(nodes)]


def uniform_table(nodes: int, per_node: int) -> list[RankEntry]:
    """The table of a Slurm-style job: `nodes` nodes of `per_node` workers each."""
    return rank_table(anonymous_hosts(nodes, per_node))


def summary(table: Sequence[RankEntry], most: int = 4) -> str:
    """One line for people: `WORLD_SIZE 8; node 0: ranks 0-3; node 1: ranks 4-7`."""
    nodes: dict[int, list[int]] = {}
    for e in table:
        nodes.setdefault(e.node_rank, []).append(e.rank)
    parts = [
        f"node {n}: ranks {r[0]}-{r[-1]}" if len(r) > 1 else f"node {n}: rank {r[0]}"
        for n, r in list(nodes.items())[:most]
    ]
    more = "; ..." if len(nodes) > most else ""
    return f"WORLD_SIZE {len(table)}; " + "; ".join(parts) + more
