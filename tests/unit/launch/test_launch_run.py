"""The launcher's orchestration with every 'host' on this machine (no SSH): streaming,
first failure stops all, exit codes, restarts, heartbeats, signals, lost connections."""

import io
import os
import re
import signal
import subprocess
import textwrap
import threading
import time
from dataclasses import replace

import pytest
from helpers import PY, SLEEPER, SURVIVORS, LocalConnection, LocalProcess, local_plan, pids, run_to_end, tqdm_bar
from helpers import run_launcher as run

from slurmgen.contract import exitcodes
from slurmgen.errors import SlurmgenError
from slurmgen.generate.topology import Host
from slurmgen.jobs.commands import run_lines, run_status
from slurmgen.launch.fanout import Launcher
from slurmgen.launch.registry_entry import LaunchRecord
from slurmgen.runs.model import Recorder, list_rows, recoveries_of
from slurmgen.runs.registry import Registry
from slurmgen.ssh.connect import ConnectError, SSHOptions


def test_success_streams_prefixed_lines_and_summarises(tmp_path):
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(2, 1))
    code, out, err = run(plan, env={"RUN_FOR": "0.2"})
    assert code == 0, err
    assert {line.split("]")[0] + "]" for line in out.splitlines() if "done" in line} == {"[h0/0]", "[h0/1]", "[h1/2]"}
    assert "[h1] node 1/2 started ranks 2-2 of 3" in out
    assert "all 2 node(s) running 3 rank(s)" in err
    assert "all ranks succeeded" in err
    table = err[err.index("slurmgen launch: all ranks succeeded") :]
    assert "h0" in table and "0-1" in table and " ok " in table


def test_first_failure_stops_every_node_fast_with_the_ranks_code(tmp_path):
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(2, 2))
    started = time.monotonic()
    code, out, err = run(plan, env={"FAIL_RANK": "3", "FAIL_CODE": "7"})
    elapsed = time.monotonic() - started
    assert code == 7, err
    assert "stopping all nodes: rank 3 exited with code 7 on h1" in err
    assert "first failure: rank 3 exited with code 7" in err
    assert elapsed < 0.5 + 2 + 3, f"{elapsed:.1f}s"  # fail after 0.5 s, all gone within 2 s, start-up slack
    assert len(pids(out)) == 4 and SURVIVORS == []
    assert "stopped" in err  # h0's summary row


def test_restart_runs_the_whole_group_again_and_numbers_attempts(tmp_path):
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1), max_restarts=2)
    code, out, err = run(plan, env={"FAIL_RANK": "1", "FAIL_ATTEMPTS": "1,2", "FAIL_CODE": "3", "RUN_FOR": "0.2"})
    assert code == 0, err
    assert "attempt 1 of 3 failed (rank 1 exited with code 3 on h1); starting all nodes again" in err
    assert "attempt 2 of 3 failed" in err and "attempt 3 of 3" in err
    log = (tmp_path / "out" / "logs" / "rank-1.log").read_text()
    assert [line.split(",")[0] for line in log.splitlines() if line.startswith("=====")] == [
        "===== slurmgen launch: attempt 1",
        "===== slurmgen launch: attempt 2",
        "===== slurmgen launch: attempt 3",
    ]


def test_restarts_exhausted_report_the_last_failure(tmp_path):
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1), max_restarts=1)
    code, _, err = run(plan, env={"FAIL_RANK": "0", "FAIL_ATTEMPTS": "1,2", "FAIL_CODE": "5", "FAIL_AFTER": "0.1"})
    assert code == 5
    assert "(attempt 2 of 2)" in err


