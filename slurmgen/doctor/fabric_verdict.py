"""`doctor --fabric` rows -> marks, problems and warnings. Pure (the facts come from fabric.py).

- hostname: a node whose hostname resolves to a loopback address (Debian's default /etc/hosts
  maps it to 127.0.1.1) is misconfigured for a multi-node run: torch users report failed
  rendezvous from it (a process advertising an address no other node reaches). It is named with
  the interface to give GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (the one that routes to the
  master), unless both are set already. Gloo still worked with it on the test cluster, so no
  hang is claimed.
- route: the interface and address this node reaches the master by; none is a problem. An
  interface whose network does not hold the master's address is a warning while
  NCCL_SOCKET_IFNAME is unset (NCCL picks interfaces itself and may pick that one).
- net_env, rdma: agreement across nodes of the NCCL_*/GLOO_* settings and of the transport NCCL
  would use (InfiniBand, EFA through the aws-ofi-nccl plugin, or sockets).
- allreduce: the gloo all-reduce's bus bandwidth against the slowest raw TCP link of the same
  ring in the same run; less than `min_share` of it is a problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OK, BAD, NA = "ok", "bad", "n/a"
FAILED = "failed"  # the text of a check that did not pass (a mark's word, not a run's state)
AGREE = ("net_env", "rdma")
# gloo on CPU reduces in memory between sends: on the test cluster's veth links its bus bandwidth
# was about 60 % of one link's raw TCP throughput, over loopback on a busy machine 8 %. Under 5 %
# something is wrong (a slow path, a wrong interface), whatever the link.
MIN_SHARE = 0.05
IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class Mark:
    state: str  # OK, BAD or NA
    text: str  # what the cell shows


@dataclass
class Found:
    marks: dict[str, dict[str, Mark]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def transport(fab: Mapping[str, Any]) -> str:
    """The network NCCL would use on this node, from its RDMA devices and NCCL_IB_DISABLE."""
    devices = (fab.get("rdma") or {}).get("devices") or []
    if (fab.get("env") or {}).get("NCCL_IB_DISABLE") == "1":
        return "socket (NCCL_IB_DISABLE=1)"
    efa = [d["name"] for d in devices if d.get("efa")]
    if efa:
        return f"EFA {','.join(efa)} (with aws-ofi-nccl)"
    active = [d["name"] for d in devices if d.get("active")]
    if active:
        return f"IB {','.join(active)}"
    return f"socket (IB {','.join(d['name'] for d in devices)} down)" if devices else "socket"


def agreed_value(row: Mapping[str, Any], check: str) -> str | None:
    fab = row.get("fabric")
    if not fab:
        return None
    if check == "rdma":
        return transport(fab)
    return " ".join(f"{k}={v}" for k, v in (fab.get("env") or {}).items()) or "unset"


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"


def _hostname(node: str, fab: Mapping[str, Any], many: bool) -> tuple[Mark, str | None]:
    resolves = fab.get("resolves") or []
    text = ",".join(resolves) or "unresolved"
    route = fab.get("route") or {}
    iface = route.get("iface") or "the interface that routes to the master"
    env = fab.get("env") or {}
    if not resolves:
        return Mark(BAD, text), f"fabric on {node}: its hostname {fab.get('hostname')} does not resolve"
    loop = [a for a in resolves if _loopback(a)]
    if not loop or not many:
        return Mark(OK, text), None
    if all(env.get(v) == route.get("iface") for v in IFNAMES):
        return Mark(OK, f"{text} ({iface} set)"), None
    fix = " ".join(f"{v}={iface}" for v in IFNAMES)
    return Mark(BAD, text), (
        f"fabric on {node}: its hostname {fab.get('hostname')} resolves to {loop[0]}, a loopback address (as "
        f"Debian's default /etc/hosts makes it), a known cause of failed multi-node rendezvous: map it to "
        f"{route.get('addr') or 'its address'} in /etc/hosts, or set {fix}"
    )


def _route(node: str, fab: Mapping[str, Any]) -> tuple[Mark, str | None, list[str]]:
    route = fab.get("route") or {}
    if not fab.get("master"):
        return Mark(NA, "-"), None, []
    if not route.get("addr"):
        return Mark(BAD, "none"), f"fabric on {node}: no route to the master {fab['master']}", []
    iface = route.get("iface") or "?"
    warnings = []
    if not (fab.get("env") or {}).get("NCCL_SOCKET_IFNAME"):
        for other in fab.get("interfaces") or []:
            if other["name"] == iface or _loopback(other["addr"]) or other.get("reaches_master"):
                continue
            warnings.append(
                f"fabric on {node}: interface {other['name']} ({other['addr']}/{other['prefix']}) is not on the "
                f"master's network and NCCL_SOCKET_IFNAME is unset: NCCL may pick it; set "
                f"NCCL_SOCKET_IFNAME={iface} GLOO_SOCKET_IFNAME={iface} (the interface that routes to the master)"
            )
    return Mark(OK, f"{iface} {route['addr']}"), None, warnings


def _bandwidth(rows: Sequence[Mapping[str, Any]], min_share: float, found: Found) -> None:
    """One verdict for the run: the all-reduce's bus bandwidth against the slowest TCP link."""
    probes = {r["node"]: (r.get("fabric") or {}).get("bandwidth") or {} for r in rows}
    errors = [f"fabric bandwidth on {n}: {b['error']}" for n, b in probes.items() if b.get("error")]
    measured = {n: b for n, b in probes.items() if b.get("allreduce")}
    if errors or not measured:
        found.problems += errors
        for node, b in probes.items():
            found.marks[node]["allreduce"] = Mark(BAD, FAILED) if b.get("error") else Mark(NA, "-")
        return
    links = [b["tcp"] for b in measured.values() if (b.get("tcp") or {}).get("gbps")]
    bus = min(b["allreduce"]["bus_gbps"] for b in measured.values())
    slowest = min(links, key=lambda link: link["gbps"]) if links else None
    share = bus / slowest["gbps"] if slowest else 0.0
    wrong = [n for n, b in measured.items() if not b["allreduce"].get("correct")]
    text = f"{bus:g} GB/s, {share:.0%} of TCP {slowest['gbps']:g}" if slowest else f"{bus:g} GB/s, no TCP figure"
    ok = slowest is not None and share >= min_share and not wrong
    for node in probes:
        found.marks[node]["allreduce"] = Mark(OK if ok else BAD, text)
    if wrong:
        found.problems.append(f"fabric: the all-reduce gave wrong sums on {', '.join(wrong)}")
    if slowest is None:
        found.problems.append("fabric: no raw TCP throughput was measured between the nodes")
    elif share < min_share:
        n = next(iter(measured.values()))["nodes"]
        found.problems.append(
            f"fabric: a gloo all-reduce across {n} nodes got {bus:g} GB/s bus bandwidth, {share:.0%} of the slowest "
            f"raw TCP link ({slowest['gbps']:g} GB/s, {slowest['from']} -> {slowest['to']}) measured in the same "
            f"run; want at least {min_share:.0%} (--min-collective-share)"
        )


def judge(rows: Sequence[Mapping[str, Any]], min_share: float = MIN_SHARE) -> Found:
    """The per-node fabric marks (hostname, route) and the run's bandwidth verdict."""
    found = Found(marks={row["node"]: {} for row in rows})
    many = len(rows) > 1
    for row in rows:
        node, fab = row["node"], row.get("fabric")
        if not fab:
            found.marks[node].update(hostname=Mark(NA, "-"), route=Mark(NA, "-"))
            continue
        mark, problem = _hostname(node, fab, many)
        found.marks[node]["hostname"] = mark
        route, route_problem, warnings = _route(node, fab)
        warnings = warnings if many else []  # one node: no peer to pick a wrong interface for
        found.marks[node]["route"] = route
        found.problems += [p for p in (problem, route_problem) if p]
        found.warnings += warnings
    _bandwidth(rows, min_share, found)
    return found
