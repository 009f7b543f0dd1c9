"""Lightning, Accelerate and transformers programs under a real slurmgen launcher (issue 34):
`launch_multi_node.sh` as two nodes of one rank each on this machine (real bash, the node link,
real torch.distributed on gloo), each program as a user brings it (examples/), with the
integrations' callback (or `slurmgen.beat` for Accelerate). Each rank says which it is; the
timeline has every phase for every rank, read back by `slurmgen status FILE --timeline --json`;
rank 0's metrics reach the job's metrics file and the run record `status` and the page read; and
a Lightning rank that stops stepping is found hung by the launcher's watcher through the
callback's heartbeats. Under real Slurm (the test cluster), a Lightning job's records reach
`slurmgen status JOB`, and so do those of one started by `slurmgen launch` over SSH on its nodes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import base_args, free_port, sg, wait_status

from slurmgen.cli import main
from slurmgen.contract import exitcodes, phases
from slurmgen.observe.helper import metrics_path
from slurmgen.tracking.records import find_runs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

pytest.importorskip("pytorch_lightning")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")

PY = sys.executable
EXAMPLES = Path(__file__).parents[2] / "examples"
STEPS = 10


def run_two_nodes(tmp_path: Path, program: list[str], *flags: str) -> tuple[list[int], list[str], Path]:
    """`create` for 2 nodes x 1 rank, then launch_multi_node.sh once per node on 127.0.0.1:
    (exit codes, the ranks' log texts, the timeline file)."""
    with pytest.raises(SystemExit):
        main(["create", "--nodes", "2", "--gpus", "1", "--backend", "gloo", "-o", str(tmp_path / "o"), "--force",
              *flags, "--", *program])  # fmt: skip
    tl, logs = tmp_path / "timeline.jsonl", tmp_path / "logs"
    env = {
        **os.environ,
        "MASTER_PORT": str(free_port()),
        "SLURMGEN_TIMELINE_FILE": str(tl),
        "SLURMGEN_LOG_DIR": str(logs),
    }
    procs = [
        subprocess.Popen(
            [str(tmp_path / "o" / "launch_multi_node.sh"), "127.0.0.1", "2", "1", str(n)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in (0, 1)
    ]
    codes = [p.wait(180) for p in procs]
    texts = [p.stderr.read() for p in procs] + [f.read_text() for f in sorted(logs.glob("rank-*.log"))]
    return codes, texts, tl


def timeline_of(tl: Path) -> dict:
    """`slurmgen status FILE --timeline --json`, as a user reads a launch_multi_node.sh run."""
    proc = subprocess.run(
        [PY, "-m", "slurmgen", "status", str(tl), "--timeline", "--json"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("program", "exact"),
    [("lightning_ddp.py", True), ("transformers_gpt2.py", True), ("accelerate_loop.py", False)],
)
def test_a_framework_program_trains_on_two_ranks_with_slurmgens_records(tmp_path, program, exact):
    codes, texts, tl = run_two_nodes(tmp_path, [PY, str(EXAMPLES / program), str(STEPS)])
    assert codes == [0, 0], texts
    said = [re.findall(r"^rank (\d) of (\d)\b", text, re.M) for text in texts[2:]]
    assert said == [[("0", "2")], [("1", "2")]], texts  # rank-0.log, rank-1.log: each rank once, world size 2

    found = timeline_of(tl)
    (attempt,) = [a for a in found["attempts"] if a["ranks"]]
    rows = {r["rank"]: r for r in attempt["ranks"]}
    assert sorted(rows) == [0, 1], attempt
    for row in rows.values():
        times = [row[p] for p in phases.PHASES]
        assert None not in times and times == sorted(times), row
        assert row["status"] == "done" and row["last_step"] == STEPS, row
    assert found["goodput"]["goodput"] > 0, found["goodput"]
    lines = [json.loads(x) for x in tl.read_text().splitlines()]
    told = {x["event"] for x in lines if x.get("by") != "launcher" and not x.get("inferred")}
    if exact:  # the callback said them itself, nothing inferred
        assert {phases.IMPORTS, phases.RENDEZVOUS, phases.FIRST_STEP, phases.CHECKPOINT} <= told, told

    metrics = [json.loads(x) for x in metrics_path(str(tl)).read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), metrics  # rank 0 only: once per step
    assert all(m["split"] == "train" and m["loss"] > 0 for m in metrics), metrics
    if exact:
        (run,) = find_runs(tmp_path / "runs")
        assert run.steps == STEPS and run.last("loss") is not None and run.get("status") == "finished"
        assert run.last("lr", ("train",)) is not None and run.last("loss", ("val",)) is not None


HANGING = """
import sys, time
sys.argv[1:] = ["40"]
sys.path.insert(0, {examples!r})
import lightning_ddp

def stuck(self, batch, batch_idx):
    if self.global_rank == 1 and self.trainer.global_step == 3:
        time.sleep(600)  # a rank that stops stepping, its peer waiting in the all-reduce
    return step(self, batch, batch_idx)

step = lightning_ddp.Regression.training_step
lightning_ddp.Regression.training_step = stuck
lightning_ddp.main(40)
"""


def test_a_lightning_rank_that_stops_stepping_is_found_hung(tmp_path):
    """The callback's heartbeats are what the launcher's watcher judges: with rank 1 stuck inside
    step 3 the job ends with the hung code, a hung rank named, well before the program would. Which
    rank is named is not asserted: the callback beats at step ends, so rank 1 (stuck in the step)
    and rank 0 (waiting in its all-reduce) last beat at the same step's end, and the watcher names
    the older beat (docs/guides/lightning.md says so)."""
    script = tmp_path / "hang.py"
    script.write_text(HANGING.format(examples=str(EXAMPLES)))
    codes, texts, _ = run_two_nodes(tmp_path, [PY, str(script)], "--heartbeat-timeout", "6")
    assert exitcodes.HUNG in codes, (codes, texts)
    assert re.search(r"hung: rank [01] on node [01] stopped beating", "\n".join(texts[:2])), texts[:2]


def test_lightning_under_slurm_reports_to_status(cluster, tmp_path):
    """Under run_slurm.sh's srun mode (Lightning's SLURMEnvironment: its ranks are Slurm's tasks),
    the callback's records reach `slurmgen status JOB` through the registry: every rank's phases on
    the timeline, and the run record's last step and loss found by the job's group."""
    job = sg(cluster, tmp_path, "submit", "--nodes", "2", "--gpus", "1", "--backend", "gloo", "--time", "5",
             "-o", "pl", "--wait", "--", PY, str(EXAMPLES / "lightning_ddp.py"), str(STEPS)).stdout.strip()  # fmt: skip
    found = json.loads(sg(cluster, tmp_path, "status", job, "--timeline", "--json").stdout)
    (attempt,) = [a for a in found["attempts"] if a["ranks"]]
    assert sorted(r["rank"] for r in attempt["ranks"]) == [0, 1], attempt
    for row in attempt["ranks"]:
        assert None not in [row[p] for p in phases.PHASES] and row["last_step"] == STEPS, row
    view = json.loads(sg(cluster, tmp_path, "status", job, "--json").stdout)
    assert view["state"] == "COMPLETED" and view["run"]["step"] == STEPS and view["run"]["loss"] > 0, view
    logs = sg(cluster, tmp_path, "logs", job).stdout
    assert sorted(re.findall(r"^\[rank (\d)\] rank \1 of 2 node \1: done$", logs, re.M)) == ["0", "1"], logs


@pytest.mark.parametrize(
    ("program", "curves"), [("lightning_ddp.py", True), ("transformers_gpt2.py", True), ("accelerate_loop.py", False)]
)
def test_a_framework_through_slurmgen_launch_reports_to_status(cluster, tmp_path, program, curves):
    """`slurmgen launch` over SSH on the cluster's two nodes, one rank each: the program reads the
    launcher's variables (each rank trains once, world size 2), and its records reach `slurmgen
    status LAUNCH` (every rank's phases and last step) and, for the callbacks' run record, the run
    page's curves (the JSON of /ui/live/runs/SEQ/metrics) through the launch's registry row
    (Accelerate's loop beats through slurmgen.beat and keeps no run record)."""
    if len(cluster.nodes) < 2:
        pytest.skip("needs 2 nodes")
    from slurmgen.coordinator.web.curves import curves_for
    from slurmgen.runs.model import find_run
    from slurmgen.runs.registry import Registry

    registry = tmp_path / "jobs.sqlite"
    argv = [
        PY,
        "-m",
        "slurmgen",
        "launch",
        *base_args(cluster, tmp_path),
        "--registry",
        str(registry),
        "--hosts",
        "node1,node2",
        "--gpus",
        "1",
        "--",
        PY,
        str(EXAMPLES / program),
        str(STEPS),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, **cluster.env()})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(sg(cluster, tmp_path, "jobs", "--json").stdout)
    assert (row["kind"], row["state"], row["nodes"], row["ranks"]) == ("launch", "succeeded", 2, 2), row
    logs = sg(cluster, tmp_path, "logs", row["job"]).stdout
    assert sorted(re.findall(r"rank (\d) of 2\b.*: done$", logs, re.M)) == ["0", "1"], logs
    found = json.loads(sg(cluster, tmp_path, "status", row["job"], "--timeline", "--json").stdout)
    (attempt,) = [a for a in found["attempts"] if a["ranks"]]
    assert sorted(r["rank"] for r in attempt["ranks"]) == [0, 1], attempt
    for rank in attempt["ranks"]:
        assert None not in [rank[p] for p in phases.PHASES] and rank["last_step"] == STEPS, rank
    if not curves:
        return
    with Registry.open(registry) as reg:
        seq = find_run(reg, "launch", row["job"])
    curves = curves_for(registry, seq)
    steps, losses = next(iter(curves["metrics"]["loss"].values()))
    assert curves["runs"] == 1 and steps[-1] == STEPS and all(v > 0 for v in losses), curves


SLOW = """
import sys, time
sys.path.insert(0, {examples!r})
import lightning_ddp

def slow(self, batch, batch_idx):
    time.sleep(0.1)  # long enough to be warned while training
    return step(self, batch, batch_idx)

step = lightning_ddp.Regression.training_step
lightning_ddp.Regression.training_step = slow
lightning_ddp.main({steps})
"""


def _release_when_requeued(cluster, job: str, timeout: float = 60) -> None:
    """Wait for the job the program requeued to be PENDING again and let it start now (Slurm holds a
    requeued job for its credential lifetime, as in test_slurm_heal.py)."""
    deadline = time.monotonic() + timeout
    while True:
        info = cluster.job_info(job)
        if info["JobState"] == "PENDING" and info.get("Restarts") == "1":
            break
        assert time.monotonic() < deadline, f"job {job} not requeued: {info['JobState']} {info.get('Reason')}"
        time.sleep(0.1)
    time.sleep(max(0.0, int(time.time()) + 1.2 - time.time()))
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])


def test_lightnings_requeue_under_slurm_is_one_requeue_and_its_attempt_is_described(cluster, tmp_path):
    """`--preempt-signal USR1`: the warning is the one Lightning's SLURMEnvironment handles. Lightning
    saves its hpc checkpoint and requeues the job itself; attempt 2 resumes from that checkpoint and
    finishes; attempt 1, whose end the killed batch shell never wrote, reads `requeued` (item 5)."""
    steps = 150
    script = tmp_path / "slow.py"
    script.write_text(SLOW.format(examples=str(EXAMPLES), steps=steps))
    job = sg(cluster, tmp_path, "submit", "--nodes", "2", "--gpus", "1", "--backend", "gloo", "--time", "5",
             "--requeue", "--preempt-signal", "USR1", "-o", "pl", "--", PY, str(script)).stdout.strip()  # fmt: skip
    timeline = tmp_path / "pl" / "logs" / f"slurmgen-{job}.timeline.jsonl"
    deadline = time.monotonic() + 120
    while '"first_step"' not in (timeline.read_text() if timeline.exists() else ""):
        assert time.monotonic() < deadline, sg(cluster, tmp_path, "status", job).stdout
        time.sleep(0.5)
    time.sleep(1)
    sg(cluster, tmp_path, "cancel", job, "--signal", "USR1")
    _release_when_requeued(cluster, job)
    view = wait_status(cluster, tmp_path, job, {"COMPLETED", "FAILED"}, timeout=150)
    assert view["state"] == "COMPLETED", sg(cluster, tmp_path, "logs", job).stdout[-3000:]
    assert [(a["event"], a["attempt"], a.get("cause")) for a in view["attempts"]][:3] == [
        ("start", 1, None), ("end", 1, "requeued"), ("start", 2, None)
    ], view["attempts"]  # fmt: skip
    assert "attempt 1: requeued" in sg(cluster, tmp_path, "status", job).stdout
    assert len(list((tmp_path / "lightning_out").glob("hpc_ckpt_*.ckpt"))) == 1  # one checkpoint
    found = json.loads(sg(cluster, tmp_path, "status", job, "--timeline", "--json").stdout)
    second = next(a for a in found["attempts"] if a["attempt"] == 2)
    assert sorted(r["rank"] for r in second["ranks"]) == [0, 1] and all(
        r["last_step"] == steps for r in second["ranks"]
    )
    firsts = [json.loads(x) for x in timeline.read_text().splitlines() if '"first_step"' in x]
    resumed = [e["step"] for e in firsts if e.get("attempt") == 2 and e.get("by") != "launcher"]
    assert len(resumed) == 2 and min(resumed) > 1, firsts  # from Lightning's checkpoint, not from step 1


@pytest.mark.parametrize(
    ("program", "launcher"),
    [
        ("transformers_gpt2.py", "torchrun"),
        ("accelerate_loop.py", "torchrun"),
        ("lightning_ddp.py", "torchrun"),  # srun mode: test_lightning_under_slurm_reports_to_status
        ("transformers_gpt2.py", "srun"),
        ("accelerate_loop.py", "srun"),
    ],
)
def test_under_slurm_each_rank_trains_once_in_either_launcher_mode(cluster, tmp_path, program, launcher):
    """run_slurm.sh's two modes: one torchrun agent per node starting the workers (the program
    reads torchrun's variables), or srun's tasks as the ranks (Slurm's); each program started as
    `python prog.py`, as the guides say."""
    flags = ["--nodes", "2", "--gpus", "1", "--backend", "gloo", "--time", "5", "--launcher", launcher, "-o", "t"]
    job = sg(
        cluster, tmp_path, "submit", *flags, "--wait", "--", PY, str(EXAMPLES / program), str(STEPS)
    ).stdout.strip()
    logs = sg(cluster, tmp_path, "logs", job).stdout
    assert sorted(re.findall(r"^\[rank (\d)\] rank \1 of 2\b", logs, re.M)) == ["0", "1"], logs
    found = json.loads(sg(cluster, tmp_path, "status", job, "--timeline", "--json").stdout)
    (attempt,) = [a for a in found["attempts"] if a["ranks"]]
    assert sorted(r["rank"] for r in attempt["ranks"]) == [0, 1], attempt
    assert all(r["last_step"] == STEPS and r["status"] == "done" for r in attempt["ranks"]), attempt
    # Every timeline line is JSON, the launcher's own included: under torchrun its pid once read "$".
    (timeline,) = (tmp_path / "t").rglob("*.timeline.jsonl")
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    launcher = [
        (e["event"], e["rank"]) for e in lines if e.get("by") == "launcher" and e["event"] in ("process", "end")
    ]
    assert sorted(launcher) == [("end", 0), ("end", 1), ("process", 0), ("process", 1)], launcher
    assert all(isinstance(e["pid"], int) for e in lines if e.get("by") == "launcher" and "pid" in e), lines
