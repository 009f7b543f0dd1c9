"""The Python API under real Slurm (issue 34): the guide's example of `slurmgen.submit(fn)` run as
it is written (a function's result over 4 ranks on 2 nodes, a failing rank's exception with its
traceback), and `Job.submit()` of a sweep giving one handle per array task, each answering state,
logs and cancel as the commands do."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "python-api.md"


def guide_block() -> str:
    """The guide's bash block marked as needing a Slurm cluster: the example this test runs."""
    text = GUIDE.read_text()
    found = re.search(r"<!-- illustrative: needs a Slurm cluster[^\n]*-->\n```bash\n(.*?)\n```", text, re.S)
    assert found, "the guide's Slurm example is gone"
    return found.group(1)


def test_the_guides_function_example_runs_on_the_cluster(cluster, tmp_path):
    (tmp_path / "home").mkdir()
    env = cluster.env({"HOME": str(tmp_path / "home"), "SLURMGEN_REGISTRY": str(tmp_path / "jobs.sqlite")})
    proc = subprocess.run(
        ["bash", "-c", "set -e -o pipefail\n" + guide_block()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "failed", proc.stdout
    calls = sorted(tmp_path.glob("slurmgen-jobs/*/call.pkl"))
    assert len(calls) == 2 and all((c.parent / "result-0.pkl").is_file() for c in calls)


def test_a_sweep_gives_one_handle_per_task_each_with_its_logs_and_cancel(cluster, tmp_path):
    program = """
import json, time
import slurmgen
job = slurmgen.Job(
    command=["bash", "-c", 'echo "rank $RANK lr $1"; sleep "$2"', "say"],
    sweep={"lr": ["0.1", "0.01"]}, sweep_args="{value} 600", nodes=2, gpus=1, backend="gloo", time=5,
    output_dir="out",
)
handles = job.submit(registry="jobs.sqlite")
print(json.dumps([[h.key, h.task] for h in handles]), flush=True)
first, second = handles
deadline = time.monotonic() + 120
while not any("lr" in line for line in first.logs(rank=1)) and time.monotonic() < deadline:
    time.sleep(0.5)
print(json.dumps(first.logs(rank=1)), flush=True)
print(first.cancel().said, flush=True)
print(first.wait(timeout=60), second.state, flush=True)
second.cancel()
print(second.wait(timeout=60), flush=True)
"""
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, env=cluster.env(), capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    keys, logs, said, states, last = proc.stdout.strip().splitlines()[-5:]
    (job, t0), (job2, t1) = json.loads(keys)
    assert job == job2 and (t0, t1) == ("0", "1")
    assert json.loads(logs) == ["rank 1 lr 0.1"], logs
    assert job in said
    assert states.split()[0] == "stopped" and states.split()[1] in {"pending", "running"}, states
    assert last == "stopped"
