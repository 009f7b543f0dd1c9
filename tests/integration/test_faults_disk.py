"""A full disk under a real 2-rank gloo run (issue 24 items 5-7): the run directory lives on a
30 MB tmpfs, filled so that a checkpoint write fails.

What must hold: one line naming the checkpoint's directory and the intact previous checkpoint
(no torch iostream traceback), the failure exit code, a run record that says "failed" with
that code, `latest` still loading, and no temporary file left, neither after the failed run
nor after the resume that follows once there is room again.

Mounting needs root: outside CI the tests skip without it; under CI a skip fails (conftest).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import clean_env, communicate_in_session, tmpfs

from slurmgen.contract import exitcodes
from slurmgen.contract.envvars import HEARTBEAT_DIR

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

from slurmgen.train.checkpoint import files as ckpt  # noqa: E402

# About 5 MB a checkpoint: one fits in the 30 MB disk beside the filler, a second does not.
ARGS = [
    "--model",
    "gpt",
    "--n-layer",
    "2",
    "--n-embd",
    "128",
    "--n-head",
    "2",
    "--block-size",
    "16",
    "--synthetic-samples",
    "512",
    "--batch-size",
    "4",
    "--progress",
    "lines",
    "--log-every",
    "5",
    "--nproc-per-node",
    "2",
    "--keep-last",
    "1",
    "--save-every",
    "5",
]


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 30 MB tmpfs."""
    with tmpfs(tmp_path, "30m") as mnt:
        yield mnt


def start(out: Path, steps: int, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slurmgen.train", *ARGS, "--max-steps", str(steps), "--out-dir", str(out)],
        env=clean_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(p: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    out, _ = communicate_in_session(p, timeout)
    return p.returncode, out


def temporaries(*roots: Path) -> list[str]:
    return [str(p) for root in roots for p in root.rglob("*") if ".tmp." in p.name]


def record(out: Path) -> dict:
    (path,) = out.glob("tracking/*/*/run.json")
    return json.loads(path.read_text())


def fill(disk: Path, leave: int) -> Path:
    """Write a filler file until `leave` bytes are free (0: until the disk refuses a byte)."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while (room := os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - leave) > 0:
                f.write(b"\0" * min(room, 1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def first_checkpoint(out: Path, **env: str) -> int:
    """A run of 5 steps: the previous checkpoint (step 5) that the failed write must not touch."""
    code, log = finish(start(out, 5, **env))
    assert code == 0, log[-3000:]
    return (out / "checkpoints" / ckpt.checkpoint_name(5)).stat().st_size


def resume_when_there_is_room(out: Path, filler: Path, *roots: Path, **env: str) -> None:
    filler.unlink()
    code, log = finish(start(out, 20, **env))
    assert code == 0, log[-3000:]
    assert ckpt.find_latest(out / "checkpoints")[1]["step"] == 20
    assert temporaries(*roots) == []
    assert record(out)["status"] == "finished"


def test_a_checkpoint_that_cannot_fit_fails_in_one_line(small_disk: Path, tmp_path: Path):
    """Half a checkpoint of room: the write of step 10 is refused before a byte is written."""
    out, beats = small_disk / "run", small_disk / "heartbeats"
    size = first_checkpoint(out, **{HEARTBEAT_DIR: str(beats)})
    filler = fill(small_disk, leave=size // 2)
    code, log = finish(start(out, 20, **{HEARTBEAT_DIR: str(beats)}))

    assert code == exitcodes.FAILED, log[-3000:]
    directory = out / "checkpoints"
    assert f"checkpoint step 10: no space left on {directory} (needs ~" in log, log[-3000:]
    assert "the previous checkpoint (step 5) is intact" in log, log[-3000:]
    assert "basic_ios" not in log and "iostream error" not in log, log[-3000:]
    path, state = ckpt.find_latest(directory)
    assert state["step"] == 5 and path.name == ckpt.checkpoint_name(5)
    meta = record(out)
    assert (meta["status"], meta["exit_code"]) == ("failed", exitcodes.FAILED), meta
    assert temporaries(small_disk) == []
    resume_when_there_is_room(out, filler, small_disk, **{HEARTBEAT_DIR: str(beats)})


def latest_step(directory: Path) -> int:
    try:
        return int((directory / "latest").read_text().strip()[5:14])
    except (OSError, ValueError):
        return -1


def wait_for_latest(directory: Path, step: int, p: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while latest_step(directory) < step:
        assert p.poll() is None and time.monotonic() < deadline, f"no checkpoint of step {step} in {directory}"
        time.sleep(0.002)


def test_a_disk_filled_to_the_last_byte_mid_run(small_disk: Path):
    """The disk fills up while the run trains (another writer takes every byte): whatever
    write fails first, the failure path's own writes (heartbeat, node summary, run record)
    find no room either, and must neither skip each other nor leave temporary files."""
    out = small_disk / "run"
    first_checkpoint(out)
    p = start(out, 400)
    try:
        wait_for_latest(out / "checkpoints", 10, p)
        filler = fill(small_disk, leave=0)
    finally:
        code, log = finish(p)

    assert code == exitcodes.FAILED, log[-3000:]
    meta = record(out)
    assert (meta["status"], meta.get("exit_code")) == ("failed", exitcodes.FAILED), log[-3000:]
    assert meta["attempts"][-1]["status"] == "failed", meta
    assert temporaries(small_disk) == [], log[-3000:]
    assert ckpt.find_latest(out / "checkpoints")[1]["step"] >= 10
    resume_when_there_is_room(out, filler, small_disk)
