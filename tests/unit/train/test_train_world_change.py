"""A checkpoint resumed on a world of another size (issue 35's smaller world, `--min-nodes`): the
trainer keeps the global batch by raising gradient accumulation where it divides, else keeps the
per-process batch and says the global batch changed; one log line and the run record say which.
The rule is pure (config.refit); the real runs are 2 gloo ranks that checkpoint and 1 that resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmgen.train.config import refit, refit_line


@pytest.mark.parametrize(
    "global_batch, batch, world, accum, expected",
    [
        (32, 8, 2, 1, (2, True)),  # 2 nodes x 2 ranks -> 1 node: accumulation 1 -> 2
        (32, 8, 4, 1, (1, True)),  # back to the full world: 1 again
        (48, 8, 3, 2, (2, True)),
        (24, 8, 2, 1, (1, False)),  # 3 ranks -> 2: 24 is no multiple of 16, the per-rank batch stays
        (16, 8, 4, 1, (1, False)),  # a larger world than the global batch holds
    ],
)
def test_the_accumulation_keeps_the_global_batch_where_it_divides(global_batch, batch, world, accum, expected):
    assert refit(global_batch, batch, world, accum) == expected


def test_the_refit_is_said_in_one_line():
    assert refit_line((4, 8, 1), (2, 8, 2)) == (
        "the world changed from 4 to 2 processes: gradient accumulation 1 -> 2 keeps the global batch of 32 samples "
        "(8 x 2 x 2)"
    )
    assert refit_line((3, 8, 1), (2, 8, 1)) == (
        "the world changed from 3 to 2 processes: the global batch of 24 samples is not a multiple of 8 per process "
        "x 2 processes, so the per-process batch stays 8 with accumulation 1: the global batch changes 24 -> 16 samples"
    )


ARGS = ["--model", "mlp", "--synthetic-samples", "256", "--batch-size", "4", "--log-every", "1", "--save-every", "4"]
ARGS += ["--eval-iters", "1", "--progress", "lines", "--threads", "1", "--track", "rank0"]


def train(out: Path, nproc: int, steps: int, *extra: str) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "SLURMGEN_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC"))
    }
    env["SLURMGEN_HEARTBEAT_DIR"] = str(out.parent / f"{out.name}-heartbeats")
    argv = [*ARGS, "--out-dir", str(out), "--nproc-per-node", str(nproc), "--max-steps", str(steps), *extra]
    p = subprocess.run(
        [sys.executable, "-m", "slurmgen.train", *argv], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p.stdout + p.stderr


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_smaller_world_resumes_the_larger_worlds_checkpoint_with_the_same_global_batch(tmp_path, strategy):
    out = tmp_path / "run"
    first = train(out, 2, 4, "--strategy", strategy)
    assert "global batch: 8 samples (4 per process x 1 accumulation x 2 processes)" in first
    log = train(out, 1, 8, "--strategy", strategy)
    assert "resumed from" in log and "at step 4" in log, log[-3000:]
    said = "the world changed from 2 to 1 processes: gradient accumulation 1 -> 2 keeps the global batch of 8 samples"
    assert said in log, log[-3000:]
    assert "global batch: 8 samples (4 per process x 2 accumulation x 1 processes)" in log
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 8
    (record,) = [json.loads(p.read_text()) for p in (out / "tracking").rglob("run.json")]
    first_attempt, second = record["attempts"]
    assert "batch" not in first_attempt
    assert second["batch"]["grad_accum"] == 2 and second["batch"]["global_batch"] == 8 and second["batch"]["kept"]
    assert second["batch"]["before"] == {"world_size": 2, "batch_size": 4, "grad_accum": 1}
    assert second["batch"]["note"].startswith(said)


def test_when_it_does_not_divide_the_per_process_batch_stays_and_the_log_says_the_global_batch_changed(tmp_path):
    out = tmp_path / "run"
    train(out, 1, 4)  # 4 samples a step; 4 is no multiple of 2 x 4 (a 3 -> 2 world is the same rule, and slower)
    log = train(out, 2, 8)
    assert "the global batch changes 4 -> 8 samples" in log, log[-3000:]
    assert "global batch: 8 samples (4 per process x 1 accumulation x 2 processes)" in log
