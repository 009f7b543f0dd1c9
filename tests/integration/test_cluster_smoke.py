"""The test cluster itself: nodes with their own names and addresses, Slurm, sshd, clean-up.

If these fail, every other integration test is meaningless; they run first (file order).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_srun_runs_one_task_on_each_node(cluster):
    n = len(cluster.nodes)
    proc = cluster.run(["srun", f"-N{n}", "--ntasks-per-node=1", "hostname"], timeout=60)
    assert sorted(proc.stdout.split()) == sorted(cluster.node_names)


def test_nodes_have_own_address_and_no_default_route(cluster):
    for node in cluster.nodes:
        assert cluster.run_on(node, ["hostname"], check=True).stdout.strip() == node.name
        addrs = cluster.run_on(node, ["ip", "-4", "-o", "addr", "show"], check=True).stdout
        assert f" {node.ip}/24 " in addrs
        routes = cluster.run_on(node, ["ip", "route"], check=True).stdout
        assert "default" not in routes, routes


def test_node_names_resolve_and_nodes_reach_each_other(cluster):
    first, last = cluster.nodes[0], cluster.nodes[-1]
    # From inside the first node: the last node's name resolves to its address, and its sshd
    # port answers across the bridge.
    code = textwrap.dedent(
        f"""
        import socket
        print(socket.gethostbyname({last.name!r}))
        socket.create_connection(({last.name!r}, 22), timeout=5).close()
        """
    )
    proc = cluster.run_on(first, ["python", "-c", code], check=True)
    assert proc.stdout.strip() == last.ip
    assert socket.gethostbyname(first.name) == first.ip


def test_job_python_is_this_venv_and_imports_slurmgen(cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -N1 -o out.txt\n"
        "set -euo pipefail\n"
        "srun --export=ALL python -c 'import sys, slurmgen; print(sys.executable)'\n"
    )
    job = cluster.submit(script, cwd=tmp_path)
    assert cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    out = (tmp_path / "out.txt").read_text()
    assert os.path.dirname(sys.executable) + "/python" in out


def test_batch_exit_code_is_reported(cluster, tmp_path):
    script = tmp_path / "fail.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1 -o out.txt\nexit 3\n")
    job = cluster.submit(script, cwd=tmp_path)
    assert cluster.wait(job, timeout=60) == ("FAILED", 3)


def test_fake_gpus_are_schedulable(cluster):
    if cluster.gpus_per_node < 2:
        pytest.skip("cluster declared fewer than 2 GPUs per node")
    n = len(cluster.nodes)
    for flag in ("--gpus-per-node=2", "--gres=gpu:2"):
        proc = cluster.run(["srun", f"-N{n}", "--ntasks-per-node=2", flag, "hostname"], timeout=60)
        assert sorted(proc.stdout.split()) == sorted(cluster.node_names * 2)


def test_each_sshd_answers_with_its_own_hostname(cluster):
    for node in cluster.nodes:
        client = cluster.ssh_client(node)
        try:
            _, stdout, _ = client.exec_command("hostname", timeout=10)
            assert stdout.read().decode().strip() == node.name
            assert stdout.channel.recv_exit_status() == 0
        finally:
            client.close()


def test_unknown_host_key_is_refused(cluster, tmp_path):
    import paramiko

    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        cluster.ssh_client(cluster.nodes[0], known_hosts=empty)


def test_another_nodes_host_key_is_refused(cluster, tmp_path):
    # Every node has its own host key: node1's key listed under node2's name must not pass.
    import paramiko

    if len(cluster.nodes) < 2:
        pytest.skip("needs 2 nodes")
    a, b = cluster.nodes[0], cluster.nodes[1]
    key_of_a = next(
        line.split(" ", 1)[1]
        for line in cluster.known_hosts.read_text().splitlines()
        if line.split(" ", 1)[0].split(",")[0] == a.name
    )
    swapped = tmp_path / "known_hosts_swapped"
    swapped.write_text(f"{b.name},{b.ip} {key_of_a}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        cluster.ssh_client(b, known_hosts=swapped)


def test_sshd_refuses_a_key_it_does_not_know(cluster, tmp_path):
    import paramiko

    key_path = tmp_path / "stranger"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_path)],
        check=True,
        timeout=30,
    )
    client = paramiko.SSHClient()
    client.load_host_keys(str(cluster.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        with pytest.raises(paramiko.AuthenticationException):
            client.connect(
                cluster.nodes[0].name,
                username=cluster.ssh_user,
                key_filename=str(key_path),
                look_for_keys=False,
                allow_agent=False,
                timeout=10,
            )
    finally:
        client.close()


def test_scancel_leaves_no_task_on_any_node(cluster, tmp_path: Path):
    n = len(cluster.nodes)
    script = tmp_path / "sleep.sh"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N{n} --ntasks-per-node=2 -o out.txt\nsrun --kill-on-bad-exit=1 sleep 300\n"
    )
    job = cluster.submit(script, cwd=tmp_path)
    cluster.wait_state(job, {"RUNNING"}, timeout=30)
    # Wait until every node runs its two sleeps, so the cancel has something to kill.
    for _ in range(120):  # 30 s
        sleeps = [p for p in cluster.job_pids(job) if p.cmdline.startswith("/usr/bin/sleep")]
        if sorted({p.node for p in sleeps}) == sorted(cluster.node_names) and len(sleeps) == 2 * n:
            break
        time.sleep(0.25)
    else:
        pytest.fail(f"tasks never all started: {cluster.job_pids(job)}")
    cluster.cancel(job)
    state, _ = cluster.wait(job, timeout=30)
    assert state == "CANCELLED"
    assert cluster.wait_no_tasks(job, timeout=15) == []


def test_signal_reaches_the_batch_script(cluster, tmp_path: Path):
    # What requeue-on-USR1 (issue 3, test 4) builds on: the batch shell gets the signal.
    script = tmp_path / "trap.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -N1 -o out.txt\n"
        "trap 'echo got USR1; exit 0' USR1\n"
        "echo ready\n"
        "for _ in $(seq 600); do sleep 0.1; done\n"
        "exit 7\n"
    )
    job = cluster.submit(script, cwd=tmp_path)
    cluster.wait_state(job, {"RUNNING"}, timeout=30)
    out = tmp_path / "out.txt"
    for _ in range(120):  # the trap must be installed before the signal arrives
        if out.exists() and "ready" in out.read_text(errors="replace"):
            break
        time.sleep(0.25)
    cluster.signal(job, "USR1", batch_only=True)
    assert cluster.wait(job, timeout=30) == ("COMPLETED", 0)
    assert "got USR1" in out.read_text()
