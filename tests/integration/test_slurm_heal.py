"""Jobs that heal under Slurm: hang detection, the retry policy and the finished marker.

Real jobs on the test cluster, rendered by `slurmgen create` (shellchecked), running an
external-style program (not our trainer): it writes the one-line heartbeat protocol itself
when SLURMGEN_HEARTBEAT_DIR is set, and notes every start in a shared file.

- A rank that stops beating while staying alive: the watcher stops the step within
  timeout + 2 s of its last beat, the job exits HUNG and its attempts record names the rank.
- `--retries 1 --retry-on 3 --exclude-failed-node`, a 1-node job whose first attempt fails
  with 3: the job requeues itself once, with the failing node excluded, runs on the other
  node and COMPLETES. Requeued by hand afterwards, it does not run again (finished marker).
- Under torchrun (one srun task per node: the node's agent), a failing worker is named in the
  attempts record by its own rank and node, with its own exit code, not by its agent's task.

Slurm holds a requeued job for its credential lifetime (BeginTime, 120 s); as in
test_slurm_train.py the test lifts the hold with `scontrol update StartTime=now`, at least one
wall-clock second after the requeue (a credential revoked in the same second is refused).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import render_and_lint

from slurmgen.contract import exitcodes
from slurmgen.generate.hostlist import expand
from slurmgen.heal.attempts import attempts_path, finished_path, read_attempts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# argv: MODE SHARED_DIR. Every start appends "restart rank host" to SHARED_DIR/starts.txt.
# hang: every rank beats every 0.1 s; rank 3 stops after 1 s, notes when, and sleeps on.
# fail-once: in the first attempt rank 1 exits 3 after 0.3 s; otherwise every rank exits 0.
# rank3-fails: rank 3 exits 5 after 0.3 s; the others wait to be stopped.
PROGRAM = r"""
import json, os, socket, sys, time
mode, shared = sys.argv[1], sys.argv[2]
rank, restart = int(os.environ["RANK"]), int(os.environ.get("SLURM_RESTART_COUNT") or 0)
with open(os.path.join(shared, "starts.txt"), "a") as f:
    f.write("%d %d %s\n" % (restart, rank, socket.gethostname()))
beats = os.environ.get("SLURMGEN_HEARTBEAT_DIR")

def beat():
    os.makedirs(beats, exist_ok=True)
    path = os.path.join(beats, "rank-%05d.json" % rank)
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps({"rank": rank, "step": 0, "time": time.time(), "pid": os.getpid(),
                            "host": socket.gethostname(), "status": "running"}) + "\n")
    os.replace(path + ".tmp", path)

if mode == "hang":
    start = time.time()
    while time.time() - start < 60:
        beat()
        if rank == 3 and time.time() - start > 1:
            with open(os.path.join(shared, "last-beat.txt"), "w") as f:
                f.write(repr(time.time()))
            time.sleep(600)
        time.sleep(0.1)
elif mode == "fail-once":
    time.sleep(0.3)
    sys.exit(3 if restart == 0 and rank == 1 else 0)
elif mode == "rank3-fails":
    time.sleep(0.3)
    if rank == 3:
        sys.exit(5)
    time.sleep(60)
