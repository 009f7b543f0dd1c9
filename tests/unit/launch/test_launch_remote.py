"""The per-node bootstrap of `slurmgen launch`, run by bash on this machine exactly as sshd would.

Covers: the payload arrives, ranks and environment are right for uneven nodes, stdin's end
stops every process group within 2 s (also for programs that ignore TERM), a stale heartbeat
in the node-local SLURMGEN_HEARTBEAT_DIR fails the node with 124, events arrive on stderr
only, and nothing is left behind.
"""

import json
import os
import textwrap
import time

import pytest
from helpers import PY, LocalProcess, alive, local_plan

from slurmgen.contract import exitcodes
from slurmgen.contract.node_events import NodeEvent, parse_event
from slurmgen.launch.remote import payload, remote_command

REPORT = (
    "import json, os; print('REPORT ' + json.dumps({k: os.environ.get(k) for k in ["
    "'RANK', 'LOCAL_RANK', 'NODE_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', "
    "'SLURMGEN_ATTEMPT', 'FROM_STDIN', 'CUDA_VISIBLE_DEVICES']} | {'cwd': os.getcwd()}))"
)


def start(plan, node_index=0, attempt=1):
    node = plan.nodes[node_index]
    return LocalProcess(remote_command(plan, node, attempt), payload(plan, node))


def output_of(proc, timeout=30):
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = proc.read()
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode()


def events_of(proc):
    """Every line of the node's event channel (stderr), parsed; None for a stray line."""
    assert proc.popen.stderr is not None
    return [parse_event(line) for line in proc.popen.stderr.read().decode().splitlines()]


def pids_from(text):
    return [int(line.split("PID ")[1]) for line in text.splitlines() if "PID " in line]


def ended(proc, pids, since):
    """The rest of `proc`'s output, its exit status, and how long after `since` its ranks `pids`
    were all gone (waiting 5 s at most)."""
    text = output_of(proc)
    code = proc.exit_status()
    while any(alive(p) for p in pids) and time.monotonic() - since < 5:
        time.sleep(0.02)
    return text, code, time.monotonic() - since


def wait_for_lines(proc, marker, count, timeout=20):
    """Read until `count` lines contain `marker`; return what was read."""
    text = ""
    deadline = time.monotonic() + timeout
    while text.count(marker) < count and time.monotonic() < deadline:
        data = proc.read()
        if not data:
            break
        text += data.decode()
    assert text.count(marker) >= count, text
    return text


def test_uneven_node_gets_offset_ranks_environment_workdir_and_logs(tmp_path):
    plan = local_plan(tmp_path, [PY, "-c", REPORT], slots=(2, 3), env={"FROM_STDIN": "it's $secret"})
    proc = start(plan, node_index=1, attempt=2)
    text = output_of(proc)
    assert proc.exit_status() == 0, text
    rows = [json.loads(line.split("REPORT ", 1)[1]) for line in text.splitlines() if "REPORT " in line]
    assert sorted((int(r["RANK"]), int(r["LOCAL_RANK"])) for r in rows) == [(2, 0), (3, 1), (4, 2)]
    assert {
        (
            r["NODE_RANK"],
            r["WORLD_SIZE"],
            r["LOCAL_WORLD_SIZE"],
            r["MASTER_ADDR"],
            r["MASTER_PORT"],
            r["SLURMGEN_ATTEMPT"],
            r["FROM_STDIN"],
            r["cwd"],
        )
        for r in rows
    } == {("1", "5", "3", "127.0.0.1", str(plan.master_port), "2", "it's $secret", str(tmp_path))}
    assert rows[0]["CUDA_VISIBLE_DEVICES"] is None
    assert "started ranks 2-4 of 5" in text
    log = (tmp_path / "out" / "logs" / "rank-4.log").read_text()
    assert "===== slurmgen launch: attempt 2, node 1" in log and "REPORT" in log
    assert not list(tmp_path.glob("slurmgen-launch.*"))


def test_end_of_stdin_stops_every_process_group_within_2s(tmp_path):
    # Rank 0 ignores TERM (killed after the grace), rank 1 spawns a grandchild.
    program = textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        if os.environ["LOCAL_RANK"] == "0":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            child = subprocess.Popen([{PY!r}, "-c", "import time; time.sleep(60)"])
            print("PID", child.pid, flush=True)
        print("PID", os.getpid(), flush=True)
        time.sleep(60)
    """)
    plan = local_plan(tmp_path, [PY, "-c", program], slots=(2,))
    proc = start(plan)
    text = wait_for_lines(proc, "PID ", 3)
    pids = pids_from(text)
    assert all(alive(p) for p in pids)
    stopped = time.monotonic()
    proc.close_stdin()
    rest, code, gone_after = ended(proc, pids, since=stopped)
    text += rest
    assert not any(alive(p) for p in pids), text
    assert gone_after < 2.0, f"{gone_after:.2f}s\n{text}"
    assert code == 143, text
    assert "got SIGTERM" in text


SLEEPER = textwrap.dedent("""
    import os, time
    print("PID", os.getpid(), flush=True)
    time.sleep(60)
