"""The link agent of launch_multi_node.sh, as real processes on this machine: who may join, and
what a node is told. (tests/integration/test_launch_link.py runs it inside the launchers.)"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import subprocess
import sys

import pytest
from helpers import free_port

from slurmgen import nodelink
from slurmgen.contract import exitcodes
from slurmgen.generate.render import LAUNCH_SCRIPT, render
from slurmgen.generate.specfile import build_spec
from slurmgen.nodelink import agent


def start(port: int, node: int, nnodes: int = 2, token: str = "secret", start_timeout: float = 5):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slurmgen.nodelink.agent",
            "me",
            "127.0.0.1",
            str(port),
            str(node),
            str(nnodes),
            str(start_timeout),
            "10",
            "1",
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLURMGEN_LINK_TOKEN": token},
    )


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
    assert (code, err.strip()) == (
        7,
        "me: first failure of the job: rank 3 on node 1 exited with code 7; stopping the ranks on node 1",
    )
    code, err = finish(master)
    assert (code, err.strip()) == (
        7,
        "me: first failure of the job: rank 3 on node 1 exited with code 7; stopping the ranks on node 0",
    )


def test_a_hung_rank_is_told_as_hung_on_every_node():
    port = free_port()
    master = start(port, 0)
    worker = start(port, 1)
    code, err = finish(worker, f"rank 999999\nfailed 3 {exitcodes.HUNG} hung\n")
    told = f"me: first failure of the job: rank 3 on node 1 stopped beating (hung, code {exitcodes.HUNG}); "
    assert (code, err.strip()) == (exitcodes.HUNG, told + "stopping the ranks on node 1")
    code, err = finish(master)
    assert (code, err.strip()) == (exitcodes.HUNG, told + "stopping the ranks on node 0")


def linked_peer(link: agent.Agent) -> socket.socket:
    """One end of a connection registered as the agent's link to the other side (node 1 for
    the master, the master for a worker); the test keeps the other end."""
    mine, theirs = socket.socketpair()
    if isinstance(link, agent.Master):
        peer = link.peers[mine] = agent.Peer(mine, "127.0.0.1", link.awake)
        peer.node = 1
        link.nodes.add(1)
        link.sel.register(mine, selectors.EVENT_READ, link.on_peer)
    else:
        link.conn, link.ready, link.seen = mine, True, link.awake
        link.sel.register(mine, selectors.EVENT_READ, link.on_master)
    return theirs


def unstarted_agent(role: str) -> agent.Agent:
    """Node 0's or node 1's agent of a 2-node job (link timeout 10 s), its loop not running:
    the test drives its clock with tick()."""
    port = free_port()
    return (
        agent.Master("me", 2, "t", 1, "127.0.0.1", port, 300, 10)
        if role == "master"
        else agent.Worker("me", 1, 2, "t", 1, "127.0.0.1", port, 300, 10)
    )


@pytest.mark.parametrize("role", ["master", "worker"])
def test_a_stall_of_the_agent_itself_is_not_the_other_side_s_silence(role):
    # On a loaded machine the agent may not run for longer than the link timeout; the other
    # side's pings of that time are still on their way, so it must not be declared lost at once
    # (it was: both nodes then named a node "lost" that was not). Real silence still is.
    link = unstarted_agent(role)
    other = linked_peer(link)
    now = link.awake + 12  # the agent did not run for 12 s
    link.tick(now)
    assert link.code is None
    quiet_until = now + 9.5
    while link.code is None and now < quiet_until + 1:
        now += agent.TICK
        link.tick(now)
    assert link.code == exitcodes.LOST and now > quiet_until, (link.code, now - quiet_until)
    other.close()


@pytest.mark.parametrize("role", ["master", "worker"])
def test_a_frozen_peer_is_lost_even_when_every_pass_of_the_agent_stalls(role):
    # Silence counts the time the agent ran: with every pass 1.5 s late (each one excused), a
    # peer that never speaks is still declared lost, after link_timeout of running passes.
    link = unstarted_agent(role)
    other = linked_peer(link)
    other.setblocking(False)
    now, passes = link.awake, 0
    while link.code is None and passes < 300:
        now, passes = now + 1.5, passes + 1
        link.tick(now)
        with contextlib.suppress(BlockingIOError):
            other.recv(4096)  # the frozen peer's kernel still takes the pings (a TCP buffer would)
    assert link.code == exitcodes.LOST, passes
    assert 10 / agent.TICK - 2 <= passes <= 10 / agent.TICK + 2
    other.close()
