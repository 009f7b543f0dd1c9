"""`submit --shapes --earliest` on the real test cluster (issue 36, item 2): while another job holds
node1 for 3 minutes, a 2-node shape waits for it and a 1-node shape starts now; the table's
expected starts are what `sbatch --test-only` says of the same scripts, the 1-node shape is
submitted, and the bundled trainer in it keeps the global batch (--global-batch) by accumulating."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from helpers import sg

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
    holder = cluster.submit(tmp_path / "hold.sh", tmp_path, args=["-N1", "-w", "node1", "--exclusive", "--time=3"])
    try:
        cluster.wait_state(holder, {"RUNNING"})
        proc = sg(
            cluster, tmp_path, "submit", "--shapes", "2x2,1x2", "--earliest", "--time", "2",
            "--backend", "gloo", "-o", "out", *TRAIN,
        )  # fmt: skip
        job = proc.stdout.strip()
        rows = table(proc.stderr)
        assert set(rows) == {"2x2", "1x2"}, proc.stderr
        assert "busy until then" in rows["2x2"]["why"] and rows["1x2"]["why"] == "free now", proc.stderr
        assert "submitting 1x2" in proc.stderr

        # The same scripts, asked of sbatch --test-only by hand: the same expected starts.
        sg(cluster, tmp_path, "create", "-N", "2", "--gpus", "2", "--time", "2", "-o", "two", *TRAIN)
        said = cluster.run(["sbatch", "--test-only", "two/run_slurm.sh"], cwd=tmp_path, check=False).stderr
        by_hand = datetime.fromisoformat(re.search(r"to start at (\S+)", said)[1])
        printed = datetime.fromisoformat(rows["2x2"]["start"])
        assert abs(by_hand - printed) <= timedelta(seconds=5), (said, rows)
        ends = cluster.job_info(holder)["EndTime"]
        assert abs(printed - datetime.fromisoformat(ends)) <= timedelta(seconds=5), (ends, rows)

        # The 1-node shape runs now, and the trainer accumulates 2 micro-steps to keep 16 samples.
        assert cluster.job_info(job)["NumNodes"] == "1"
        assert cluster.wait(job, timeout=120) == ("COMPLETED", 0)
        log = next((tmp_path / "out" / "logs").glob(f"*-{job}.out")).read_text()
        assert "global batch: 16 samples (4 per process x 2 accumulation x 2 processes)" in log, log[-2000:]
    finally:
        cluster.cancel(holder)
