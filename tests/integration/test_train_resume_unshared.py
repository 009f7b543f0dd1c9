"""Resume when the checkpoint is not readable on every node: rank 0 sends it, and resuming stays exact.

Three ranks on gloo, each its own "node". Rank 1 runs in a private mount namespace with an
empty tmpfs over the run directory (a node that does not share the file system); rank 2 sees
a truncated copy of the checkpoint (a node whose view of the file is damaged). Only rank 0
reads the real file, so the other two must get the state from rank 0 (resume.load).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env, communicate_in_session, free_port

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

from slurmgen.contract.envvars import HEARTBEAT_DIR as HEARTBEAT_DIR_ENV  # noqa: E402
from slurmgen.train.checkpoint import files as ckpt  # noqa: E402

WORLD = 3
DRIVER = str(Path(__file__).with_name("resume_rank.py"))
# sh -c MASK mask DIR CMD...: mounts an empty tmpfs over DIR in this process's own mount
# namespace (it dies with the process, so nothing is left mounted), then execs CMD.
# MASK_WITH_COPY takes DIR FILE NAME CMD... and first copies FILE into the tmpfs as NAME.
MASK = 'mount -t tmpfs tmpfs "$1" && shift && exec "$@"'
MASK_WITH_COPY = 'mount -t tmpfs tmpfs "$1" && cp "$2" "$1/$3" && shift 3 && exec "$@"'


def private_mounts() -> list[str]:
    """The prefix that runs a command in a mount namespace of its own (root only)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a private mount namespace")
    return ["unshare", "--mount", "--propagation", "private"]


def run_ranks(tmp_path: Path, name: str, prefixes: list[list[str]]) -> list[tuple[int, str]]:
    """Start rank r as PREFIXES[r] + the driver, each on a 'node' of its own; (exit code, log) per rank."""
    port, procs = free_port(), []
    for r, prefix in enumerate(prefixes):
        env = clean_env(
            RANK=str(r),
            LOCAL_RANK="0",
            WORLD_SIZE=str(WORLD),
            LOCAL_WORLD_SIZE="1",
            NODE_RANK=str(r),
            GROUP_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **{HEARTBEAT_DIR_ENV: str(tmp_path / f"heartbeats-{name}-{r}")},
        )
        cmd = [*prefix, sys.executable, DRIVER, str(tmp_path / "run"), str(tmp_path / f"params-{name}-{r}.pt")]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
            )
        )
    results = []
    for p in procs:
        out, _ = communicate_in_session(p, timeout=120)
        results.append((p.returncode, out))
    return results


def final_params(tmp_path: Path, name: str, rank: int) -> dict:
    state = torch.load(tmp_path / f"params-{name}-{rank}.pt", weights_only=True)
    assert state["step"] == 8, (name, rank, state["step"])
    return state["model"]


def back_to_step_4(ckpt_dir: Path) -> Path:
    """Undo the end of a finished run, as if it had been interrupted after the checkpoint of step 4."""
    (ckpt_dir / ckpt.checkpoint_name(8)).unlink()
    step4 = ckpt_dir / ckpt.checkpoint_name(4)
    (ckpt_dir / ckpt.LATEST).write_text(step4.name + "\n")
    return step4


def test_resume_from_a_checkpoint_only_rank_0_can_read(tmp_path):
    """Every rank ends bit for bit where the uninterrupted run ended."""
    prefix = private_mounts()
    run, ckpt_dir = tmp_path / "run", tmp_path / "run" / "checkpoints"
    for code, out in run_ranks(tmp_path, "full", [[]] * WORLD):
        assert code == 0 and "rank 0 will send" not in out, out[-3000:]
    step4 = back_to_step_4(ckpt_dir)
    reference = final_params(tmp_path, "full", 0)
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(step4.read_bytes()[:1000])

    results = run_ranks(
        tmp_path,
        "unshared",
        [
            [],
            [*prefix, "sh", "-c", MASK, "mask", str(run)],
            [*prefix, "sh", "-c", MASK_WITH_COPY, "mask", str(ckpt_dir), str(damaged), step4.name],
        ],
    )
    for code, out in results:
        assert code == 0, out[-3000:]
    logs = [out for _, out in results]
    assert f"resumed from {step4} at step 4" in logs[0], logs[0][-3000:]
    assert f"{step4} is not readable on every node" in logs[0], logs[0][-3000:]
    assert f"cannot read {step4} here" in logs[1] and "No such file" in logs[1], logs[1][-3000:]
    assert f"cannot read {step4} here" in logs[2] and "damaged" in logs[2], logs[2][-3000:]
    for r in range(WORLD):
        params = final_params(tmp_path, "unshared", r)
        differ = [k for k in reference if not torch.equal(reference[k], params[k])]
        assert not differ, f"rank {r} differs from the uninterrupted run: {differ}"
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text(), "a tmpfs outlived its rank"
