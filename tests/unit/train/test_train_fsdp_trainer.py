"""`--strategy fsdp` through the trainer's command line: 2 real gloo ranks (`--nproc-per-node`),
sharded checkpoints, a stop by kill -9 and a resume that ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import wait_for

from slurmgen.train.checkpoint import sharded

ARGS = [
    "--model",
    "gpt",
    "--n-layer",
    "2",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "16",
    "--dropout",
    "0.1",
    "--synthetic-samples",
    "256",
    "--batch-size",
    "4",
    "--grad-accum",
    "2",
    "--max-steps",
    "8",
    "--eval-iters",
    "1",
    "--log-every",
    "1",
    "--progress",
    "lines",
    "--save-every",
    "4",
    "--threads",
    "1",
]


def train(out: Path, *extra: str, nproc: int = 2, fault: str | None = None) -> tuple[int, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "SLURMGEN_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC"))
    }
    env["SLURMGEN_HEARTBEAT_DIR"] = str(out.parent / f"{out.name}-heartbeats")
    if fault:
        env["SLURMGEN_TRAIN_FAULT"] = fault
    p = subprocess.run(
        [sys.executable, "-m", "slurmgen.train", *ARGS, "--out-dir", str(out), "--nproc-per-node", str(nproc), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return p.returncode, p.stdout + p.stderr


def losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r.get("split") == "train"}


def weights(out: Path) -> dict[str, torch.Tensor]:
    path, _ = sharded.newest_good(out)
    return sharded.full_model_state(path)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The out dir of one uninterrupted `--strategy fsdp` run (thread writer), the run that the
    resumed and the process-writer runs must match: the same arguments, so it is made once."""
    out = tmp_path_factory.mktemp("fsdp") / "whole"
    code, log = train(out, "--strategy", "fsdp")
    assert code == 0, log[-3000:]
    return out


def test_fsdp_run_killed_after_a_checkpoint_resumes_bit_identical(tmp_path, whole):
    code, log = train(tmp_path / "cut", "--strategy", "fsdp", fault="before-prune@4")
    assert code != 0
    assert (tmp_path / "cut" / "checkpoints" / "latest").read_text().strip() == sharded.checkpoint_name(4)
    code, log = train(tmp_path / "cut", "--strategy", "fsdp")
    assert code == 0, log[-3000:]
    assert "at step 4" in log
    a, b = weights(whole), weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert losses(tmp_path / "cut") == losses(whole)
    assert [p.name for p in (whole / "checkpoints").iterdir() if p.name.endswith(".dcp")] != []


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds `marker` (what a run started, whatever its parent)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue  # gone, or not ours to read
    return found


def test_the_process_writer_writes_the_same_checkpoints_and_leaves_no_process(tmp_path, monkeypatch, whole):
    marker = f"TEST_RUN_MARK={tmp_path}"
    monkeypatch.setenv("TEST_RUN_MARK", str(tmp_path))  # inherited by the ranks and DCP's writer processes
    code, log = train(tmp_path / "proc", "--strategy", "fsdp", "--checkpoint-writer", "process")
    assert code == 0 and "Traceback" not in log, log[-3000:]
    assert "Checkpoint background process is running" in log  # DCP's own writer process wrote them
    # A writer process sees its rank's pipe close and ends: within seconds, not left behind.
    wait_for(lambda: not processes_with(marker), 10, f"DCP's writer processes to end ({processes_with(marker)})")
    for step in (4, 8):
        info = sharded.describe(tmp_path / "proc" / "checkpoints" / sharded.checkpoint_name(step))
        assert info["complete"] and info["world_size"] == 2, info
    a, b = weights(tmp_path / "proc"), weights(whole)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "first,then",
    [
        ("fsdp", ["--strategy", "fsdp", "--nproc-per-node", "3"]),
        ("ddp", ["--strategy", "fsdp"]),
        ("fsdp", ["--strategy", "ddp"]),
    ],
)
def test_resume_on_another_world_size_or_strategy_continues_from_the_same_step(tmp_path, first, then):
    code, log = train(tmp_path / "run", "--strategy", first, fault="before-prune@4")
    assert code != 0
    code, log = train(tmp_path / "run", *then)
    assert code == 0, log[-3000:]
    assert "resumed from" in log and "at step 4" in log
    if "3" in then:
        assert "written by 2 processes, now 3: resharding" in log
    resumed = losses(tmp_path / "run")
    assert set(resumed) == set(range(1, 9)) and all(v == v for v in resumed.values())


def test_bad_strategy_values_are_one_line_and_exit_2(tmp_path):
    for extra, said in (
        (["--strategy", "zero3"], "--strategy"),
        (["--strategy", "fsdp", "--dtype", "float16"], "--dtype float16"),
        (["--checkpoint-writer", "process"], "--checkpoint-writer process needs --strategy fsdp"),
        (["--strategy", "fsdp", "--checkpoint-writer", "fork"], "--checkpoint-writer"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "slurmgen.train", *extra, "--out-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr


# The signal goes out once 3 steps are logged and the ranks stop 1-3 steps later (the vote is one
# step late): the run stopped at step 6 here, at 15-60 steps/s. 100 leaves the first run seconds
# to spare and the resumed one little to do (400 steps were 10-18 s of it).
PREEMPT_STEPS = 100


def test_preemption_signal_writes_a_sharded_checkpoint_and_the_run_resumes_from_it(tmp_path):
    """The warning signal to every rank: they agree on a step, write a sharded checkpoint, exit 75;
    run again, the job continues from that step to the end."""
    import signal
    import time

    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMGEN_"))}
    env["SLURMGEN_HEARTBEAT_DIR"] = str(tmp_path / "hb")
    args = [
        sys.executable,
        "-m",
        "slurmgen.train",
        *ARGS,
        "--max-steps",
        str(PREEMPT_STEPS),
        "--save-every",
        "0",
        "--strategy",
        "fsdp",
        "--nproc-per-node",
        "2",
        "--out-dir",
        str(out),
    ]
    p = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while (
            time.monotonic() < deadline
            and p.poll() is None
            and len(losses(out) if (out / "metrics.jsonl").exists() else {}) < 3
        ):
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGUSR2)
        log, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 75, log[-3000:]
    path, meta = sharded.newest_good(out)
    assert path.name.endswith(".dcp") and 3 <= meta["step"] < PREEMPT_STEPS and meta["world_size"] == 2
    code, log = train(out, "--strategy", "fsdp", "--max-steps", str(PREEMPT_STEPS), "--save-every", "0")
    assert code == 0, log[-3000:]
    assert f"at step {meta['step']}" in log and sharded.newest_good(out)[1]["step"] == PREEMPT_STEPS
