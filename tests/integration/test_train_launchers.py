"""The bundled trainer under every launcher, with real processes on gloo (CPU).

Each run is tiny (an MLP or a one-layer GPT, a few steps); the cost is process start-up, so
every test checks several things about its run instead of starting another one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env, communicate_in_session, free_port

from slurmgen.train.logs import read_heartbeats

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

PY = sys.executable
RUN = [
    "--model",
    "mlp",
    "--max-steps",
    "6",
    "--log-every",
    "3",
    "--progress",
    "lines",
    "--eval-iters",
    "2",
    "--mlp-hidden",
    "16",
    "--synthetic-samples",
    "256",
    "--init-timeout",
    "30",
]


def run(cmd: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a launcher in its own session; kill the whole session if it outlives the timeout."""
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    out, err = communicate_in_session(p, timeout)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def run_ranks(
    cmds: list[list[str]], envs: list[dict[str, str]], timeout: float = 120
) -> list[subprocess.CompletedProcess]:
    procs = [
        subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for c, e in zip(cmds, envs)
    ]
    results = []
    try:
        for c, p in zip(cmds, procs):
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(c, p.returncode, out, err))
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return results


def check_run_dir(out: Path, world: int, steps: int = 6, checkpoint: str = "ckpt-{:09d}.pt") -> None:
    """What every successful run leaves: rank 0's metrics and checkpoint (a sharded one is a
    `.dcp` directory), every rank's last heartbeat in one summary per node (one node here)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(3, steps + 1, 3))
    assert [r["split"] for r in rows].count("val") == 1
    assert (out / "checkpoints" / "latest").read_text().strip() == checkpoint.format(steps)
    assert all(re.fullmatch(r"node-.+-\d+\.json", b.name) for b in (out / "heartbeats").iterdir())
    beats = read_heartbeats(out / "heartbeats")
    assert {r: (b["step"], b["status"]) for r, b in beats.items()} == {r: (steps, "done") for r in range(world)}


def check_only_rank0_talks(text: str, world: int) -> None:
    assert text.count("done: step 6") == 1, text[-3000:]
    assert f"world_size={world}" in text
    assert "[rank 1]" not in text and "Traceback" not in text, text[-3000:]
    assert "terminate called" not in text


@pytest.mark.parametrize(
    "nproc,extra",
    [(2, ["--dtype", "float16"]), (4, ["--grad-accum", "2", "--batch-size", "4"]), (2, ["--strategy", "fsdp"])],
)
def test_torchrun(tmp_path, nproc, extra):
    out = tmp_path / "run"
    torchrun = [PY, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", str(free_port())]
    res = run(
        torchrun + ["-m", "slurmgen.train", "--out-dir", str(out), *RUN, *extra], clean_env(SLURMGEN_BACKEND="gloo")
    )
    assert res.returncode == 0, res.stderr[-3000:]
    check_only_rank0_talks(res.stdout + res.stderr, nproc)
    assert "launcher=torchrun" in res.stderr
    check_run_dir(out, nproc, checkpoint="ckpt-{:09d}.dcp" if "fsdp" in extra else "ckpt-{:09d}.pt")


@pytest.mark.parametrize(
    "nproc,extra",
    [(2, ["--dtype", "bfloat16"]), (4, ["--model", "gpt", "--n-layer", "1", "--n-embd", "16", "--block-size", "16"])],
)
def test_own_spawn(tmp_path, nproc, extra):
    out = tmp_path / "run"
    res = run(
        [PY, "-m", "slurmgen.train", "--nproc-per-node", str(nproc), "--out-dir", str(out), *RUN, *extra], clean_env()
    )
    assert res.returncode == 0, res.stderr[-3000:]
    check_only_rank0_talks(res.stdout + res.stderr, nproc)
    assert "launcher=spawn" in res.stderr
    check_run_dir(out, nproc)


# Records every path a rank opens for writing or renames onto, then runs the trainer unchanged.
AUDIT = r"""
import os, runpy, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
def hook(event, args):
    path = None
    if event == "open":
        target, mode, flags = args
        writing = (mode is None and (flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)) or (
            isinstance(mode, str) and any(c in mode for c in "wax+"))
        path = target if writing and isinstance(target, (str, bytes, os.PathLike)) else None
    elif event in ("os.rename", "os.replace", "os.mkdir", "os.remove"):
        path = args[1] if event in ("os.rename", "os.replace") else args[0]
    if path is not None:
        os.write(fd, (os.path.abspath(os.fsdecode(path)) + "\n").encode())
