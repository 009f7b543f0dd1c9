"""The hung rank's whole stack on a Slurm job's and a launch's run page (issue 33, item 3): read
from the files the watchers left (a Slurm job's stacks file, a launch's stack-rank-R.txt), only
their end, escaped on the page and as JSON for the page's script. The registry, the files and
bash are real; Slurm is a fake `scontrol` printing the job's line."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from slurmgen.contract.exitcodes import HUNG  # noqa: E402
from slurmgen.contract.files import LAUNCH_STACK_NAME, STACKS_NAME  # noqa: E402
from slurmgen.contract.states import State  # noqa: E402
from slurmgen.coordinator.group_runs import GroupRuns  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.coordinator.web import run_stacks  # noqa: E402
from slurmgen.runs.model import Failure, NewRun, Recorder  # noqa: E402
from slurmgen.runs.registry import JobRecord, Registry  # noqa: E402

TOKEN = "t0ken-for-run-stacks"
HOSTILE = "<svg onload=alert(1)>"

GOLDEN = Path(__file__).parents[1] / "generate" / "golden" / "healing.run_slurm.sh"
DUMP = (
    'Thread 0x7f (most recent call first):\n  File "train.py", line 12 in all_reduce\n  File "t.py", line 40 in step\n'
)


def fake_slurm(tmp_path, monkeypatch, job: str, state: str, code: int) -> None:
    """`scontrol show job -o` says job `job` ended in `state` with exit `code`; `sacct` knows nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    line = f"JobId={job} JobName=train JobState={state} Reason=None Restarts=0 ExitCode={code}:0 NodeList=gn[6-7]"
    (bin_dir / "out.txt").write_text(line + "\n")
    for name, body in (("scontrol", f"cat {bin_dir / 'out.txt'}"), ("sacct", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def add_job(registry, tmp_path, job: str) -> int:
    """Slurm job `job` as `slurmgen submit` registers it, its logs in tmp_path/logs."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    info = {"nodes": 2, "gpus": 1, "log_dir": str(tmp_path / "logs"), "workdir": str(tmp_path), "launcher": "srun"}
    with Registry.open(registry) as reg:
        record = JobRecord(job, "train", str(tmp_path / "out"), time.time() - 30, None, "RUNNING", None, info)
        reg.add(record)
        return record.seq


@pytest.fixture
def served(tmp_path):
    """A served page, logged in, and its registry."""
    registry = tmp_path / "jobs.sqlite"
    Registry.open(registry, create=True).close()
    store = Store(tmp_path / "c.db")
    with TestClient(create_app(Coordinator(store, runs=GroupRuns(Recorder(registry))), TOKEN)) as c:
        c.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://testserver"})
        yield c, registry
    store.close()


def header(rank: int, node: str, restarts: int) -> str:
    """The header run_slurm.sh's watcher writes before a stack, run by bash from the rendered script
    (the attempt is SLURMGEN_ATTEMPT, which in-job restarts count on as requeues do)."""
    line = next(x for x in GOLDEN.read_text().splitlines() if "=== rank" in x)
    echo = re.search(r'echo "=== rank [^"]*"', line)
    assert echo, line
    env = {**os.environ, "hung_rank": str(rank), "SLURMD_NODENAME": node, "SLURMGEN_ATTEMPT": str(restarts + 1)}
    return subprocess.run(["bash", "-c", echo[0]], env=env, capture_output=True, text=True, check=True).stdout


def test_the_watchers_header_is_read_back_as_rank_node_and_attempt():
    text = header(1, "gn7", 0) + DUMP + header(3, "gn6", 1) + "second dump\n"
    stacks = run_stacks.sections(text, cut=False)
    assert [(s.rank, s.node, s.attempt) for s in stacks] == [(1, "gn7", 1), (3, "gn6", 2)]
    assert stacks[0].text == DUMP.rstrip("\n") and stacks[1].text == "second dump"


def test_only_the_end_of_a_long_stacks_file_is_read_and_its_cut_stack_is_dropped(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text(header(0, "gn6", 0) + "x" * 5000 + "\n" + header(1, "gn7", 0) + DUMP)
    text, cut = run_stacks._read_here(str(path), limit=len(DUMP) + 200)
    assert cut and len(text) == len(DUMP) + 200
    assert [(s.rank, s.attempt, s.text) for s in run_stacks.sections(text, cut)] == [(1, 1, DUMP.rstrip("\n"))]


def test_a_slurm_jobs_page_and_json_show_the_hung_ranks_whole_stack_escaped(served, tmp_path, monkeypatch):
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, "91", "FAILED", HUNG)
    seq = add_job(registry, tmp_path, "91")
    hostile_dump = DUMP + f'  File "{HOSTILE}.py", line 1 in <module>\n'
    (tmp_path / "logs" / STACKS_NAME.format(job_id="91")).write_text(header(1, "gn7", 0) + hostile_dump)
    html = client.get(f"/ui/runs/{seq}").text
    section = html.split('id="stacks"')[1].split("</section>")[0]
    assert "<figcaption>Rank 1 on gn7, attempt 1</figcaption>" in section
    assert "line 12 in all_reduce" in section and "line 40 in step" in section
    assert HOSTILE not in html and "&lt;svg onload=alert(1)&gt;.py" in section
    got = client.get(f"/ui/live/runs/{seq}/stacks").json()
    assert got["stacks"] == [{"rank": 1, "node": "gn7", "attempt": 1, "text": hostile_dump.rstrip("\n")}]
    assert client.get("/ui/live/runs/999/stacks").status_code == 404


def test_a_slurm_job_without_a_hang_has_no_stack_section(served, tmp_path, monkeypatch):
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, "92", "COMPLETED", 0)
    seq = add_job(registry, tmp_path, "92")
    assert 'id="stacks"' not in client.get(f"/ui/runs/{seq}").text
    assert client.get(f"/ui/live/runs/{seq}/stacks").json() == {"stacks": [], "note": None}


def launch(registry, logs: Path, key: str, started: float | None = None) -> int:
    """A launch of two nodes whose attempt 1 ended with rank 1 on gn7 hung, as its launcher records it."""
    rec = Recorder(registry, clock=(lambda: started) if started else time.time)
    run = rec.started(
        NewRun(
            "launch",
            key,
            "hang",
            str(logs.parent),
            2,
            2,
            logs=[{"node": "gn6", "path": str(logs)}, {"node": "gn7", "path": str(logs)}],
            info={"hosts": ["gn6", "gn7"]},
        )
    )
    hung = Failure("rank 1 hung (no heartbeat for 6.0 s)", 1, "gn7", HUNG)
    rec.attempt_started(run, 1)
    rec.attempt_ended(run, 1, State.FAILED, hung)
    rec.ended(run, State.FAILED, HUNG, hung)
    return run


def test_a_launchs_page_shows_the_blamed_ranks_stack_file_and_not_an_older_runs(served, tmp_path):
    client, registry = served
    logs = tmp_path / "launch-logs"
    logs.mkdir()
    seq = launch(registry, logs, "L1")
    assert "No stack of a hung rank is readable" in client.get(f"/ui/live/runs/{seq}/stacks").json()["note"]
    (logs / LAUNCH_STACK_NAME.format(rank=1)).write_text(DUMP)
    html = client.get(f"/ui/runs/{seq}").text
    assert "<figcaption>Rank 1 on gn7, attempt 1</figcaption>" in html and "line 12 in all_reduce" in html
    # a file left by an earlier launch in the same log directory is not this run's stack
    old = launch(registry, logs, "L2", started=time.time() + 3600)
    assert client.get(f"/ui/live/runs/{old}/stacks").json()["stacks"] == []
