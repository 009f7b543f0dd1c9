"""kill -9 at any instant: the latest checkpoint always loads, and resuming is exact (gloo, CPU)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import LAUNCH_VARS, clean_env

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

import contextlib

from slurmgen.contract.envvars import HEARTBEAT_DIR as HEARTBEAT_DIR_ENV  # noqa: E402
from slurmgen.train.checkpoint import files as ckpt  # noqa: E402
from slurmgen.train.cli import main  # noqa: E402

PY = sys.executable


@pytest.fixture
def no_launcher(monkeypatch):
    for k in list(os.environ):
        if k in LAUNCH_VARS or k.startswith("SLURM_"):
            monkeypatch.delenv(k)


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    # Killed runs cannot remove their node-local heartbeat directory: keep it under tmp_path.
    out = Path(args[args.index("--out-dir") + 1])
    env = {**env, HEARTBEAT_DIR_ENV: str(out.parent / f"{out.name}-heartbeats")}
    return subprocess.Popen(
        [PY, "-m", "slurmgen.train", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def kill_session(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)


def finish(p: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        kill_session(p) if p.poll() is None else None
    return p.returncode, out + err


def latest_step(directory: Path) -> int:
    try:
        return int((directory / "latest").read_text().strip()[5:14])
    except (OSError, ValueError):
        return -1


def final_state(out: Path, step: int) -> dict:
    return ckpt.load(out / "checkpoints" / ckpt.checkpoint_name(step))


GPT = [
    "--model",
    "gpt",
    "--n-layer",
    "1",
    "--n-head",
    "2",
    "--n-embd",
    "16",
    "--block-size",
    "16",
    "--dropout",
    "0.1",
    "--synthetic-samples",
    "512",
    "--batch-size",
    "4",
    "--max-steps",
    "30",
    "--eval-every",
    "10",
    "--eval-iters",
    "2",
    "--log-every",
    "10",
    "--progress",
    "lines",
    "--nproc-per-node",
    "2",
]


def test_exact_resume_after_kill_9(tmp_path):
    """Two ranks killed with SIGKILL at a random step, resumed: bit-identical to an uninterrupted run."""
    rng = random.Random()
    kill_at = rng.randint(3, 20)
    ref, run = tmp_path / "reference", tmp_path / "interrupted"
    code, log = finish(start(GPT + ["--out-dir", str(ref), "--save-every", "0"], clean_env()))
    assert code == 0, log[-3000:]

    victim = start(GPT + ["--out-dir", str(run), "--save-every", "1", "--keep-last", "2"], clean_env())
    deadline = time.monotonic() + 90
    while latest_step(run / "checkpoints") < kill_at and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert victim.poll() is None, f"the run ended before the kill at step {kill_at}"
    kill_session(victim)
    killed_at = latest_step(run / "checkpoints")
    assert 0 < killed_at < 30, killed_at

    code, log = finish(start(GPT + ["--out-dir", str(run), "--save-every", "1", "--keep-last", "2"], clean_env()))
    assert code == 0, log[-3000:]
    resumed_at = int(log.split("at step ")[1].split()[0])
    assert killed_at <= resumed_at < 30, (killed_at, resumed_at)
    a, b = final_state(ref, 30), final_state(run, 30)
    diff = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert not diff, f"killed at step {killed_at}, resumed at {resumed_at}: parameters differ: {diff}"
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("point", ckpt.FAULT_POINTS)
def test_kill_9_inside_a_checkpoint_write(tmp_path, point, no_launcher):
    """SIGKILL between any two steps of save(): `latest` loads, and the next run resumes from it."""
    out = tmp_path / "run"
    args = [
        "--model",
        "mlp",
        "--mlp-hidden",
        "16",
        "--synthetic-samples",
        "256",
        "--max-steps",
        "6",
        "--save-every",
        "2",
        "--keep-last",
        "1",
        "--progress",
        "none",
        "--out-dir",
        str(out),
    ]
    code, log = finish(start(args, clean_env(SLURMGEN_TRAIN_FAULT=f"{point}@4")), timeout=60)
    assert code == -signal.SIGKILL, log[-2000:]
    path, state = ckpt.find_latest(out / "checkpoints")
    expected = 4 if point == "before-prune" else 2
    assert state["step"] == expected and path.name == ckpt.checkpoint_name(expected)
    leftovers = [n for n in os.listdir(out / "checkpoints") if ".tmp." in n]
    assert bool(leftovers) == (point in ("mid-write", "before-rename")), leftovers
    assert main(args) == 0  # in this process: resumes and finishes
    assert [n for n in os.listdir(out / "checkpoints") if ".tmp." in n] == []
    assert ckpt.find_latest(out / "checkpoints")[1]["step"] == 6


def test_random_kill_9_while_saving_every_step(tmp_path, no_launcher):
    """A ~13 MB checkpoint every step, so most of the time is spent writing: kill -9 at random
    moments, and every time the latest checkpoint still loads and the run continues from it."""
    out = tmp_path / "run"
    args = [
        "--model",
        "mlp",
        "--mlp-hidden",
        "1024",
        "--synthetic-samples",
        "4096",
        "--max-steps",
        "400",
        "--save-every",
        "1",
        "--keep-last",
        "2",
        "--progress",
        "none",
        "--out-dir",
        str(out),
    ]
    rng, seen = random.Random(), []
    for _ in range(3):
        p = start(args, clean_env())
        before = latest_step(out / "checkpoints")
        deadline = time.monotonic() + 60
        while latest_step(out / "checkpoints") <= before and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        assert p.poll() is None, "the run ended before it could be killed"
        kill_session(p)
        path, state = ckpt.find_latest(out / "checkpoints")
        assert state["step"] > before and path.name == ckpt.checkpoint_name(state["step"])
        seen.append(state["step"])
    assert seen == sorted(seen)
