"""In-job restarts under Slurm (issue 35): a failure ends a job step, not the job.

Real jobs on the test cluster, rendered by `slurmgen create --restarts 1` (shellchecked), running
the bundled trainer (gloo, CPU) with a checkpoint every few steps:

- SIGKILL of one rank (or SIGSTOP: a hung rank, which the watcher names and kills): run_slurm.sh
  starts a new job step in the same job within seconds (the job id stays, it is never PENDING
  again, Slurm counts no restart), attempt 2's first step comes after the checkpoint (it
  resumed), the attempts record says restart then finished, and nothing of the job is left on
  any node. Under srun and torchrun (the hang under srun).
- With a spare node (`--spare-nodes 1`, 3 nodes for a 2-node job): the failed rank's node is
  left out and the spare takes its node rank; the next step runs on the spare.
- With no spare and `--min-nodes 1` (a smaller world): the lost node drops out and the next step
  runs on the node left, in the same job; the trainer resumes the 2-node checkpoint with twice the
  gradient accumulation (the same global batch) and says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import assert_nodes_clean, render_and_lint, sg

from slurmgen.contract import exitcodes
from slurmgen.contract.files import TIMELINE_NAME
from slurmgen.contract.warm import WORLD_NAME
from slurmgen.heal.attempts import attempts_path, read_attempts, where_next
from slurmgen.jsonl import objects

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TRAIN = [
    *("python", "-m", "slurmgen.train"),
    *("--model", "gpt", "--synthetic-samples", "4096", "--batch-size", "8", "--max-steps", "400"),
    *("--threads", "1", "--init-timeout", "60", "--progress", "lines", "--log-every", "10"),
    *("--heartbeat-every", "0.2", "--save-every", "20", "--keep-last", "3"),
]
KILLED_RANK = 1


def _train_for(steps: int) -> list[str]:
    """TRAIN with another --max-steps."""
    at = TRAIN.index("--max-steps") + 1
    return [*TRAIN[:at], str(steps), *TRAIN[at + 1 :]]


def _warm_args(restarts: int) -> tuple[str, ...]:
    """`submit`'s options for the warm-restart tests: 2 nodes x 2 gloo ranks, `restarts` in-job restarts."""
    warm = ("--restarts", str(restarts), "--restart-mode", "warm")
    return ("--backend", "gloo", "--time", "5", *warm, "--nodes", "2", "--gpus", "2")


def _submit(cluster, tmp_path: Path, *create_args: str) -> tuple[Path, str]:
    out = render_and_lint(
        tmp_path / "out", "--backend", "gloo", "--time", "5", "--restarts", "1", *create_args, command=TRAIN
    )
    return out, cluster.submit(out / "run_slurm.sh", cwd=out)


def _log(out: Path, job: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((out / "logs").glob(f"*-{job}.out")))


# bash's own report of a process it waited for that a signal ended, with that line of the script's
# source ("slurm_script: line 824: 30284 Killed   srun ...", 20 lines of it): a SIGKILLed rank's
# wrapper, a stopped srun, a probe ended by its timeout each printed one into the job log.
SHELL_REPORT = re.compile(r"line \d+: +\d+ (Killed|Terminated) ")


def _no_shell_reports(log: str, step_srun: bool = False) -> None:
    """`step_srun`: the one report left, a line, when a warm attempt's stuck step srun is stopped:
    the guard that kills it is another process, and the batch shell reaps it in its watch loop
    and reports it before any wait of its own could send the report nowhere."""
    found = [ln for ln in log.splitlines() if SHELL_REPORT.search(ln)]
    if step_srun:
        found = [ln for ln in found if not re.search(r'Killed +srun "\$\{srun_args\[@\]\}"', ln)]
    assert not found, found


def _timeline(out: Path, job: str) -> list[dict]:
    path = out / "logs" / TIMELINE_NAME.format(job_id=job)
    return list(objects(path.read_text().splitlines())) if path.exists() else []


def _rank_pid(cluster, job: str, rank: int):
    """The trainer process of `rank` (its RANK in its environment): node and pid."""
    for proc in cluster.job_pids(job):
        if "slurmgen.train" not in proc.cmdline or proc.cmdline.startswith(("bash", "slurmstepd")):
            continue
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return proc
    return None


