"""doctor --fabric: the pure verdict on the nodes' network facts (fabric_verdict.py via compare),
and the facts this machine gives (no traffic: the route comes from a UDP socket that never sends)."""

from __future__ import annotations

import pytest

from slurmgen.doctor import fabric
from slurmgen.doctor.compare import BAD, CHECKS, FABRIC, NA, OK, compare
from slurmgen.doctor.fabric_verdict import transport


def fab(node: str, ip: str, *, resolves=None, env=None, devices=(), extra=(), bus=0.4, tcp=0.6, ok=True, **over):
    ifaces = [
        {"name": "lo", "addr": "127.0.0.1", "prefix": 8, "reaches_master": False},
        {"name": "eth0", "addr": ip, "prefix": 24, "reaches_master": True},
        *extra,
    ]
    peer = "n2" if node == "n1" else "n1"
    band = {
        "rank": 0 if node == "n1" else 1,
        "nodes": 2,
        "mb": 8,
        "tcp": {"bytes": 1, "gbps": tcp, "from": peer, "to": node},
        "allreduce": {"seconds": 0.1, "bus_gbps": bus, "correct": ok},
    }
    facts = {
        "master": "10.0.0.1",
        "hostname": node,
        "resolves": resolves or [ip],
        "route": {"addr": ip, "iface": "eth0"},
        "interfaces": ifaces,
        "env": env or {},
        "rdma": {"devices": list(devices)},
        "bandwidth": band,
    }
    return {"node": node, "fabric": {**facts, **over}}


def healthy():
    return [fab("n1", "10.0.0.1"), fab("n2", "10.0.0.2")]


def test_a_healthy_fabric_passes_with_its_columns_after_the_others():
    verdict = compare(healthy())
    assert verdict.problems == [] and verdict.warnings == []
    assert verdict.checks == CHECKS + FABRIC
    assert verdict.marks["n2"]["route"] == verdict.marks["n2"]["route"].__class__(OK, "eth0 10.0.0.2")
    assert verdict.marks["n1"]["allreduce"].text == "0.4 GB/s, 67% of TCP 0.6"
    assert compare([{"node": "n1"}]).checks == CHECKS  # without --fabric the table is as before


def test_a_hostname_on_loopback_names_the_interface_to_set_and_set_ones_pass():
    rows = [fab("n1", "10.0.0.1"), fab("n2", "10.0.0.2", resolves=["127.0.1.1"])]
    verdict = compare(rows)
    assert verdict.problems == [
        "fabric on n2: its hostname n2 resolves to 127.0.1.1, a loopback address (as Debian's default /etc/hosts "
        "makes it), a known cause of failed multi-node rendezvous: map it to 10.0.0.2 in /etc/hosts, or set "
        "GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0"
    ]
    assert (verdict.marks["n2"]["hostname"].state, verdict.marks["n1"]["hostname"].state) == (BAD, OK)
    both = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
    fixed = compare([fab("n1", "10.0.0.1", env=both), fab("n2", "10.0.0.2", resolves=["127.0.1.1"], env=both)])
    assert fixed.ok and fixed.marks["n2"]["hostname"].text == "127.0.1.1 (eth0 set)"
    # One node alone has no peer to advertise a loopback address to.
    assert compare([fab("n2", "10.0.0.2", resolves=["127.0.1.1"])]).ok


def test_an_interface_off_the_masters_network_is_a_warning_until_nccl_is_told():
    extra = [{"name": "ib9", "addr": "192.168.5.1", "prefix": 16, "reaches_master": False}]
    verdict = compare([fab("n1", "10.0.0.1", extra=extra), fab("n2", "10.0.0.2")])
    assert verdict.ok and verdict.warnings == [
        "fabric on n1: interface ib9 (192.168.5.1/16) is not on the master's network "
        "and NCCL_SOCKET_IFNAME is unset: "
        "NCCL may pick it; set NCCL_SOCKET_IFNAME=eth0 GLOO_SOCKET_IFNAME=eth0 "
        "(the interface that routes to the master)"
    ]
    env = {"NCCL_SOCKET_IFNAME": "eth0"}
    assert compare([fab("n1", "10.0.0.1", extra=extra, env=env), fab("n2", "10.0.0.2", env=env)]).warnings == []


