"""Issue 3, test 4: the bundled trainer as a real 2-node x 2-process gloo job on the test cluster.

`slurmgen create --nodes 2 --gpus 2 --backend gloo ... -- python -m slurmgen.train <tiny MLP>`
is rendered, shellchecked, submitted with sbatch and polled, in both launcher modes:

- a plain run COMPLETES, and checkpoints and metrics come from rank 0 only. All ranks share the
  run directory (one disk), so its contents alone cannot say who wrote a file. Each job therefore
  runs with a `sitecustomize` on PYTHONPATH that installs an audit hook (sys.addaudithook) in
  every Python process of the job: one JSON line per write-open, rename and delete under the run
  directory (and per `scontrol` started), with the process's RANK, pid and host. The trainer's
  own heartbeats (one summary per node, holding each rank's rank and pid) tie those pids to ranks.
- with `--requeue`, a USR2 sent to the job's steps (what `#SBATCH --signal=USR2@<lead>` does
  before the time limit: without `B:` Slurm signals the steps' processes, not the batch shell)
  makes the trainer checkpoint and run `scontrol requeue`; the job goes back to PENDING and
  RUNNING (Restarts=1), resumes at the checkpoint's step and COMPLETES.

Slurm holds a requeued job with Reason=BeginTime for the credential lifetime (AuthInfo
cred_expire, 120 s by default) before it may start again. That is the real behaviour; the test
lifts the hold with `scontrol update JobId=N StartTime=now` instead of waiting two minutes, at
least one wall-clock second after the old run's credential was revoked (see below).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import clean_env, communicate_in_session, render_and_lint

from slurmgen.train.logs import read_heartbeats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# A tiny MLP on synthetic data, one thread per process (4 processes share 2 cores), a metrics
# record every step and a heartbeat every 50 ms, so the test can follow the run from outside.
TRAIN = [
    *("python", "-m", "slurmgen.train"),
    *("--model", "mlp", "--mlp-hidden", "32", "--synthetic-samples", "512", "--batch-size", "8"),
    *("--threads", "1", "--init-timeout", "30", "--progress", "lines", "--log-every", "1"),
    *("--heartbeat-every", "0.05", "--keep-last", "10"),
]
WORLD = 4
LEADERS = [0, 2]  # local rank 0 of node 0 and node 1: they write their node's heartbeat summary
# A 2 x 2 trainer job takes 10-20 s here (torch start-up on 2 cores is most of it); a hang is
# caught long before the 60 s rendezvous or 300 s torchrun exit-barrier defaults would end it.
JOB_TIMEOUT = 90

# Installed in every Python process of a job through PYTHONPATH. Appends with os.write on an
# O_APPEND descriptor: a record is on disk at once, even when the process then leaves with
# os._exit (the trainer's clean exit) or dies of a signal.
AUDIT_HOOK = r'''
"""Written by tests/integration/test_slurm_train.py: log who writes what under the run dir."""
import json, os, socket, sys, time

_root = os.environ.get("SLURMGEN_TEST_AUDIT_ROOT")
_dir = os.environ.get("SLURMGEN_TEST_AUDIT_DIR")
if _root and _dir:
    _host = socket.gethostname()
    _fd = os.open(os.path.join(_dir, "%s-%d.jsonl" % (_host, os.getpid())),
                  os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _busy = [False]

    def _under_root(p):
        if p is None or isinstance(p, int):
            return None
        p = os.path.abspath(os.fsdecode(os.fspath(p)))
        return p if p == _root or p.startswith(_root + os.sep) else None

    def _record(event, args):
        argv = None
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE)
            paths = [path] if writes else []
        elif event == "os.rename":  # os.rename and os.replace
            paths = list(args[:2])
        elif event == "os.remove":  # os.remove and os.unlink
            paths = [args[0]]
        elif event == "subprocess.Popen":
            cmd = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
            argv = [os.fsdecode(a) for a in cmd]
            if os.path.basename(argv[0]) != "scontrol":
                return
            paths = []
        else:
            return
        paths = [p for p in map(_under_root, paths) if p]
        if not paths and argv is None:
            return
        env = os.environ
        rec = {"event": event, "paths": paths, "argv": argv, "pid": os.getpid(), "host": _host,
               "rank": env.get("RANK"), "restart": env.get("SLURM_RESTART_COUNT", "0"),
               "signals_to_handle": env.get("TORCHELASTIC_SIGNALS_TO_HANDLE"), "time": time.time()}
        os.write(_fd, (json.dumps(rec) + "\n").encode())

    def _hook(event, args):
        if _busy[0]:
            return
        _busy[0] = True
        try:
            _record(event, args)
        except Exception:
            pass
        finally:
            _busy[0] = False

    sys.addaudithook(_hook)
'''


# --- helpers ------------------------------------------------------------------------------------


@dataclass
class TrainJob:
    """One trainer job: where it renders, runs and logs, and what its processes left."""

    tmp: Path
    launcher: str
    job_id: str = ""

    @property
    def out(self) -> Path:  # the rendered scripts and the Slurm logs
        return self.tmp / "out"

    @property
    def run_dir(self) -> Path:  # the trainer's --out-dir
        return self.tmp / "run"

    @property
    def audit_dir(self) -> Path:
        return self.tmp / "audit"

    def render(self, *train_args: str, create_args: tuple[str, ...] = ()) -> None:
        render_and_lint(
            self.out,
            *("--nodes", "2", "--gpus", "2", "--backend", "gloo", "--launcher", self.launcher),
            *("--time", "5", *create_args),
            command=[*TRAIN, "--out-dir", str(self.run_dir), *train_args],
        )

    def submit(self, cluster) -> str:
        hook = self.tmp / "audit-hook"
        hook.mkdir()
        self.audit_dir.mkdir()
        (hook / "sitecustomize.py").write_text(AUDIT_HOOK)
        env = {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
            "SLURMGEN_TEST_AUDIT_ROOT": str(self.run_dir),
            "SLURMGEN_TEST_AUDIT_DIR": str(self.audit_dir),
            "PYTHONUNBUFFERED": "1",
        }
        self.job_id = cluster.submit(self.out / "run_slurm.sh", cwd=self.out, env=env)
        return self.job_id

    def log(self) -> str:
        logs = sorted((self.out / "logs").glob(f"*-{self.job_id}.out"))
        assert logs, f"no log for job {self.job_id} in {self.out / 'logs'}"
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def audit(self) -> list[dict]:
        recs = []
        for f in sorted(self.audit_dir.glob("*.jsonl")):
            recs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        return recs

    def heartbeats(self) -> dict[int, dict]:
        return read_heartbeats(self.run_dir / "heartbeats")

    def metrics(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def files(self, but: str = "//") -> list[str]:
        """Every file in the run directory, except those under `but`."""
        found = (str(p.relative_to(self.run_dir)) for p in self.run_dir.rglob("*") if p.is_file())
        return sorted(f for f in found if not f.startswith(but))


def ckpt(step: int) -> str:
    return f"checkpoints/ckpt-{step:09d}.pt"


def tracking_files(job_id: str) -> list[str]:
    """The run record rank 0 keeps (rank-0 mode): one run in the group the script sets."""
    run = f"tracking/slurm-{job_id}/main"
    return [f"{run}/{name}" for name in ("artifacts.jsonl", "hparams.yaml", "metrics.jsonl", "run.json")]


def check_rank0_io(job: TrainJob, restarts: int = 0) -> dict[tuple[int, int], int]:
    """Checkpoints and metrics were written by rank 0 only, heartbeats by each node's local
    rank 0 (one summary per node: ranks 0 and 2 here), nothing by the other ranks.

    Returns {(run, rank): pid} from the audit log (run = SLURM_RESTART_COUNT)."""
    recs = job.audit()
    pids: dict[tuple[int, int], set[int]] = {}
    for r in recs:
        assert r["rank"] is not None, f"a process without RANK wrote in the run directory: {r}"
        pids.setdefault((int(r["restart"]), int(r["rank"])), set()).add(r["pid"])
    # Every node leader of every run shows up (its node's heartbeats at least) and is one process.
    runs = range(restarts + 1)
    assert sorted(pids) == [(run, rank) for run in runs for rank in LEADERS], sorted(pids)
    assert all(len(p) == 1 for p in pids.values()), pids
    owner = {key: next(iter(p)) for key, p in pids.items()}
    # Checkpoints, metrics and the run record, incl. their temporaries: rank 0's alone.
    shared = re.compile(r"checkpoints/.*|\.?metrics\.jsonl(\.tmp\.\d+)?|tracking/.*")
    wrote_shared = False
    for r in recs:
        for p in r["paths"]:
            rel = str(Path(p).relative_to(job.run_dir))
            if shared.fullmatch(rel):
                assert r["rank"] == "0", f"rank {r['rank']} wrote {rel}: {r}"
                wrote_shared |= rel.startswith("checkpoints/ckpt-")
            elif rel.startswith("heartbeats/"):
                mine = r"heartbeats/\.?node-[^/]+\.json(\.tmp\.\d+)?"
                assert int(r["rank"]) in LEADERS and re.fullmatch(mine, rel), f"rank {r['rank']} wrote {rel}: {r}"
            else:
                raise AssertionError(f"unexpected write in the run directory: {r}")
    assert wrote_shared, "the audit hook saw no checkpoint write at all: is it installed?"
    # The hook's RANK agrees with the trainer's own idea of its rank: the final heartbeat of
    # leader k was written by the pid the hook recorded for rank k in the last run.
    beats = job.heartbeats()
    assert {k: beats[k]["pid"] for k in LEADERS} == {k: owner[(restarts, k)] for k in LEADERS}
    return owner


def check_heartbeat_files(job: TrainJob, hosts: list[str]) -> None:
    """One heartbeat summary per node (named by host and node rank), no temporaries."""
    names = sorted(p.name for p in (job.run_dir / "heartbeats").iterdir())
    assert len(names) == len(set(hosts)), names
    for host in set(hosts):
        assert sum(bool(re.fullmatch(rf"node-{re.escape(host)}-\d+\.json", n)) for n in names) == 1, names


def check_heartbeats_done(job: TrainJob, step: int, launcher: str, hosts: list[str]) -> None:
    beats = job.heartbeats()
    assert sorted(beats) == list(range(WORLD)), beats
    assert {b["status"] for b in beats.values()} == {"done"}, beats
    assert {b["step"] for b in beats.values()} == {step}, beats
    assert len({b["pid"] for b in beats.values()}) == WORLD
    for host in hosts:  # two ranks per node
        assert sum(b["host"] == host for b in beats.values()) == 2, beats
    if launcher == "srun":  # block distribution: ranks 0-1 on the first node, 2-3 on the second
        assert [beats[k]["host"] for k in range(WORLD)] == [hosts[0], hosts[0], hosts[1], hosts[1]]


def train_steps(job: TrainJob) -> list[int]:
    return [m["step"] for m in job.metrics() if m["split"] == "train"]


def hostnames(cluster, job_id: str) -> list[str]:
    nodelist = cluster.job_info(job_id)["NodeList"]
    return cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def wait_stepping(cluster, job: TrainJob, min_step: int) -> dict[int, dict]:
    """Every rank's heartbeat once all are at `min_step` or later, inside the step loop: the
    trainer's signal handlers are installed then (before that, USR2 would simply kill a rank,
    as it would on a real cluster)."""
    deadline = time.monotonic() + 60
    while True:
        beats = job.heartbeats()
        if len(beats) == WORLD and all(b["step"] >= min_step for b in beats.values()):
            return beats
        info = cluster.job_info(job.job_id)
        assert info["JobState"] == "RUNNING", f"{info['JobState']}\n{job.log()}"
        assert time.monotonic() < deadline, f"ranks not stepping after 60 s: {beats}\n{job.log()}"
        time.sleep(0.05)


def follow_requeue(cluster, job: TrainJob) -> list[tuple[str, str, str]]:
    """REQUEUED/COMPLETING -> PENDING (held until BeginTime) -> RUNNING again, Restarts=1:
    the states seen on the way, the hold lifted as soon as Slurm accepts it."""
    seen: list[tuple[str, str, str]] = []
    released = False
    deadline = time.monotonic() + 60
    while True:
        info = cluster.job_info(job.job_id)
        now = (info["JobState"], info.get("Reason", ""), info.get("Restarts", ""))
        if not seen or seen[-1] != now:
            seen.append(now)
        if now[0] == "PENDING" and now[1] == "BeginTime" and not released:
            # Slurm holds a requeued job for cred_expire (120 s); start it now instead, but not
            # within the second in which slurmd revoked the old run's credential (done before
            # the job turned PENDING): slurmd refuses a credential created in that same second
            # ("Killing non-startable batch JobId=N: Job credential revoked", job FAILED).
            time.sleep(max(0.0, int(time.time()) + 1.2 - time.time()))
            cluster.run(["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"])
            released = True
        if now[0] == "RUNNING" and now[2] == "1":
            return seen
        assert now[0] not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), f"{seen}\n{job.log()}"
        assert time.monotonic() < deadline, f"not back to RUNNING after 60 s: {seen}\n{job.log()}"
        time.sleep(0.1)


# --- issue 3, test 4a: a few steps, rank-0 I/O ----------------------------------------------------
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_trainer_runs_and_only_rank0_writes(cluster, tmp_path, launcher):
    steps = 30
    job = TrainJob(tmp_path, launcher)
    job.render("--max-steps", str(steps), "--save-every", "10")
    t0 = time.monotonic()
    job.submit(cluster)
    state, code = cluster.wait(job.job_id, timeout=JOB_TIMEOUT)
    seconds = time.monotonic() - t0
    log = job.log()
    assert (state, code) == ("COMPLETED", 0), log
    print(f"{launcher}: 2 x 2 trainer job of {steps} steps: {seconds:.1f}s")
    hosts = hostnames(cluster, job.job_id)

    # What rank 0 detected and did.
    detected = re.search(r"world_size=(\d+) local_world_size=(\d+) .*backend=(\w+) device=cpu launcher=(\w+)", log)
    assert detected, log
    # In srun mode the script exports RANK & co. from SLURM_PROCID inside each task: the trainer
    # may call that "env" or "srun"; either way not torchrun.
    launchers = {"torchrun"} if launcher == "torchrun" else {"env", "srun"}
    assert detected.groups()[:3] == (str(WORLD), "2", "gloo") and detected.group(4) in launchers, log
    assert f"done: step {steps}," in log, log
    assert "resumed from" not in log, log

    # The run directory holds exactly this: checkpoints every 10 steps, one metrics file, a
    # heartbeat summary per node, no temporaries.
    assert job.files(but="heartbeats/") == sorted(
        [ckpt(10), ckpt(20), ckpt(30), "checkpoints/latest", "metrics.jsonl"] + tracking_files(job.job_id)
    )
    check_heartbeat_files(job, hosts)
    assert (job.run_dir / "checkpoints" / "latest").read_text().strip() == Path(ckpt(steps)).name
    # One train record per step (four writers would repeat each), a val record at the end.
    assert train_steps(job) == list(range(1, steps + 1))
    assert [m["step"] for m in job.metrics() if m["split"] == "val"] == [steps]
    check_heartbeats_done(job, steps, launcher, hosts)
    check_rank0_io(job)
    left = cluster.wait_no_tasks(job.job_id, timeout=15)
    assert left == [], f"tasks survived the job: {left}"


# --- issue 3, test 4b: USR2 (the default preempt_signal) -> checkpoint, requeue, resume, complete
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_usr2_checkpoints_requeues_and_resumes(cluster, tmp_path, launcher):
    # Long enough that the first run cannot finish before the signal (it arrives about 10
    # steps after every rank has started stepping, at 30-60 steps/s here), short enough that
    # the resumed run ends in a few seconds. --save-every 0: the only checkpoints are the
    # preemption one and the final one, so the resume can only come from the former.
    steps = 160
    job = TrainJob(tmp_path, launcher)
    job.render("--max-steps", str(steps), "--save-every", "0", create_args=("--requeue",))
    script = (job.out / "run_slurm.sh").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=USR2@" in script
    t0 = time.monotonic()
    job_id = job.submit(cluster)
    cluster.wait_state(job_id, {"RUNNING"}, timeout=30)

    beats = wait_stepping(cluster, job, min_step=10)
    first_pids = {k: b["pid"] for k, b in beats.items()}
    signalled = time.time()
    cluster.signal(job_id, "USR2")  # scancel --signal=USR2 JOB: every step's processes
    seen = follow_requeue(cluster, job)
    restarted = time.time()
    assert ("PENDING", "BeginTime", "1") in seen or ("PENDING", "None", "1") in seen, seen

    state, code = cluster.wait(job_id, timeout=JOB_TIMEOUT)
    seconds = time.monotonic() - t0
    log = job.log()  # --open-mode=append: both runs are in it
    assert (state, code) == ("COMPLETED", 0), f"{seen}\n{log}"
    info = cluster.job_info(job_id)
    assert (info["Restarts"], info["Requeue"]) == ("1", "1"), info
    print(f"{launcher}: requeue job: {seconds:.1f}s in all; states after USR2: {seen}")

    # Run 1: every rank stopped at the same step, rank 0 checkpointed there and asked Slurm to
    # requeue (seen by the audit hook as the scontrol it started: its log line may be cut off,
    # since the requeue it asked for terminates the job right away).
    stopped = re.search(r"signal (\d+|on another rank): checkpoint written at step (\d+), stopping", log)
    assert stopped, log
    stop = int(stopped.group(2))
    assert 10 <= stop < steps, f"preempted at step {stop} of {steps}\n{log}"
    requeues = [r for r in job.audit() if r["argv"] and r["argv"][1:] == ["requeue", job_id]]
    assert [(r["rank"], r["restart"]) for r in requeues] == [("0", "0")], requeues
    assert signalled <= requeues[0]["time"] <= restarted

    # Run 2: resumed from that checkpoint, not from step 0, and finished.
    assert f"resumed from {job.run_dir / ckpt(stop)} at step {stop}" in log, log
    assert log.count("resumed from") == 1, log
    assert f"done: step {steps}," in log, log
    assert job.files(but="heartbeats/") == sorted(
        [ckpt(stop), ckpt(steps), "checkpoints/latest", "metrics.jsonl"] + tracking_files(job_id)
    )
    check_heartbeat_files(job, hostnames(cluster, job_id))
    # The requeued job continued the same run record: restart count 1, status finished.
    record = json.loads((job.run_dir / tracking_files(job_id)[-1]).read_text())
    assert (record["restart_count"], record["status"]) == (1, "finished"), record
    # Metrics: every step once, steps up to `stop` from before the requeue, the rest after it.
    records = [r for r in job.metrics() if r["split"] == "train"]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["time"] < signalled + 5 for r in records if r["step"] <= stop)
    assert all(r["time"] > restarted - 1 for r in records if r["step"] > stop)
    hosts = hostnames(cluster, job_id)
    check_heartbeats_done(job, steps, launcher, hosts)
    owner = check_rank0_io(job, restarts=1)
    assert {k: owner[(0, k)] for k in LEADERS} == {k: first_pids[k] for k in LEADERS}  # run 1's processes, as seen
    assert cluster.wait_no_tasks(job_id, timeout=15) == []

    if launcher == "torchrun":
        # torchrun itself must handle USR2 (and pass it on), not die of it.
        seen_by_workers = {r["signals_to_handle"] for r in job.audit()}
        assert all("SIGUSR2" in (s or "").split(",") for s in seen_by_workers), seen_by_workers
        assert "User defined signal 2" not in log, log


# --- issue 26: the same path under --strategy fsdp: every rank writes its shard, resume reshards nothing
FSDP_STEPS = 120


def start_uninterrupted(out: Path, request) -> subprocess.Popen:
    """The run to compare with: the same 4 ranks, uninterrupted, on this machine (the trainer's
    own spawn: the model and the data order do not depend on the launcher). Its session is
    killed at the test's end whatever happens."""
    proc = subprocess.Popen(
        [
            sys.executable,
            *TRAIN[1:],
            "--out-dir",
            str(out),
            "--max-steps",
            str(FSDP_STEPS),
            "--save-every",
            "0",
            "--strategy",
            "fsdp",
            "--backend",
            "gloo",
            "--nproc-per-node",
            str(WORLD),
        ],
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    request.addfinalizer(stop)
    return proc


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_fsdp_usr2_writes_a_sharded_checkpoint_requeues_and_resumes_where_it_would_have_ended(
    cluster, tmp_path, launcher, request
):
    """Both launcher modes: under torchrun the ranks' RANK, the shards' file names and the
    resume's world size come from torchrun's rendezvous, not from srun's task ids. The
    comparison with an uninterrupted run (started alongside, it doubles the load of the 2
    cores) is made once, in srun mode: what it checks does not depend on the launcher."""
    steps = FSDP_STEPS
    job = TrainJob(tmp_path, launcher)
    job.render("--max-steps", str(steps), "--save-every", "0", "--strategy", "fsdp", create_args=("--requeue",))
    t0 = time.monotonic()
    job_id = job.submit(cluster)
    reference = start_uninterrupted(tmp_path / "reference", request) if launcher == "srun" else None
    cluster.wait_state(job_id, {"RUNNING"}, timeout=30)
    wait_stepping(cluster, job, min_step=5)
    cluster.signal(job_id, "USR2")
    follow_requeue(cluster, job)
    state, code = cluster.wait(job_id, timeout=JOB_TIMEOUT)
    log = job.log()
    assert (state, code) == ("COMPLETED", 0), log
    print(f"fsdp {launcher} requeue job: {time.monotonic() - t0:.1f}s in all")
    launchers = {"torchrun"} if launcher == "torchrun" else {"env", "srun"}
    detected = re.findall(r"world_size=(\d+) .*launcher=(\w+)", log)
    assert len(detected) == 2 and all(w == str(WORLD) and how in launchers for w, how in detected), detected

    stopped = re.search(r"signal (\d+|on another rank): checkpoint written at step (\d+), stopping", log)
    assert stopped, log
    stop = int(stopped.group(2))
    assert 5 <= stop < steps, log
    shards = f"checkpoints/ckpt-{stop:09d}.dcp"
    assert f"resumed from {job.run_dir / shards} at step {stop}" in log and log.count("resumed from") == 1, log
    # Each of the 4 ranks, on both nodes, wrote its own shard of that checkpoint (into its
    # temporary directory); the directory holds the 4 shards, DCP's index and meta.pt.
    wrote = {
        (r["rank"], Path(p).name)
        for r in job.audit()
        for p in r["paths"]
        if f".ckpt-{stop:09d}.dcp.tmp/" in p and p.endswith(".distcp")
    }
    assert wrote == {(str(k), f"__{k}_0.distcp") for k in range(WORLD)}, wrote
    assert sorted(p.name for p in (job.run_dir / shards).iterdir()) == sorted(
        [".metadata", "meta.pt", *(f"__{k}_0.distcp" for k in range(WORLD))]
    )
    assert (job.run_dir / "checkpoints" / "latest").read_text().strip() == f"ckpt-{steps:09d}.dcp"
    # Every step once, and the run ends exactly where the uninterrupted one does.
    records = [r for r in job.metrics() if r["split"] == "train"]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert cluster.wait_no_tasks(job_id, timeout=15) == []
    if reference is None:
        return
    ref_out, _ = communicate_in_session(reference, 60)
    assert reference.returncode == 0, ref_out[-3000:]
    expected = [json.loads(line) for line in (tmp_path / "reference" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in records[-3:]] == [
        (r["step"], r["loss"]) for r in expected if r["split"] == "train"
    ][-3:]
    assert [r["loss"] for r in job.metrics() if r["split"] == "val"] == [
        r["loss"] for r in expected if r["split"] == "val"
    ]