def _spares(cluster, job: str) -> list:
    """The job's warm spare processes (Python started as slurmgen.train.spare, promoted or not):
    not the bash, slurmstepd and srun whose command lines name it too (the spare's srun runs on the
    batch node, in the job: taken for node1's spare, it failed a run that had promoted the real one)."""
    return [
        p
        for p in cluster.job_pids(job)
        if "slurmgen.train.spare" in p.cmdline and not p.cmdline.startswith(("bash", "slurmstepd", "srun"))
    ]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_spares_ready(cluster, out: Path, job: str, nodes: int) -> dict[str, object]:
    """The spares of every node, once each has imported torch: idle, its CPU time unchanged for a second."""
    deadline = time.monotonic() + 90
    while True:
        assert time.monotonic() < deadline, (_spares(cluster, job), _log(out, job)[-3000:])
        spares = {p.node: p for p in _spares(cluster, job)}
        if len(spares) == nodes:
            with contextlib.suppress(OSError):
                before = {n: _cpu_seconds(p.pid) for n, p in spares.items()}
                time.sleep(1)
                if all(_cpu_seconds(p.pid) == before[n] for n, p in spares.items()):
                    return spares
        time.sleep(0.5)


def _promoted(out: Path, job: str, rank: int) -> set[int]:
    """The pids the trainer of `rank` wrote its lines from after a warm restart (generation 1 on)."""
    return {e["pid"] for e in _timeline(out, job) if e.get("rank") == rank and e.get("generation") and "pid" in e}


def _wait_for_a_checkpoint(cluster, out: Path, job: str) -> None:
    """Until attempt 1 wrote a checkpoint and the trainer of KILLED_RANK is running."""
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, _log(out, job)
        state = cluster.job_info(job)["JobState"]
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), (state, _log(out, job))
        saved = [e for e in _timeline(out, job) if e.get("event") == "checkpoint" and e.get("attempt") == 1]
        if saved and _rank_pid(cluster, job, KILLED_RANK) is not None:
            return
        time.sleep(0.2)


def _kill_rank_after_a_checkpoint(cluster, out: Path, job: str, fault: int) -> tuple[float, object]:
    """Wait for a checkpoint of attempt 1, then send `fault` to the trainer of KILLED_RANK; when and which."""
    _wait_for_a_checkpoint(cluster, out, job)
    proc = _rank_pid(cluster, job, KILLED_RANK)
    os.kill(proc.pid, fault)
    return time.time(), proc


def _wait_never_pending(cluster, job: str, timeout: float = 180) -> str:
    """Poll the job to its end; it must never go back to PENDING (no requeue)."""
    deadline = time.monotonic() + timeout
    while True:
        info = cluster.job_info(job)
        assert info["JobState"] != "PENDING", info
        if info["JobState"] not in ("RUNNING", "COMPLETING", "CONFIGURING"):
            return info
        assert time.monotonic() < deadline, info
        time.sleep(0.25)


@pytest.mark.parametrize(
    "launcher, fault, code",
    [("srun", signal.SIGKILL, 137), ("torchrun", signal.SIGKILL, 137), ("srun", signal.SIGSTOP, exitcodes.HUNG)],
    ids=["srun-kill", "torchrun-kill", "srun-hang"],
)
def test_a_killed_rank_restarts_in_the_same_job_from_the_checkpoint(cluster, tmp_path, launcher, fault, code):
    # A stopped rank (SIGSTOP) is a hung one: the watcher (--heartbeat-timeout) names and kills it.
    hang = ("--heartbeat-timeout", "10") if fault == signal.SIGSTOP else ()
    out, job = _submit(cluster, tmp_path, "--nodes", "2", "--gpus", "2", "--launcher", launcher, *hang)
    killed_at, killed = _kill_rank_after_a_checkpoint(cluster, out, job, fault)
    info = _wait_never_pending(cluster, job)
    log = _log(out, job)
    _no_shell_reports(log)
    assert (info["JobState"], info["ExitCode"], info.get("Restarts")) == ("COMPLETED", "0:0", "0"), log
    records = read_attempts(attempts_path(out / "logs", job))
    starts = [r for r in records if r["event"] == "start"]
    ends = [r for r in records if r["event"] == "end"]
    assert [r["attempt"] for r in starts] == [1, 2], records
    assert [(r["attempt"], r["exit_code"], r["action"]) for r in ends] == [(1, code, "restart"), (2, 0, "finished")], (
        log
    )
    assert ends[0]["node"] == killed.node and starts[1]["restart"] == 1, records
    if not hang:
        # The batch shell is done with the old step (ended, its failure read, the nodes probed)
        # within seconds of a kill: nothing waits out the 10 s guard for a lost node's srun.
        assert ends[0]["time"] - killed_at < 8, (ends[0]["time"] - killed_at, log)
    if hang:
        assert ends[0]["hung_rank"] == KILLED_RANK, records
    # Attempt 2 resumed: its first step is past a checkpoint of attempt 1, and came seconds after the kill.
    timeline = _timeline(out, job)
    saved = max(e["step"] for e in timeline if e.get("event") == "checkpoint" and e.get("attempt") == 1)
    firsts = [e for e in timeline if e.get("event") == "first_step" and e.get("attempt") == 2]
    assert len({e["rank"] for e in firsts}) == 4, timeline
    assert min(e["step"] for e in firsts) > saved >= 20, firsts
    stepping_again = max(e["time"] for e in firsts) - killed_at
    print(
        f"{launcher} {fault.name}: fault to every rank stepping again {stepping_again:.1f} s (from step {saved}); "
        f"the next step started {starts[1]['time'] - killed_at:.1f} s after the fault"
    )
    assert stepping_again < (60 if not hang else 75), log  # a hang is found 10 s after the last beat
    assert cluster.wait_no_tasks(job, timeout=15) == []


