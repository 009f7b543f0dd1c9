"""Check before submit: a request the cluster can never meet is refused, saying what it has.

A job asking for 8 GPUs per node where nodes have 4, more memory than any node has, a feature
no node has, a time above the partition's MaxTime or an account it may not use sits PENDING for
days with a reason people misread. `submit` (unless --no-check) and `slurmgen doctor --slurm`
ask the cluster once (`QUERY`: one fixed shell script, nothing of the user's in it, the job's
script on its stdin for `sbatch --test-only`) and compare (`problems`, pure). A job that only has
to wait is submitted, with when Slurm expects it to start.

Found on the test cluster (Slurm 22.05.8): --test-only refuses GPUs, memory, features and
partitions ("Requested node configuration is not available", which names nothing) but accepts a
time above MaxTime, and any account or QOS where AccountingStorageEnforce does not name them; so
the facts are compared here, and --test-only's word is kept for what they do not explain.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from slurmgen.errors import SlurmgenError
from slurmgen.generate.slurm_values import memory_mb, time_limit_seconds
from slurmgen.jobs import shapes, test_only
from slurmgen.jobs.slurm_runner import Runner

if TYPE_CHECKING:
    from slurmgen.generate.render import Rendered
    from slurmgen.generate.spec import JobSpec

SEP = "@@slurmgen@@"
QUERY = f"""
sinfo -h -N -o '%N|%P|%c|%m|%G|%f' </dev/null || exit 3; echo {SEP}
scontrol show partition -o </dev/null; echo {SEP}
scontrol show config </dev/null | grep -i '^AccountingStorageEnforce'; echo {SEP}
timeout 10 sacctmgr -n -P show assoc user="$(id -un)" format=account,qos </dev/null 2>/dev/null; echo {SEP}
date +%Y-%m-%dT%H:%M:%S; echo {SEP}
sbatch --test-only 2>&1
"""
TIMEOUT = 60.0
_GRES = re.compile(r"^gpu(?::(?P<type>[^:(]+))?:(?P<count>\d+)")
_UNLIMITED = {"UNLIMITED", "INFINITE", "NONE", ""}


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: dict[str | None, int]  # by type (None: untyped), from the node's Gres
    features: frozenset[str]


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool = False
    max_time: int | None = None  # seconds; None: unlimited
    max_nodes: int | None = None
    allow_accounts: frozenset[str] | None = None  # None: ALL
    allow_qos: frozenset[str] | None = None
    nodes: tuple[Node, ...] = ()


@dataclass(frozen=True)
class Facts:
    partitions: dict[str, Partition]
    enforce: frozenset[str] = frozenset()  # AccountingStorageEnforce's words
    accounts: frozenset[str] = frozenset()  # the user's associations
    qos: frozenset[str] = frozenset()
    now: datetime | None = None
    estimate: test_only.Estimate = field(default_factory=test_only.Estimate)


def before_submit(runner: Runner, rendered: Rendered, skip: str) -> str | None:
    """The check every submission makes (`slurmgen submit`, `Job.submit()`): a request the cluster
    can never meet raises, each reason on its line, `skip` named as the way to submit it anyway;
    otherwise the note to say, if any: when Slurm expects a job that has to wait to start, or that
    the cluster could not be asked (not fatal: the check only spares a job that would never start)."""
    from slurmgen.generate.render import SLURM_SCRIPT

    cwd = os.getcwd() if runner.where == "local" else None
    try:
        facts = ask(runner, rendered.files[SLURM_SCRIPT], cwd)
    except (ValueError, SlurmgenError) as exc:
        return f"the request was not checked against the cluster: {exc}"
    found = problems(rendered.spec, facts)
    if found:
        raise SlurmgenError(*found, hint=f"the cluster can never start it; {skip} submits it anyway")
    if facts.estimate.start and shapes.why(facts.estimate, facts.now) != "free now":
        start = facts.estimate.start.isoformat(sep=" ")
        return f"Slurm expects the job to start at {start}: its nodes are busy until then"
    return None


def ask(runner: Runner, script: str, cwd: str | None) -> Facts:
    """The cluster's facts and its --test-only answer for `script`, in one round trip."""
    res = runner.run(["sh", "-c", QUERY], cwd=cwd, stdin=script.encode(), timeout=TIMEOUT)
    parts = res.out.split(SEP + "\n")
    if len(parts) != 6 or not parts[0].strip():
        said = (res.err.strip() or res.out.strip() or f"exit code {res.code}").splitlines()[-1]
        raise ValueError(said)
    sinfo, partitions, enforce, assoc, date, answer = parts
    return parse(sinfo, partitions, enforce, assoc, date, test_only.parse(answer, 0 if "to start at" in answer else 1))