def test_the_frozen_rank_is_named_across_nodes_not_the_one_that_waits(tmp_path):
    """Rank 0 (on h0) stops beating first, as a rank blocked in a collective does; rank 1 (on
    h1) beats a little longer, then freezes (SIGSTOP) in frozen_here(). A node judging alone
    named rank 0. Rank 1 dumps its stack on SIGURG as the trainer does ("stack": true): the
    launcher asks h1 for it before stopping, and the verdict says where rank 1 was stuck."""
    program = textwrap.dedent("""
        import faulthandler, json, os, signal, time
        rank = int(os.environ["RANK"]); hb = os.environ["SLURMGEN_HEARTBEAT_DIR"]
        print("PID", os.getpid(), flush=True)
        stack = open(f"{hb}/stack-{rank:05d}.txt", "a")
        faulthandler.register(signal.SIGURG, file=stack, all_threads=True)
        def frozen_here():
            os.kill(os.getpid(), signal.SIGSTOP)
        start, step = time.time(), 0
        while time.time() - start < (0.4 if rank == 0 else 0.5):
            step += 1
            with open(f"{hb}/.{rank}", "w") as f:
                f.write(json.dumps({"rank": rank, "step": step, "time": time.time(), "pid": os.getpid(),
                                    "status": "running", "stack": True}) + "\\n")
            os.replace(f"{hb}/.{rank}", f"{hb}/rank-{rank:05d}.json")
            time.sleep(0.05)
        if rank == 1:
            frozen_here()
        time.sleep(60)
    """)
    plan = local_plan(tmp_path, [PY, "-c", program], slots=(1, 1), heartbeat_timeout=2.0)
    started = time.monotonic()
    code, out, err = run(plan)
    elapsed = time.monotonic() - started
    assert code == exitcodes.HUNG, err
    assert "stopping all nodes: rank 1 on h1 stopped beating at step " in err, err
    assert "its process is stopped); rank 0 waited in a collective; stuck in <string>:8 in frozen_here()" in err, err
    assert "rank 1 on h1 stopped beating" in err.split("slurmgen launch: ")[-1]  # the summary's title
    dump = (tmp_path / plan.log_dir / "stack-rank-1.txt").read_text()
    assert 'File "<string>", line 8 in frozen_here' in dump, dump
    # freeze, limit, poll, the stack (about 0.1 s here), stop grace, start-up
    assert elapsed < 0.5 + 2 + 0.5 + 0.5 + 1 + 3, f"{elapsed:.1f}s"
    assert SURVIVORS == [] and pids(out)


@pytest.mark.parametrize("signum, expected", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_everything_and_exits_128_plus_signal(tmp_path, signum, expected):
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1))
    timer = threading.Timer(1.5, os.kill, args=(os.getpid(), signum))
    timer.start()
    try:
        code, out, err = run(plan)
    finally:
        timer.cancel()
    assert code == expected, err
    assert f"got {signal.Signals(signum).name}" in err and f"interrupted by {signal.Signals(signum).name}" in err
    assert SURVIVORS == [] and pids(out)


class BrokenConnection(LocalConnection):
    def start(self, command, stdin, timeout=10.0, separate_stderr=True):
        raise ConnectError(self.alias, "cannot start the node's command: channel refused")


class LosingProcess(LocalProcess):
    """Output and events through `cat`s standing in for sshd: killing them breaks the node's
    pipes and ends its stdin, as a dropped connection does; no exit status comes back."""

    def __init__(self, command, stdin, env=None):
        super().__init__(command, stdin, env)
        self.relays = [
            subprocess.Popen(["cat"], stdin=stream, stdout=subprocess.PIPE)
            for stream in (self.popen.stdout, self.popen.stderr)
        ]
        self.popen.stdout.close()
        self.popen.stderr.close()
        threading.Timer(1.0, self.lose).start()

    def read(self):
        return os.read(self.relays[0].stdout.fileno(), 65536)

    def read_stderr(self):
        return os.read(self.relays[1].stdout.fileno(), 65536)

    def lose(self):
        self.close_stdin()
        for relay in self.relays:
            relay.kill()

    def exit_status(self):
        for relay in self.relays:
            relay.wait()
        return None


class LosingConnection(LocalConnection):
    def start(self, command, stdin, timeout=10.0, separate_stderr=True):
        proc = LosingProcess(command, stdin, self.env)
        self.procs.append(proc)
        return proc