"""
HEARTBEAT_TIMEOUT = 2.0


def _job(cluster, tmp_path: Path, mode: str, *create_args: str) -> tuple[Path, Path, str]:
    shared = tmp_path / "shared"
    shared.mkdir()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    out = render_and_lint(
        tmp_path / "out",
        "--backend",
        "gloo",
        "--time",
        "5",
        *create_args,
        command=["python", str(program), mode, str(shared)],
    )
    return out, shared, cluster.submit(out / "run_slurm.sh", cwd=out)


def _log(out: Path, job: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((out / "logs").glob(f"*-{job}.out")))


def _release_when_held(cluster, job: str, restarts: str, timeout: float = 40) -> None:
    """Wait for the requeued job to be PENDING (BeginTime) and let it start now."""
    deadline = time.monotonic() + timeout
    while True:
        info = cluster.job_info(job)
        if info["JobState"] == "PENDING" and info.get("Restarts") == restarts:
            break
        assert time.monotonic() < deadline, f"job {job} not requeued: {info['JobState']} {info.get('Reason')}"
        time.sleep(0.1)
    time.sleep(max(0.0, int(time.time()) + 1.2 - time.time()))
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])


def test_a_rank_without_heartbeat_stops_the_step_and_is_named(cluster, tmp_path):
    out, shared, job = _job(
        cluster, tmp_path, "hang", "--nodes", "2", "--gpus", "2", "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT)
    )
    state, code = cluster.wait(job, timeout=60)
    log = _log(out, job)
    assert (state, code) == ("FAILED", exitcodes.HUNG), log
    last_beat = float((shared / "last-beat.txt").read_text())
    (start, end) = read_attempts(attempts_path(out / "logs", job))
    node2 = cluster.node_names[1]
    assert (start["event"], end["event"], end["hung_rank"], end["node"]) == ("start", "end", 3, node2), end
    assert (end["exit_code"], end["action"]) == (exitcodes.HUNG, "stop"), end
    # The batch shell wrote "end" once the step was over: within timeout + 2 s of the last beat.
    stopped_after = end["time"] - last_beat
    print(f"hung rank stopped {stopped_after:.2f} s after its last beat (timeout {HEARTBEAT_TIMEOUT} s)")
    assert HEARTBEAT_TIMEOUT < stopped_after <= HEARTBEAT_TIMEOUT + 2, log
    assert "slurmgen: hung: rank=3 node=" + node2 in log, log
    assert cluster.wait_no_tasks(job, timeout=10) == []
    # Each node's watcher removed its node-local heartbeat directory.
    assert not list(Path(cluster.env()["TMPDIR"]).glob(f"slurmgen-heartbeats-{job}.*")), "heartbeat dirs left"


def test_a_cancelled_trainer_job_leaves_no_heartbeat_directory_on_any_node(cluster, tmp_path):
    """scancel's TERM reaches the watchers and the ranks at once: each watcher removes its node's
    heartbeat directory, and the bundled trainer, which saves a checkpoint on TERM and then beats
    once more ("stopped"), must not make it again (it did: the benchmark's cancelled jobs left
    their directories, and a later job of the same id judged their stale beats as its own hang)."""
    train = [
        *("python", "-m", "slurmgen.train", "--model", "mlp", "--mlp-hidden", "16", "--synthetic-samples", "256"),
        *("--batch-size", "8", "--max-steps", "100000", "--threads", "1", "--heartbeat-every", "0.2"),
        *("--save-every", "50", "--out-dir", str(tmp_path / "run")),
    ]
    args = ["--backend", "gloo", "--time", "5", "--nodes", "2", "--gpus", "2", "--heartbeat-timeout", "30"]
    out = render_and_lint(tmp_path / "out", *args, "--restarts", "1", command=train)
    job = cluster.submit(out / "run_slurm.sh", cwd=out)
    beats = Path(cluster.env()["TMPDIR"]).glob
    deadline = time.monotonic() + 90
    while len(list(beats(f"slurmgen-heartbeats-{job}.*/*/rank-*.json"))) < 4:
        assert time.monotonic() < deadline, f"no beat from every rank:\n{_log(out, job)[-3000:]}"
        time.sleep(0.2)
    cluster.cancel(job)
    assert cluster.wait(job, timeout=30)[0] == "CANCELLED"
    assert cluster.wait_no_tasks(job, timeout=15) == []
    assert not list(beats(f"slurmgen-heartbeats-{job}.*")), f"heartbeat dirs left:\n{_log(out, job)[-3000:]}"


def test_retry_requeues_once_without_the_failed_node_then_never_again(cluster, tmp_path):
    out, shared, job = _job(
        cluster,
        tmp_path,
        "fail-once",
        "--nodes",
        "1",
        "--gpus",
        "2",
        "--retries",
        "1",
        "--retry-on",
        "3",
        "--exclude-failed-node",
    )
    _release_when_held(cluster, job, restarts="1")
    state, code = cluster.wait(job, timeout=60)
    log = _log(out, job)
    assert (state, code) == ("COMPLETED", 0), log
    starts = [line.split() for line in (shared / "starts.txt").read_text().splitlines()]
    first = {host for restart, _, host in starts if restart == "0"}
    second = {host for restart, _, host in starts if restart == "1"}
    assert len(first) == 1 and len(second) == 1 and first != second, starts
    info = cluster.job_info(job)
    assert (info["Restarts"], info["ExcNodeList"]) == ("1", first.pop()), info
    records = read_attempts(attempts_path(out / "logs", job))
    ends = [r for r in records if r["event"] == "end"]
    assert [(r["attempt"], r["exit_code"], r["task"], r["action"]) for r in ends] == [
        (1, 3, 1, "requeue"),
        (2, 0, None, "finished"),
    ], records  # restart counts 0 and 1: attempts 1 and 2
    assert ends[0]["exclude"] == info["ExcNodeList"] == ends[0]["node"]
    assert finished_path(out / "logs", job).exists()

    # A finished job requeued by hand starts, finds its marker, and runs nothing.
    cluster.run(["scontrol", "requeue", job])
    _release_when_held(cluster, job, restarts="2")
    assert cluster.wait(job, timeout=60) == ("COMPLETED", 0)
    assert len((shared / "starts.txt").read_text().splitlines()) == len(starts)
    assert [r["event"] for r in read_attempts(attempts_path(out / "logs", job))][-1] == "skipped"
    assert "already finished" in _log(out, job)


def test_under_torchrun_the_record_names_the_failing_rank_and_its_node(cluster, tmp_path):
    # c10d hands out ranks by arrival: which node holds rank 3 is only known from the program.
    out, shared, job = _job(cluster, tmp_path, "rank3-fails", "--nodes", "2", "--gpus", "2", "--launcher", "torchrun")
    state, code = cluster.wait(job, timeout=90)
    log = _log(out, job)
    assert (state, code) == ("FAILED", 5), log
    (host,) = [
        h for _, rank, h in (line.split() for line in (shared / "starts.txt").read_text().splitlines()) if rank == "3"
    ]
    (_, end) = read_attempts(attempts_path(out / "logs", job))
    assert (end["exit_code"], end["rank"], end["node"], end["hung_rank"]) == (5, 3, host, None), end
    # The agent's task: one per node, in the order of the job's nodes.
    assert end["task"] == expand(cluster.job_info(job)["NodeList"]).index(host), end
    assert f"slurmgen: rank 3 on {host} exited with code 5 first" in log.splitlines()[-1], log
    assert cluster.wait_no_tasks(job, timeout=10) == []
