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
from pathlib import Path

from helpers import alive

from slurmgen.coordinator.client import ClientError
from slurmgen.coordinator.models import AgentOrders, StartOrder, WorldOrder
from slurmgen.coordinator.node_agent import WorkerAgent


def order(worker, argv, rank=0, timeout=60.0):
    return StartOrder(
        worker=worker,
        group="g",
        attempt=1,
        rank=rank,
        argv=argv,
        cwd=None,
        env={"RANK": str(rank)},
        heartbeat_timeout=timeout,
    )


def wait_until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_ranks_run_report_and_stop_with_everything_they_forked(tmp_path):
    agent = WorkerAgent(client=None, workers=2, host="gn6", state_dir=tmp_path)
    try:
        child = tmp_path / "child.pid"
        script = (
            "import subprocess, sys, time; print('hello', flush=True);"
            f"p = subprocess.Popen(['sleep', '60']); open({str(child)!r}, 'w').write(str(p.pid));"
            "time.sleep(60)"
        )
        agent.procs.start(order(0, [sys.executable, "-c", script]), agent.hb_root)
        agent.procs.start(
            order(1, [sys.executable, "-c", "import sys; print('bye'); sys.exit(3)"], rank=1), agent.hb_root
        )
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
    agent = WorkerAgent(client=None, workers=1, host="gn6", state_dir=tmp_path)
    try:
        agent.procs.start(order(0, ["/nonexistent/trainer"]), agent.hb_root)
        report, _ = agent.report()
        assert (report.workers[0].state, report.workers[0].exit_code) == ("exited", 127)
        assert "cannot start '/nonexistent/trainer'" in report.lines[0].line
    finally:
        agent.procs.stop_all(1)


def test_a_stale_trainer_heartbeat_is_reported_hung(tmp_path):
    agent = WorkerAgent(client=None, workers=1, host="gn6", state_dir=tmp_path)
    try:
        beat = (
            "import json, os, time; d = os.environ['SLURMGEN_HEARTBEAT_DIR'];"
            "open(d + '/rank-00000.json', 'w').write(json.dumps({'rank': 0, 'step': 5, 'status': 'running',"
            "'time': time.time() - 100, 'pid': os.getpid(), 'host': 'gn6'}));"
            "time.sleep(60)"
        )
        agent.procs.start(order(0, [sys.executable, "-c", beat], timeout=30), agent.hb_root)
        hb = agent.procs.slots[0].hb_file
        wait_until(lambda: hb.exists() and hb.read_text())
        assert json.loads(hb.read_text())["step"] == 5
        report, _ = agent.report()
        assert report.workers[0].hung and report.workers[0].state == "running"
        quiet = report.workers[0].beat
        assert quiet is not None and (quiet.step, quiet.stopped) == (5, False) and quiet.age > 99
        os.kill(json.loads(hb.read_text())["pid"], signal.SIGSTOP)  # the server names a stopped rank first
        wait_until(lambda: agent.report()[0].workers[0].beat.stopped)
    finally:
        agent.procs.stop_all(1)


AGENT_THAT_DIES = """
import sys, threading, time
from pathlib import Path
from slurmgen.coordinator.client import ClientError
from slurmgen.coordinator.models import AgentOrders, StartOrder, WorldOrder
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
        wait_until(
            lambda: not alive(grandchild), timeout=10
        )  # the watchdog acts at once; a loaded machine may take seconds to schedule it
    finally:
        if alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_the_watchdog_kills_the_groups_still_listed_when_its_input_ends():
    from slurmgen.coordinator.procs import WATCHDOG

    kept, cleared = (subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2))
    try:
        watchdog = subprocess.run(
            WATCHDOG, input=f"+{kept.pid}\n+{cleared.pid}\n-{cleared.pid}\n", text=True, timeout=10
        )
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
        agent = WorkerAgent(client=None, workers=1, host="gn6", state_dir=tmp_path)
        try:
            agent.procs.start(order(0, [sys.executable, "-c", "print('secret')"]), agent.hb_root)
            wait_until(lambda: agent.procs.slots[0].exit_code is not None)
        finally:
            agent.procs.stop_all(1)
    finally:
        os.umask(old)
    log = tmp_path / "gn6/logs/g/attempt-1/rank-0.log"
    assert log.read_text() == "secret\n" and log.stat().st_mode & 0o777 == 0o600
    for d in (
        log.parent,
        log.parent.parent,
        tmp_path / "gn6/logs",
        tmp_path / "gn6/heartbeats",
        tmp_path / "gn6/heartbeats/g-1",
    ):
        assert d.stat().st_mode & 0o777 == 0o700, d


def test_a_rank_that_records_a_run_is_reported_with_it(tmp_path):
    """The rank's run record is named by the rank itself (beside its heartbeat), not searched for."""
    agent = WorkerAgent(client=None, workers=1, host="gn6", state_dir=tmp_path / "agent")
    script = (
        "import sys; from slurmgen import tracking; "
        "run = tracking.init(sys.argv[1], group='exp1', place={'rank': 0, 'world_size': 1}); "
        "run.log(type='train', metrics={'loss': 1.0}, step=1); run.finish()"
    )
    try:
        agent.procs.start(order(0, [sys.executable, "-c", script, str(tmp_path / "out")]), agent.hb_root)
        wait_until(lambda: agent.procs.slots[0].exit_code is not None)
        report, _ = agent.report()
    finally:
        agent.procs.stop_all(1)
    assert agent.procs.slots[0].exit_code == 0, report.lines
    assert report.workers[0].runs == [str(tmp_path / "out" / "exp1" / "main")]