@pytest.mark.parametrize(
    "cls, expected, words",
    [(BrokenConnection, 1, "channel refused"), (LosingConnection, exitcodes.LOST, "lost the connection to h1")],
)
def test_a_node_that_cannot_start_or_is_lost_stops_the_others(tmp_path, cls, expected, words):
    made = {}

    def connector(hosts, opts, notify=None):
        conns = {h: (cls(h) if h == "h1" else LocalConnection(h)) for h in hosts}
        made.update(conns)
        return conns

    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1))
    code, out, err = run(plan, connector=connector, made=made)
    assert code == expected, err
    assert words in err
    assert SURVIVORS == []


def test_restart_reconnects_a_lost_host(tmp_path):
    made, calls = {}, []

    class LosingOnce(LosingConnection):
        def start(self, command, stdin, timeout=10.0, separate_stderr=True):
            proc = super().start(command, stdin, timeout, separate_stderr)
            threading.Timer(1.0, setattr, args=(self, "active", False)).start()
            return proc

    def connector(hosts, opts, notify=None):
        calls.append(list(hosts))
        env = {"RUN_FOR": "2.5"}  # attempt 1 loses h1 after 1 s; attempt 2 ends by itself
        conns = {h: (LosingOnce(h, env) if h == "h1" and len(calls) == 1 else LocalConnection(h, env)) for h in hosts}
        made.update({f"{h}-{len(calls)}": c for h, c in conns.items()})
        return conns

    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1), max_restarts=1)
    code, out, err = run(plan, env=None, connector=connector, made=made)
    assert calls == [["h0", "h1"], ["h1"]], err
    assert "attempt 1 of 2 failed (lost the connection to h1 on h1)" in err and "reconnecting to h1" in err
    assert code == 0, err
    assert out.count("] done") == 2


def test_prefixes_and_colours():
    from slurmgen.launch.display import Prefixer

    plain, colour = Prefixer(["a", "b"], False), Prefixer(["a", "b"], True)
    assert plain.format("b", "[rank 3] hello [rank 4]") == "[b/3] hello [rank 4]"
    assert plain.format("a", "launch_multi_node.sh: node 0/2 started") == "[a] node 0/2 started"
    assert colour.format("b", "[rank 3] x") == "\x1b[33m[b/3]\x1b[0m x"


def test_a_progress_bar_shows_as_its_last_state_under_its_rank(tmp_path):
    """A tqdm bar's line redraws after each "\r": printed as it came, the terminal went back over the
    `[host/rank]` tag (issue 34, item 2); its last state is shown, the warning after it kept."""
    program = f"import sys\nsys.stderr.write({tqdm_bar()!r})"
    code, out, err = run(local_plan(tmp_path, [PY, "-c", program], slots=(1,)))
    assert code == 0, err
    bar = [line for line in out.splitlines() if "Epoch" in line or "warnings.warn" in line]
    assert len(bar) == 3 and all(line.startswith("[h0/0] ") for line in bar) and "\r" not in out, out
    assert bar[0].endswith("UserWarning: lr is large") and "| 4/4 [" in bar[2]


def test_rank_dying_mid_line_or_printing_fake_events_gets_its_own_verdict(tmp_path):
    program = textwrap.dedent("""
        import os, sys, time
        print("PID", os.getpid(), flush=True)
        if os.environ["RANK"] == "1":
            print("slurmgen-event-1 exited 0 9", flush=True)    # looks like an event: only shown
            print("launch_multi_node.sh: rank 0 (local rank 0) exited with code 9", flush=True)
            time.sleep(0.5)
            sys.stdout.write("progress 50%"); sys.stdout.flush()  # no final newline
            sys.exit(3)
        time.sleep(60)
    """)
    plan = local_plan(tmp_path, [PY, "-c", program], slots=(1, 1))
    code, out, err = run(plan)
    assert code == 3, err
    assert "stopping all nodes: rank 1 exited with code 3 on h1" in err
    assert "[h1/1] slurmgen-event-1 exited 0 9" in out and "[h1/1] progress 50%" in out
    assert SURVIVORS == [] and len(pids(out)) == 2


