"""A smaller world (`min_nodes`): the one rule of when it can be asked for, and the one wording of
a restart that went on with fewer nodes, for run_slurm.sh's in-job restarts (the spec's
`min_nodes`, read back from the attempts record), `slurmgen launch --min-nodes` and a coordinator
group's `min_nodes`.

A smaller world is only ever reached by a restart (a node lost, no spare left to take its place),
so it needs a restart budget, and it is the fewest nodes the restart may go on with: 1 to the
nodes the job runs on. Each caller names its own restart budget (`restarts: N`, `--max-restarts`).
"""

from __future__ import annotations


def min_nodes_refusal(
    min_nodes: int | None, nodes: int | None, restarts: int, *, restart: str = "a restart", give: str
) -> str | None:
    """Why `min_nodes` cannot be had (None: it can): not 1 to `nodes` (None: not known yet, the
    caller checks again once it is), or no restart (`restarts` of them allowed) to go on with it.
    `restart` is what the caller's restart is called, `give` how it is asked for."""
    if min_nodes is None:
        return None
    if nodes is not None and min_nodes > nodes:
        return f"min_nodes: {min_nodes} is more than nodes ({nodes}); expected 1 to {nodes}"
    if min_nodes < 1:
        expected = f"1 to {nodes}" if nodes is not None else "at least 1"
        return f"min_nodes: {min_nodes} is fewer than 1; expected {expected}"
    if restarts < 1:
        return f"min_nodes: {min_nodes} is the fewest nodes {restart} goes on with; give {give}"
    return None


def fewer_nodes(before: int, after: int, lost: str, min_nodes: int, took: str = "") -> str:
    """A restart on fewer nodes, in words: '2 -> 1 nodes: node2 lost, --min-nodes 1' (`lost`: the
    nodes that dropped out; `took`: the spares that took a place, if any)."""
    spares = f", spare {took} took a place" if took else ""
    return f"{before} -> {after} nodes: {lost} lost{spares}, --min-nodes {min_nodes}"