@pytest.mark.parametrize("watch", [(), ("--heartbeat-timeout", "10")], ids=["plain", "heartbeat"])
def test_a_lost_node_is_replaced_by_the_spare_in_the_same_job(cluster, tmp_path, watch):
    """Every process of the job on node 2 killed and node 2's slurmd stopped (SIGSTOP: it answers
    nobody): the job (--no-kill) keeps its allocation, the next step runs on the spare in node 2's
    node rank, resumes from the checkpoint and completes. With the hang watch (--heartbeat-timeout)
    its srun, whose watcher on node 2 never reports its end, does not hold the next step: it is
    stopped once the healthy nodes' watchers have ended, and nothing is left on any node."""
    if len(cluster.nodes) < 3:
        pytest.skip("a spare needs a third node: SLURMGEN_TEST_NODES=3")
    out, job = _submit(cluster, tmp_path, "--nodes", "2", "--gpus", "2", "--spare-nodes", "1", *watch)
    _wait_for_a_checkpoint(cluster, out, job)
    active = read_attempts(attempts_path(out / "logs", job))[0]["nodes"].split(",")
    spare = next(n.name for n in cluster.nodes if n.name not in active)
    lost = cluster.node(active[1])
    os.kill(lost.slurmd_pid, signal.SIGSTOP)
    try:
        killed_at = time.time()
        for proc in cluster.pids_on(lost):
            if proc.job_id == job:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        records = _wait_finished(cluster, out, job)
    finally:
        # The node answers again (as after a reboot): Slurm can end the job's part there, and the
        # tests after this one have every node.
        os.kill(lost.slurmd_pid, signal.SIGCONT)
    log = _log(out, job)
    _no_shell_reports(log)
    starts = [r for r in records if r["event"] == "start"]
    ends = [r for r in records if r["event"] == "end"]
    assert [(r["attempt"], r["action"]) for r in ends] == [(1, "restart"), (2, "finished")], log
    assert ends[0]["exclude"] == lost.name and starts[1]["nodes"] == f"{active[0]},{spare}", records
    firsts = [e for e in _timeline(out, job) if e.get("event") == "first_step" and e.get("attempt") == 2]
    assert len(firsts) == 4 and {e["host"] for e in firsts if e["rank"] >= 2} == {spare}, firsts
    again, new_step = max(e["time"] for e in firsts) - killed_at, starts[1]["time"] - killed_at
    print(
        f"lost node{' (heartbeat watch)' if watch else ''}: every rank stepping again on the spare {again:.1f} s "
        f"(attempt 1 ended {ends[0]['time'] - killed_at:.1f} s, the new step started {new_step:.1f} s after the "
        f"fault; load {os.getloadavg()[0]:.1f})"
    )
    info = _wait_never_pending(cluster, job)
    assert (info["JobState"], info["ExitCode"], info.get("Restarts")) == ("COMPLETED", "0:0", "0"), log
    assert cluster.wait_no_tasks(job, timeout=30) == []
    if watch:
        assert_nodes_clean(cluster, timeout=30)
        # The new step within 5 s of the lost node's probe (up to 5 s); 15.9 s when the watchers' srun
        # waited out its 10 s grace for node 2's report. The four new processes' start is the load's.
        assert new_step < 14 and again < 45, log[-3000:]


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_a_lost_node_with_no_spare_leaves_a_smaller_world_in_the_same_job(cluster, tmp_path, launcher):
    """--nodes 2 --min-nodes 1, no spare: node 2's processes killed and its slurmd stopped; the next
    step runs on node 1 alone (ranks 0-1, a world of 2), resumes past the checkpoint with gradient
    accumulation 2 (4 ranks x 8 x 1 = 2 ranks x 8 x 2 samples a step), and the job completes."""
    out, job = _submit(cluster, tmp_path, "--nodes", "2", "--gpus", "2", "--min-nodes", "1", "--launcher", launcher)
    _wait_for_a_checkpoint(cluster, out, job)
    active = read_attempts(attempts_path(out / "logs", job))[0]["nodes"].split(",")
    lost = cluster.node(active[1])
    os.kill(lost.slurmd_pid, signal.SIGSTOP)
    try:
        killed_at = time.time()
        for proc in cluster.pids_on(lost):
            if proc.job_id == job:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        records = _wait_finished(cluster, out, job)
    finally:
        os.kill(lost.slurmd_pid, signal.SIGCONT)  # as after a reboot: the tests after this one have every node
    log = _log(out, job)
    _no_shell_reports(log)
    starts = [r for r in records if r["event"] == "start"]
    ends = [r for r in records if r["event"] == "end"]
    assert [(r["attempt"], r["action"]) for r in ends] == [(1, "restart"), (2, "finished")], log
    assert (starts[1]["nodes"], starts[1]["min_nodes"], ends[0]["exclude"]) == (active[0], 1, lost.name), records
    said = where_next(records, records.index(ends[0]))
    assert said == f" on {active[0]} (2 -> 1 nodes: {lost.name} lost, --min-nodes 1)", said
    timeline = _timeline(out, job)
    saved = max(e["step"] for e in timeline if e.get("event") == "checkpoint" and e.get("attempt") == 1)
    firsts = [e for e in timeline if e.get("event") == "first_step" and e.get("attempt") == 2]
    assert sorted(e["rank"] for e in firsts) == [0, 1] and {e["host"] for e in firsts} == {active[0]}, firsts
    assert min(e["step"] for e in firsts) > saved >= 20, firsts
    assert "the world changed from 4 to 2 processes: gradient accumulation 1 -> 2 keeps the global batch" in log
    assert "global batch: 32 samples (8 per process x 2 accumulation x 2 processes)" in log, log
    again = max(e["time"] for e in firsts) - killed_at
    print(f"lost node, smaller world ({launcher}): every rank stepping again {again:.1f} s")
    info = _wait_never_pending(cluster, job)
    assert (info["JobState"], info["ExitCode"], info.get("Restarts")) == ("COMPLETED", "0:0", "0"), log
    assert cluster.wait_no_tasks(job, timeout=30) == []


