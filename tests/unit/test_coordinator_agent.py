"""The agent's process handling with real processes: output, log files, exit codes, stopping a
rank's whole process group, and judging a stale trainer heartbeat. No server: the orders are
built by hand and the report is read directly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from slurmgen.coordinator.agent import Agent
from slurmgen.coordinator.models import StartOrder


def order(worker, argv, rank=0, timeout=60.0):
    return StartOrder(worker=worker, group="g", attempt=1, rank=rank, argv=argv, cwd=None,
                      env={"RANK": str(rank)}, heartbeat_timeout=timeout)


def wait_until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ranks_run_report_and_stop_with_everything_they_forked(tmp_path):
    agent = Agent(client=None, workers=2, host="gn6", state_dir=tmp_path)
    try:
        child = tmp_path / "child.pid"
        script = ("import subprocess, sys, time; print('hello', flush=True);"
                  f"p = subprocess.Popen(['sleep', '60']); open({str(child)!r}, 'w').write(str(p.pid));"
                  "time.sleep(60)")
        agent.procs.start(order(0, [sys.executable, "-c", script]), agent.hb_root)
        agent.procs.start(order(1, [sys.executable, "-c", "import sys; print('bye'); sys.exit(3)"], rank=1),
                          agent.hb_root)
        agent.procs.start(order(0, ["false"]), agent.hb_root)  # already running: ignored
        wait_until(lambda: child.exists() and child.read_text() and agent.procs.slots[1].exit_code is not None)
        report, _ = agent.report()
        states = [(w.state, w.exit_code, w.group, w.attempt) for w in report.workers]
        assert states == [("running", None, "g", 1), ("exited", 3, "g", 1)]
        assert sorted((ln.rank, ln.line) for ln in report.lines) == [(0, "hello"), (1, "bye")]
        assert (tmp_path / "gn6/logs/g/attempt-1/rank-1.log").read_text() == "bye\n"

        grandchild = int(child.read_text())
        agent.procs.stop(0, grace=5)
        wait_until(lambda: agent.procs.slots[0].exit_code is not None)
        assert agent.procs.slots[0].exit_code == 143  # TERM, as a shell reports it
        wait_until(lambda: not alive(grandchild), timeout=3)
    finally:
        agent.procs.stop_all(1)


def test_a_command_that_cannot_start_exits_127_with_a_line(tmp_path):
    agent = Agent(client=None, workers=1, host="gn6", state_dir=tmp_path)
    try:
        agent.procs.start(order(0, ["/nonexistent/trainer"]), agent.hb_root)
        report, _ = agent.report()
        assert (report.workers[0].state, report.workers[0].exit_code) == ("exited", 127)
        assert "cannot start '/nonexistent/trainer'" in report.lines[0].line
    finally:
        agent.procs.stop_all(1)


def test_a_stale_trainer_heartbeat_is_reported_hung(tmp_path):
    agent = Agent(client=None, workers=1, host="gn6", state_dir=tmp_path)
    try:
        beat = ("import json, os, time; d = os.environ['SLURMGEN_HEARTBEAT_DIR'];"
                "open(d + '/rank-00000.json', 'w').write(json.dumps({'rank': 0, 'step': 5, 'status': 'running',"
                "'time': time.time() - 100, 'pid': os.getpid(), 'host': 'gn6'}));"
                "time.sleep(60)")
        agent.procs.start(order(0, [sys.executable, "-c", beat], timeout=30), agent.hb_root)
        hb = agent.procs.slots[0].hb_file
        wait_until(lambda: hb.exists() and hb.read_text())
        assert json.loads(hb.read_text())["step"] == 5
        report, _ = agent.report()
        assert report.workers[0].hung and report.workers[0].state == "running"
    finally:
        agent.procs.stop_all(1)


AGENT_THAT_DIES = """
import sys, threading, time
from pathlib import Path
from slurmgen.coordinator.models import StartOrder
from slurmgen.coordinator.procs import Procs

root = Path(sys.argv[1])
procs = Procs(1, root, threading.Event())
procs.start(StartOrder(worker=0, group="g", attempt=1, rank=0, cwd=None, env={}, heartbeat_timeout=60.0,
                       argv=["sh", "-c", "sleep 60 & echo $! >" + sys.argv[2] + "; wait"]), root)
time.sleep(60)
"""


def test_what_a_rank_forked_dies_with_a_killed_agent(tmp_path):
    """The rank's leader goes by PR_SET_PDEATHSIG, its `sleep` (a fork, which does not inherit
    it) only by the watchdog, which kills the group when the agent's pipe closes."""
    child = tmp_path / "child.pid"
    agent = subprocess.Popen([sys.executable, "-c", AGENT_THAT_DIES, str(tmp_path), str(child)])
    try:
        wait_until(lambda: child.exists() and child.read_text().strip())
        grandchild = int(child.read_text())
        assert alive(grandchild)
    finally:
        agent.kill()
        agent.wait()
    try:
        wait_until(lambda: not alive(grandchild), timeout=3)
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_the_watchdog_kills_the_groups_still_listed_when_its_input_ends():
    from slurmgen.coordinator.procs import WATCHDOG

    kept, cleared = (subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2))
    try:
        watchdog = subprocess.run(WATCHDOG, input=f"+{kept.pid}\n+{cleared.pid}\n-{cleared.pid}\n", text=True,
                                  timeout=10)
        assert watchdog.returncode == 0
        assert kept.wait(3) == -signal.SIGKILL
        assert cleared.poll() is None
    finally:
        for proc in (kept, cleared):
            proc.kill()
            proc.wait()


def test_rank_logs_are_private_whatever_the_umask(tmp_path):
    """Rank logs were 0644 in 0755 directories: other users of the node could read them."""
    old = os.umask(0o022)
    try:
        (tmp_path / "gn6" / "logs" / "g").mkdir(parents=True, mode=0o755)  # left by an older agent
        agent = Agent(client=None, workers=1, host="gn6", state_dir=tmp_path)
        try:
            agent.procs.start(order(0, [sys.executable, "-c", "print('secret')"]), agent.hb_root)
            wait_until(lambda: agent.procs.slots[0].exit_code is not None)
        finally:
            agent.procs.stop_all(1)
    finally:
        os.umask(old)
    log = tmp_path / "gn6/logs/g/attempt-1/rank-0.log"
    assert log.read_text() == "secret\n" and log.stat().st_mode & 0o777 == 0o600
    for d in (log.parent, log.parent.parent, tmp_path / "gn6/logs", tmp_path / "gn6/heartbeats", tmp_path / "gn6/heartbeats/g-1"):
        assert d.stat().st_mode & 0o777 == 0o700, d


def test_a_rank_that_records_a_run_is_reported_with_it(tmp_path):
    """The rank's run record is named by the rank itself (beside its heartbeat), not searched for."""
    agent = Agent(client=None, workers=1, host="gn6", state_dir=tmp_path / "agent")
    script = ("import sys; from slurmgen import tracking; "
              "run = tracking.init(sys.argv[1], group='exp1', place={'rank': 0, 'world_size': 1}); "
              "run.log(type='train', metrics={'loss': 1.0}, step=1); run.finish()")
    try:
        agent.procs.start(order(0, [sys.executable, "-c", script, str(tmp_path / "out")]), agent.hb_root)
        wait_until(lambda: agent.procs.slots[0].exit_code is not None)
        report, _ = agent.report()
    finally:
        agent.procs.stop_all(1)
    assert agent.procs.slots[0].exit_code == 0, report.lines
    assert report.workers[0].runs == [str(tmp_path / "out" / "exp1" / "main")]
