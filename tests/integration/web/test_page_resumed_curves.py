"""A launch that resumed another launch's checkpoint draws every attempt's steps (issue 33 item 5),
in Chromium against a real `slurmgen serve` of the test's own, without the cluster: the bundled
trainer runs here twice in one working directory with the variables `slurmgen launch` gives its
ranks (a launch id and its group), the second run resuming the first one's checkpoint from the
default --out-dir and so going on writing the first one's run record. The second launch's page
showed no curve (its own record directory stays empty); it draws steps 10-80, both attempts'."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from slurmgen.contract import envvars
from slurmgen.runs.model import NewRun, add_run
from slurmgen.runs.registry import Registry
from slurmgen.runs.trainer_records import record_dir

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.timeout(240)]

TRAIN = ["-m", "slurmgen.train", "--model", "mlp", "--mlp-hidden", "8", "--log-every", "10", "--save-every", "0"]


def _launch(tmp_path, launch_id: str, steps: int) -> None:
    """One launch's only rank, here, as `slurmgen launch` starts it (its id and group)."""
    env = {**os.environ, envvars.LAUNCH_ID: launch_id, envvars.GROUP: f"launch-{launch_id}"}
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        env.pop(name, None)
    argv = [sys.executable, *TRAIN, "--max-steps", str(steps)]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture
def own_coordinator(serve, tmp_path):
    """`slurmgen serve`, after launch A trained 40 steps and launch B resumed it to 80."""
    _launch(tmp_path, "A", 40)
    _launch(tmp_path, "B", 80)
    return serve()


def test_a_launch_that_resumed_another_launchs_checkpoint_draws_both_attempts(page, own_coordinator, tmp_path):
    coordinator, p = own_coordinator, page
    command = ["python", *TRAIN, "--max-steps", "80"]
    records = record_dir(str(tmp_path), command, "launch-B")
    assert records is not None and not os.path.isdir(records)  # B went on writing A's record
    with Registry.open(coordinator.env["SLURMGEN_REGISTRY"], create=True) as reg:
        new = NewRun("launch", "B", "resumed", str(tmp_path), 1, 1, "launch-B", records, info={"command": command})
        seq = add_run(reg, new, time.time())
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/runs/{seq}")
    loss = p.page.locator("figure[data-metric=loss]")
    expect(loss.locator(".uplot")).to_have_count(1, timeout=10_000)
    x_ticks = [int(t) for t in loss.get_attribute("data-x-ticks").split()]
    assert x_ticks and x_ticks[0] <= 20 and x_ticks[-1] >= 70, x_ticks  # attempt 1's steps and attempt 2's
    p.shot("resumed-launch-curves")
