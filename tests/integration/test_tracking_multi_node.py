"""Run records of the bundled trainer as 2 nodes x 2 processes through launch_multi_node.sh on
this machine (gloo): one run in rank-0 mode, four runs in one group per process, artifact hashes
that match the files, a kill -9 and a resume that continue one run with continuous steps, and a
plot of it that is a real picture."""

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port

from slurmgen.cli import main
from slurmgen.tracking.records import find_runs

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

TRAIN = [
    "python",
    "-m",
    "slurmgen.train",
    "--model",
    "mlp",
    "--mlp-in",
    "8",
    "--mlp-hidden",
    "16",
    "--mlp-classes",
    "4",
    "--synthetic-samples",
    "512",
    "--batch-size",
    "4",
    "--log-every",
    "1",
    "--eval-every",
    "3",
    "--eval-iters",
    "2",
    "--progress",
    "lines",
    "--init-timeout",
    "60",
    "--heartbeat-every",
    "0.2",
]


def create(out: Path, *args: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(
            [
                "create",
                "--nodes",
                "2",
                "--gpus",
                "2",
                "--backend",
                "gloo",
                "-o",
                str(out),
                "--force",
                "--",
                *TRAIN,
                *args,
            ]
        )
    assert info.value.code == 0


def start(out: Path, port: int) -> list[subprocess.Popen]:
    """Both nodes at once, as two people would type it on two machines."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SLURMGEN_", "WANDB_", "MLFLOW_", "SWANLAB_")) and k != "TORCHELASTIC_RUN_ID"
    }
    env.update(
        PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
        SLURMGEN_STOP_GRACE="5",
    )
    return [
        subprocess.Popen(
            [str(out / "launch_multi_node.sh"), "127.0.0.1", "2", "2", str(node)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for node in (0, 1)
    ]


def wait(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    return results


def ours(marker: str) -> list[int]:
    """PIDs of the processes of this test (their command lines hold its unique temporary path)."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found if int(p) != os.getpid()]


def run_ok(out: Path, port: int | None = None) -> None:
    results = wait(start(out, port or free_port()))
    assert [rc for rc, _ in results] == [0, 0], "\n".join(text[-3000:] for _, text in results)


def test_rank0_mode_writes_exactly_one_run_with_matching_hashes(tmp_path):
    out = tmp_path / "job"
    create(out, "--out-dir", str(tmp_path / "run"), "--max-steps", "6", "--save-every", "3")
    run_ok(out)
    (run,) = find_runs(tmp_path)
    meta = run.meta
    assert (meta["status"], meta["mode"], meta["job_type"], meta["restart_count"]) == ("finished", "rank0", "main", 0)
    assert meta["group"].startswith("rdzv-127.0.0.1-")  # the same on all four ranks, and nobody talked
    world = meta["world"]
    assert (world["world_size"], world["local_world_size"], world["nodes"], world["backend"]) == (4, 2, 2, "gloo")
    assert meta["hosts"] == [socket.gethostname()] and meta["versions"]["torch"]
    assert run.hparams["max_steps"] == 6 and run.hparams["model"] == "mlp"
    assert [r["step"] for r in run.metrics if r["type"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in run.metrics if r["type"] == "val"] == [3, 6]
    outputs = [a for a in run.artifacts if a["role"] == "output"]
    assert [a["name"] for a in outputs] == ["ckpt-000000003", "ckpt-000000006", "model"]
    for artifact in outputs:
        for entry in artifact["files"]:
            data = Path(entry["path"]).read_bytes()
            assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()


def test_per_process_mode_writes_four_runs_in_one_group(tmp_path):
    out = tmp_path / "job"
    create(out, "--out-dir", str(tmp_path / "run"), "--max-steps", "4", "--save-every", "0", "--track", "per-process")
    run_ok(out)
    runs = list(find_runs(tmp_path))
    assert len(runs) == 4 and len({r.get("group") for r in runs}) == 1
    assert sorted(r.get("job_type") for r in runs) == [
        "node_0_rank_0",
        "node_0_rank_1",
        "node_1_rank_2",
        "node_1_rank_3",
    ]
    assert sorted(r.get("world")["rank"] for r in runs) == [0, 1, 2, 3]
    assert {r.get("world")["node_rank"] for r in runs if r.get("world")["rank"] >= 2} == {1}
    for run in runs:
        assert run.get("status") == "finished" and [m["step"] for m in run.metrics if m["type"] == "train"] == [
            1,
            2,
            3,
            4,
        ]
    # only the main run holds the checkpoint (rank 0 writes it); every run has the same global loss
    assert sorted(len(r.artifacts) for r in runs) == [0, 0, 0, 2]
    assert len({r.last("loss") for r in runs}) == 1


def test_killed_and_resumed_run_is_one_run_with_continuous_steps_and_a_real_plot(tmp_path):
    image = pytest.importorskip("matplotlib.image", reason="matplotlib is not installed: pip install 'slurmgen[plot]'")
    out, run_dir = tmp_path / "job", tmp_path / "run"
    create(out, "--out-dir", str(run_dir), "--max-steps", "40", "--save-every", "5")
    procs = start(out, free_port())
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # let it pass a checkpoint or two, then kill -9 everything
            steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()] if metrics.exists() else []
            if steps and steps[-1] >= 13:
                break
            assert all(p.poll() is None for p in procs), "the job ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail("the job did not reach step 13 in time")
    finally:
        for pid in ours(str(tmp_path)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait(procs, timeout=30)
    (killed,) = find_runs(tmp_path)
    assert killed.get("status") == "running"  # nobody could say otherwise: it was killed
    killed_at = killed.steps
    run_ok(out)  # a new rendezvous port: the run is found again through the checkpoint
    (run,) = find_runs(tmp_path)
    assert run.get("id") == killed.get("id") and run.get("restart_count") == 1 and run.get("status") == "finished"
    first, second = run.get("attempts")
    assert first["status"] == "lost" and second["status"] == "finished"
    assert second["resumed_at_step"] % 5 == 0 and second["resumed_at_step"] <= killed_at
    train_steps = [r["step"] for r in run.metrics if r["type"] == "train"]
    assert train_steps == list(range(1, 41)), train_steps  # continuous, none twice
    val_steps = [r["step"] for r in run.metrics if r["type"] == "val"]
    assert val_steps == sorted(set(val_steps)) and val_steps[-1] == 40

    with pytest.raises(SystemExit) as info:
        main(["plot", str(run.dir), "-o", str(tmp_path / "curves.png")])
    assert info.value.code == 0
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 1000 and height >= 400
    pixels = image.imread(str(tmp_path / "curves.png"))[..., :3]
    blank = (pixels > 0.97).all(axis=-1).mean()
    train_blue = (abs(pixels - [0x1F / 255, 0x77 / 255, 0xB4 / 255]).max(axis=-1) < 0.05).sum()
    val_red = (abs(pixels - [0xD6 / 255, 0x27 / 255, 0x28 / 255]).max(axis=-1) < 0.05).sum()
    assert blank < 0.97 and train_blue > 1000 and val_red > 100  # curves, not an empty frame
