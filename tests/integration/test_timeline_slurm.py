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


def test_any_program_has_its_ranks_process_and_end_on_the_timeline(cluster, tmp_path):
    """A program that knows nothing of slurmgen (no slurmgen.beat): the rank wrapper of run_slurm.sh
    records each rank's process and end, as every launcher does (issue 34, item 7)."""
    job = sg(
        cluster,
        tmp_path,
        "submit",
        *("--nodes", "2", "--gpus", "2", "--backend", "gloo", "--time", "5", "-o", "plain", "--wait"),
        *("--", "bash", "-c", "sleep 0.5"),
    ).stdout.strip()
    found = json.loads(sg(cluster, tmp_path, "status", job, "--timeline", "--json").stdout)
    (attempt,) = found["attempts"]
    ranks = {r["rank"]: r for r in attempt["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3], attempt
    for r in ranks.values():
        assert r[phases.PROCESS] is not None and r[phases.END] is not None and r[phases.PROCESS] <= r[phases.END], r
        assert r["status"] == "done", r
    assert {r["host"] for r in ranks.values()} == {"node1", "node2"}, ranks
    table = sg(cluster, tmp_path, "status", job, "--timeline").stdout
    assert "no timeline recorded" not in table and table.startswith("attempt 1"), table