""")


def test_silent_lifeline_stops_every_rank_though_stdin_stays_open(tmp_path):
    # A partition drops packets: stdin never ends, the keepalive lines just stop coming.
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(2,))
    node = plan.nodes[0]
    proc = LocalProcess(remote_command(plan, node, 1, keepalive=0.25), payload(plan, node))  # silence=1
    text = wait_for_lines(proc, "PID ", 2)
    pids = pids_from(text)
    cut = time.monotonic()
    rest, code, gone_after = ended(proc, pids, since=cut)
    text += rest
    assert not any(alive(p) for p in pids), text
    assert gone_after < 1 + 1 + 1.0, f"{gone_after:.2f}s\n{text}"  # silence + stop grace + slack
    assert code == 143, text
    assert "slurmgen-launch: no keepalive from the launcher for 1s; stopping the ranks on this node" in text
    proc.close_stdin()


def test_keepalive_lines_keep_the_node_running(tmp_path):
    plan = local_plan(tmp_path, [PY, "-c", SLEEPER], slots=(1,))
    node = plan.nodes[0]
    proc = LocalProcess(remote_command(plan, node, 1, keepalive=0.25), payload(plan, node))
    pids = pids_from(wait_for_lines(proc, "PID ", 1))
    for _ in range(12):  # 3 s: three times the silence
        proc.send(b"\n")
        time.sleep(0.25)
    assert all(alive(p) for p in pids)
    proc.close_stdin()
    text = output_of(proc)
    assert proc.exit_status() == 143, text
    assert "no keepalive" not in text


def test_the_node_reports_its_quiet_ranks_beats_and_leaves_the_verdict_to_the_launcher(tmp_path):
    # Both ranks beat; rank 1 stops beating after half a second and freezes (SIGSTOP).
    program = textwrap.dedent("""
        import json, os, signal, time
        rank = int(os.environ["RANK"])
        path = os.path.join(os.environ["SLURMGEN_HEARTBEAT_DIR"], f"rank-{rank:05d}.json")
        print("PID", os.getpid(), flush=True)
        print("HB", path, flush=True)
        start = time.time()
        while True:
            if rank == 1 and time.time() - start > 0.5:
                os.kill(os.getpid(), signal.SIGSTOP)
            with open(path + ".tmp", "w") as f:
                f.write(json.dumps({"rank": rank, "step": 7, "time": time.time(), "pid": os.getpid(),
                                    "host": "h", "status": "running"}) + "\\n")
            os.replace(path + ".tmp", path)
            time.sleep(0.2)
    """)
    # A 2 s limit: rank 0 beats every 0.2 s, yet on two loaded cores it went a second unscheduled
    # (reported quiet at a 1 s limit, though it never stopped beating).
    plan = local_plan(tmp_path, [PY, "-c", program], slots=(2,), heartbeat_timeout=2.0)
    proc = start(plan)
    text = wait_for_lines(proc, "HB ", 2)
    time.sleep(3.5)  # beyond the limit: the node itself stops nothing
    assert all(alive(p) for p in pids_from(text))
    proc.close_stdin()
    text += output_of(proc)
    assert proc.exit_status() == exitcodes.TERMINATED, text
    events = events_of(proc)
    beats = [e.beats for e in events if e is not None and e.kind == "beats"]
    assert [e.kind for e in events if e.kind != "beats"] == ["started"], events
    # Every report names the frozen rank 1. Rank 0, never stopped, may be named too when two
    # loaded cores left it unscheduled past the limit (CI at load 9): then as running, not stopped.
    assert beats and all(1 in [b.rank for b in reported] for reported in beats), beats
    assert all(b.rank == 1 or not b.stopped for reported in beats for b in reported), beats
    last = next(b for b in beats[-1] if b.rank == 1)
    assert (last.step, last.stopped) == (7, True) and last.age_ms > 1500, last
    # The directory is the node's own (under its TMPDIR), not the working directory, and goes with the node.
    hb_dirs = {line.split("HB ")[1].rsplit("/", 1)[0] for line in text.splitlines() if "] HB " in line}
    assert len(hb_dirs) == 1 and not hb_dirs.pop().startswith(str(tmp_path)), text
    assert not any(alive(p) for p in pids_from(text))


def test_finished_ranks_and_other_statuses_are_not_judged(tmp_path):
    program = textwrap.dedent("""
        import json, os, time
        rank = int(os.environ["RANK"])
        with open(os.path.join(os.environ["SLURMGEN_HEARTBEAT_DIR"], f"rank-{rank:05d}.json"), "w") as f:
            f.write(json.dumps({"rank": rank, "time": time.time(), "status": "done"}) + "\\n")
        time.sleep(2.5)
    """)
    plan = local_plan(tmp_path, [PY, "-c", program], slots=(1,), heartbeat_timeout=0.5)
    proc = start(plan)
    text = output_of(proc)
    assert proc.exit_status() == 0, text


def test_no_heartbeat_dir_without_a_heartbeat_timeout(tmp_path):
    plan = local_plan(
        tmp_path, [PY, "-c", "import os; print('HB', os.environ.get('SLURMGEN_HEARTBEAT_DIR'))"], slots=(1,)
    )
    proc = start(plan)
    assert "HB None" in output_of(proc)
    assert proc.exit_status() == 0


def test_missing_workdir_is_one_error_event(tmp_path):
    plan = local_plan(tmp_path, ["true"], slots=(1,))
    plan = type(plan)(**{**plan.__dict__, "workdir": str(tmp_path / "nope")})
    proc = start(plan)
    output_of(proc)
    assert proc.exit_status() == exitcodes.BAD_INPUT
    assert events_of(proc) == [
        NodeEvent(
            "error",
            message=f"working directory '{tmp_path / 'nope'}' does not exist "
            "on " + os.uname().nodename + " (see --workdir)",
        )
    ]


def test_truncated_payload_is_refused(tmp_path):
    plan = local_plan(tmp_path, ["true"], slots=(1,))
    node = plan.nodes[0]
    data = payload(plan, node)
    proc = LocalProcess(remote_command(plan, node, 1), data[:-200])
    proc.close_stdin()
    output_of(proc)
    assert proc.exit_status() == exitcodes.BAD_INPUT
    assert [e.kind for e in events_of(proc)] == ["error"]
    assert not os.path.exists(tmp_path / "out" / "logs" / "rank-0.log")


@pytest.mark.parametrize("cut", ["bootstrap", "payload"])
def test_a_payload_that_stops_arriving_is_given_up_within_the_silence(tmp_path, cut):
    """A node cut off mid-send: stdin stays open but nothing more comes (packets drop). The
    node waits at most the lifeline's silence (1 s with a 0.25 s keepalive), runs nothing."""
    plan = local_plan(tmp_path, ["true"], slots=(1,))
    node = plan.nodes[0]
    data = payload(plan, node)
    keep = 300 if cut == "bootstrap" else len(data) - 200  # inside the bootstrap, or the node script
    started = time.monotonic()
    proc = LocalProcess(remote_command(plan, node, 1, keepalive=0.25), data[:keep])
    try:
        output_of(proc, timeout=10)
        elapsed = time.monotonic() - started
        status = proc.exit_status()
        events = events_of(proc)
    finally:
        proc.close_stdin()
    assert elapsed < 1 + 1.5, f"{elapsed:.1f}s"
    if cut == "payload":
        assert status == exitcodes.BAD_INPUT
        assert events == [NodeEvent("error", message="the node script and environment did not arrive within 1s")]
    else:
        assert status != 0 and events == []  # no part of a bootstrap cut short is run
    assert not os.path.exists(tmp_path / "out" / "logs" / "rank-0.log")