def _wait_finished(cluster, out: Path, job: str, timeout: float = 200) -> list[dict]:
    """The attempts record once it says the job finished; the job never PENDING meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        assert cluster.job_info(job)["JobState"] != "PENDING", _log(out, job)
        records = read_attempts(attempts_path(out / "logs", job))
        if any(r.get("action") == "finished" for r in records):
            return records
        assert time.monotonic() < deadline, _log(out, job)
        time.sleep(0.5)


def test_a_killed_rank_restarts_warm_and_the_healthy_ranks_keep_their_processes(cluster, tmp_path):
    """--restart-mode warm, srun mode: SIGKILL of one rank after a checkpoint. The step goes on
    (--kill-on-bad-exit=0): the batch script writes generation 1's world on both nodes and starts
    the killed rank anew on its node; the healthy ranks keep their processes (the same PIDs, no
    new interpreter), every rank steps on from the checkpoint in generation 1 of attempt 1, and the
    job completes in its allocation with one recovery in its attempts record and its status."""
    # submitted by `slurmgen submit`, so that `slurmgen status` knows the job
    args = _warm_args(restarts=1)
    # 800 steps: the run goes on long enough after the fault for the promoted spare's replacement
    # (the 10 s settle time, then its srun's start) to be seen while the job runs; with 400 a quiet
    # machine ended the job 14 s after the fault, before it could be.
    train = _train_for(800)
    job = sg(cluster, tmp_path, "submit", *args, "-o", "out", "--", *train).stdout.strip().splitlines()[-1]
    out = tmp_path / "out"
    lint = subprocess.run(["shellcheck", str(out / "run_slurm.sh")], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout
    _wait_for_a_checkpoint(cluster, out, job)
    spares = _wait_spares_ready(cluster, out, job, nodes=2)
    healthy = {r: _rank_pid(cluster, job, r) for r in (0, 2, 3)}
    killed = _rank_pid(cluster, job, KILLED_RANK)
    load = os.getloadavg()[0]
    os.kill(killed.pid, signal.SIGKILL)
    killed_at = time.time()
    # The promoted spare's node gets a new one once the settle time is past, while the job runs.
    refill, deadline, promoted = None, time.monotonic() + 30, spares[killed.node].pid
    while refill is None and time.monotonic() < deadline and cluster.job_info(job)["JobState"] == "RUNNING":
        refill = next((p for p in _spares(cluster, job) if p.node == killed.node and p.pid != promoted), None)
        time.sleep(0.5)
    records = _wait_finished(cluster, out, job)
    log = _log(out, job)
    _no_shell_reports(log)
    timeline = _timeline(out, job)
    firsts = [e for e in timeline if e.get("event") == "first_step" and e.get("generation") == 1]
    assert sorted(e["rank"] for e in firsts) == [0, 1, 2, 3] and {e["attempt"] for e in firsts} == {1}, (
        timeline[-40:],
        log[-4000:],
    )
    # The healthy ranks went on in their own processes: the same PIDs in generation 1.
    again = {
        r: {e["pid"] for e in timeline if e.get("rank") == r and e.get("generation") == 1 and "pid" in e}
        for r in healthy
    }
    for rank, proc in healthy.items():
        assert again[rank] <= {proc.pid}, (rank, proc.pid, again[rank])
    saved = max(e["step"] for e in timeline if e.get("event") == "checkpoint" and e.get("generation", 0) == 0)
    assert min(e["step"] for e in firsts) > saved >= 20, firsts
    stepping_again = max(e["time"] for e in firsts) - killed_at
    starts = [r for r in records if r["event"] == "start"]
    ends = [r for r in records if r["event"] == "end"]
    warm = [r for r in records if r["event"] == "recovery"]
    assert [r["attempt"] for r in starts] == [1] and [(r["attempt"], r["exit_code"], r["action"]) for r in ends] == [
        (1, 0, "finished")
    ], log
    assert [(r["generation"], r["rank"], r["node"], r["exit_code"]) for r in warm] == [
        (1, KILLED_RANK, killed.node, 137)
    ], records
    # Rank 1 went on in its node's warm spare, started with the step: its pid existed before the fault.
    assert warm[0]["what"] == (
        f"warm restart 1: rank 1 went on in the warm spare on {killed.node} "
        f"after rank 1 exited with code 137 on {killed.node}"
    )
    assert _promoted(out, job, KILLED_RANK) == {spares[killed.node].pid}, (spares, timeline[-40:])
    assert f"slurmgen: rank 1 goes on in the warm spare on {killed.node}" in log, log[-4000:]
    # Its output is labelled as rank 1's, as srun labels the others.
    assert re.search(r"^1: .*warm restart: generation 1 stepping again", log, re.M), log[-4000:]
    assert refill is not None, "no new spare on the node after the promotion"
    print(
        f"srun warm SIGKILL, a warm spare: fault to every rank stepping again {stepping_again:.2f} s "
        f"(from step {saved}; load {load:.1f} at the fault, {os.getloadavg()[0]:.1f} after)"
    )
    info = _wait_never_pending(cluster, job)
    assert (info["JobState"], info["ExitCode"], info.get("Restarts")) == ("COMPLETED", "0:0", "0"), log
    status = sg(cluster, tmp_path, "status", job).stdout
    assert f"attempt 1: {warm[0]['what']}" in status, status
    assert stepping_again < 30, log
    assert cluster.wait_no_tasks(job, timeout=30) == []
    assert not list(Path(cluster.env()["TMPDIR"]).glob(f"slurmgen-warm-{job}.*")), "the nodes' world files are left"


def test_a_second_failure_soon_after_a_warm_restart_restarts_cold(cluster, tmp_path):
    """--restart-mode warm --restarts 2: rank 1 killed, then its fresh process killed within the
    settle time of the new world. The second failure gets no warm restart: every task of the
    attempt is stopped (the step and the rank's own), a cold in-job restart follows (attempt 2 of
    every rank, the warm restart counted against --restarts), and the job completes in its allocation."""
    args = _warm_args(restarts=2)
    job = sg(cluster, tmp_path, "submit", *args, "-o", "out", "--", *TRAIN).stdout.strip().splitlines()[-1]
    out = tmp_path / "out"
    _wait_for_a_checkpoint(cluster, out, job)
    first = _rank_pid(cluster, job, KILLED_RANK)
    os.kill(first.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    # Its node's warm spare takes its place: the pid its trainer writes on the timeline.
    while not (again := _promoted(out, job, KILLED_RANK)):
        assert time.monotonic() < deadline, _log(out, job)
        time.sleep(0.1)
    os.kill(again.pop(), signal.SIGKILL)
    records = _wait_finished(cluster, out, job)
    log = _log(out, job)
    assert [(r["event"], r["attempt"], r.get("action")) for r in records] == [
        ("start", 1, None),
        ("recovery", 1, None),
        ("end", 1, "restart"),
        ("start", 2, None),
        ("end", 2, "finished"),
    ], (records, log[-3000:])
    # The kill may find the rank's wrapper first, which leaves no note: the rank is known either way.
    assert (records[2]["rank"], records[2]["exit_code"] != 0, records[3]["restart"]) == (KILLED_RANK, True, 2), records
    firsts = [e for e in _timeline(out, job) if e.get("event") == "first_step" and e.get("attempt") == 2]
    assert sorted(e["rank"] for e in firsts) == [0, 1, 2, 3], firsts
    info = _wait_never_pending(cluster, job)
    assert (info["JobState"], info["ExitCode"], info.get("Restarts")) == ("COMPLETED", "0:0", "0"), log
    assert cluster.wait_no_tasks(job, timeout=30) == []
    assert not list(Path(cluster.env()["TMPDIR"]).glob(f"slurmgen-warm-{job}.*")), "the nodes' world files are left"


def test_a_cancelled_job_under_warm_restarts_leaves_no_world_files(cluster, tmp_path):
    """--restart-mode warm: a warm restart writes its world on each node of the step (the node's
    slurmgen-warm-JOB.ATTEMPT in its TMPDIR). Cancelled after it (`slurmgen cancel`), the job
    leaves no process and no world file: each rank's wrapper, stopped, removes its node's (the
    batch shell removes them only at the end of an attempt that was not stopped)."""
    args = _warm_args(restarts=1)
    job = sg(cluster, tmp_path, "submit", *args, "-o", "out", "--", *_train_for(100_000)).stdout.strip().split()[-1]
    out = tmp_path / "out"
    _wait_for_a_checkpoint(cluster, out, job)
    os.kill(_rank_pid(cluster, job, KILLED_RANK).pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len({e["rank"] for e in _timeline(out, job) if e.get("event") == "first_step" and e.get("generation")}) < 4:
        assert time.monotonic() < deadline, _log(out, job)[-3000:]
        time.sleep(0.2)
    worlds = Path(cluster.env()["TMPDIR"]).glob(f"slurmgen-warm-{job}.*/*/{WORLD_NAME}")
    assert len(list(worlds)) == 2, _log(out, job)[-3000:]  # one per node of the step
    sg(cluster, tmp_path, "cancel", job)
    info = _wait_never_pending(cluster, job)
    assert info["JobState"] == "CANCELLED", info
    assert cluster.wait_no_tasks(job, timeout=60) == []
    left = list(Path(cluster.env()["TMPDIR"]).glob(f"slurmgen-warm-{job}.*"))
    assert left == [], (left, _log(out, job)[-3000:])


@pytest.mark.parametrize("watch", [(), ("--heartbeat-timeout", "10")], ids=["plain", "heartbeat"])
def test_a_lost_node_under_warm_restarts_restarts_cold_on_the_spare(cluster, tmp_path, watch):
    """--restart-mode warm --spare-nodes 1: node 2's processes killed and its slurmd stopped. No
    rank notes an exit (the node is gone), the healthy ranks wait for a new world and say so; the
    batch script probes the step's nodes, finds node 2 lost and restarts cold on the spare. Node 2
    is probed once: the guard of the stopped srun and the next step's choice of nodes take that
    probe's word (issue 35's bound: training again on the spare within 20 s; 32-40 s with three
    probes). The phases are printed: the fault to the attempt's end, to the new step, to stepping.
    With the hang watch, its srun (waiting for node 2's watcher) does not hold the new step."""
    if len(cluster.nodes) < 3:
        pytest.skip("a spare needs a third node: SLURMGEN_TEST_NODES=3")
    out, job = _submit(
        cluster, tmp_path, "--nodes", "2", "--gpus", "2", "--spare-nodes", "1", "--restart-mode", "warm", *watch
    )
    _wait_for_a_checkpoint(cluster, out, job)
    active = read_attempts(attempts_path(out / "logs", job))[0]["nodes"].split(",")
    spare = next(n.name for n in cluster.nodes if n.name not in active)
    lost = cluster.node(active[1])
    os.kill(lost.slurmd_pid, signal.SIGSTOP)
    try:
        killed_at = time.time()
        for proc in cluster.pids_on(lost):
            if proc.job_id == job:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        records = _wait_finished(cluster, out, job)
    finally:
        os.kill(lost.slurmd_pid, signal.SIGCONT)  # as after a reboot: the tests after this one have every node
    log = _log(out, job)
    _no_shell_reports(log, step_srun=True)
    ends = [r for r in records if r["event"] == "end"]
    starts = [r for r in records if r["event"] == "start"]
    assert [(r["attempt"], r["exit_code"], r["action"]) for r in ends] == [
        (1, exitcodes.LOST, "restart"),
        (2, 0, "finished"),
    ], log[-3000:]
    assert ends[0]["node"] == ends[0]["exclude"] == lost.name and starts[1]["nodes"] == f"{active[0]},{spare}", records
    assert not [r for r in records if r["event"] == "recovery"], records
    # One probe of the lost node: the guard stopped srun on its word, and the next step did not ask again.
    assert f"slurmgen: node {lost.name} does not answer (found before); stopping srun" in log, log[-3000:]
    assert f"slurmgen: node {lost.name} does not answer; stopping srun" not in log, log[-3000:]
    firsts = [e for e in _timeline(out, job) if e.get("event") == "first_step" and e.get("attempt") == 2]
    assert len(firsts) == 4 and {e["host"] for e in firsts if e["rank"] >= 2} == {spare}, firsts
    again = max(e["time"] for e in firsts) - killed_at
    print(
        f"lost node under warm restarts{' (heartbeat watch)' if watch else ''}: every rank stepping on the spare "
        f"{again:.1f} s (attempt 1 ended "
        f"{ends[0]['time'] - killed_at:.1f} s, the new step started {starts[1]['time'] - killed_at:.1f} s "
        f"after the fault; load {os.getloadavg()[0]:.1f})"
    )
    info = _wait_never_pending(cluster, job)
    assert (info["JobState"], info["ExitCode"], info.get("Restarts")) == ("COMPLETED", "0:0", "0"), log
    assert cluster.wait_no_tasks(job, timeout=30) == []
    if watch:
        assert_nodes_clean(cluster, timeout=30)
        assert starts[1]["time"] - killed_at < 14, log[-3000:]  # not held by the watchers' srun (10 s)
    # The bound is 20 s; on this 2-core machine, shared, the new step's four processes alone take 5-15 s
    # (16-22 s at load 10-13, with the watchers polling beside them).
    assert again < (45 if watch else 30), log[-3000:]


@pytest.mark.timeout(360)
def test_a_hung_rank_under_warm_restarts_is_killed_and_started_anew_each_time(cluster, tmp_path):
    """--restart-mode warm --heartbeat-timeout 10 --restarts 2, srun mode: rank 1 SIGSTOPped after a
    checkpoint. Its peers block in a collective with it; the heartbeat watch finds it hung (a
    stopped process) and kills it (KILL), which ends its own task only (--kill-on-bad-exit=0): its
    wrapper notes exit code 137, its peers lose it and wait for a new world, and the warm watch
    answers the note as any crash: a warm restart (rank 1 started anew on its node, the others in
    their processes). Then the process that took rank 1's place hangs too, after a checkpoint of
    generation 1: the same node's watcher, which judges on after its first verdict, finds it as
    it found the first (before, it judged no more in that attempt, and the job hung to its time
    limit). The run resumes from a checkpoint in generations 1 and 2 of attempt 1 and ends 0; a
    hang a warm restart answered does not end the attempt (no cold restart after it); nothing is left."""
    out = render_and_lint(
        tmp_path / "out", "--backend", "gloo", "--time", "5", "--restarts", "2", "--nodes", "2", "--gpus", "2",
        "--restart-mode", "warm", "--heartbeat-timeout", "10", command=_train_for(800),
    )  # fmt: skip
    job = cluster.submit(out / "run_slurm.sh", cwd=out)
    _wait_for_a_checkpoint(cluster, out, job)
    healthy = {r: _rank_pid(cluster, job, r) for r in (0, 2, 3)}
    stopped_at, stopped = _kill_rank_after_a_checkpoint(cluster, out, job, signal.SIGSTOP)
    # The second hang: rank 1 in its new process, once generation 1 saved a checkpoint and the
    # warm settle time (10 s: a failure sooner is a cold restart's) is past.
    deadline = time.monotonic() + 150
    while True:
        assert time.monotonic() < deadline, _log(out, job)[-3000:]
        timeline = _timeline(out, job)
        firsts = [e for e in timeline if e.get("event") == "first_step" and e.get("generation") == 1]
        saved = [e for e in timeline if e.get("event") == "checkpoint" and e.get("generation") == 1]
        if len({e["rank"] for e in firsts}) == 4 and saved and time.time() > max(e["time"] for e in firsts) + 11:
            break
        time.sleep(0.3)
    (second,) = _promoted(out, job, KILLED_RANK)
    assert second != stopped.pid
    os.kill(second, signal.SIGSTOP)
    second_at = time.time()
    records = _wait_finished(cluster, out, job, timeout=250)
    log = _log(out, job)
    _no_shell_reports(log)
    assert [(r["event"], r["attempt"], r.get("action")) for r in records] == [
        ("start", 1, None),
        ("recovery", 1, None),
        ("recovery", 1, None),
        ("end", 1, "finished"),
    ], (records, log[-3000:])
    for recovery in records[1:3]:
        assert (recovery["rank"], recovery["node"], recovery["exit_code"]) == (KILLED_RANK, stopped.node, 137), records
    answered = re.findall(r"slurmgen: hung, answered by a warm restart: rank=(\d+) node=(\S+)", log)
    assert answered == [(str(KILLED_RANK), stopped.node)] * 2, log[-3000:]
    timeline = _timeline(out, job)
    agains = []
    for generation, fault_at in ((1, stopped_at), (2, second_at)):
        firsts = [e for e in timeline if e.get("event") == "first_step" and e.get("generation") == generation]
        assert sorted(e["rank"] for e in firsts) == [0, 1, 2, 3] and {e["attempt"] for e in firsts} == {1}, firsts
        # The checkpoints the world finished before the fault: a rank stopped inside one (now judged,
        # contract/hangs.py) leaves it unwritten, though its peers record its stall as they leave it.
        saved = max(
            e["step"]
            for e in timeline
            if e.get("event") == "checkpoint" and e.get("generation", 0) == generation - 1 and e["time"] < fault_at
        )
        assert min(e["step"] for e in firsts) > saved >= 20, firsts
        agains.append(max(e["time"] for e in firsts) - fault_at)
    for rank, proc in healthy.items():  # the healthy ranks went on in their own processes
        pids = {e["pid"] for e in timeline if e.get("rank") == rank and e.get("generation") and "pid" in e}
        assert pids <= {proc.pid}, (rank, proc.pid, pids)
    print(
        "srun warm SIGSTOP twice on one node: fault to every rank stepping again "
        + ", ".join(f"{a:.1f} s" for a in agains)
        + " (10 s of each the heartbeat timeout)"
    )
    info = _wait_never_pending(cluster, job)
    assert (info["JobState"], info["ExitCode"], info.get("Restarts")) == ("COMPLETED", "0:0", "0"), log
    assert cluster.wait_no_tasks(job, timeout=30) == []
    assert not list(Path(cluster.env()["TMPDIR"]).glob(f"slurmgen-warm-{job}.*")), "the nodes' world files are left"
    assert max(agains) < 60, log[-3000:]
