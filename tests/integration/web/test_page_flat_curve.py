"""A chart of a constant series (issue 33: a constant lr drew an empty chart, no line and no y
labels), in Chromium against a real `slurmgen serve` of the test's own, without the cluster: the
bundled trainer runs here as a launch's only rank with its learning rate held (--min-lr equal to
--lr, no warm-up); its lr chart draws the line about its value, with y labels."""

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

LR = "0.003"
TRAIN = ["-m", "slurmgen.train", "--model", "mlp", "--mlp-hidden", "8", "--log-every", "10", "--save-every", "0"]
TRAIN += ["--max-steps", "40", "--lr", LR, "--min-lr", LR, "--warmup-steps", "0"]


@pytest.fixture
def own_coordinator(serve, tmp_path):
    """`slurmgen serve`, after launch F trained 40 steps at a constant learning rate."""
    env = {**os.environ, envvars.LAUNCH_ID: "F", envvars.GROUP: "launch-F"}
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, *TRAIN], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return serve()


def test_a_constant_series_draws_its_line_and_y_labels(page, own_coordinator, tmp_path):
    coordinator, p = own_coordinator, page
    command = ["python", *TRAIN]
    records = record_dir(str(tmp_path), command, "launch-F")
    with Registry.open(coordinator.env["SLURMGEN_REGISTRY"], create=True) as reg:
        new = NewRun("launch", "F", "flat", str(tmp_path), 1, 1, "launch-F", records, info={"command": command})
        seq = add_run(reg, new, time.time())
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/runs/{seq}")
    lr = p.page.locator("figure[data-metric=lr]")
    expect(lr.locator(".uplot")).to_have_count(1, timeout=10_000)
    expect(lr.locator(".chart-summary")).to_contain_text(f"train {LR} at step 40")  # the series is flat
    y_ticks = [float(t) for t in lr.get_attribute("data-y-ticks").split()]
    assert len(y_ticks) >= 2 and min(y_ticks) <= float(LR) <= max(y_ticks), y_ticks  # labels about its value
    line = lr.evaluate(  # the line's pixels (the series' blue) on the chart's canvas
        """f => {
            const c = f.querySelector("canvas");
            const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
            let n = 0;
            for (let i = 0; i < d.length; i += 4) if (d[i] < 90 && d[i + 2] > 200 && d[i + 3] > 0) n++;
            return n;
        }"""
    )
    assert line > 100, f"{line} pixels of the line"
    p.shot("flat-lr-chart")