class SilentConnection(LocalConnection):
    """A host whose keepalive answers stop 1 s after the start (its network froze)."""

    def start_keepalive(self, interval):
        self.since = time.monotonic() + 1.0

    def silent_for(self, interval):
        return max(0.0, time.monotonic() - self.since - interval)


def test_silent_host_is_lost_within_the_keepalive_window_while_another_floods(tmp_path):
    made = {}

    def connector(hosts, opts, notify=None):
        conns = {h: (SilentConnection(h) if h == "h1" else LocalConnection(h)) for h in hosts}
        made.update(conns)
        return conns

    flood = "import os, sys\nprint('PID', os.getpid(), flush=True)\nwhile True: print('x' * 80, flush=True)"
    plan = local_plan(tmp_path, [PY, "-c", flood], slots=(1, 1))
    out, err = io.StringIO(), io.StringIO()
    launcher = Launcher(plan, SSHOptions(), out=out, err=err, colour=False, keepalive=0.2, connector=connector)
    started = time.monotonic()
    code = run_to_end(launcher, made)
    took = time.monotonic() - started
    assert code == exitcodes.LOST, err.getvalue()[-2000:]
    assert "no answer from h1 for 1s" in err.getvalue()
    # Silent from 1 s, lost after 4 keepalive intervals (0.8 s), stopped within the grace and the wait.
    assert out.getvalue().count("xxxx") > 1000 and took < 1 + 0.8 + 1 + 5, f"{took:.1f}s"


def test_stray_lines_on_the_event_channel_are_shown_not_obeyed(tmp_path):
    # A login shell's rc file may write to stderr before the bootstrap runs (as sshd starts it:
    # shell level 1 with SSH_CLIENT set, where Debian's bash sources ~/.bashrc).
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("echo 'conda: base activated' >&2\necho 'slurmgen-event-1 exited x y' >&2\n")
    env = {"HOME": str(home), "SHLVL": "0", "SSH_CLIENT": "10.0.0.1 50000 22"}
    plan = local_plan(tmp_path, [PY, "-c", "print('PID', __import__('os').getpid())"], slots=(1,))
    code, out, err = run(plan, env=env)
    assert code == 0, err
    assert "[h0] conda: base activated" in out and "[h0] slurmgen-event-1 exited x y" in out


def test_a_lost_host_hands_its_node_to_a_spare_host(tmp_path):
    """--spare-hosts: h1 is lost in attempt 1; attempt 2 runs node 1 (rank 1) on the spare h2,
    and h1 is not contacted again."""
    made, calls = {}, []

    class LosingOnce(LosingConnection):
        def start(self, command, stdin, timeout=10.0, separate_stderr=True):
            proc = super().start(command, stdin, timeout, separate_stderr)
            threading.Timer(1.0, setattr, args=(self, "active", False)).start()
            return proc

    def connector(hosts, opts, notify=None):
        calls.append(list(hosts))
        env = {"RUN_FOR": "2.5"}
        conns = {h: (LosingOnce(h, env) if h == "h1" else LocalConnection(h, env)) for h in hosts}
        made.update({f"{h}-{len(calls)}": c for h, c in conns.items()})
        return conns

    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1), max_restarts=1, spares=[Host.with_count("h2", 1)])
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L2", "SLURMGEN_GROUP": "launch-L2"})
    registry = tmp_path / "jobs.sqlite"
    record = LaunchRecord.start(Recorder(registry), plan, "spare", [PY, "-c", SLEEPER])
    code, out, err = run(plan, env=None, connector=connector, made=made, record=record)
    assert calls == [["h0", "h1"], ["h2"]], err
    assert "node 1 moves from h1 to the spare host h2" in err
    # The run registry keeps the move with the attempt it followed: the page and status show it.
    with Registry.open(registry) as reg:
        (row,) = list_rows(reg)
        assert recoveries_of(row["info"]) == {1: ["node 1 moved from h1 to the spare host h2"]}
        assert "  attempt 1: node 1 moved from h1 to the spare host h2" in run_lines(run_status(reg, row, False))
    assert code == 0, err
    assert re.search(r"^h2\s+1\s+1\s+ok", err, re.M), err  # the summary: node 1, rank 1 on h2
    log = (tmp_path / "out" / "logs" / "rank-1.log").read_text()
    assert "attempt 2, node 1 (" in log and SURVIVORS == []


