"""The faults of the matrix (docs/guides/faults.md) that no other test injects. Each other row
names the test that proves it; `-m fault` runs them all (tests/conftest.py reads the table).

- launch_multi_node.sh with node2 cut off by nftables (every packet dropped, nothing closed):
  both nodes stop their ranks and exit 255, naming the lost node, within the node link's 10 s
  silence + the fail grace + slack, while the partition still lasts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
from faults import cut_off
from helpers import free_port, render_and_lint, wait_for

from slurmgen.contract import exitcodes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SLEEPER = (
    "import os, sys, time; open(os.path.join(os.environ['UP_DIR'], 'up-' + os.environ['RANK']), 'w'); time.sleep(120)"
)
LINK_SILENCE = 10.0  # the node link gives a silent node up after this (slurmgen/nodelink/agent.py)
BOUND = LINK_SILENCE + 2 + 3  # + the fail grace + slack


def test_launch_multi_node_nodes_cut_apart_both_stop_naming_the_lost_node(cluster, tmp_path):
    if len(cluster.nodes) < 2:
        pytest.skip("needs 2 nodes")
    marker = f"slurmgen-fault-{tmp_path.name}"
    out = render_and_lint(
        tmp_path / "out", "--backend", "gloo", "--nodes", "2", "--gpus", "2", command=["python3", "-c", SLEEPER, marker]
    )
    node1, node2 = cluster.nodes[:2]
    env = cluster.env({"MASTER_PORT": str(free_port()), "UP_DIR": str(tmp_path)})
    procs = [
        subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{n.netns}",
                f"--uts=/proc/{n.slurmd_pid}/ns/uts",
                "--",
                str(out / "launch_multi_node.sh"),
                node1.ip,
                "2",
                "2",
                str(i),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"node{i}.err", "w"),  # noqa: SIM115
            start_new_session=True,
        )
        for i, n in enumerate((node1, node2))
    ]
    try:
        wait_for(lambda: len(list(tmp_path.glob("up-*"))) == 4, 30, "4 ranks up")
        with cut_off(node2.netns):
            cut = time.monotonic()
            ended = [None, None]
            while None in ended and time.monotonic() < cut + BOUND + 5:
                ended = [
                    e if e is not None or p.poll() is None else time.monotonic() - cut
                    for e, p in zip(ended, procs, strict=True)
                ]
                time.sleep(0.05)
            left = [p for n in (node1, node2) for p in cluster.pids_on(n) if marker in p.cmdline]
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    err = [(tmp_path / f"node{i}.err").read_text() for i in (0, 1)]
    print(
        "nodes cut apart: "
        + ", ".join(
            f"node {i} ended after {e:.2f} s" if e is not None else f"node {i} still ran" for i, e in enumerate(ended)
        )
    )
    assert [p.returncode for p in procs] == [exitcodes.LOST, exitcodes.LOST], err
    assert all(e is not None and e <= BOUND for e in ended), (ended, err)
    assert "node 1 was lost" in err[0], err[0]
    assert "lost" in err[1], err[1]
    assert not left, [p.cmdline for p in left]  # gone on both sides while the partition lasted
