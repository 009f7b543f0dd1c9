"""Chains on the real test cluster (issue 36, item 1): `slurmgen submit --chain 3` of the bundled
trainer with a short time limit resumes its run across links and stops early once the run
finishes (the last link cancelled, the reason kept); a link failing with a code no retry would
fix stops the chain; with a sweep, each array task's chain ends on its own.

Each link gets `#SBATCH --signal=USR2@60` before its 2-minute limit. Slurm sends it up to a
minute early or late (its timer's resolution), so the test sends the same USR2 itself (as
`--signal` does: to the steps' processes) once the first link has trained a few steps, through
`slurmgen cancel CHAIN --signal USR2`, which names the chain's running link.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from helpers import sg, status

from slurmgen.contract.files import ATTEMPTS_NAME, CHAIN_ENDED_NAME

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL"}
STEPS = 150
TRAIN = [
    *("--", "python", "-m", "slurmgen.train", "--model", "mlp", "--mlp-hidden", "16"),
    *("--max-steps", str(STEPS), "--save-every", "10", "--log-every", "1", "--heartbeat-every", "0.2"),
]
CHAIN = ["--chain", "3", "--time", "2", "--signal-lead", "60", "--backend", "gloo"]


def wait_for(what, predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found or time.monotonic() > deadline:
            assert found, f"timed out waiting for {what}"
            return found
        time.sleep(0.5)


def chain_view(cluster, cwd: Path, job: str) -> dict:
    return status(cluster, cwd, job)["chain"]


def all_ended(cluster, cwd: Path, job: str) -> dict | None:
    chain = chain_view(cluster, cwd, job)
    return chain if all(link["state"].split()[0] in ENDED for link in chain["links"]) else None


def steps_in(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    return [row["step"] for row in map(json.loads, metrics.read_text().splitlines()) if row.get("split") == "train"]


def end_record(logs: Path, job: str) -> dict:
    return json.loads((logs / ATTEMPTS_NAME.format(job_id=job)).read_text().splitlines()[-1])


def test_a_chain_resumes_across_links_and_stops_once_the_run_finishes(cluster, tmp_path):
    chain = sg(
        cluster, tmp_path, "submit", *CHAIN, "--nodes", "2", "--gpus", "2", "-o", "ch",
        *("-e", "SLURMGEN_TRAIN_SLOW=0:0.05"), *TRAIN,
    ).stdout.strip()  # fmt: skip
    first, second, third = [link["job"] for link in chain_view(cluster, tmp_path, chain)["links"]]
    assert first == chain
    # Every link's run directory is the chain's (SLURMGEN_CHAIN), not runs/job-<its own id>.
    metrics = tmp_path / "runs" / f"job-{chain}" / "metrics.jsonl"
    wait_for("link 1 to train 20 steps", lambda: max(steps_in(metrics), default=0) >= 20, 150)
    said = sg(cluster, tmp_path, "cancel", chain, "--signal", "USR2").stdout
    assert first in said, said  # the warning went to the running link: the first
    ended = wait_for("every link to end", lambda: all_ended(cluster, tmp_path, chain), 300)

    states = [(link["job"], link["state"].split()[0], link["exit_code"]) for link in ended["links"]]
    assert states[0][2] == 75 and states[1] == (second, "COMPLETED", 0) and states[2][:2] == (third, "CANCELLED"), (
        states
    )
    assert ended["ended"] == f"the run finished in link {second}", ended
    logs = tmp_path / "ch" / "logs"
    assert (logs / CHAIN_ENDED_NAME.format(job_id=chain)).read_text().strip() == ended["ended"]
    assert end_record(logs, first)["chain"] == "next" and end_record(logs, second)["chain"] == "finished"
    assert not (logs / ATTEMPTS_NAME.format(job_id=third)).exists()  # cancelled before it started

    # Link 2 resumed link 1's checkpoint, in the same run directory, and trained to the end.
    log2 = (logs / f"slurmgen-{second}.out").read_text()
    resumed = re.search(r"resumed from \S+ at step (\d+)", log2)
    assert resumed and int(resumed.group(1)) >= 10, log2[-3000:]
    steps = steps_in(metrics)
    assert steps[-1] == STEPS and min(s for s in steps if s > int(resumed.group(1))) == int(resumed.group(1)) + 1
    text = sg(cluster, tmp_path, "status", second).stdout
    assert f"chain {chain}: link 2 of 3; links: {first} " in text and f"chain ended: {ended['ended']}" in text, text
    listed = sg(cluster, tmp_path, "jobs").stdout
    assert f"(link 3/3 of chain {chain})" in listed, listed


def test_a_link_failing_beyond_a_retry_stops_the_chain(cluster, tmp_path):
    # An unknown model is bad input (exit 2): the next link would fail the same way.
    chain = sg(
        cluster, tmp_path, "submit", *CHAIN, "--nodes", "1", "--gpus", "1", "-o", "bad",
        "--", "python", "-m", "slurmgen.train", "--model", "no-such-model",
    ).stdout.strip()  # fmt: skip
    ended = wait_for("every link to end", lambda: all_ended(cluster, tmp_path, chain), 240)
    first, second, third = ended["links"]
    assert (first["state"].split()[0], first["exit_code"]) == ("FAILED", 2), ended
    assert second["state"].startswith("CANCELLED") and third["state"].startswith("CANCELLED"), ended
    why = f"link {chain} failed with exit code 2, which another attempt would not fix: the chain stops"
    assert ended["ended"] == why
    record = end_record(tmp_path / "bad" / "logs", chain)
    assert (record["chain"], record["chain_why"]) == ("stopped", why), record
    assert "chain ended: " + why in sg(cluster, tmp_path, "status", third["job"]).stdout


def test_a_sweeps_chain_ends_per_array_task(cluster, tmp_path):
    # Task 0 finishes in link 1; task 1 ends as at its time limit (75) in every link.
    chain = sg(
        cluster, tmp_path, "submit", *CHAIN, "--nodes", "1", "--gpus", "1", "-o", "sw",
        "--sweep", "code=0,75", "--", "bash", "-c", "exit {sweep.code}",
    ).stdout.strip()  # fmt: skip
    ended = wait_for("every link to end", lambda: all_ended(cluster, tmp_path, chain), 240)
    _, second, third = (link["job"] for link in ended["links"])
    logs = tmp_path / "sw" / "logs"
    for later in (second, third):
        # Task 0 of the later links was cancelled while its array waited: Slurm drops a pending
        # array task that scancel names (`scontrol show job 102_0`: not found), so it never ran.
        assert not (logs / f"slurmgen-{later}_0.out").exists(), later
        assert "not found" in cluster.run(["scontrol", "show", "job", f"{later}_0"], check=False).stdout
        dropped = status(cluster, tmp_path, f"{later}_0")  # not the array's PENDING it would never leave
        assert (dropped["state"], dropped["exit_code"]) == ("CANCELLED", None), dropped
        assert any("cancelled before it started, it never ran" in note for note in dropped["notes"]), dropped
        assert status(cluster, tmp_path, f"{later}_1")["exit_code"] == 75
    assert (logs / CHAIN_ENDED_NAME.format(job_id=f"{chain}_0")).exists()
    assert not (logs / CHAIN_ENDED_NAME.format(job_id=f"{chain}_1")).exists()