def test_settings_and_transports_must_agree_across_nodes():
    ib = [{"name": "mlx5_0", "efa": False, "active": True}]
    verdict = compare([fab("n1", "10.0.0.1", env={"NCCL_DEBUG": "INFO"}, devices=ib), fab("n2", "10.0.0.2")])
    assert verdict.problems == [
        "fabric: net_env differs across nodes: NCCL_DEBUG=INFO on n1; unset on n2",
        "fabric: rdma differs across nodes: IB mlx5_0 on n1; socket on n2",
    ]
    assert verdict.marks["n1"]["rdma"].state == BAD


@pytest.mark.parametrize(
    "devices, env, said",
    [
        ([], {}, "socket"),
        ([{"name": "mlx5_0", "efa": False, "active": False}], {}, "socket (IB mlx5_0 down)"),
        ([{"name": "mlx5_0", "efa": False, "active": True}], {"NCCL_IB_DISABLE": "1"}, "socket (NCCL_IB_DISABLE=1)"),
        ([{"name": "efa_0", "efa": True, "active": True}], {}, "EFA efa_0 (with aws-ofi-nccl)"),
    ],
)
def test_the_transport_nccl_would_use(devices, env, said):
    assert transport({"rdma": {"devices": devices}, "env": env}) == said


def test_a_collective_under_its_share_of_raw_tcp_fails_naming_the_link():
    rows = [fab("n1", "10.0.0.1", bus=0.02, tcp=0.9), fab("n2", "10.0.0.2", bus=0.02, tcp=0.6)]
    verdict = compare(rows)
    assert verdict.problems == [
        "fabric: a gloo all-reduce across 2 nodes got 0.02 GB/s bus bandwidth, 3% of the slowest raw TCP link "
        "(0.6 GB/s, n1 -> n2) measured in the same run; want at least 5% (--min-collective-share)"
    ]
    assert {verdict.marks[n]["allreduce"].state for n in ("n1", "n2")} == {BAD}
    assert compare(rows, min_share=0.02).ok


def test_a_failed_or_wrong_probe_is_a_problem_and_one_node_is_not_applicable():
    broken = fab("n2", "10.0.0.2", bandwidth={"error": "DistStoreError: timed out"})
    verdict = compare([fab("n1", "10.0.0.1"), broken])
    assert verdict.problems == ["fabric bandwidth on n2: DistStoreError: timed out"]
    assert (verdict.marks["n2"]["allreduce"].state, verdict.marks["n1"]["allreduce"].state) == (BAD, NA)
    wrong = compare([fab("n1", "10.0.0.1", ok=False), fab("n2", "10.0.0.2")])
    assert wrong.problems == ["fabric: the all-reduce gave wrong sums on n1"]
    alone = compare([fab("n1", "10.0.0.1", bandwidth={"skipped": "needs two nodes or more"})])
    assert alone.ok and alone.marks["n1"]["allreduce"].state == NA


def test_no_route_to_the_master_is_a_problem_and_no_master_is_not_applicable():
    lost = fab("n2", "10.0.0.2", route={"addr": None, "iface": None})
    assert "fabric on n2: no route to the master 10.0.0.1" in compare([fab("n1", "10.0.0.1"), lost]).problems
    assert compare([fab("n1", "10.0.0.1", master=None)]).marks["n1"]["route"].state == NA


def test_this_machines_facts_name_the_loopback_route_without_sending():
    facts = fabric.facts("127.0.0.1")
    assert facts["route"] == {"addr": "127.0.0.1", "iface": "lo"}
    assert {"name": "lo", "addr": "127.0.0.1", "prefix": 8, "reaches_master": True} in facts["interfaces"]
    assert fabric.route_to("127.0.0.1") == "127.0.0.1" and fabric.facts(None)["route"]["addr"] is None