sys.addaudithook(hook)
sys.argv = ["slurmgen.train", *sys.argv[2:]]
runpy.run_module("slurmgen.train", run_name="__main__", alter_sys=True)
"""


def test_manual_flags_and_only_rank0_writes(tmp_path):
    out, port = tmp_path / "run", free_port()
    cmds = [
        [
            PY,
            "-c",
            AUDIT,
            str(tmp_path / f"writes-{r}.txt"),
            "--rank",
            str(r),
            "--world-size",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--backend",
            "gloo",
            "--out-dir",
            str(out),
            "--save-every",
            "2",
            "--keep-last",
            "2",
            *RUN,
        ]
        for r in (0, 1)
    ]
    results = run_ranks(cmds, [clean_env(), clean_env()])
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-2000:] + results[1].stderr[-2000:]
    assert "launcher=manual" in results[0].stderr and results[1].stderr.strip() == ""
    check_run_dir(out, 2)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "ckpt-000000004.pt",
        "ckpt-000000006.pt",
        "latest",
    ]
    inside = lambda r: {Path(p) for p in (tmp_path / f"writes-{r}.txt").read_text().split() if p.startswith(str(out))}
    rank1 = {p.relative_to(out).as_posix() for p in inside(1)}
    # Started by hand, each rank counts as the first of its node: rank 1 writes a node summary
    # of the heartbeats (the same one as rank 0, both being on this host), nothing else.
    summary = re.compile(r"heartbeats/\.?node-[^/]+\.json(\.tmp\.\d+)?")
    assert rank1 and all(p == "heartbeats" or summary.fullmatch(p) for p in rank1), rank1
    rank0 = {p.relative_to(out).as_posix() for p in inside(0)}
    assert "metrics.jsonl" in rank0 and "checkpoints/latest" in rank0


def test_plain_srun_environment(tmp_path):
    """What `srun -n 2 python -m slurmgen.train` gives a task: SLURM_* only, no torchrun contract.

    The master is the nodelist's first host and the port is derived from the job id, so the
    job id is chosen to land on a free port."""
    port = _free_port_in_job_range()
    out = tmp_path / "run"
    slurm = dict(
        SLURM_NTASKS="2",
        SLURM_NODEID="0",
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURM_JOB_NODELIST="localhost",
        SLURM_JOB_ID=str(port - 20000),
        SLURM_STEP_ID="0",
    )
    envs = [clean_env(**slurm, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)) for r in (0, 1)]
    cmd = [PY, "-m", "slurmgen.train", "--out-dir", str(out), *RUN]
    results = run_ranks([cmd, cmd], envs)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-2000:] + results[1].stderr[-2000:]
    assert f"master_addr=localhost master_port={port}" in results[0].stderr and "launcher=srun" in results[0].stderr
    check_run_dir(out, 2)


def _free_port_in_job_range() -> int:
    for candidate in range(20000 + os.getpid() % 9000, 30000):
        with socket.socket() as s:
            try:
                s.bind(("", candidate))
            except OSError:
                continue
            return candidate
    pytest.skip("no free port in 20000-29999")


SLURMGEN = shutil.which("slurmgen", path=os.path.dirname(PY)) or shutil.which("slurmgen")


@pytest.mark.skipif(SLURMGEN is None, reason="the slurmgen console script is not installed")
@pytest.mark.parametrize("per_node,strategy", [(1, "ddp"), (2, "ddp"), (1, "fsdp")])
def test_launch_multi_node_two_nodes(tmp_path, per_node, strategy):
    """slurmgen create renders launch_multi_node.sh; two 'nodes' on this machine train together,
    with the spec's strategy (exported as SLURMGEN_STRATEGY, the trainer's default)."""
    scripts, out, spec = tmp_path / "scripts", tmp_path / "run", tmp_path / "job.yaml"
    spec.write_text(f"strategy: {strategy}\n")
    create = [
        SLURMGEN,
        "create",
        "--config",
        str(spec),
        "--nodes",
        "2",
        "--gpus",
        str(per_node),
        "--backend",
        "gloo",
        "-o",
        str(scripts),
        "--",
        "python",
        "-m",
        "slurmgen.train",
        "--out-dir",
        str(out),
        *RUN,
    ]
    made = subprocess.run(create, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    env = clean_env(
        MASTER_PORT=str(free_port()),
        PATH=f"{os.path.dirname(PY)}:{os.environ['PATH']}",
        SLURMGEN_LOG_DIR=str(tmp_path / "logs"),
    )
    launch = str(scripts / "launch_multi_node.sh")
    results = run_ranks([[launch, "127.0.0.1", "2", str(per_node), str(node)] for node in (0, 1)], [env, env])
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] + r.stdout[-2000:] for r in results]
    check_run_dir(out, 2 * per_node, checkpoint="ckpt-{:09d}.dcp" if strategy == "fsdp" else "ckpt-{:09d}.pt")
    rank0_log = next(p for p in (tmp_path / "logs").iterdir() if p.name.startswith("rank-0")).read_text()
    assert "launcher=env" in rank0_log and f"world_size={2 * per_node}" in rank0_log and "done: step 6" in rank0_log


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_custom_model.py"


def test_user_api_example_under_torchrun(tmp_path):
    """examples/train_custom_model.py: a user model and data set through train_ddp() on 2 ranks."""
    out = tmp_path / "run"
    torchrun = [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port())]
    res = run(torchrun + [str(EXAMPLE), "--out-dir", str(out), "--max-steps", "100"], clean_env())
    assert res.returncode == 0, res.stderr[-3000:]
    val = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines() if '"val"' in line]
    assert len(val) == 1 and val[0] < 0.1
    assert (out / "checkpoints" / "latest").read_text().strip() == "ckpt-000000100.pt"
    assert "Traceback" not in res.stderr and "terminate called" not in res.stderr
