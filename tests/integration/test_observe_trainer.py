"""The bundled trainer writes the timeline through the same writer as `slurmgen.beat`: two
gloo processes on this machine (no Slurm) with a timeline file, rank 1 slowed on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurmgen.contract import phases
from slurmgen.observe.report import analyse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_trainer_on_gloo_records_every_phase_and_its_slow_rank_is_a_straggler(tmp_path):
    tl = tmp_path / "slurmgen-1.timeline.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMGEN_")}
    env.update(SLURMGEN_TIMELINE_FILE=str(tl), SLURMGEN_TRAIN_SLOW="1:0.04")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmgen.train",
            "--nproc-per-node",
            "2",
            "--backend",
            "gloo",
            "--model",
            "mlp",
            "--mlp-hidden",
            "16",
            "--max-steps",
            "50",
            "--save-every",
            "25",
            "--log-every",
            "25",
            "--heartbeat-every",
            "0.2",
            "--progress",
            "lines",
            "--out-dir",
            str(tmp_path / "R"),
        ],
        env=env,
        check=True,
        timeout=150,
        capture_output=True,
        text=True,
    )
    found = analyse(tl.read_text(), [], None, time.time())
    (attempt,) = found["timeline"]["attempts"]
    assert [r["rank"] for r in attempt["ranks"]] == [0, 1]
    for r in attempt["ranks"]:
        times = [r[p] for p in phases.PHASES]
        assert None not in times and times == sorted(times), r
        assert [c["step"] for c in r["checkpoint_list"]] == [25, 50] and r["status"] == "done", r
    # Two ranks: the median is their mean, so rank 1 must be over 3x rank 0 (it sleeps 40 ms a step).
    assert [s["rank"] for s in found["stragglers"]] == [1], found
    assert found["goodput"]["breakdown"]["checkpoint"] > 0, found["goodput"]
    # The trainer names it too, in its log line and its metrics, from the same work per step.
    assert "straggler: rank 1 " in done.stdout + done.stderr, done.stdout + done.stderr
    train = [json.loads(x) for x in (tmp_path / "R" / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert [m["straggler"]["rank"] for m in train] == [1, 1], train
