"""Issue 20, items 4, 6 and 12 on the real test cluster, through `slurmgen submit` and `logs`.

- srun mode: every rank sees OMP_NUM_THREADS=1 (two ranks a node, no cpus_per_task); before,
  none was set and each rank started a thread per core.
- torchrun mode: a value in the submitting environment wins, and each worker's lines carry its
  own rank: `logs --rank R` gives rank R's line (the prefix was the node's task before).
- A sweep of the bundled trainer with `--out-dir 'runs/x/{task}-{sweep.lr}'`: each task trains
  in its own directory instead of resuming the other's checkpoints.
"""

from __future__ import annotations

import json

import pytest
from helpers import sg, status

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SHOW = ["--", "bash", "-c", 'echo "RANK=$RANK OMP=${OMP_NUM_THREADS-unset}"']
BASE = ["--nodes", "2", "--gpus", "2", "--backend", "gloo", "--time", "5"]


def seen(cluster, cwd, job: str, rank: int) -> list[str]:
    return sg(cluster, cwd, "logs", job, "--rank", str(rank)).stdout.splitlines()


def test_ranks_see_omp_threads_and_torchrun_logs_split_by_rank(cluster, tmp_path):
    env = {k: v for k, v in cluster.env().items() if k != "OMP_NUM_THREADS"}
    srun = sg(cluster, tmp_path, "submit", *BASE, "-o", "srun", "--wait", *SHOW, env=env).stdout.strip()
    for rank in range(4):
        assert seen(cluster, tmp_path, srun, rank) == [f"[rank {rank}] RANK={rank} OMP=1"]

    torchrun = sg(
        cluster,
        tmp_path,
        "submit",
        *BASE,
        "--launcher",
        "torchrun",
        "-o",
        "torchrun",
        "--wait",
        *SHOW,
        env={**env, "OMP_NUM_THREADS": "3"},
    ).stdout.strip()
    for rank in range(4):  # the user's value wins; each line is its own rank's, wherever c10d put it
        assert seen(cluster, tmp_path, torchrun, rank) == [f"[rank {rank}] RANK={rank} OMP=3"]
    lines = json.loads("[" + ",".join(sg(cluster, tmp_path, "logs", torchrun, "--json").stdout.splitlines()) + "]")
    said = sorted((ln["rank"], ln["task"]) for ln in lines if ln["line"].startswith("RANK="))
    assert [rank for rank, _ in said] == [0, 1, 2, 3] and {task for _, task in said} == {0, 1}, lines
    node = sg(cluster, tmp_path, "logs", torchrun, "--node", "1").stdout
    assert sorted(ln.split("]")[0] for ln in node.splitlines() if "RANK=" in ln) == [
        f"[rank {r}" for r, task in said if task == 1
    ], node
    bad = sg(cluster, tmp_path, "logs", torchrun, "--rank", "7", check=False)
    assert (bad.returncode, bad.stdout, bad.stderr.count("\n")) == (2, "", 1) and "has ranks 0-3 (got 7)" in bad.stderr


def test_a_trainer_sweep_writes_each_task_to_its_own_out_dir(cluster, tmp_path):
    array = sg(
        cluster,
        tmp_path,
        "submit",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--backend",
        "gloo",
        "--time",
        "5",
        "-o",
        "grid",
        "--sweep",
        "lr=1e-3,3e-4",
        "--array",
        "%2",
        "--wait",
        "--",
        "python",
        "-m",
        "slurmgen.train",
        "--model",
        "mlp",
        "--max-steps",
        "20",
        "--save-every",
        "10",
        "--out-dir",
        "runs/x/{task}-{sweep.lr}",
    ).stdout.strip()
    view = status(cluster, tmp_path, array)
    assert view["state"] == "COMPLETED" and len(view["tasks"]) == 2, view
    for task, lr in enumerate(["1e-3", "3e-4"]):
        out = tmp_path / "runs" / "x" / f"{task}-{lr}"
        steps = [
            json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
        ]
        assert steps and steps[-1] == 20 and (out / "checkpoints" / "latest").exists(), (out, steps)
        log = sg(cluster, tmp_path, "logs", f"{array}_{task}").stdout
        assert "resumed from" not in log, log  # a fresh run each, not the other task's checkpoint
