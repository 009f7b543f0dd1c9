"""Each in-job attempt of a Slurm job and the spare that took over (issue 35), in a real Chromium
against a real `slurmgen serve`: the job is registered as `submit` registers one with
`--restarts 2 --spare-nodes 1`, its attempts record is what run_slurm.sh writes, and Slurm is a
stand-in `scontrol` saying the job runs with Restarts=0 (an in-job restart is a new job step in
the same allocation, which Slurm's restart count never sees)."""

from __future__ import annotations

import json
import os
import time

import pytest

from slurmgen.heal.attempts import attempts_path
from slurmgen.runs.registry import JobRecord, Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.timeout(180)]

JOB = "9501"


def _stand_in_slurm(tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    line = (
        f"JobId={JOB} JobName=spare JobState=RUNNING Reason=None Restarts=0 ExitCode=0:0 "
        "RunTime=00:01:10 TimeLimit=00:30:00 NodeList=gn[1-3]"
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


def _restarting_job(registry, tmp_path) -> int:
    """Attempt 1: rank 1 killed on gn2, gn3 (the spare) takes its node rank; attempt 2: rank 0
    exits 1, the same nodes again; attempt 3 runs."""
    logs = tmp_path / "logs"
    logs.mkdir()
    t0, base = time.time() - 70, {"job": JOB, "host": "gn1"}
    records = [
        {**base, "event": "start", "attempt": 1, "time": t0, "nodes": "gn1,gn2", "restart": 0},
        {
            **base,
            "event": "end",
            "attempt": 1,
            "time": t0 + 30,
            "exit_code": 137,
            "rank": 1,
            "node": "gn2",
            "task": 1,
            "action": "restart",
            "exclude": "gn2",
        },  # fmt: skip
        {**base, "event": "start", "attempt": 2, "time": t0 + 33, "nodes": "gn1,gn3", "restart": 1},
        {
            **base,
            "event": "end",
            "attempt": 2,
            "time": t0 + 50,
            "exit_code": 1,
            "rank": 0,
            "node": "gn1",
            "task": 0,
            "action": "restart",
            "exclude": None,
        },  # fmt: skip
        {**base, "event": "start", "attempt": 3, "time": t0 + 52, "nodes": "gn1,gn3", "restart": 2},
    ]
    attempts_path(logs, JOB).write_text("".join(json.dumps(r) + "\n" for r in records))
    info = {"nodes": 2, "gpus": 1, "log_dir": str(logs), "workdir": str(tmp_path), "launcher": "srun", "restarts": 2}
    with Registry.open(registry, create=True) as reg:
        record = JobRecord(JOB, "spare", str(tmp_path / "out"), time.time() - 80, None, "RUNNING", None, info)
        reg.add(record)
        return record.seq


def test_each_in_job_attempt_and_the_spare_that_took_over_on_the_page_and_the_list(page, own_coordinator, tmp_path):
    coordinator, p = own_coordinator, page
    seq = _restarting_job(coordinator.env["SLURMGEN_REGISTRY"], tmp_path)
    p.log_in(coordinator.token)
    # The list: attempt 3 from the attempts record, before anyone opened the run's page or ran status.
    p.page.goto(f"{coordinator.url}/ui/runs")
    row = p.page.locator(f'tr[data-run="{seq}"]')
    expect(row.locator("td").nth(7)).to_have_text("3", timeout=15_000)
    p.shot("list-counts-in-job-restarts")

    p.page.goto(f"{coordinator.url}/ui/runs/{seq}")
    rows = p.page.locator('section[aria-labelledby="attempts-title"] tbody tr')
    expect(rows).to_have_count(3)
    first, second, third = (rows.nth(i).locator("td") for i in range(3))
    expect(first.nth(4)).to_have_text("killed by signal 9 (rank 1 on gn2)")
    expect(first.nth(5)).to_have_text("1")
    expect(first.nth(6)).to_have_text("gn2")
    expect(first.nth(8)).to_have_text("restarted on gn1,gn3 (gn2 left out, spare gn3 took its place)")
    expect(second.nth(8)).to_have_text("restarted on gn1,gn3")
    expect(third.nth(1)).to_have_text("running")
    expect(third.nth(8)).to_have_text("—")
    assert not p.dialogs and not p.console_errors
    p.shot("in-job-attempts-and-the-spare")


def test_a_launchs_warm_restart_and_spare_host_move_on_its_attempts(page, own_coordinator):
    """A launch's warm restart (inside attempt 1) and its node moved to a spare host (after it),
    as the launcher keeps them in the run registry (runs/model.note_recovery)."""
    from slurmgen.contract.states import State
    from slurmgen.runs.model import Failure, NewRun, Recorder

    coordinator, p = own_coordinator, page
    rec = Recorder(coordinator.env["SLURMGEN_REGISTRY"])
    run = rec.started(NewRun("launch", "L9502", "warm", "/w", 2, 4, info={"hosts": ["h0", "h1"], "max_restarts": 3}))
    rec.attempt_started(run, 1)
    rec.recovered(run, 1, "warm restart 1: rank 3 started anew after rank 3 exited with code 137 on h1")
    rec.attempt_ended(run, 1, State.FAILED, Failure("lost the connection to h1", None, "h1", 255))
    rec.recovered(run, 1, "node 1 moved from h1 to the spare host h2")
    rec.attempt_started(run, 2)
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/runs/{run}")
    rows = p.page.locator('section[aria-labelledby="attempts-title"] tbody tr')
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td").nth(8)).to_have_text(
        "warm restart 1: rank 3 started anew after rank 3 exited with code 137 on h1; "
        "node 1 moved from h1 to the spare host h2"
    )
    expect(rows.nth(1).locator("td").nth(8)).to_have_text("—")
    assert not p.dialogs and not p.console_errors
    p.shot("launch-warm-restart-and-spare-host")
