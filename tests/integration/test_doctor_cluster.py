"""slurmgen doctor on the test cluster: as run_slurm.sh's preflight step, and over SSH.

- Preflight: node2 drops its outgoing packets to MASTER_PORT (an nftables rule inside its
  network namespace) and the working tree holds a link to /proc/sys/kernel/hostname (per UTS
  namespace, so its content differs on each node). The job fails before its step starts, the
  table marks node2's port and names both file hashes, the spec's preemption signal (USR2, the
  default) sent to the probe step reached every node's Python, and the attempts record says the
  preflight stopped it.
- Over SSH (`--hosts node1,node2`), with nothing in the way, every check passes and it exits 0.
- `srun slurmgen doctor --config job.yaml`: the signal checked is the spec's preempt_signal (USR1).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import render_and_lint

from slurmgen.heal.attempts import attempts_path, read_attempts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PORT = 24567
TABLE = "slurmgen_doctor_test"


def _block_port(cluster, node: str, port: int) -> None:
    for argv in (
        ["add", "table", "inet", TABLE],
        ["add", "chain", "inet", TABLE, "out", "{ type filter hook output priority 0 ; }"],
        ["add", "rule", "inet", TABLE, "out", "tcp", "dport", str(port), "drop"],
    ):
        cluster.run_on(node, ["nft", *argv], check=True)


def test_preflight_names_a_blocked_port_and_a_different_file(cluster, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('THE PROGRAM RAN')\n")
    (work / "node-name").symlink_to("/proc/sys/kernel/hostname")
    out = render_and_lint(
        work / "out",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--backend",
        "gloo",
        "--preflight",
        "--master-port",
        str(PORT),
        command=["python", "train.py"],
    )
    node1, node2 = cluster.node_names[:2]
    _block_port(cluster, node2, PORT)
    try:
        # The preflight's doctor takes its port time-out from the job's environment (10 s otherwise).
        job = cluster.submit(out / "run_slurm.sh", cwd=work, env={"SLURMGEN_DOCTOR_PORT_TIMEOUT": "3"})
        state, code = cluster.wait(job, timeout=90)
    finally:
        cluster.run_on(node2, ["nft", "delete", "table", "inet", TABLE], check=True)
    log = "\n".join(p.read_text() for p in (out / "logs").glob(f"*-{job}.out"))
    assert (state, code) == ("FAILED", 1), log
    assert "THE PROGRAM RAN" not in log
    ip = cluster.node(node1).ip
    assert f"slurmgen: error: doctor: port on {node2}: {ip}:{PORT} unreachable within 3 s" in log, log
    assert "slurmgen: error: doctor: files differs across nodes: " in log, log
    rows = {line.split()[0]: line for line in log.splitlines() if line.split()[:1] in ([node1], [node2])}
    # node, python, torch, cuda, nccl, gpus, files, master, port, signal, disk: the marks in order.
    marks = {node: [w for w in line.split() if w in ("✓", "✗", "-")] for node, line in rows.items()}
    assert marks[node1] == ["✓"] * 5 + ["✗"] + ["✓"] * 4, log
    assert marks[node2] == ["✓"] * 5 + ["✗", "✓", "✗", "✓", "✓"], log
    assert all(" ✓ USR2 " in line for line in rows.values()), log  # the spec's signal arrived
    (start, end) = read_attempts(attempts_path(out / "logs", job))
    assert (end["stage"], end["exit_code"], end["action"]) == ("preflight", 1, "stop"), end
    assert cluster.wait_no_tasks(job, timeout=10) == []


def test_doctor_over_ssh_passes_when_all_agree(cluster, tmp_path):
    (tmp_path / "train.py").write_text("print('same everywhere')\n")
    args = [
        "--hosts",
        ",".join(cluster.node_names[:2]),
        "--ssh-config",
        str(cluster.ssh_config),
        "--workdir",
        str(tmp_path),
        "--files",
        "train.py",  # --python: this venv's, by default
        "--master-port",
        str(PORT),
        "--port-timeout",
        "5",
        "--json",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgen", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env(),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["problems"] == []
    rows = report["rows"]
    assert [r["node"] for r in rows] == cluster.node_names[:2]
    assert [r["port"]["listener"] for r in rows] == [True, False]
    assert len({r["files"]["hash"] for r in rows}) == 1 and rows[0]["files"]["count"] == 1


def test_srun_doctor_reports_every_node_from_task_0(cluster, tmp_path):
    (tmp_path / "train.py").write_text("print('same everywhere')\n")
    (tmp_path / "job.yaml").write_text("preempt_signal: USR1\n")
    argv = [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=2",
        sys.executable,
        "-m",
        "slurmgen",
        "doctor",
        "--dir",
        str(tmp_path),
        "--files",
        "train.py",
        "--config",
        "job.yaml",
        "--json",
    ]
    proc = cluster.run(argv, cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)  # task 0 alone printed
    assert report["problems"] == []
    rows = report["rows"]
    assert [r["node"] for r in rows] == cluster.node_names[:2]
    assert all(r["signal"]["ok"] and r["port"]["ok"] for r in rows), rows
    assert {r["signal"]["name"] for r in rows} == {"USR1"}, rows
    assert not list(tmp_path.glob(".slurmgen-doctor-*")), "the exchange directory was left behind"


FABRIC_PORT = 24577
DUMMY = "sgextra0"
DUMMY_ADDR = "198.51.100.1"  # TEST-NET-2: inside node1's namespace only, never sent to


def _python_with_loopback_hostname(tmp_path, node: str) -> str:
    """A --python for the SSH probes: on `node` it runs under its own mount namespace with an
    /etc/hosts that maps the node's name to 127.0.1.1, as Debian's default one does; the other
    nodes, and every other process on `node`, keep the real file."""
    hosts = tmp_path / "hosts-loopback"
    kept = [line for line in Path("/etc/hosts").read_text().splitlines() if node not in line.split()[1:]]
    hosts.write_text("\n".join([*kept, f"127.0.1.1\t{node}"]) + "\n")
    wrapper = tmp_path / "python-loopback"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$(hostname)" = {node} ]; then\n'
        f'  exec unshare --mount --propagation private sh -c \'mount --bind "$0" /etc/hosts && exec "$@"\' '
        f'{hosts} {sys.executable} "$@"\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def _fabric_doctor(cluster, tmp_path, *extra: str) -> tuple[int, dict, str]:
    args = [
        "--hosts",
        ",".join(cluster.node_names[:2]),
        "--ssh-config",
        str(cluster.ssh_config),
        "--workdir",
        str(tmp_path),
        "--files",
        "train.py",
        "--master-port",
        str(FABRIC_PORT),
        "--port-timeout",
        "5",
        "--fabric",
        "--json",
        *extra,
    ]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgen", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=cluster.env(),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    print(
        f"doctor --fabric took {time.monotonic() - started:.1f} s; exit {proc.returncode}; stderr {proc.stderr[-2000:]}"
    )
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.timeout(300)
def test_fabric_names_a_loopback_hostname_and_an_interface_off_the_masters_network(cluster, tmp_path):
    (tmp_path / "train.py").write_text("print('same everywhere')\n")
    node1, node2 = cluster.node_names[:2]
    # Healthy first: every check passes, the collective gets its share of raw TCP.
    code, report, err = _fabric_doctor(cluster, tmp_path)
    assert code == 0 and report["problems"] == [] and report["warnings"] == [], (report["problems"], err)
    bands = [r["fabric"]["bandwidth"] for r in report["rows"]]
    print("bandwidth:", [(b["tcp"], b["allreduce"]) for b in bands])
    assert sorted(b["rank"] for b in bands) == [0, 1] and all(b["allreduce"]["correct"] for b in bands)
    assert all(b["tcp"]["gbps"] > 0 and b["allreduce"]["bus_gbps"] > 0 for b in bands), bands
    assert {(b["tcp"]["from"], b["tcp"]["to"]) for b in bands} == {(node1, node2), (node2, node1)}
    routes = {r["node"]: r["fabric"]["route"] for r in report["rows"]}
    assert routes[node2]["addr"] == cluster.node(node2).ip, routes
    # Then node2's name resolves to loopback for its probe, and node1 has an extra interface.
    # A veth pair with both ends inside node1 (this kernel has no dummy interfaces): nothing behind it.
    for argv in (
        ["ip", "link", "add", DUMMY, "type", "veth", "peer", "name", f"{DUMMY}p"],
        ["ip", "addr", "add", f"{DUMMY_ADDR}/24", "dev", DUMMY],
        ["ip", "link", "set", DUMMY, "up"],
    ):
        cluster.run_on(node1, argv, check=True)
    try:
        code, report, err = _fabric_doctor(
            cluster, tmp_path, "--python", _python_with_loopback_hostname(tmp_path, node2)
        )
    finally:
        cluster.run_on(node1, ["ip", "link", "del", DUMMY], check=True)
    iface1, iface2 = routes[node1]["iface"], routes[node2]["iface"]
    assert code == 1, (report, err)
    assert report["problems"] == [
        f"fabric on {node2}: its hostname {node2} resolves to 127.0.1.1, a loopback address (as Debian's default "
        f"/etc/hosts makes it), a known cause of failed multi-node rendezvous: map it to {cluster.node(node2).ip} "
        f"in /etc/hosts, or set GLOO_SOCKET_IFNAME={iface2} NCCL_SOCKET_IFNAME={iface2}"
    ], report["problems"]
    assert report["warnings"] == [
        f"fabric on {node1}: interface {DUMMY} ({DUMMY_ADDR}/24) is not on the master's network and "
        f"NCCL_SOCKET_IFNAME is unset: NCCL may pick it; set NCCL_SOCKET_IFNAME={iface1} "
        f"GLOO_SOCKET_IFNAME={iface1} (the interface that routes to the master)"
    ], report["warnings"]
    assert f"slurmgen: warning: doctor: fabric on {node1}: interface {DUMMY}" in err, err
    # The loopback name is a misconfiguration, not a hang: the measurement still ran (gloo, note 24).
    assert all(r["fabric"]["bandwidth"]["allreduce"]["correct"] for r in report["rows"]), report["rows"]
    assert DUMMY not in cluster.run_on(node1, ["ip", "-o", "link"]).stdout
    assert "127.0.1.1" not in cluster.run_on(node2, ["getent", "hosts", node2]).stdout


@pytest.mark.timeout(400)
def test_srun_doctor_fabric_measures_across_the_steps_nodes(cluster, tmp_path):
    (tmp_path / "train.py").write_text("print('same everywhere')\n")
    argv = [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        sys.executable,
        "-m",
        "slurmgen",
        "doctor",
        "--dir",
        str(tmp_path),
        "--files",
        "train.py",
        "--fabric",
        "--json",
    ]
    proc = cluster.run(argv, cwd=tmp_path, check=False, timeout=90)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["problems"] == [] and report["warnings"] == [], report
    bands = [r["fabric"]["bandwidth"] for r in report["rows"]]
    assert sorted(b["rank"] for b in bands) == [0, 1] and all(b["allreduce"]["correct"] for b in bands), bands
    assert [r["fabric"]["route"]["addr"] for r in report["rows"]] == [
        cluster.node(n).ip for n in cluster.node_names[:2]
    ]
