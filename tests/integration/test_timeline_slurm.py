"""Where the time of a Slurm job goes (issue 23): a 2x2 job of the bundled trainer on the real
test cluster has a complete per-rank timeline in `status --timeline --json`, and a rank made
slow on purpose (SLURMGEN_TRAIN_SLOW) is named as a straggler, with the job's goodput."""

from __future__ import annotations

import json

import pytest
from helpers import sg

from slurmgen.contract import phases

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TRAIN = [
    "--",
    "python",
    "-m",
    "slurmgen.train",
    "--model",
    "mlp",
    "--mlp-hidden",
    "16",
    "--max-steps",
    "60",
    "--save-every",
    "30",
    "--log-every",
    "1000",
    "--heartbeat-every",
    "0.2",
    "--out-dir",
    "R",
]


def test_a_2x2_trainer_job_has_a_full_timeline_and_its_slow_rank_is_a_straggler(cluster, tmp_path):
    job = sg(
        cluster,
        tmp_path,
        "submit",
        "--nodes",
        "2",
        "--gpus",
        "2",
        "--backend",
        "gloo",
        "--time",
        "5",
        "-o",
        "tl",
        "-e",
        "SLURMGEN_TRAIN_SLOW=1:0.05",
        "--wait",
        *TRAIN,
    ).stdout.strip()
    found = json.loads(sg(cluster, tmp_path, "status", job, "--timeline", "--json").stdout)
    (attempt,) = found["attempts"]
    assert attempt["start"] is not None and attempt["end"] is not None, attempt
    ranks = {r["rank"]: r for r in attempt["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3], attempt
    for r in ranks.values():
        times = [r[p] for p in phases.PHASES]
        assert None not in times and times == sorted(times), r  # every phase, in the order they happen
        assert r["status"] == "done" and r["last_step"] == 60 and r["checkpoints"] == 2, r
    assert set(attempt["slowest"]) == set(phases.PHASES), attempt
    assert {r["host"] for r in ranks.values()} == {"node1", "node2"}, ranks

    (straggler,) = found["stragglers"]
    assert straggler["rank"] == 1 and straggler["steps"] >= 20 and straggler["ratio"] > 1.5, found["stragglers"]
    good = found["goodput"]
    assert 0 < good["goodput"] < 1 and good["breakdown"]["startup"] > 0 and good["breakdown"]["checkpoint"] > 0, good
    assert good["queue"] is not None and good["queue"] >= 0, good

    text = sg(cluster, tmp_path, "status", job).stdout
    assert "stragglers: rank 1 " in text and "goodput " in text, text
    table = sg(cluster, tmp_path, "status", job, "--timeline").stdout.splitlines()
    assert table[0].startswith("attempt 1") and "rendezvous" in table[1] and table[-1].lstrip().startswith("slowest"), (
        table
    )
