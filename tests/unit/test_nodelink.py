"""The link agent of launch_multi_node.sh, as real processes on this machine: who may join, and
what a node is told. (tests/integration/test_launch_link.py runs it inside the launchers.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from slurmgen import exitcodes, nodelink
from slurmgen.config import build_spec
from slurmgen.nodelink import agent
from slurmgen.render import LAUNCH_SCRIPT, render


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(port: int, node: int, nnodes: int = 2, token: str = "secret", start_timeout: float = 5):
    return subprocess.Popen(
        [sys.executable, "-m", "slurmgen.nodelink.agent", "me", "127.0.0.1", str(port), str(node), str(nnodes),
         str(start_timeout), "10", "1"],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "SLURMGEN_LINK_TOKEN": token})


def finish(proc: subprocess.Popen, say: str = "") -> tuple[int, str]:
    """Tell the agent `say` as its launcher would; its exit code and stderr. Stdin stays open
    until it ends: closing it would mean that the launcher died."""
    try:
        proc.stdin.write(say)
        proc.stdin.flush()
        proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.stdin.close()
    return proc.returncode, proc.stderr.read()


def test_exit_codes_are_the_ones_of_exitcodes():
    # The agent runs where slurmgen may not be installed, so it spells the codes itself.
    assert (agent.BAD_INPUT, agent.HUNG, agent.LOST) == (exitcodes.BAD_INPUT, exitcodes.HUNG, exitcodes.LOST)


def test_the_script_embeds_the_agent_verbatim():
    script = render(build_spec({"nodes": 2})).files[LAUNCH_SCRIPT]
    assert nodelink.source().rstrip("\n") + f"\n{nodelink.HEREDOC_END}\n" in script


def test_every_node_done_ends_the_job_well():
    port = free_port()
    master = start(port, 0)
    worker = start(port, 1)
    assert finish(worker, "done\n") == (0, "")
    assert finish(master, "done\n") == (0, "")


def test_a_node_without_the_token_is_refused_and_cannot_stop_the_job():
    port = free_port()
    master = start(port, 0, start_timeout=1.5)
    stranger = start(port, 1, token="guess")
    code, err = finish(stranger)
    assert code == exitcodes.BAD_INPUT
    assert "refused this node: its token differs from the master's (SLURMGEN_LINK_TOKEN)" in err
    # Garbage and an endless line are dropped too; the master goes on waiting for node 1.
    for junk in (b"failed 0 9 rank\n", b"x" * 5000):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(junk)
    code, err = finish(master)
    assert code == exitcodes.HUNG
    assert "refused a connection from 127.0.0.1" in err
    assert "first failure of the job: node 1 never showed up (code 124)" in err


def test_a_node_started_with_another_node_count_fails_the_job_on_both():
    port = free_port()
    master = start(port, 0)
    worker = start(port, 1, nnodes=3)
    for proc in (worker, master):
        code, err = finish(proc)
        assert code == exitcodes.BAD_INPUT
        assert "first failure of the job: node 1 was started with another number of nodes (code 2)" in err


def test_a_failure_names_its_rank_on_every_node():
    port = free_port()
    master = start(port, 0)
    worker = start(port, 1)
    code, err = finish(worker, "rank 999999\nfailed 3 7\n")
    assert (code, err.strip()) == (7, "me: first failure of the job: rank 3 on node 1 exited with code 7; "
                                      "stopping the ranks on node 1")
    code, err = finish(master)
    assert (code, err.strip()) == (7, "me: first failure of the job: rank 3 on node 1 exited with code 7; "
                                      "stopping the ranks on node 0")