def parse(sinfo: str, partitions: str, enforce: str, assoc: str, date: str, estimate: test_only.Estimate) -> Facts:
    """The query's parts to Facts (pure)."""
    nodes: dict[str, Node] = {}
    members: dict[str, list[str]] = {}
    default = None
    for line in sinfo.splitlines():
        cells = line.strip().split("|")
        if len(cells) != 6:
            continue
        name, part, cpus, mem, gres, features = cells
        default = part.rstrip("*") if part.endswith("*") else default
        nodes[name] = Node(name, _int(cpus), _int(mem), _gpus(gres), _words(features))
        members.setdefault(part.rstrip("*"), []).append(name)
    found = {}
    for line in partitions.splitlines():
        kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "PartitionName" not in kv:
            continue
        name = kv["PartitionName"]
        found[name] = Partition(
            name,
            kv.get("Default") == "YES" or name == default,
            None if kv.get("MaxTime", "").upper() in _UNLIMITED else time_limit_seconds(kv["MaxTime"]),
            None if kv.get("MaxNodes", "").upper() in _UNLIMITED else _int(kv["MaxNodes"]),
            None if kv.get("AllowAccounts", "ALL") == "ALL" else _words(kv["AllowAccounts"]),
            None if kv.get("AllowQos", "ALL") == "ALL" else _words(kv["AllowQos"]),
            tuple(nodes[n] for n in members.get(name, []) if n in nodes),
        )
    rows = [line.split("|") for line in assoc.splitlines() if "|" in line]
    try:
        now = datetime.fromisoformat(date.strip())
    except ValueError:
        now = None
    return Facts(
        found,
        _words(enforce.partition("=")[2].replace(" ", "")),
        frozenset(r[0] for r in rows if r[0]),
        frozenset(q for r in rows for q in r[1].split(",") if q),
        now,
        estimate,
    )


def _int(text: str) -> int:
    digits = re.match(r"\d+", text.strip())
    return int(digits.group()) if digits else 0


def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in text.strip().split(",") if w and w != "(null)")


def _gpus(gres: str) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for item in re.split(r",(?=gpu)", gres.strip()):
        m = _GRES.match(item)
        if m:
            out[m["type"]] = out.get(m["type"], 0) + int(m["count"])
    return out


def problems(spec: JobSpec, facts: Facts) -> list[str]:
    """Every way the request can never be met on this cluster, one line each with what it has
    and the nearest request that fits; then --test-only's refusal if nothing here explains it."""
    parts, found = _partitions(spec, facts)
    if not found:
        names = ", ".join(p.name for p in parts)
        nodes = list({n.name: n for p in parts for n in p.nodes}.values())
        found = [*_limits(spec, parts, names), *_node_needs(spec, nodes, names), *_allowed(spec, facts, parts)]
    if not found and facts.estimate.error:
        found = [f"slurm: sbatch --test-only says the request can never start: {facts.estimate.error}"]
    return found


def _partitions(spec: JobSpec, facts: Facts) -> tuple[list[Partition], list[str]]:
    have = ", ".join(sorted(facts.partitions)) or "none"
    if not spec.partition:
        default = [p for p in facts.partitions.values() if p.default]
        return (
            (default, []) if default else ([], [f"partition: the cluster has no default partition: give one of {have}"])
        )
    asked = [w for w in spec.partition.split(",") if w]
    unknown = [w for w in asked if w not in facts.partitions]
    if unknown:
        return [], [f"partition: the cluster has no partition {unknown[0]!r} (it has: {have})"]
    return [facts.partitions[w] for w in asked], []


def _limits(spec: JobSpec, parts: list[Partition], names: str) -> list[str]:
    out = []
    limit = time_limit_seconds(spec.time) if spec.time else None
    longest = None if any(p.max_time is None for p in parts) else max(p.max_time or 0 for p in parts)
    if limit is not None and longest is not None and limit > longest:
        out.append(
            f"time: partition {names} allows at most {clock_time(longest)} (asked {spec.time}); "
            f"fits: --time {clock_time(longest)}, with --chain K for a longer run"
        )
    widest = None if any(p.max_nodes is None for p in parts) else max(p.max_nodes or 0 for p in parts)
    if widest is not None and spec.nodes > widest:
        out.append(f"nodes: partition {names} allows at most {widest} nodes a job (asked {spec.nodes})")
    return out


@dataclass(frozen=True)
class _Need:
    """What one node must have for this request."""

    gpus: int
    gpu_type: str | None
    cpus: int
    mem_mb: int
    features: frozenset[str]
    any_feature: bool  # a|b: one of them is enough

    def met_by(self, n: Node) -> bool:
        has = bool(n.features & self.features) if self.any_feature else self.features <= n.features
        return _gpus_of(n, self.gpu_type) >= self.gpus and n.cpus >= self.cpus and n.mem_mb >= self.mem_mb and has