def test_an_attempts_heartbeat_and_warm_dirs_go_once_no_rank_of_it_runs_here(tmp_path):
    """Every attempt makes a heartbeat and a warm-world directory on each node it runs on; they
    go once none of its ranks runs there and the server keeps no warm restart of it there (a rank
    of it may be started anew), also one an earlier agent left. The rank's log stays, and the run
    record it announced beside its heartbeat is still reported."""
    agent = WorkerAgent(client=None, workers=1, host="gn6", state_dir=tmp_path)
    announce = (
        "import json, os, time; d = os.environ['SLURMGEN_HEARTBEAT_DIR'];"
        "open(d + '/run-record-0.json', 'w').write(json.dumps({'dir': '/runs/exp1/main'}));"
        "print('up', flush=True); time.sleep(60)"
    )
    left = agent.hb_root / "g-0"  # an earlier attempt's, which a killed agent left
    left.mkdir(parents=True)
    (left / "rank-00000.json").write_text("{}")
    world = WorldOrder(group="g", attempt=1, generation=1, master_addr="gn7", master_port=29501, world_size=2)
    try:
        agent.apply(AgentOrders(start=[order(0, [sys.executable, "-c", announce])], worlds=[world]))
        wait_until(lambda: (agent.hb_root / "g-1" / "run-record-0.json").exists())
        assert sorted(p.name for p in agent.hb_root.iterdir()) == ["g-1"]  # a running rank's stays
        assert (agent.warm_root / "g-1").is_dir()
        agent.procs.stop(0, grace=5)
        wait_until(lambda: agent.procs.slots[0].exit_code is not None)
        agent.apply(AgentOrders(warm=[("g", 1)]))  # the attempt goes on warm: its rank may start anew here
        assert (agent.hb_root / "g-1").is_dir() and (agent.warm_root / "g-1").is_dir()
        agent.apply(AgentOrders())  # the attempt is over for this node
        assert list(agent.hb_root.iterdir()) == [] and list(agent.warm_root.iterdir()) == []
        assert (tmp_path / "gn6/logs/g/attempt-1/rank-0.log").read_text() == "up\n"
        assert agent.report()[0].workers[0].runs == ["/runs/exp1/main"]
    finally:
        agent.procs.stop_all(1)


class FlakyServer:
    """A fast stand-in for the server's heartbeat answer, up or unreachable at will (the real
    partition is tests/integration/test_coordinator_cluster.py)."""

    timeout, base_url = 10.0, "http://gn1:8470"

    def __init__(self, agent_timeout: float = 3.0):
        self.up, self.agent_timeout, self.waits = True, agent_timeout, []

    def heartbeat(self, report, timeout=None):
        self.waits.append(timeout)
        if not self.up:
            raise ClientError("server: cannot reach http://gn1:8470: timed out")
        return AgentOrders(agent_timeout=self.agent_timeout)


