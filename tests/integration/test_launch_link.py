"""launch_multi_node.sh's nodes stop as one: two launchers on this machine, linked through the
master address, running a program that is not ours (the torchrun environment contract only).

Deadlines are measured from the moment of the fault (the failing rank's own timestamp, or the
kill) to each launcher's exit and to the last rank process gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import clean_env, free_port

from slurmgen.cli import main
from slurmgen.contract import exitcodes

pytestmark = pytest.mark.integration

# Every rank says it is up (writing the link's token if it got one: it should not); FAIL_RANK
# fails with code 1 FAIL_AFTER seconds later, writing the time it did so; the others would run
# for two minutes.
PROGRAM = """
import os, sys, time
rank = os.environ["RANK"]
with open(os.path.join(os.environ["UP_DIR"], "up-" + rank), "w") as f:
    f.write(os.environ.get("SLURMGEN_LINK_TOKEN", ""))
if rank == os.environ.get("FAIL_RANK"):
    time.sleep(float(os.environ["FAIL_AFTER"]))
    with open(os.environ["FAIL_FILE"] + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(os.environ["FAIL_FILE"] + ".tmp", os.environ["FAIL_FILE"])
    sys.exit(1)
time.sleep(120)
"""
DEADLINE = 2.0


@pytest.fixture
def job(tmp_path):
    """Write the scripts; yield a starter of launchers; leave nothing running afterwards."""
    marker = f"slurmgen-link-test-{os.getpid()}-{tmp_path.name}"
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "create",
                "--nodes",
                "2",
                "--gpus",
                "2",
                "--backend",
                "gloo",
                "-o",
                str(out),
                "--force",
                "--",
                "python3",
                "-c",
                PROGRAM,
                marker,
            ]
        )
    assert exit_info.value.code == 0
    port = free_port()
    started: list[subprocess.Popen] = []

    def start(node: int, **env: str) -> subprocess.Popen:
        log = tmp_path / f"node{node}"
        proc = subprocess.Popen(
            [str(out / "launch_multi_node.sh"), "127.0.0.1", "2", "2", str(node)],
            stdout=open(f"{log}.out", "w"),  # noqa: SIM115  (the child's output, held past this line)
            stderr=open(f"{log}.err", "w"),  # noqa: SIM115
            start_new_session=True,
            env=clean_env(MASTER_PORT=str(port), UP_DIR=str(tmp_path), FAIL_FILE=str(tmp_path / "failed"), **env),
        )
        started.append(proc)
        return proc

    start.marker = marker  # type: ignore[attr-defined]
    yield start
    # Each launcher leads a session that holds all it started (agent, ranks, tee, sed: set -m
    # gives them process groups of their own, not sessions); a launcher that hung is killed with
    # all of them, and the test waits until they are gone.
    sessions = {proc.pid for proc in started}
    for pid in in_sessions(sessions) + ranks(marker):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for proc in started:
        proc.wait()
    wait_for(lambda: not in_sessions(sessions) and not ranks(marker), 10, "the launchers' processes to be gone")


def ranks(marker: str) -> list[int]:
    """Rank processes of the job still alive (their command line holds the marker)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def in_sessions(sessions: set[int]) -> list[int]:
    """Live processes of these sessions (not zombies: nothing to kill, and not running)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            state, _, _, session = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:4]
            if entry.name.isdigit() and state != "Z" and int(session) in sessions:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def exits(procs: list[subprocess.Popen], marker: str, timeout: float = 30) -> tuple[list[float], float]:
    """Wall-clock times at which each launcher exited, and when the last rank was gone."""
    ended: list[float | None] = [None] * len(procs)
    deadline = time.monotonic() + timeout
    while any(t is None for t in ended) and time.monotonic() < deadline:
        for i, proc in enumerate(procs):
            if ended[i] is None and proc.poll() is not None:
                ended[i] = time.time()
        time.sleep(0.01)
    assert all(t is not None for t in ended), (
        "a launcher did not exit",
        [proc.poll() for proc in procs],
        subprocess.run(
            ["ps", "-o", "pid,pgid,sid,stat,args", "-s", ",".join(str(proc.pid) for proc in procs)],
            capture_output=True,
            text=True,
        ).stdout,
    )
    wait_for(lambda: not ranks(marker), timeout, "the ranks to be gone")
    return ended, time.time()  # type: ignore[return-value]


def stderr(tmp_path: Path, node: int) -> str:
    return (tmp_path / f"node{node}.err").read_text()


def test_a_failing_rank_stops_every_node_and_is_named(job, tmp_path):
    procs = [job(0, FAIL_RANK="3", FAIL_AFTER="3"), job(1, FAIL_RANK="3", FAIL_AFTER="3")]
    ended, gone = exits(procs, job.marker)
    failed = float((tmp_path / "failed").read_text())
    assert [p.returncode for p in procs] == [1, 1], [stderr(tmp_path, n) for n in (0, 1)]
    assert max(ended) - failed < DEADLINE and gone - failed < DEADLINE + 0.1, (failed, ended, gone)
    for node in (0, 1):
        assert (
            f"first failure of the job: rank 3 on node 1 exited with code 1; stopping the ranks on node {node}"
            in stderr(tmp_path, node)
        )


@pytest.mark.parametrize("killed_node", [1, 0])
def test_a_launcher_killed_with_sigkill_stops_every_node(job, tmp_path, killed_node):
    procs = [job(0, SLURMGEN_LINK_TOKEN="s3cret"), job(1, SLURMGEN_LINK_TOKEN="s3cret")]
    wait_for(lambda: len(list(tmp_path.glob("up-*"))) == 4, 30, "four ranks up")
    assert {p.read_text() for p in tmp_path.glob("up-*")} == {""}  # the token stays with the launchers
    os.kill(procs[killed_node].pid, signal.SIGKILL)  # the launcher alone: its ranks and agent live on
    killed = time.time()
    ended, gone = exits(procs, job.marker)
    other = 1 - killed_node
    assert procs[killed_node].returncode == -signal.SIGKILL
    assert procs[other].returncode == exitcodes.LOST, stderr(tmp_path, other)
    assert max(ended) - killed < DEADLINE and gone - killed < DEADLINE + 0.1, (killed, ended, gone)
    assert f"first failure of the job: node {killed_node} was lost" in stderr(tmp_path, other)


def test_a_node_that_never_starts_is_reported_after_the_start_timeout(job, tmp_path):
    started = time.time()
    proc = job(0, SLURMGEN_START_TIMEOUT="2")
    wait_for(lambda: len(list(tmp_path.glob("up-*"))) == 2, 30, "node 0's ranks up")
    up = time.time()  # the link started before the ranks
    (ended,), gone = exits([proc], job.marker)
    assert proc.returncode == exitcodes.HUNG, stderr(tmp_path, 0)
    assert ended - started >= 2 and gone - up < 2 + DEADLINE, (started, up, ended, gone)
    assert "first failure of the job: node 1 never showed up (code 124)" in stderr(tmp_path, 0)


def test_ctrl_c_on_one_node_stops_all(job, tmp_path):
    procs = [job(0), job(1)]
    wait_for(lambda: len(list(tmp_path.glob("up-*"))) == 4, 30, "four ranks up")
    os.killpg(procs[1].pid, signal.SIGINT)  # as a terminal does: the launcher's process group
    pressed = time.time()
    ended, gone = exits(procs, job.marker)
    assert [p.returncode for p in procs] == [exitcodes.INTERRUPTED] * 2, [stderr(tmp_path, n) for n in (0, 1)]
    assert max(ended) - pressed < DEADLINE and gone - pressed < DEADLINE + 0.1, (pressed, ended, gone)
    assert "first failure of the job: node 1 was interrupted by a signal (code 130)" in stderr(tmp_path, 0)


def agent_of(launcher: subprocess.Popen) -> int:
    """The pid of a launcher's link agent (its child running the embedded agent)."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if (
                entry.name.isdigit()
                and int(stat[1]) == launcher.pid
                and b"class Master" in (entry / "cmdline").read_bytes()
            ):
                return int(entry.name)
        except (OSError, IndexError, ValueError):
            pass
    raise AssertionError(f"no link agent under launcher {launcher.pid}")


def test_agents_stopped_for_a_while_still_name_the_right_cause(job, tmp_path):
    # A stall longer than a ping (here: SIGSTOP, as a loaded machine or a debugger may do) is no
    # loss. It was one: bash took the stopped agent for dead and closed its stdin, and the agent
    # then reported its own node lost, on both nodes, instead of the Ctrl-C that followed.
    procs = [job(0), job(1)]
    wait_for(lambda: len(list(tmp_path.glob("up-*"))) == 4, 30, "four ranks up")
    agents = [agent_of(proc) for proc in procs]
    for pid in agents:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(3)
    for pid in agents:
        os.kill(pid, signal.SIGCONT)
    time.sleep(0.5)
    assert [proc.poll() for proc in procs] == [None, None], [stderr(tmp_path, n) for n in (0, 1)]
    os.killpg(procs[1].pid, signal.SIGINT)
    exits(procs, job.marker)
    assert [p.returncode for p in procs] == [exitcodes.INTERRUPTED] * 2, [stderr(tmp_path, n) for n in (0, 1)]
    for node in (0, 1):
        assert "first failure of the job: node 1 was interrupted by a signal (code 130)" in stderr(tmp_path, node)
