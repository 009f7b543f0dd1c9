"""A run's page in Chromium on a real run record, without the cluster (issues 22 and 23): the
bundled trainer runs here with the variables run_slurm.sh gives it (its timeline file beside the
job's logs, its group slurm-<id>), its output becomes the job's srun-labelled log, and the job
is registered as `slurmgen submit` registers it; Slurm is a stand-in `scontrol` saying the job
exited 75 after "checkpoint and stop". The page shows it preempted with its elapsed time, the
per-rank timeline as SVG, goodput, the curves of the trainer's own record with step numbers, and
the log, followed live."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest

from slurmgen.contract import envvars
from slurmgen.contract.files import TIMELINE_NAME
from slurmgen.runs.registry import JobRecord, Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.timeout(240)]

JOB = "9301"
TRAIN = [
    "python",
    "-m",
    "slurmgen.train",
    "--model",
    "mlp",
    "--mlp-hidden",
    "16",
    "--max-steps",
    "120",
    "--save-every",
    "60",
    "--log-every",
    "10",
    "--heartbeat-every",
    "0.2",
    "--out-dir",
    "R",
]
SCONTROL = (
    f"JobId={JOB} JobName=train JobState=FAILED Reason=NonZeroExitCode Restarts=0 ExitCode=75:0 RunTime=00:00:20 "
    "TimeLimit=00:05:00 EndTime={end} NodeList=node1"
)


def _trained(tmp_path) -> None:
    """The trainer's own run here, as rank 0 of job JOB: its record, timeline and log."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {
        **os.environ,
        envvars.TIMELINE_FILE: str(logs / TIMELINE_NAME.format(job_id=JOB)),
        envvars.GROUP: f"slurm-{JOB}",
        "SLURM_JOB_ID": JOB,
        "SLURM_RESTART_COUNT": "0",
    }
    proc = subprocess.run(
        [sys.executable, *TRAIN[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (logs / f"train-{JOB}.out").write_text("".join(f"0: {line}\n" for line in (proc.stdout + proc.stderr).splitlines()))


def _stand_in_slurm(tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    end = datetime.fromtimestamp(time.time()).isoformat(timespec="seconds")  # Slurm's form, its local time
    (bin_dir / "scontrol.txt").write_text(SCONTROL.format(end=end) + "\n")
    for name, body in (("scontrol", f"cat '{bin_dir / 'scontrol.txt'}'"), ("sacct", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def own_coordinator(serve, tmp_path, monkeypatch):
    """`slurmgen serve` with the stand-in scontrol first on its PATH, after the trainer ran
    (submitted 2 s before it started)."""
    (tmp_path / "submitted").write_text(str(time.time() - 2))
    _trained(tmp_path)
    _stand_in_slurm(tmp_path, monkeypatch)
    return serve()


def test_a_checkpointed_trainer_jobs_page(page, own_coordinator, tmp_path):
    coordinator, p = own_coordinator, page
    with Registry.open(coordinator.env["SLURMGEN_REGISTRY"], create=True) as reg:  # the tests' own (tests/conftest.py)
        submitted = float((tmp_path / "submitted").read_text())
        record = JobRecord(
            JOB,
            "train",
            str(tmp_path / "out"),
            submitted,
            None,
            "RUNNING",
            None,
            {
                "nodes": 1,
                "gpus": 1,
                "log_dir": str(tmp_path / "logs"),
                "workdir": str(tmp_path),
                "launcher": "srun",
                "command": TRAIN,
            },
        )
        reg.add(record)
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/runs/{record.seq}")
    expect(p.page.locator(".facts .state")).to_have_text("preempted")
    expect(p.page.locator("#failure-title")).to_have_text("Stopped to checkpoint")
    elapsed = p.page.locator(".facts dt:text-is('Elapsed') + dd").inner_text()
    assert re.fullmatch(r"(\d+ min )?\d+ s", elapsed), elapsed  # Slurm's end time kept: not "—"
    timeline = p.page.locator("figure.timeline svg")
    expect(timeline).to_have_attribute("aria-label", "per-rank timeline of attempt 1")  # Slurm's restart count 0
    expect(timeline.locator("g.rank-row")).to_have_count(1)
    assert timeline.locator("rect").count() >= 4  # launch, imports, rendezvous, first step, training, checkpoints
    expect(p.page.locator("#goodput")).to_contain_text("Goodput")
    expect(p.page.locator("figure[data-metric=loss]")).to_be_visible()
    ticks = p.page.locator("figure[data-metric=loss]").get_attribute("data-x-ticks").split()
    assert ticks and all(t.isdigit() for t in ticks) and int(ticks[-1]) <= 120, ticks
    expect(p.page.locator("#log-view .log-line").first).to_be_visible()
    with (tmp_path / "logs" / f"train-{JOB}.out").open("a") as f:
        f.write("0: a line written now\n")
    expect(p.page.locator("#log-view .log-line").last).to_contain_text("a line written now", timeout=1500)
    p.shot("run-page-timeline")