def _need(spec: JobSpec) -> _Need:
    gpus = spec.gpus if spec.gpu_style != "none" else 0
    if spec.mem:
        mem = memory_mb(spec.mem)  # 0: all of the node, which any node has
    else:
        mem = memory_mb(spec.mem_per_gpu) * max(gpus, 1) if spec.mem_per_gpu else 0
    named = frozenset(re.findall(r"[A-Za-z_][\w.-]*", spec.constraint or ""))
    return _Need(gpus, spec.gpu_type, (spec.cpus_per_task or 1) * spec.gpus, mem, named, "|" in (spec.constraint or ""))


def _node_needs(spec: JobSpec, nodes: list[Node], names: str) -> list[str]:
    """GPUs (and their type), CPUs, memory and features per node, then enough nodes meeting all."""
    need, where = _need(spec), f"the nodes of partition {names}"
    out = []
    most = max((_gpus_of(n, need.gpu_type) for n in nodes), default=0)
    if need.gpus and need.gpu_type and not any(need.gpu_type in n.gpus for n in nodes):
        out.append(f"gpu_type: none of {where} has GPUs of type {need.gpu_type!r} ({_gpu_kinds(nodes)})")
    elif need.gpus > most:
        out.append(f"gpus: {where} have at most {most} GPUs (asked {need.gpus} per node){_fewer(spec, nodes, most)}")
    most_cpus = max((n.cpus for n in nodes), default=0)
    if need.cpus > most_cpus:
        out.append(
            f"cpus_per_task: {where} have at most {most_cpus} CPUs (asked {need.cpus} per node: {spec.gpus} "
            f"processes x {spec.cpus_per_task or 1}); fits: --cpus-per-task {max(most_cpus // spec.gpus, 1)}"
        )
    most_mem = max((n.mem_mb for n in nodes), default=0)
    if need.mem_mb > most_mem:
        out.append(
            f"{'mem' if spec.mem else 'mem_per_gpu'}: {where} have at most {most_mem}M of memory "
            f"(asked {need.mem_mb}M per node); fits: "
            + (f"--mem {most_mem}M" if spec.mem else f"--mem-per-gpu {most_mem // max(need.gpus, 1)}M")
        )
    have = frozenset().union(*(n.features for n in nodes))
    missing = sorted(need.features - have)
    if missing and not (need.any_feature and need.features & have):
        out.append(
            f"constraint: none of {where} has feature {', '.join(map(repr, missing))} "
            f"(their features: {', '.join(sorted(have)) or 'none'})"
        )
    fit = sum(need.met_by(n) for n in nodes)
    if not out and fit < spec.nodes:
        out.append(
            f"nodes: partition {names} has {fit} node(s) that fit one node's request (asked {spec.nodes})"
            + (f"; fits: --nodes {fit}" if fit else "")
        )
    return out


def _allowed(spec: JobSpec, facts: Facts, parts: list[Partition]) -> list[str]:
    """The account and QOS: the partition's AllowAccounts/AllowQos, and the user's associations
    where AccountingStorageEnforce makes Slurm hold to them."""
    out = []
    for name, asked, mine, enforced, allowed in (
        ("account", spec.account, facts.accounts, "associations" in facts.enforce, [p.allow_accounts for p in parts]),
        ("qos", spec.qos, facts.qos, bool({"qos", "associations"} & facts.enforce), [p.allow_qos for p in parts]),
    ):
        if not asked:
            continue
        if enforced and facts.accounts and asked not in mine:
            out.append(
                f"{name}: your associations on this cluster have no {name} {asked!r} (yours: {', '.join(sorted(mine))})"
            )
        elif all(a is not None and asked not in a for a in allowed):
            listed = ", ".join(sorted({x for a in allowed for x in a or ()}))
            out.append(f"{name}: the partition allows {name} {listed} only (asked {asked!r})")
    return out


def _gpus_of(node: Node, kind: str | None) -> int:
    return node.gpus.get(kind, 0) if kind else sum(node.gpus.values())


def _gpu_kinds(nodes: list[Node]) -> str:
    kinds = sorted({k for n in nodes for k in n.gpus if k})
    untyped = any(None in n.gpus for n in nodes)
    return (
        "types: " + ", ".join(kinds) + (" and untyped" if untyped else "")
        if kinds
        else "their GPUs are untyped"
        if untyped
        else "they have no GPUs"
    )


def _fewer(spec: JobSpec, nodes: list[Node], most: int) -> str:
    """The same processes on more nodes of fewer GPUs, where the partition has them."""
    world = spec.nodes * spec.gpus
    if most and world % most == 0 and sum(_gpus_of(n, spec.gpu_type) >= most for n in nodes) >= world // most:
        return f"; fits: --nodes {world // most} --gpus {most} (the same {world} processes)"
    return f"; fits: --gpus {most}" if most else ""


def clock_time(seconds: int) -> str:
    """Seconds as Slurm writes a time limit: [D-]HH:MM:SS."""
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
