"""The hung rank's whole stack on a Slurm job's and a launch's run page (issue 33, item 3), in a
real Chromium against a real `slurmgen serve`: only the group page showed one, though the
watchers had written `slurmgen-<id>.stacks.txt` and `stack-rank-R.txt`. The runs are registered
as `submit` and `launch` register them, the stack files are where the watchers write them, and
Slurm is a stand-in `scontrol` saying the job ended hung (exit 124)."""

from __future__ import annotations

import os
import time
from datetime import datetime

import pytest

from slurmgen.contract.exitcodes import HUNG
from slurmgen.contract.files import LAUNCH_STACK_NAME, STACKS_NAME
from slurmgen.contract.states import State
from slurmgen.runs.model import Failure, NewRun, Recorder
from slurmgen.runs.registry import JobRecord, Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.timeout(180)]

JOB = "9401"
HOSTILE = "<img src=x onerror=alert(1)>"
# A faulthandler dump of the hung rank, as take_stack leaves it, with the watcher's header.
DUMP = (
    "Thread 0x00007f3a2b7fe640 (most recent call first):\n"
    '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
    "\n"
    "Current thread 0x00007f3a3c1b3740 (most recent call first):\n"
    '  File "/site-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce\n'
    f'  File "/work/{HOSTILE}/train.py", line 88 in train_step\n'
    '  File "/work/train.py", line 120 in main\n'
    '  File "/work/train.py", line 131 in <module>\n'
)


def _stand_in_slurm(tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    end = datetime.fromtimestamp(time.time()).isoformat(timespec="seconds")
    line = (
        f"JobId={JOB} JobName=hang JobState=FAILED Reason=NonZeroExitCode Restarts=0 ExitCode={HUNG}:0 "
        f"RunTime=00:00:40 TimeLimit=00:05:00 EndTime={end} NodeList=gn[6-7]"
    )
    (bin_dir / "scontrol.txt").write_text(line + "\n")
    for name, body in (("scontrol", f"cat '{bin_dir / 'scontrol.txt'}'"), ("sacct", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def own_coordinator(serve, tmp_path, monkeypatch):
    _stand_in_slurm(tmp_path, monkeypatch)
    return serve()


def _slurm_job(registry, tmp_path) -> int:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / STACKS_NAME.format(job_id=JOB)).write_text(f"=== rank 1 on gn7, attempt 1\n{DUMP}")
    info = {"nodes": 2, "gpus": 1, "log_dir": str(logs), "workdir": str(tmp_path), "launcher": "srun"}
    with Registry.open(registry, create=True) as reg:
        record = JobRecord(JOB, "hang", str(tmp_path / "out"), time.time() - 60, None, "RUNNING", None, info)
        reg.add(record)
        return record.seq


def _launch(registry, tmp_path) -> tuple[int, object]:
    """A launch on gn6 and gn7 whose attempt 1 ended with rank 3 on gn7 hung and whose attempt 2 runs."""
    logs = tmp_path / "launch-logs"
    logs.mkdir()
    rec = Recorder(registry)
    run = rec.started(
        NewRun(
            "launch",
            "L9401",
            "hang-launch",
            str(tmp_path),
            2,
            4,
            logs=[{"node": "gn6", "path": str(logs)}, {"node": "gn7", "path": str(logs)}],
            info={"hosts": ["gn6", "gn7"], "max_restarts": 1},
        )
    )
    rec.attempt_started(run, 1)
    rec.attempt_ended(run, 1, State.FAILED, Failure("rank 3 hung (no heartbeat for 6.0 s)", 3, "gn7", HUNG))
    rec.attempt_started(run, 2)
    return run, logs


def test_the_hung_ranks_stack_on_a_slurm_jobs_and_a_launchs_page(page, own_coordinator, tmp_path):
    coordinator, p = own_coordinator, page
    registry = coordinator.env["SLURMGEN_REGISTRY"]
    seq = _slurm_job(registry, tmp_path)
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/runs/{seq}")
    stacks = p.page.locator("#stacks")
    expect(stacks.get_by_role("heading")).to_have_text("Stack of the hung rank")
    expect(stacks.locator("figcaption")).to_have_text("Rank 1 on gn7, attempt 1")
    text = stacks.locator("pre.stack-text")
    expect(text).to_contain_text("line 2050 in all_reduce")
    expect(text).to_contain_text(f"/work/{HOSTILE}/train.py")  # shown as text, never as an element
    assert stacks.locator("img").count() == 0 and not p.dialogs
    assert "line 331 in wait" in text.inner_text()  # the whole stack: every thread, not the innermost frames
    p.shot("slurm-job-stack")

    run, logs = _launch(registry, tmp_path)
    p.page.goto(f"{coordinator.url}/ui/runs/{run}")
    stacks = p.page.locator("#stacks")
    expect(stacks.locator(".hint")).to_contain_text("No stack of a hung rank is readable from this machine")
    p.shot("launch-before-its-stack")
    # the node copies the stack in while the page is open (the launch runs on): the page shows it
    (logs / LAUNCH_STACK_NAME.format(rank=3)).write_text(DUMP)
    expect(stacks.locator("figcaption")).to_have_text("Rank 3 on gn7, attempt 1", timeout=12_000)
    expect(stacks.locator("pre.stack-text")).to_contain_text("line 88 in train_step")
    expect(stacks.locator(".hint")).to_have_count(0)
    assert stacks.locator("img").count() == 0 and not p.dialogs and not p.console_errors
    p.shot("launch-stack-appeared")
