"""The seed's rank rule for a group, on top of `slurmgen.generate.topology`. Pure.

Master node first; the other nodes in plain alphabetical order of their names (the seed's
table puts gn39 < gn40 < gn7, unlike Slurm's natural order); workers inside a node by numeric
id; LOCAL_RANK from 0 on each node; NODE_RANK by node order. World size defaults to the
group's worker count, a smaller one takes the first ranks, a larger one is refused. The last
`spare_nodes` nodes in that order run nothing: on a restart, a failed or lost node's ranks move to
one of them (`pick_spare`, `on_spares`), keeping every rank and node rank; with `min_nodes` and no
spare left, a restart goes on without them instead (`fewer_nodes_allowed`, `without_nodes`), its
ranks dense over the nodes left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from slurmgen.contract import envvars
from slurmgen.contract.world import min_nodes_refusal
from slurmgen.coordinator.models import GroupConfig, RankOut
from slurmgen.errors import SlurmgenError, show
from slurmgen.generate.topology import Host, order_hosts, rank_table


def default_master(hosts: Iterable[str]) -> str:
    return sorted(hosts)[0]


def plan_ranks(config: GroupConfig, members: Iterable[tuple[str, int]]) -> list[RankOut]:
    """The rank of each member worker `(host, id)` under `config`, its spare nodes left out;
    errors name the field."""
    ordered = _ordered_hosts(config, members)
    table = rank_table(ordered[: len(ordered) - config.spare_nodes], config.world_size)
    return [RankOut(worker=f"{e.host}-{e.slot}", **e.as_dict()) for e in table]


def spare_hosts(config: GroupConfig, members: Iterable[tuple[str, int]]) -> list[str]:
    """The group's spare nodes, in the order they are taken: its last `spare_nodes` in its order."""
    ordered = _ordered_hosts(config, members)
    return [h.name for h in ordered[len(ordered) - config.spare_nodes :]]


def _ordered_hosts(config: GroupConfig, members: Iterable[tuple[str, int]]) -> list[Host]:
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
    if config.spare_nodes >= len(by_host):
        raise SlurmgenError(
            f"spare_nodes: {config.spare_nodes} leaves no node to run on (the group has {len(by_host)})",
            hint="ask for fewer spare nodes than the group's nodes, or move more workers into it",
        )
    refused = min_nodes_refusal(
        config.min_nodes, len(by_host) - config.spare_nodes, config.max_restarts, give="max_restarts (--max-restarts N)"
    )
    if refused:
        spares = "min_nodes counts the nodes that run ranks: the group's nodes but its spares"
        raise SlurmgenError(refused, hint=spares if config.spare_nodes else None)
    hosts = [Host(name, tuple(sorted(ids))) for name, ids in by_host.items()]
    return order_hosts(hosts, master, order="alphabetical")


def on_spares(ranks: list[RankOut], moved: Mapping[str, str], slots: Mapping[str, list[int]]) -> list[RankOut]:
    """`ranks` with each moved node's ranks on its spare (`moved`: node -> the spare that holds
    its node rank now), worker by worker in slot order, so the world, every rank and node rank
    stay as they were; `slots` holds each spare's worker ids."""
    taken: dict[str, list[int]] = {}
    out = []
    for r in ranks:
        host = moved.get(r.host, r.host)
        if host == r.host:
            out.append(r)
            continue
        slot = sorted(slots[host])[len(taken.setdefault(host, []))]
        taken[host].append(slot)
        out.append(r.model_copy(update={"worker": f"{host}-{slot}", "host": host}))
    return out


def pick_spare(
    ranks: list[RankOut],
    host: str,
    spares: list[str],
    slots: Mapping[str, list[int]],
    lost: AbstractSet[str],
    master_addr: str | None = None,
) -> str | None:
    """The first spare whose agent is heard and which has a worker for each of `host`'s ranks;
    None when none fits, when `host` runs no rank of `ranks`, or when it is node 0 and the
    master's address was given (the address names that node: the rendezvous cannot follow)."""
    needed = sum(r.host == host for r in ranks)
    if not needed or (master_addr and any(r.host == host and r.node_rank == 0 for r in ranks)):
        return None
    return next((s for s in spares if s != host and s not in lost and len(slots.get(s, ())) >= needed), None)


def without_nodes(ranks: list[RankOut], dropped: AbstractSet[str]) -> list[RankOut]:
    """`ranks` without the ranks on `dropped` nodes, dense again in the same order (a smaller
    world, GroupConfig.min_nodes): RANK and NODE_RANK renumbered from 0, WORLD_SIZE the ranks
    left; each rank keeps its worker, LOCAL_RANK and LOCAL_WORLD_SIZE."""
    kept = [r for r in ranks if r.host not in dropped]
    nodes = list(dict.fromkeys(r.host for r in kept))
    return [
        r.model_copy(update={"rank": i, "node_rank": nodes.index(r.host), "world_size": len(kept)})
        for i, r in enumerate(kept)
    ]


def fewer_nodes_allowed(
    ranks: list[RankOut], hosts: AbstractSet[str], min_nodes: int | None, master_addr: str | None = None
) -> bool:
    """Whether the attempt after one on `ranks` may go on without `hosts` (failed or lost nodes no
    spare took): with `min_nodes`, while at least that many nodes are left, and not when node 0
    goes while the master's address was given (it names that node: the rendezvous cannot follow)."""
    nodes = {r.host for r in ranks}
    gone = nodes & hosts
    if min_nodes is None or not gone or len(nodes - gone) < min_nodes:
        return False
    return not (master_addr and any(r.host in gone and r.node_rank == 0 for r in ranks))


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