def test_moving_to_a_spare_keeps_node_ranks_and_takes_the_rendezvous_with_node_0(tmp_path):
    from slurmgen.launch.plan import move_to_spare

    plan = local_plan(tmp_path, ["true"], slots=(2, 2), spares=[Host.with_count("s1", 1), Host.with_count("s2", 2)])
    plan = replace(plan, spare_addrs={"s1": "10.0.0.1", "s2": "10.0.0.2"})
    moved = move_to_spare(plan, "h0")
    assert moved is not None and [n.host for n in moved.nodes] == ["s2", "h1"]  # s1 has too few slots
    assert [e.rank for e in moved.nodes[0].entries] == [0, 1] and moved.master_addr == "10.0.0.2"
    assert [s.name for s in moved.spares] == ["s1"] and move_to_spare(moved, "h1") is None
    assert move_to_spare(plan, "h1").master_addr == plan.master_addr  # type: ignore[union-attr]
    with pytest.raises(SlurmgenError, match=r"^spare_hosts: h1 is also one of the job's hosts"):
        local_plan(tmp_path, ["true"], slots=(1, 1), spares=[Host.with_count("h1", 1)])


def test_a_lost_host_with_no_spare_drops_out_while_min_nodes_are_left(tmp_path):
    """--min-nodes (the pure decision, plan.shrink): the lost host's node goes, the others keep their
    order with node ranks and ranks dense, WORLD_SIZE follows; node 0 going takes the rendezvous to
    the next first host; never below min_nodes."""
    from slurmgen.launch.plan import shrink

    plan = local_plan(tmp_path, ["true"], slots=(2, 1, 2), max_restarts=1, min_nodes=2)
    shrunk = shrink(plan, "h1")
    assert shrunk is not None and shrunk.world_size == 4 and shrunk.master_addr == plan.master_addr
    assert [(n.host, n.node_rank, [(e.rank, e.node_rank, e.world_size) for e in n.entries]) for n in shrunk.nodes] == [
        ("h0", 0, [(0, 0, 4), (1, 0, 4)]),
        ("h2", 1, [(2, 1, 4), (3, 1, 4)]),
    ]
    assert shrink(shrunk, "h2") is None  # 1 node left: fewer than min_nodes 2
    assert shrink(plan, "elsewhere") is None
    # local_plan gives the master's address (127.0.0.1): node 0 cannot drop out without it...
    assert shrink(plan, "h0") is None
    # ...and when it follows the hosts, it moves to the next first host's.
    followed = shrink(replace(plan, host_addrs={"h1": "10.0.0.1", "h2": "10.0.0.2"}), "h0")
    assert followed is not None and followed.master_addr == "10.0.0.1"
    assert [(n.host, n.rank_offset) for n in followed.nodes] == [("h1", 0), ("h2", 1)]
    assert shrink(replace(plan, min_nodes=None), "h1") is None  # no --min-nodes: no smaller world


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--min-nodes", "3", "--max-restarts", "1"], "min_nodes: 3 is more than nodes (2); expected 1 to 2"),
        (["--min-nodes", "0", "--max-restarts", "1"], "min_nodes: 0 is fewer than 1; expected 1 to 2"),
        (
            ["--min-nodes", "1"],
            "min_nodes: 1 is the fewest nodes a restart goes on with; give --max-restarts N",
        ),
    ],
)
def test_min_nodes_that_do_not_fit_are_one_line_exit_2_nothing_written(capsys, tmp_path, monkeypatch, flags, words):
    from helpers import run as run_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURMGEN_HOME", str(tmp_path / "home"))
    code, out, err = run_cli(capsys, "launch", "--hosts", "a,b", *flags, "--", "python3", "-m", "x")
    assert (code, out, err.strip()) == (2, "", f"slurmgen: error: {words}")
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_a_lost_host_with_no_spare_leaves_a_smaller_world(tmp_path):
    """--min-nodes 1, no spare: h1 is lost in attempt 1; attempt 2 runs on h0 alone, rank 0 of a
    1-rank world, h1 is not contacted again, and the run registry says so as Slurm's restart does."""
    made, calls = {}, []

    class LosingOnce(LosingConnection):
        def start(self, command, stdin, timeout=10.0, separate_stderr=True):
            proc = super().start(command, stdin, timeout, separate_stderr)
            threading.Timer(1.0, setattr, args=(self, "active", False)).start()
            return proc

    def connector(hosts, opts, notify=None):
        calls.append(list(hosts))
        env = {"RUN_FOR": "2.5"}
        conns = {h: (LosingOnce(h, env) if h == "h1" else LocalConnection(h, env)) for h in hosts}
        made.update({f"{h}-{len(calls)}": c for h, c in conns.items()})
        return conns

    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1, 1), max_restarts=1, min_nodes=1)
    plan.env.update({"SLURMGEN_LAUNCH_ID": "L4", "SLURMGEN_GROUP": "launch-L4"})
    registry = tmp_path / "jobs.sqlite"
    record = LaunchRecord.start(Recorder(registry), plan, "smaller", [PY, "-c", SLEEPER])
    code, out, err = run(plan, env=None, connector=connector, made=made, record=record)
    assert calls == [["h0", "h1"]], err
    told = "2 -> 1 nodes: h1 lost, --min-nodes 1"
    assert f"the next attempt runs without h1 ({told})" in err
    with Registry.open(registry) as reg:
        (row,) = list_rows(reg)
        assert recoveries_of(row["info"]) == {1: [told]}
        assert f"  attempt 1: {told}" in run_lines(run_status(reg, row, False))
    assert code == 0, err
    log = (tmp_path / "out" / "logs" / "rank-0.log").read_text()
    assert re.search(r"attempt 2, node 0 \(\S+\), rank 0 of 1,", log), log
    assert not (tmp_path / "out" / "logs" / "rank-1.log").read_text().count("attempt 2") and SURVIVORS == []


