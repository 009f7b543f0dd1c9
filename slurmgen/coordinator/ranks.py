"""The seed's rank rule for a group, on top of `slurmgen.generate.topology`. Pure.

Master node first; the other nodes in plain alphabetical order of their names (the seed's
table puts gn39 < gn40 < gn7, unlike Slurm's natural order); workers inside a node by numeric
id; LOCAL_RANK from 0 on each node; NODE_RANK by node order. World size defaults to the
group's worker count, a smaller one takes the first ranks, a larger one is refused.
"""

from __future__ import annotations

from collections.abc import Iterable

from slurmgen.contract import envvars
from slurmgen.coordinator.models import GroupConfig, RankOut
from slurmgen.errors import SlurmgenError, show
from slurmgen.generate.topology import Host, order_hosts, rank_table


def default_master(hosts: Iterable[str]) -> str:
    return sorted(hosts)[0]


def plan_ranks(config: GroupConfig, members: Iterable[tuple[str, int]]) -> list[RankOut]:
    """The rank of each member worker `(host, id)` under `config`; errors name the field."""
    by_host: dict[str, list[int]] = {}
    for host, idx in members:
        by_host.setdefault(host, []).append(idx)
    if not by_host:
        raise SlurmgenError(
            "workers: the group has no workers", hint="move workers into it first (slurmgen group move ... --to GROUP)"
        )
    master = config.master or default_master(by_host)
    if master not in by_host:
        worker_host = master.rpartition("-")[0]
        hint = (
            f"master is a node name: give {show(worker_host)}, not the worker {show(master)}"
            if worker_host in by_host
            else f"the group's nodes are {', '.join(sorted(by_host))}"
        )
        raise SlurmgenError(f"master: {show(master)} is not a node of this group", hint=hint)
    hosts = [Host(name, tuple(sorted(ids))) for name, ids in by_host.items()]
    table = rank_table(order_hosts(hosts, master, order="alphabetical"), config.world_size)
    return [RankOut(worker=f"{e.host}-{e.slot}", **e.as_dict()) for e in table]


def rank_env(config: GroupConfig, group: str, entry: RankOut, master: str) -> dict[str, str]:
    """The environment a rank starts with: the group's env, then the torchrun contract."""
    return {
        **config.env,
        "RANK": str(entry.rank),
        "LOCAL_RANK": str(entry.local_rank),
        "NODE_RANK": str(entry.node_rank),
        "WORLD_SIZE": str(entry.world_size),
        "LOCAL_WORLD_SIZE": str(entry.local_world_size),
        "MASTER_ADDR": config.master_addr or master,
        "MASTER_PORT": str(config.master_port),
        envvars.BACKEND: config.backend,
        envvars.STRATEGY: config.strategy,
        envvars.GROUP: group,
    }
