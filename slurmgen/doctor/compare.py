"""Probe rows -> one mark per node and check, and one line per problem. Pure.

Two kinds of check:
- agreement (python, torch, cuda, nccl, gpus, files): every node must report the same value.
  A node is marked bad when its value is not the most common one (all of them, on a tie), so
  on 8 nodes the odd one out stands out; the problem line lists each value with its nodes.
- per node (master resolves, port reachable, the preemption signal arrives, disk space): each
  node passes or fails alone. A check a node did not run (no MASTER_ADDR given, the signal
  outside Slurm) is "n/a".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmgen.doctor import fabric_verdict

AGREE = ("python", "torch", "cuda", "nccl", "gpus", "files")
PER_NODE = ("master", "port", "signal", "disk")
CHECKS = AGREE + PER_NODE
# `--fabric` (fabric_verdict.py): the hostname's address, the route to the master, NCCL_*/GLOO_*,
# InfiniBand/EFA, the all-reduce against raw TCP.
FABRIC = ("hostname", "route", "net_env", "rdma", "allreduce")
OK, BAD, NA = fabric_verdict.OK, fabric_verdict.BAD, fabric_verdict.NA
Mark = fabric_verdict.Mark


@dataclass(frozen=True)
class Comparison:
    nodes: list[str]
    marks: dict[str, dict[str, Mark]]  # node -> check -> mark
    problems: list[str]
    warnings: list[str] = field(default_factory=list)  # said, but not failing
    checks: tuple[str, ...] = CHECKS  # the table's columns

    @property
    def ok(self) -> bool:
        return not self.problems


def _value(row: Mapping[str, Any], check: str) -> Any:
    if check == "files":
        files = row.get("files") or {}
        return files.get("hash") or f"error: {files.get('error', 'not checked')}"
    if check in fabric_verdict.AGREE:
        return fabric_verdict.agreed_value(row, check)
    return row.get(check)


def _show(value: Any) -> str:
    return "none" if value is None else str(value)


def _agreement(rows: Sequence[Mapping[str, Any]], check: str) -> tuple[dict[str, Mark], str | None]:
    values = {row["node"]: _value(row, check) for row in rows}
    counts = Counter(_show(v) for v in values.values())
    if len(counts) <= 1:
        return {node: Mark(OK, _show(v)) for node, v in values.items()}, None
    top = counts.most_common()
    majority = top[0][0] if top[0][1] > top[1][1] else None
    marks = {node: Mark(OK if _show(v) == majority else BAD, _show(v)) for node, v in values.items()}
    groups = "; ".join(f"{value} on {', '.join(n for n, v in values.items() if _show(v) == value)}" for value, _ in top)
    return marks, f"{check} differs across nodes: {groups}"


def _per_node(row: Mapping[str, Any], check: str) -> tuple[Mark, str | None]:
    result = row.get(check)
    if not result:
        return Mark(NA, "-"), None
    if check == "master":
        ok, text = result.get("ip") is not None, result.get("ip") or "unresolved"
    elif check == "disk":
        ok, text = bool(result.get("ok")), f"{result.get('free_gb')} GB"
    elif check == "signal":
        ok, text = bool(result.get("ok")), result.get("name") or "?"
    else:
        ok = bool(result.get("ok"))
        text = ("ok (listener)" if result.get("listener") else "ok") if ok else fabric_verdict.FAILED
    if ok:
        return Mark(OK, text), None
    return Mark(BAD, text), f"{check} on {row['node']}: {result.get('error') or fabric_verdict.FAILED}"


def compare(rows: Sequence[Mapping[str, Any]], min_share: float = fabric_verdict.MIN_SHARE) -> Comparison:
    """Marks for every node and check, and the problems in check order (agreement first);
    with `--fabric` rows, the network checks after them (`min_share`: see fabric_verdict)."""
    nodes = [row["node"] for row in rows]
    marks: dict[str, dict[str, Mark]] = {node: {} for node in nodes}
    problems: list[str] = [f"{row['node']}: {row['error']}" for row in rows if row.get("error")]
    for check in AGREE:
        by_node, problem = _agreement(rows, check)
        for node, mark in by_node.items():
            marks[node][check] = mark
        if problem:
            problems.append(problem)
    for row in rows:  # a tree that could not be hashed is a problem even where all agree
        error = (row.get("files") or {}).get("error")
        if error:
            marks[row["node"]]["files"] = Mark(BAD, "unreadable")
            problems.append(f"files on {row['node']}: {error}")
    for check in PER_NODE:
        for row in rows:
            mark, problem = _per_node(row, check)
            marks[row["node"]][check] = mark
            if problem:
                problems.append(problem)
    if not any(row.get("fabric") for row in rows):
        return Comparison(nodes, marks, problems)
    for check in fabric_verdict.AGREE:
        by_node, problem = _agreement(rows, check)
        for node, mark in by_node.items():
            marks[node][check] = mark
        if problem:
            problems.append(f"fabric: {problem}")
    found = fabric_verdict.judge(rows, min_share)
    for node, by_check in found.marks.items():
        marks[node].update(by_check)
    return Comparison(nodes, marks, problems + found.problems, found.warnings, CHECKS + FABRIC)
