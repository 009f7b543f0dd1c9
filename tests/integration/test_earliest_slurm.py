"""`submit --shapes --earliest` on the real test cluster (issue 36, item 2): while another job holds
node1 for 3 minutes, a 2-node shape waits for it and a 1-node shape starts now; the table's
expected starts are what `sbatch --test-only` says of the same scripts (here, and with --remote on
the login node), the 1-node shape is submitted, and the bundled trainer in it keeps the global
batch (--global-batch) by accumulating."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

import pytest
from helpers import remote_flags, sg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TRAIN = [
    *("--", "python", "-m", "slurmgen.train", "--model", "mlp", "--mlp-hidden", "16", "--max-steps", "3"),
    *("--batch-size", "4", "--global-batch", "16", "--log-every", "1"),
]
_ROW = re.compile(r"^(?P<shape>\d+x\d+)( \*)?\s+(?P<partition>\S+)\s+(?P<start>\S+ \S+)\s+(?P<why>.+)$")


def table(err: str) -> dict[str, dict[str, str]]:
    return {m["shape"]: m.groupdict() for m in map(_ROW.match, err.splitlines()) if m}


def test_a_shape_free_now_is_submitted_before_one_that_waits_for_a_running_job(cluster, tmp_path):
    (tmp_path / "hold.sh").write_text("#!/bin/bash\nsleep 300\n")
    held = [n.name for n in cluster.nodes[:-1]]  # every node but one: a 1-node shape fits now, a 2-node one waits
    holder = cluster.submit(
        tmp_path / "hold.sh", tmp_path, args=[f"-N{len(held)}", "-w", ",".join(held), "--exclusive", "--time=3"]
    )
    try:
        cluster.wait_state(holder, {"RUNNING"})
        shapes = ["--shapes", "2x2,1x2", "--time", "2", "--backend", "gloo"]
        dry = sg(cluster, tmp_path, "submit", *shapes, "--dry-run", *TRAIN).stdout
        # The same script, asked of sbatch --test-only by hand right after: the same expected start,
        # the holder's end.
        sg(cluster, tmp_path, "create", "-N", "2", "--gpus", "2", "--time", "2", "-o", "two", *TRAIN)
        said = cluster.run(["sbatch", "--test-only", "two/run_slurm.sh"], cwd=tmp_path, check=False).stderr
        rows = table(dry)
        assert set(rows) == {"2x2", "1x2"} and "would submit 1x2" in dry, dry
        assert "busy until then" in rows["2x2"]["why"] and rows["1x2"]["why"] == "free now", dry
        by_hand = datetime.fromisoformat(re.search(r"to start at (\S+)", said)[1])
        printed = datetime.fromisoformat(rows["2x2"]["start"])
        assert abs(by_hand - printed) <= timedelta(seconds=5), (said, rows)
        ends = cluster.job_info(holder)["EndTime"]
        assert abs(printed - datetime.fromisoformat(ends)) <= timedelta(seconds=5), (ends, rows)
        # Asked of node1's Slurm over the SSH connection of --remote: the same table.
        there = sg(cluster, tmp_path, "submit", *shapes, "--dry-run", *remote_flags(cluster), *TRAIN).stdout
        far = table(there)
        assert far["1x2"]["why"] == "free now" and "would submit 1x2" in there, there
        assert abs(datetime.fromisoformat(far["2x2"]["start"]) - printed) <= timedelta(seconds=5), (there, dry)

        proc = sg(cluster, tmp_path, "submit", *shapes, "--earliest", "-o", "out", *TRAIN)
        job = proc.stdout.strip()
        assert "1x2 *" in proc.stderr and "submitting 1x2" in proc.stderr, proc.stderr

        # The 1-node shape runs now, and the trainer accumulates 2 micro-steps to keep 16 samples.
        # Started within 30 s, so not after the holder's 3 minutes (pending, NumNodes reads "1-1").
        cluster.wait_state(job, {"RUNNING", "COMPLETED"})
        assert cluster.job_info(job)["NumNodes"] == "1"
        assert cluster.wait(job, timeout=120) == ("COMPLETED", 0)
        log = next((tmp_path / "out" / "logs").glob(f"*-{job}.out")).read_text()
        assert "global batch: 16 samples (4 per process x 2 accumulation x 2 processes)" in log, log[-2000:]

        # The 2-node shape submitted anyway only waits: it is submitted, and submit and status say until when.
        waiting = sg(cluster, tmp_path, "submit", "-N", "2", "--gpus", "2", "--time", "2", "-o", "wait", "--", "true")
        second = waiting.stdout.strip()
        assert "note: Slurm expects the job to start at" in waiting.stderr, waiting.stderr
        deadline = time.monotonic() + 90  # StartTime comes with the backfill scheduler's next cycle (30 s)
        while "Slurm expects it to start at" not in (said := sg(cluster, tmp_path, "status", second).stdout):
            assert time.monotonic() < deadline, said
            time.sleep(2)
        assert "pending: Resources; Slurm expects it to start at" in said, said
    finally:
        cluster.cancel(holder)