def test_the_bundled_trainer_goes_on_in_the_smaller_world_with_its_global_batch(tmp_path):
    """The real thing: 2 gloo ranks of the bundled trainer on h0 and h1; h1 is lost once a checkpoint
    is written; with --min-nodes 1 attempt 2 resumes it on h0 alone, accumulation 1 -> 2 keeping the
    global batch of 16 (config.refit)."""
    out_dir = tmp_path / "run"

    class LosingAfterCheckpoint(LosingProcess):
        def lose(self):
            deadline = time.monotonic() + 120
            while not list((out_dir / "checkpoints").glob("ckpt-*.pt")) and time.monotonic() < deadline:
                time.sleep(0.05)
            super().lose()

    class Losing(LocalConnection):
        def start(self, command, stdin, timeout=10.0, separate_stderr=True):
            proc = LosingAfterCheckpoint(command, stdin, self.env)
            self.procs.append(proc)
            return proc

    made, calls = {}, []

    def connector(hosts, opts, notify=None):
        calls.append(list(hosts))
        conns = {h: (Losing(h) if h == "h1" else LocalConnection(h)) for h in hosts}
        made.update({f"{h}-{len(calls)}": c for h, c in conns.items()})
        return conns

    trainer = [PY, "-m", "slurmgen.train", "--model", "mlp", "--mlp-hidden", "16", "--synthetic-samples", "256"]
    trainer += ["--threads", "1", "--max-steps", "400", "--save-every", "20", "--out-dir", str(out_dir)]
    plan = local_plan(tmp_path, trainer, slots=(1, 1), max_restarts=1, min_nodes=1)
    code, out, err = run(plan, env=None, connector=connector, made=made)
    assert code == 0, err[-3000:] + out[-3000:]
    assert calls == [["h0", "h1"]] and "(2 -> 1 nodes: h1 lost, --min-nodes 1)" in err, err
    assert "the world changed from 2 to 1 processes: gradient accumulation 1 -> 2 keeps the global batch of 16" in out
    assert "done: step 400" in out, out[-3000:]