def test_rank_output_never_reaches_the_event_channel(tmp_path):
    # A rank prints a line that looks like an event, writes to the event descriptor, and
    # exits mid-line: the channel carries exactly the node's own two events.
    program = textwrap.dedent("""
        import os, sys
        print("slurmgen-event-1 exited 0 9", flush=True)
        print("slurmgen-event-1 exited 0 9", file=sys.stderr, flush=True)
        try:
            os.write(9, b"slurmgen-event-1 exited 0 8\\n")
        except OSError as exc:
            print("fd 9:", exc.strerror, flush=True)
        sys.stdout.write("progress 50%"); sys.stdout.flush()
        sys.exit(3)
    """)
    plan = local_plan(tmp_path, [PY, "-c", program], slots=(1,))
    proc = start(plan)
    text = output_of(proc)
    assert proc.exit_status() == 3, text
    assert events_of(proc) == [NodeEvent("started"), NodeEvent("exited", 0, 3)], text
    assert "fd 9: Bad file descriptor" in text and "[rank 0] progress 50%" in text


def test_users_bashrc_runs_once_per_node_not_again_in_the_bootstrap(tmp_path):
    # As sshd runs it: the login shell at shell level 1 with SSH_CLIENT set, where Debian's
    # bash sources ~/.bashrc even for a command. The bootstrap must not source it a second time.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(f'echo "$$" >>{tmp_path / "rc-runs"}\n')
    plan = local_plan(tmp_path, ["bash", "-c", "echo RANK_UP"], slots=(1,))
    node = plan.nodes[0]
    proc = LocalProcess(
        remote_command(plan, node, 1),
        payload(plan, node),
        env={"HOME": str(home), "SHLVL": "0", "SSH_CLIENT": "10.0.0.1 50000 22"},
    )
    assert "RANK_UP" in output_of(proc)
    assert proc.exit_status() == 0
    assert len((tmp_path / "rc-runs").read_text().split()) == 1
