"""`slurmgen launch` against the real sshd of every test-cluster node (each in its own network
namespace, key-only, host keys pinned in the cluster's known_hosts).

Every run goes through the real command line (`python -m slurmgen launch`) in a subprocess;
processes are checked per node with `ip netns pids`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import random
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults import cut_off
from helpers import Run, assert_nodes_clean, base_args, sg

from slurmgen.contract import envvars, exitcodes
from slurmgen.contract.node_events import STACK_ASK_WAIT, lifeline_silence
from slurmgen.train.logs import read_heartbeats

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")
pytest.importorskip("paramiko", reason="paramiko is not installed: run scripts/setup.sh")

PY = sys.executable
PROBE = [PY, "-m", "slurmgen.train.probe", "--timeout", "60"]
PROBE_RE = re.compile(r"^\[(\S+)/(\d+)\] SLURMGEN_PROBE (\{.*\})$")


def launch(cluster, workdir: Path, *args: str, env=None, timeout: float = 120) -> Run:
    run = Run([*base_args(cluster, workdir), *args], env=env)
    run.finish(timeout)
    return run


def probe_rows(text: str) -> list[tuple[str, int, dict]]:
    return [(m.group(1), int(m.group(2)), json.loads(m.group(3))) for m in map(PROBE_RE.match, text.splitlines()) if m]


def job_procs(cluster, marker: str) -> list:
    """Processes on any node whose command line contains `marker`."""
    return [p for n in cluster.nodes for p in cluster.pids_on(n) if marker in p.cmdline]


def wait_gone(cluster, marker: str, timeout: float) -> tuple[float, list]:
    """Poll every node until no process matches; (the time it was so, what is left)."""
    start = time.monotonic()
    while True:
        left = job_procs(cluster, marker)
        if not left or time.monotonic() - start > timeout:
            return time.monotonic(), left
        time.sleep(0.02)


@pytest.fixture
def two_nodes(cluster):
    if len(cluster.nodes) < 2:
        pytest.skip("needs 2 nodes")
    assert_nodes_clean(cluster, timeout=15)  # a previous test's leftovers would skew the checks
    return cluster


# ---- ranks ------------------------------------------------------------------------------------------
def test_two_nodes_two_ranks_gloo_probe(two_nodes, tmp_path):
    c = two_nodes
    run = launch(c, tmp_path, "--hosts", "node1,node2", "--gpus", "2", "--", *PROBE)
    assert run.proc.returncode == 0, run.text()
    rows = probe_rows(run.out)
    assert sorted(rank for _, rank, _ in rows) == [0, 1, 2, 3], run.text()
    assert {
        (tag, rank, r["host"], r["rank"], r["local_rank"], r["node_rank"], r["world_size"]) for tag, rank, r in rows
    } == {
        ("node1", 0, "node1", 0, 0, 0, 4),
        ("node1", 1, "node1", 1, 1, 0, 4),
        ("node2", 2, "node2", 2, 0, 1, 4),
        ("node2", 3, "node2", 3, 1, 1, 4),
    }
    assert all(r["problems"] == [] and r["sum"] == 10 and r["master_addr"] == "node1" for _, _, r in rows)
    assert "all 2 node(s) running 4 rank(s)" in run.err
    assert re.search(r"node1\s+0\s+0-1\s+ok\s+0", run.err) and re.search(r"node2\s+1\s+2-3\s+ok\s+0", run.err), run.err
    logs = tmp_path / "out" / "logs"
    # Per-rank logs, and the launch's timeline beside them (named by its launch id; the registry names it too).
    names = sorted(p.name for p in logs.iterdir())
    assert names[:4] == ["rank-0.log", "rank-1.log", "rank-2.log", "rank-3.log"], names
    assert len(names) == 5 and re.fullmatch(r"slurmgen-[0-9]{8}-[0-9]{6}-[0-9a-f]+\.timeline\.jsonl", names[4]), names
    assert "SLURMGEN_PROBE" in (logs / "rank-3.log").read_text()
    assert_nodes_clean(c)


def test_uneven_slots_from_a_hostfile_master_first(two_nodes, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# DeepSpeed format\nnode1 slots=1\nnode2 slots=3  # bigger node\n")
    run = launch(two_nodes, tmp_path, "--hostfile", str(hostfile), "--master", "node2", "--", *PROBE)
    assert run.proc.returncode == 0, run.text()
    rows = probe_rows(run.out)
    assert sorted(
        (r["rank"], r["host"], r["local_rank"], r["node_rank"], r["local_world_size"]) for _, _, r in rows
    ) == [(0, "node2", 0, 0, 3), (1, "node2", 1, 0, 3), (2, "node2", 2, 0, 3), (3, "node1", 0, 1, 1)]
    assert all(r["problems"] == [] and r["world_size"] == 4 and r["master_addr"] == "node2" for _, _, r in rows)


def test_include_picks_slots_and_sets_the_gpu_list(two_nodes, tmp_path):
    show = "import os; print('CVD', os.environ['RANK'], os.environ.get('CUDA_VISIBLE_DEVICES'))"
    run = launch(
        two_nodes,
        tmp_path,
        "--hosts",
        "node1,node2",
        "--gpus",
        "4",
        "--include",
        "node1:1,3@node2:2",
        "--",
        PY,
        "-c",
        show,
    )
    assert run.proc.returncode == 0, run.text()
    assert sorted(re.findall(r"\] CVD (\d) (\S+)", run.out)) == [("0", "1,3"), ("1", "1,3"), ("2", "2")]


# ---- failure -------------------------------------------------------------------------------------
def test_failing_rank_stops_every_process_on_both_nodes(two_nodes, tmp_path):
    c = two_nodes
    marker = f"--fail-rank 3 --sleep 3{random.randint(100, 999)}"
    run = Run([*base_args(c, tmp_path), "--hosts", "node1,node2", "--gpus", "2", "--", *PROBE, *marker.split()])
    failed_at = run.wait_for(r"rank 3 \(local rank 1\) exited with code 1", timeout=90)
    gone_at, left = wait_gone(c, marker, timeout=10)
    code = run.finish(30)
    assert not left, [(p.node, p.cmdline) for p in left]
    # From the moment the failure was reported to the last rank process gone, on every node.
    assert gone_at - failed_at < 2.0, f"{gone_at - failed_at:.2f}s\n{run.text()}"
    assert code == 1, run.text()
    assert "stopping all nodes: rank 3 exited with code 1 on node2" in run.err
    assert re.search(r"node2\s+1\s+2-3\s+failed\s+1 .*first failure: rank 3 exited with code 1", run.err), run.err
    assert re.search(r"node1\s+0\s+0-1\s+stopped\s+143", run.err), run.err
    assert "fails on purpose" in (tmp_path / "out" / "logs" / "rank-3.log").read_text()
    assert_nodes_clean(c)


def test_lost_connection_stops_the_other_node_and_its_own_ranks(two_nodes, tmp_path):
    c = two_nodes
    marker = f"--sleep 4{random.randint(100, 999)}"
    run = Run([*base_args(c, tmp_path), "--hosts", "node1,node2", "--gpus", "1", "--", *PROBE, *marker.split()])
    run.wait_for(r"all 2 node\(s\) running", timeout=60)
    time.sleep(0.5)
    node2 = c.node("node2")
    sessions = [p for p in c.pids_on(node2) if p.cmdline.startswith("sshd:")]
    assert sessions, [p.cmdline for p in c.pids_on(node2)]
    for p in sessions:  # as if node2's network went away: its sshd sessions vanish
        os.kill(p.pid, signal.SIGKILL)
    killed = time.monotonic()
    gone_at, left = wait_gone(c, marker, timeout=10)
    code = run.finish(30)
    assert not left, [(p.node, p.cmdline) for p in left]
    assert gone_at - killed < 2.5, f"{gone_at - killed:.2f}s\n{run.text()}"
    assert code == 255, run.text()
    assert "lost the connection to node2" in run.err
    assert_nodes_clean(c)


@pytest.mark.parametrize("program", ["probe", "flood"])
def test_a_node_cut_off_stops_its_own_ranks_while_the_partition_lasts(two_nodes, tmp_path, program):
    # Every packet to and from node2 is dropped: its SSH session never closes, so only the
    # missing keepalive lines can tell its bootstrap to stop. Nothing heals before the check.
    # "flood": a rank that prints without pause, whose output sshd no longer takes.
    c = two_nodes
    node2 = c.node("node2")
    marker = f"--sleep 8{random.randint(100, 999)}"
    flood = "import sys\nwhile True: sys.stdout.write('x' * 200 + chr(10)); sys.stdout.flush()\n"
    command = [*PROBE, *marker.split()] if program == "probe" else [PY, "-c", flood, *marker.split()]
    run = Run([*base_args(c, tmp_path), "--keepalive", "1", "--hosts", "node1,node2", "--gpus", "2", "--", *command])
    run.wait_for(r"all 2 node\(s\) running", timeout=60)
    time.sleep(1.5)  # a keepalive line or two has reached node2
    silence, grace = lifeline_silence(1.0), 1
    try:
        with cut_off(node2.netns):
            cut = time.monotonic()
            # Everything on node2 but slurmd and the sshd listener: the session, the bootstrap,
            # its relays and watcher, the node script, the ranks.
            assert any(marker in p.cmdline for p in c.pids_on(node2))
            deadline = cut + silence + grace + 10
            while (left := c.pids_on(node2)) and time.monotonic() < deadline:
                time.sleep(0.05)
            gone_at = time.monotonic()
            lost_at = run.wait_for(r"stopping all nodes: no answer from node2", timeout=5)
            code = run.finish(15)
            node1_left = [p for p in c.pids_on(c.node("node1")) if marker in p.cmdline]
            assert not left, [p.cmdline for p in left]
            still_cut = _nft_tables(node2.netns)
    finally:
        for p in c.pids_on(node2):  # only after a failure: the node ends its session itself
            if p.cmdline.startswith("sshd:"):
                os.kill(p.pid, signal.SIGKILL)
    print(
        f"{program}: cut-off node2 clean {gone_at - cut:.2f}s after the cut; launcher gave up after "
        f"{lost_at - cut:.2f}s"
    )
    assert "slurmgen_test_cut" in still_cut  # the node was still cut off when its job was gone
    assert gone_at - cut < silence + grace + 2.0, f"{gone_at - cut:.2f}s\n{run.text()}"
    assert code == exitcodes.LOST, run.text()
    assert not node1_left, [p.cmdline for p in node1_left]
    assert_nodes_clean(c)


def _nft_tables(netns: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", netns, "nft", "list", "tables"], capture_output=True, text=True, timeout=10
    ).stdout


def test_events_survive_a_rank_dying_mid_line_and_a_silent_host_amid_a_flood(two_nodes, tmp_path):
    c = two_nodes
    # 1. node2's rank prints a line that looks like an event, then dies mid-line: its own verdict.
    mid_line = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    print('slurmgen-event-1 exited 0 9', flush=True); time.sleep(1)\n"
        "    sys.stdout.write('progress 50%'); sys.stdout.flush(); sys.exit(3)\n"
        f"time.sleep(6{random.randint(100, 999)})\n"
    )
    run = launch(c, tmp_path, "--hosts", "node1,node2", "--gpus", "1", "--", PY, "-c", mid_line, timeout=60)
    assert run.proc.returncode == 3, run.text()
    assert "stopping all nodes: rank 1 exited with code 3 on node2" in run.err
    assert "[node2/1] slurmgen-event-1 exited 0 9" in run.out and "[node2/1] progress 50%" in run.out
    assert_nodes_clean(c)
    # 2. node1 floods output while node2's sshd freezes (its network went silent, no FIN):
    # lost within the keepalive window (1 s x 4), though output never stops arriving.
    marker = f"--sleep 7{random.randint(100, 999)}"
    flood = "import os, sys, time\nwhile os.environ['RANK'] == '0': print('x' * 60, flush=True); time.sleep(0.002)\n"
    run = Run(
        [
            *base_args(c, tmp_path),
            "--keepalive",
            "1",
            "--hosts",
            "node1,node2",
            "--gpus",
            "1",
            "--",
            PY,
            "-c",
            flood + "time.sleep(60)",
            *marker.split(),
        ]
    )
    run.wait_for(r"all 2 node\(s\) running", timeout=60)
    sessions = [p for p in c.pids_on(c.node("node2")) if p.cmdline.startswith("sshd:")]
    assert sessions
    for p in sessions:
        os.kill(p.pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        lost_at = run.wait_for(r"stopping all nodes: no answer from node2 for 4s on node2", timeout=30)
        code = run.finish(30)
    finally:
        for p in sessions:
            os.kill(p.pid, signal.SIGCONT)  # node2 then sees the closed connection and stops its ranks
    assert code == exitcodes.LOST, run.text()
    assert 3.0 <= lost_at - frozen < 4 + 2.5, f"{lost_at - frozen:.1f}s\n{run.text()}"
    assert sum(1 for _, s, t in run.lines if s == "out" and t.startswith("[node1/0] xxx")) > 200
    gone_at, left = wait_gone(c, marker, timeout=10)
    assert not left, [(p.node, p.cmdline) for p in left]
    assert_nodes_clean(c)


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_every_node_within_2s(two_nodes, tmp_path, sig, expected):
    c = two_nodes
    marker = f"--sleep 5{random.randint(100, 999)}"
    run = Run([*base_args(c, tmp_path), "--hosts", "node1,node2", "--gpus", "2", "--", *PROBE, *marker.split()])
    run.wait_for(r"all 2 node\(s\) running", timeout=60)
    time.sleep(0.5)
    run.proc.send_signal(sig)
    sent = time.monotonic()
    gone_at, left = wait_gone(c, marker, timeout=10)
    code = run.finish(30)
    assert not left, [(p.node, p.cmdline) for p in left]
    assert gone_at - sent < 2.0, f"{gone_at - sent:.2f}s\n{run.text()}"
    assert code == expected, run.text()
    name = signal.Signals(sig).name
    assert f"stopping all nodes: got {name}" in run.err and f"interrupted by {name}" in run.err
    assert_nodes_clean(c)


def trainer_args(out: Path, *extra: str) -> list[str]:
    return [
        PY,
        "-m",
        "slurmgen.train",
        "--model",
        "mlp",
        "--mlp-hidden",
        "16",
        "--synthetic-samples",
        "256",
        "--progress",
        "lines",
        "--heartbeat-every",
        "0.2",
        "--out-dir",
        str(out),
        *extra,
    ]


def heartbeats(out: Path) -> dict[int, dict]:
    """The trainer's heartbeats: in OUT_DIR/heartbeats, or, under --heartbeat-timeout, in the
    node-local directory the bootstrap made (the nodes share this machine's /tmp), told apart
    from other runs' by the writer's command line."""
    beats = {}
    for f in [
        *(out / "heartbeats").glob("rank-*.json"),
        *Path("/tmp").glob("slurmgen-launch.*/heartbeats/rank-*.json"),
    ]:
        try:
            beat = json.loads(f.read_text())
            if str(out) in Path(f"/proc/{beat['pid']}/cmdline").read_bytes().decode(errors="replace"):
                beats[int(f.stem.split("-")[1])] = beat
        except (ValueError, OSError, KeyError):
            continue
    return beats


def wait_until(predicate, timeout: float, what: str, run: Run | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if run is not None and run.proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{run.text()}" if run else ""))


# Runs of the frozen-rank test (issue 24: 10 of 10 for the benchmark, benchmarks/bench_hang.py).
HANG_RUNS = range(int(os.environ.get("SLURMGEN_HANG_RUNS", "1")))


@pytest.mark.parametrize("run_no", HANG_RUNS)
def test_frozen_rank_on_the_second_node_is_named_across_nodes(two_nodes, tmp_path, run_no):
    """Rank 3 (node2) SIGSTOPped: ranks 0-2 block in the next collective and go quiet too; each
    node judging alone blamed one of its own. The launcher judges every node's beats, then asks
    node2 for rank 3's Python stack before it stops every node: the verdict says where rank 3 was
    stuck, and the whole dump (the trainer's loop, `fit`, in it) is beside the rank logs."""
    c, limit = two_nodes, 3.0
    out = tmp_path / "run"
    run = Run(
        [
            *base_args(c, tmp_path),
            "--hosts",
            "node1,node2",
            "--gpus",
            "2",
            "--heartbeat-timeout",
            str(limit),
            "--",
            *trainer_args(out, "--max-steps", "1000000"),
        ]
    )
    beats = wait_until(
        lambda: (lambda b: b if len(b) == 4 and all(x["status"] == "running" for x in b.values()) else None)(
            heartbeats(out)
        ),
        90,
        "4 running heartbeats",
        run,
    )
    victim = beats[3]
    assert victim["host"] == "node2"
    os.kill(victim["pid"], signal.SIGSTOP)  # a rank that hangs: no progress, no heartbeat, no exit
    stopped = time.monotonic()
    try:
        hung_at = run.wait_for(r"stopping all nodes: rank \d", timeout=30)
        code = run.finish(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim["pid"], signal.SIGKILL)
    ended = run.lines[-1][0] - stopped if run.lines else float("inf")
    print(
        f"run {run_no}: frozen -> launch ended {ended:.2f} s (named after {hung_at - stopped:.2f} s, limit {limit:g} s)"
    )
    assert code == exitcodes.HUNG, run.text()
    story = re.search(
        r"stopping all nodes: (rank 3 on node2 stopped beating at step \d+ \(no heartbeat for "
        r"[0-9.]+ s, its process is stopped\); ranks 0-2 waited in a collective; "
        r"stuck in (/\S+\.py):(\d+) in (\S+)\(\))$",
        run.err,
        re.M,
    )
    assert story, run.err
    dumps = list(tmp_path.glob("**/stack-rank-3.txt"))
    assert len(dumps) == 1, dumps
    dump = dumps[0].read_text()
    print(f"rank 3 stuck in {story[2]}:{story[3]} in {story[4]}()")
    assert f'File "{story[2]}", line {story[3]} in {story[4]}' in dump, dump
    assert re.search(r'File ".*/slurmgen/train/trainer\.py", line \d+ in fit$', dump, re.M), dump
    table = " ".join(run.err.split())  # the summary wraps a long note
    assert re.search(r"hung 124 .*first failure: " + re.escape(" ".join(story[1].split())), table), run.err
    # Not before the limit, counted from the last beat (at most one 0.2 s beat period before the freeze);
    # the stack may hold the stop up by at most STACK_ASK_WAIT.
    assert limit - 0.2 <= hung_at - stopped and ended <= limit + 2 + STACK_ASK_WAIT, run.text()
    assert_nodes_clean(c)


def test_restart_resumes_the_trainer_from_its_checkpoint(two_nodes, tmp_path):
    c = two_nodes
    out = tmp_path / "run"
    run = Run(
        [
            *base_args(c, tmp_path),
            "--hosts",
            "node1,node2",
            "--gpus",
            "1",
            "--max-restarts",
            "1",
            "--",
            *trainer_args(out, "--max-steps", "250", "--save-every", "20", "--log-every", "25"),
        ]
    )
    wait_until(lambda: list((out / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint", run)
    # No --heartbeat-timeout: the trainer's own node summaries in the run directory.
    victim = wait_until(lambda: read_heartbeats(out / "heartbeats").get(1), 30, "rank 1's heartbeat", run)
    os.kill(victim["pid"], signal.SIGKILL)  # rank 1 on node2 crashes mid-run
    code = run.finish(240)
    assert code == 0, run.text()
    assert re.search(
        r"attempt 1 of 2 failed \(rank 1 exited with code 137 on node2\); starting all nodes again", run.err
    )
    m = re.search(r"resumed from \S+ckpt-0*(\d+)\.pt at step (\d+)", run.out)
    assert m and int(m.group(2)) >= 20, run.text()
    assert "done: step 250" in run.out
    log = (tmp_path / "out" / "logs" / "rank-1.log").read_text()
    assert (
        "===== slurmgen launch: attempt 1, node 1 (node2)" in log
        and "===== slurmgen launch: attempt 2, node 1 (node2)" in log
    )
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(m["step"] for m in metrics) == 250
    assert_nodes_clean(c)


def test_a_warm_restart_keeps_the_healthy_rank_and_goodput_counts_it_as_a_recovery(two_nodes, tmp_path):
    """Issue 35: `--restart-mode warm` over real sshd. Rank 1 (node2) SIGKILLed after a checkpoint:
    rank 0 keeps its process and rejoins, rank 1 goes on in node2's warm spare. slurmgen's own
    goodput read the new world's first step as the attempt's and everything before it as start-up
    (0% for a run with a warm restart a minute); it now accounts a recovery inside attempt 1: the
    steps redone since the checkpoint (lost) and the fault to every rank stepping again (restart).
    Rank 0 sleeps 80 ms a step (SLURMGEN_TRAIN_SLOW) so that training, not start-up, fills the run
    however fast the machine."""
    c = two_nodes
    out = tmp_path / "run"
    run = Run(
        [
            *base_args(c, tmp_path),
            *("--registry", str(tmp_path / "jobs.sqlite"), "--hosts", "node1,node2", "--gpus", "1"),
            *("--max-restarts", "1", "--restart-mode", "warm", "--env", f"{envvars.TRAIN_SLOW}=0:0.08", "--"),
            *trainer_args(out, "--max-steps", "400", "--save-every", "50", "--log-every", "100"),
        ]
    )
    wait_until(lambda: list((out / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint", run)
    victim = wait_until(lambda: read_heartbeats(out / "heartbeats").get(1), 30, "rank 1's heartbeat", run)
    os.kill(victim["pid"], signal.SIGKILL)
    assert run.finish(240) == 0, run.text()
    assert "warm restart 1 of at most 1" in run.err and "starting all nodes again" not in run.err, run.err
    assert "done: step 400" in run.out
    (row,) = json.loads(sg(c, tmp_path, "jobs", "--json").stdout)
    found = json.loads(sg(c, tmp_path, "status", row["job"], "--json").stdout)
    g, told = found["goodput"], found["recoveries"]["1"]
    print(f"warm restart over sshd: {g['goodput']:.1%} goodput, {g['breakdown']}, lost {g['lost_steps']}")
    assert 0.5 < g["goodput"] < 1, g
    (lost,) = g["lost_steps"]
    assert (lost["attempt"], lost["generation"]) == (1, 1) and 0 <= lost["steps"] <= 60, g
    assert 0 < g["breakdown"]["restart"] < 30 and len(told) == 1 and told[0].startswith("warm restart 1:"), found
    text = sg(c, tmp_path, "status", row["job"]).stdout
    assert "  attempt 1: warm restart 1: rank 1 started anew" in text and "goodput " in text, text
    assert_nodes_clean(c)


# ---- host keys ----------------------------------------------------------------------------------------
def test_unknown_host_key_is_refused_and_accepted_only_with_the_opt_in(two_nodes, tmp_path):
    c = two_nodes
    known = tmp_path / "ssh" / "known_hosts"  # does not exist yet
    args = ["--hosts", "node1,node2", "--known-hosts", str(known), "--", "true"]
    run = launch(c, tmp_path, *args)
    assert run.proc.returncode == 1, run.text()
    lines = [ln for ln in run.err.splitlines() if ln.startswith("slurmgen: error:")]
    assert len(lines) == 2, run.err
    for node in ("node1", "node2"):
        line = next(ln for ln in lines if f"error: {node}:" in ln)
        assert re.search(
            rf"host key ssh-ed25519 SHA256:\S+ of {node} is not in {re.escape(str(known))}; refusing", line
        )
        assert "--accept-new-host-keys" in line and "ssh-keyscan" in line
    assert not known.exists()

    run = launch(c, tmp_path, "--accept-new-host-keys", *args)
    assert run.proc.returncode == 0, run.text()
    assert "added new host key ssh-ed25519" in run.err
    recorded = {line.split()[0]: line.split()[2] for line in known.read_text().splitlines()}
    pinned = {line.split()[0].split(",")[0]: line.split()[2] for line in c.known_hosts.read_text().splitlines()}
    assert recorded == {"node1": pinned["node1"], "node2": pinned["node2"]}

    run = launch(c, tmp_path, *args)  # now known: no opt-in needed
    assert run.proc.returncode == 0, run.text()


def test_changed_host_key_is_refused_even_with_the_opt_in(two_nodes, tmp_path):
    c = two_nodes
    pinned = {line.split()[0].split(",")[0]: line.split(None, 1)[1] for line in c.known_hosts.read_text().splitlines()}
    forged = tmp_path / "known_hosts"
    forged.write_text(f"node1 {pinned['node2']}\nnode2 {pinned['node2']}")  # node1 "changed" its key
    run = launch(
        c, tmp_path, "--hosts", "node1,node2", "--known-hosts", str(forged), "--accept-new-host-keys", "--", "true"
    )
    assert run.proc.returncode == 1, run.text()
    assert re.search(
        r"error: node1: host key of node1 has CHANGED: the server offers ssh-ed25519 SHA256:\S+, "
        r"known_hosts has ssh-ed25519 SHA256:\S+; refusing \(hint: .*ssh-keygen -R",
        run.err,
    ), run.err
    assert "node2:" not in run.err.replace("node2 ", "")  # node2 itself was fine


# ---- reaching hosts ---------------------------------------------------------------------------------------
def test_closed_port_is_refused_at_once_naming_the_host(two_nodes, tmp_path):
    start = time.monotonic()
    run = launch(two_nodes, tmp_path, "--hosts", "node1,node2", "--port", "2", "--", "true")
    assert run.proc.returncode == 1
    assert "error: node1: connection refused by node1:2" in run.err and "error: node2: connection refused" in run.err
    assert time.monotonic() - start < 5


def test_silent_host_fails_within_the_connect_timeout(two_nodes, tmp_path):
    # A listener on loopback that accepts and never says a word (a hung or non-SSH service).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        cfg = tmp_path / "ssh_config"
        cfg.write_text(
            f"Host quiet\n  HostName 127.0.0.1\n  Port {silent.getsockname()[1]}\n" + two_nodes.ssh_config.read_text()
        )
        start = time.monotonic()
        run = Run(["--ssh-config", str(cfg), "--hosts", "node1,quiet", "--connect-timeout", "1.5", "--", "true"])
        code = run.finish(30)
        elapsed = time.monotonic() - start
    assert code == 1, run.text()
    assert "error: quiet: 127.0.0.1:" in run.err and "sent no SSH greeting within 1.5 s" in run.err, run.err
    assert "error: node1" not in run.err, run.err  # node1 was fine; only quiet is named
    assert elapsed < 1.5 + 3, f"{elapsed:.1f}s"


def test_unreachable_address_times_out_within_the_connect_timeout(two_nodes, tmp_path):
    # A namespace of our own with a veth pair whose both ends stay inside it: the TEST-NET
    # address 203.0.113.2 is pinned to a MAC nobody has, so SYNs go out one end, arrive at the
    # other and are dropped there. Nothing leaves the namespace; nothing ever answers.
    ns, a, b = f"sgt-unreach-{os.getpid()}", "sgtua0", "sgtub0"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "-n", ns, "link", "add", a, "type", "veth", "peer", "name", b],
        ["ip", "-n", ns, "addr", "add", "203.0.113.1/24", "dev", a],
        ["ip", "-n", ns, "link", "set", a, "up"],
        ["ip", "-n", ns, "link", "set", b, "up"],
        ["ip", "-n", ns, "neigh", "add", "203.0.113.2", "lladdr", "02:00:00:00:00:02", "dev", a, "nud", "permanent"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        start = time.monotonic()
        proc = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                ns,
                PY,
                "-m",
                "slurmgen",
                "launch",
                "--hosts",
                "203.0.113.2",
                "--known-hosts",
                str(tmp_path / "kh"),
                "--ssh-config",
                os.devnull,
                "--connect-timeout",
                "2",
                "--",
                "true",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        elapsed = time.monotonic() - start
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == (
        "slurmgen: error: 203.0.113.2: no answer from 203.0.113.2:22 within 2 s (hint: is "
        "the host up and reachable from here? (--connect-timeout to wait longer))"
    ), proc.stderr
    assert elapsed < 2 + 3, f"{elapsed:.1f}s"


# ---- authentication and ssh config ----------------------------------------------------------------------
def test_flags_without_ssh_config_and_agent_authentication(two_nodes, tmp_path):
    c = two_nodes
    flags = [
        "--user",
        "root",
        "--known-hosts",
        str(c.known_hosts),
        "--workdir",
        str(tmp_path),
        "--ssh-config",
        str(tmp_path / "empty_config"),
        "--hosts",
        "node1,node2",
    ]
    (tmp_path / "empty_config").write_text("")
    run = Run([*flags, "--identity", str(c.ssh_key), "--", "hostname"])
    assert run.finish(60) == 0, run.text()
    assert sorted(re.findall(r"^\[(node\d)/\d\] (node\d)$", run.out, re.M)) == [("node1", "node1"), ("node2", "node2")]

    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, 10, "ssh-agent's socket")
        subprocess.run(
            ["ssh-add", str(c.ssh_key)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)}, check=True, capture_output=True
        )
        run = Run([*flags, "--", "hostname"], env={"SSH_AUTH_SOCK": str(sock), "HOME": str(tmp_path)})
        assert run.finish(60) == 0, run.text()
        run = Run([*flags, "--", "hostname"], env={"SSH_AUTH_SOCK": "", "HOME": str(tmp_path)})
        assert run.finish(60) == 1
        assert (
            "error: node1: authentication as 'root' failed at node1:22 (key files: none given; ssh-agent: no)"
            in run.err
        ), run.err
    finally:
        agent.terminate()
        agent.wait(10)


def run_on_a_terminal(args: list[str], answers: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """`slurmgen launch` on a real pseudo-terminal: each answer is typed at the next
    passphrase prompt; (exit code, everything the terminal showed, colours removed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        try:
            os.execve(PY, [PY, "-m", "slurmgen", "launch", *args], {**os.environ, **env})
        finally:
            os._exit(127)
    shown, pending = b"", list(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            shown += data
            if pending and shown.count(b"Enter passphrase") > len(answers) - len(pending):
                os.write(fd, pending.pop(0).encode() + b"\n")
    finally:
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), re.sub(r"\x1b\[[0-9;]*m", "", shown.decode(errors="replace"))


def test_encrypted_key_is_asked_for_once_on_a_terminal_or_taken_from_the_agent(two_nodes, tmp_path):
    c = two_nodes
    passphrase = "it's a $(secret)"
    key = tmp_path / "encrypted_key"
    shutil.copy(c.ssh_key, key)
    key.chmod(0o600)
    subprocess.run(
        ["ssh-keygen", "-q", "-p", "-f", str(key), "-P", "", "-N", passphrase], check=True, capture_output=True
    )
    (tmp_path / "empty_config").write_text("")
    flags = [
        "--user",
        "root",
        "--known-hosts",
        str(c.known_hosts),
        "--workdir",
        str(tmp_path),
        "--ssh-config",
        str(tmp_path / "empty_config"),
        "--hosts",
        "node1,node2",
        "--identity",
        str(key),
        "--",
        "hostname",
    ]
    no_agent = {"SSH_AUTH_SOCK": "", "HOME": str(tmp_path)}

    # On a terminal: asked once for both hosts; a wrong answer is asked again; never echoed.
    code, shown = run_on_a_terminal(flags, ["wrong", passphrase], no_agent)
    assert code == 0, shown
    assert shown.count(f"Enter passphrase for key '{key}': ") == 2, shown
    assert sorted(re.findall(r"^\[(node\d)/\d\] (node\d)\r?$", shown, re.M)) == [("node1", "node1"), ("node2", "node2")]
    assert passphrase not in shown and "wrong" not in shown

    # Without a terminal: skipped (as ssh in batch mode does); nothing else gets in, so each
    # host's error says why that key was not offered and what to do.
    run = Run(flags, env=no_agent)
    assert run.finish(60) == 1
    assert run.err.splitlines() == [
        f"slurmgen: error: {host}: authentication as 'root' failed at {host}:22 (key files: {key} (encrypted and "
        f"not in ssh-agent: ssh-add {key}, or run from a terminal to be asked for its passphrase); ssh-agent: no) "
        "(hint: check --user and --identity, the keys in your ssh-agent, or ~/.ssh/config)"
        for host in ("node1", "node2")
    ]
    # ... and a second key that works still gets in.
    run = Run([*flags[: flags.index("--")], "--identity", str(c.ssh_key), "--", "hostname"], env=no_agent)
    assert run.finish(60) == 0, run.text()

    # Held by ssh-agent (added with its passphrase through SSH_ASKPASS): used from there.
    sock = tmp_path / "agent.sock"
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\nprintf '%s\\n' {shlex.quote(passphrase)}\n")
    askpass.chmod(0o700)
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, 10, "ssh-agent's socket")
        subprocess.run(
            ["ssh-add", str(key)],
            check=True,
            capture_output=True,
            start_new_session=True,
            env={
                **os.environ,
                "SSH_AUTH_SOCK": str(sock),
                "SSH_ASKPASS": str(askpass),
                "SSH_ASKPASS_REQUIRE": "force",
                "DISPLAY": ":0",
            },
        )
        # Eight connections at once (four aliases per node) sign through the agent together:
        # each must talk to the agent over its own socket.
        aliases = [f"n{i}{x}" for i in (1, 2) for x in "abcd"]
        (tmp_path / "aliases").write_text("".join(f"Host {a}\n  HostName node{a[1]}\n" for a in aliases))
        eight = [
            *flags[: flags.index("--ssh-config")],
            "--ssh-config",
            str(tmp_path / "aliases"),
            "--hosts",
            ",".join(aliases),
            "--identity",
            str(key),
            "--",
            "hostname",
        ]
        run = Run(eight, env={"SSH_AUTH_SOCK": str(sock), "HOME": str(tmp_path)})
        assert run.finish(60) == 0, run.text()
        assert sorted(re.findall(r"^\[(n\d\w)/\d\] (node\d)$", run.out, re.M)) == [(a, f"node{a[1]}") for a in aliases]
    finally:
        agent.terminate()
        agent.wait(10)


def test_proxy_jump_one_and_two_hops_and_a_broken_jump(two_nodes, tmp_path):
    c = two_nodes
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        "Host behind\n  HostName node2\n  ProxyJump node1\n"
        "Host twohops\n  HostName node1\n  ProxyJump node1,node2\n"
        "Host broken\n  HostName node2\n  ProxyJump node1:2\n"
        "Host behind2\n  HostName node2\n  ProxyJump node1\n" + c.ssh_config.read_text()
    )
    flags = [
        "--ssh-config",
        str(cfg),
        "--workdir",
        str(tmp_path),
        "--user",
        "root",
        "--identity",
        str(c.ssh_key),
        "--known-hosts",
        str(c.known_hosts),
    ]
    show = ["bash", "-c", 'echo "CONN $(hostname) $SSH_CONNECTION"']
    for alias, lands_on, comes_from in (("behind", "node2", "node1"), ("twohops", "node1", "node2")):
        run = Run([*flags, "--hosts", alias, "--", *show])
        assert run.finish(60) == 0, run.text()
        m = re.search(rf"^\[{alias}/0\] CONN (\S+) (\S+) ", run.out, re.M)
        assert m and (m.group(1), m.group(2)) == (lands_on, c.node(comes_from).ip), run.text()
    run = Run([*flags, "--hosts", "broken", "--", "true"])
    assert run.finish(60) == 1
    assert "error: broken: via jump host node1: connection refused by node1:2" in run.err, run.err
    # Two targets behind the same jump host: one connection to it, a channel per target.
    run = Run([*flags, "--hosts", "behind,behind2", "--", "sleep", "3"])
    run.wait_for(r"all 2 node\(s\) running", timeout=60)
    ss = subprocess.run(
        ["ip", "netns", "exec", c.node("node1").netns, "ss", "-Htn", "state", "established", "( sport = :22 )"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert run.finish(60) == 0, run.text()
    assert len(ss.stdout.splitlines()) == 1, ss.stdout


def test_proxy_command_connects_fails_in_one_line_and_its_end_is_a_lost_connection(two_nodes, tmp_path):
    c = two_nodes
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host viacmd\n  HostName node2\n  ProxyCommand exec ssh -F {c.ssh_config} -W %h:%p node1\n"
        "Host badcmd\n  HostName node2\n  ProxyCommand echo 'no route via the bastion' >&2; exit 3\n"
        + c.ssh_config.read_text()
    )
    flags = [
        "--ssh-config",
        str(cfg),
        "--workdir",
        str(tmp_path),
        "--user",
        "root",
        "--identity",
        str(c.ssh_key),
        "--known-hosts",
        str(c.known_hosts),
        "--connect-timeout",
        "5",
    ]
    run = Run([*flags, "--hosts", "viacmd", "--", "bash", "-c", 'echo "CONN $(hostname) $SSH_CONNECTION"'])
    assert run.finish(60) == 0, run.text()
    m = re.search(r"^\[viacmd/0\] CONN (\S+) (\S+) ", run.out, re.M)
    assert m and (m.group(1), m.group(2)) == ("node2", c.node("node1").ip), run.text()

    started = time.monotonic()
    run = Run([*flags, "--hosts", "badcmd", "--", "true"])
    assert run.finish(60) == 1
    assert time.monotonic() - started < 4, "a proxy that ended at once must not cost the connect timeout"
    assert (
        "error: badcmd: ProxyCommand \"echo 'no route via the bastion' >&2; exit 3\" ended without an SSH "
        "connection to node2:22; it said: no route via the bastion"
    ) in run.err, run.err

    # The proxy dies mid-run: the launcher sees the connection end, node2's ranks are stopped.
    marker = f"sleep 5{random.randint(100, 999)}"
    run = Run([*flags, "--hosts", "viacmd", "--", *marker.split()])
    run.wait_for(r"all 1 node\(s\) running", timeout=60)
    subprocess.run(["pkill", "-KILL", "-P", str(run.proc.pid)], check=True)  # the proxy: the launcher's child
    killed = time.monotonic()
    code = run.finish(30)
    assert code == 255, run.text()
    assert time.monotonic() - killed < 3, run.text()
    assert "lost the connection to viacmd" in run.err
    _, left = wait_gone(c, marker, timeout=5)
    assert not left, [(p.node, p.cmdline) for p in left]
    assert_nodes_clean(c)