def beat_for(agent, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        agent.beat()
        agent.procs.enforce_grace()
        time.sleep(0.05)


def test_the_cut_off_limit_is_the_servers_agent_timeout_plus_a_margin_unless_given(tmp_path):
    server = FlakyServer(agent_timeout=30.0)
    agent = WorkerAgent(client=server, workers=1, host="gn6", state_dir=tmp_path)
    try:
        assert agent.cut_off_limit == 10.0 + 5.0  # serve's default until the server says
        agent.beat()
        assert agent.cut_off_limit == 30.0 + 5.0
        assert (
            WorkerAgent(client=server, workers=1, host="gn6", state_dir=tmp_path / "b", cut_off_after=7).cut_off_limit
            == 7
        )
    finally:
        agent.procs.stop_all(1)


def test_a_cut_off_agent_stops_its_ranks_and_a_short_outage_keeps_them(tmp_path):
    server = FlakyServer()
    agent = WorkerAgent(client=server, workers=2, host="gn6", state_dir=tmp_path, grace=1, cut_off_after=1.5)
    try:
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        agent.beat()
        agent.procs.start(order(0, sleeper), agent.hb_root)
        agent.procs.start(order(1, sleeper, rank=1), agent.hb_root)
        pids = [s.proc.pid for s in agent.procs.slots]
        # A restart: unreachable for 1 s (< 1.5 s), then back. The ranks go on.
        server.up = False
        beat_for(agent, 1.0)
        server.up = True
        agent.beat()
        assert all(alive(p) for p in pids)
        # A partition: unreachable for good. Stopped once 1.5 s have passed since the last answer.
        server.up, cut = False, time.monotonic()
        beat_for(agent, 1.2)
        assert all(alive(p) for p in pids)
        ran = server.waits[1:]  # every request while ranks ran
        wait_until(lambda: (agent.beat(), not any(alive(p) for p in pids))[1], timeout=3)
        assert 1.5 <= time.monotonic() - cut < 1.5 + 1.0
        wait_until(lambda: all(s.exit_code is not None for s in agent.procs.slots))
        assert [s.exit_code for s in agent.procs.slots] == [143, 143]
        # While ranks run, no request outlives the cut-off (at least 1 s); idle, the client's own.
        assert None not in ran and all(1.0 <= w <= 1.5 for w in ran), ran
        agent.beat()
        assert server.waits[-1] is None
    finally:
        agent.procs.stop_all(1)


def test_a_cut_off_limit_under_a_second_is_one_line_and_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "slurmgen", "agent", "--cut-off-after", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "slurmgen: error: cut_off_after: must be at least 1 second (got 0.5)"


def test_the_stack_of_a_stopped_rank_is_taken_with_the_watchers_bash(tmp_path):
    """coordinator/stacks.take runs hang_stack.sh.j2's take_stack on a real rank stopped in
    frozen_here(): the writer named in its beat (not the pid given) is continued, dumps on
    SIGURG, and its frames and dump come back."""
    from slurmgen.coordinator import stacks

    program = (
        "import faulthandler, json, os, signal, sys\n"
        "d = sys.argv[1]\n"
        "faulthandler.register(signal.SIGURG, file=open(d + '/stack-00003.txt', 'a'), all_threads=True)\n"
        "def frozen_here():\n"
        "    open(d + '/rank-00003.json', 'w')"
        ".write(json.dumps({'rank': 3, 'pid': os.getpid(), 'stack': True}) + '\\n')\n"
        "    os.kill(os.getpid(), signal.SIGSTOP)\n"
        "    signal.pause()\n"
        "frozen_here()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", program, str(tmp_path)])
    try:
        deadline = time.monotonic() + 10
        while (
            not (tmp_path / "rank-00003.json").exists() or Path(f"/proc/{proc.pid}/stat").read_text().split()[2] != "T"
        ):
            assert time.monotonic() < deadline, "the rank never stopped"
            time.sleep(0.02)
        frames, dump = stacks.take(tmp_path / "rank-00003.json", 3, 1)
        assert frames[0].endswith(" frozen_here") and frames[0].startswith("<string>:"), frames
        assert 'File "<string>", line 6 in frozen_here' in dump, dump
    finally:
        proc.kill()
        proc.wait()


def test_lines_do_not_bring_heartbeats_forward_they_go_on_their_own(tmp_path):
    """Issue 33: a group's newest line reached the page up to a beat (0.25 s under a flood, 1 s
    otherwise) plus a poll late, and a flood made the agent beat four times a second. Lines now
    wake their own sender (`ship_lines`) at once, and the heartbeat keeps its interval whatever
    waits."""
    from slurmgen.coordinator.models import ReportedLine

    agent = WorkerAgent(client=None, workers=1, host="gn6", state_dir=tmp_path, interval=1.0)
    line = ReportedLine(worker=0, group="g", attempt=1, rank=0, time=0.0, line="x")
    assert not agent.procs.output.waiting.is_set()
    for _ in range(2000):
        agent.procs.output.put(line)
    assert agent.procs.output.waiting.is_set()  # the sender wakes at once
    started = time.monotonic()
    agent.pause(started)
    assert time.monotonic() - started >= 0.99  # the heartbeat does not come sooner


def test_what_one_message_carries_is_bounded_in_lines_and_characters_newest_kept():
    from slurmgen.coordinator.models import ReportedLine
    from slurmgen.coordinator.procs import LineBuffer

    buffer = LineBuffer(limit=100)
    for i in range(50):
        buffer.put(ReportedLine(worker=0, group="g", attempt=1, rank=0, time=float(i), line=f"{i:03d}" + "x" * 97))
    assert buffer.size == 5000
    lines, dropped = buffer.take(40, 1000)  # 10 lines of 100 characters fit, the newest
    assert dropped == 40 and lines[0].line.startswith("… 40 lines skipped here")
    assert [ln.line[:3] for ln in lines[1:]] == [f"{i:03d}" for i in range(40, 50)]
    assert (buffer.size, buffer.waiting.is_set()) == (0, False)
    buffer.give_back(lines, dropped)  # a send that failed: back, counted again, waiting again
    assert (len(buffer), buffer.size, buffer.waiting.is_set()) == (10, 1000, True)
