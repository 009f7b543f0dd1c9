"""Curves wherever there are records, and the runs list's smaller truths (issue 33 items 5 and 11),
in Chromium against a real `slurmgen serve` of the test's own, without the cluster: the bundled
trainer runs here as the two tasks of a sweep, under a `bash -c` wrapper and without --out-dir
(each task writes under runs/job-<array id>_<task>, as under Slurm), with the variables run_slurm.sh
gives a task; Slurm is a stand-in `scontrol` saying both tasks completed. The sweep's page draws a
series per task, the list its best loss; an unknown run answers 404 with a page; a group without a
command opens its Settings form."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime

import pytest

from slurmgen.contract import envvars
from slurmgen.contract.grid import SWEEP_FILE, grid_jsonl
from slurmgen.runs.registry import JobRecord, Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.timeout(240)]

ARRAY = "9401"
PARAMS = [{"lr": 0.01}, {"lr": 0.002}]
TRAIN = "python -m slurmgen.train --model mlp --mlp-hidden 8 --max-steps 40 --log-every 10 --save-every 0 --lr {lr}"
SCONTROL = (
    "JobId={job} ArrayJobId=" + ARRAY + " ArrayTaskId={task} JobName=sweep JobState=COMPLETED Reason=None "
    "Restarts=0 ExitCode=0:0 RunTime=00:00:09 TimeLimit=00:05:00 EndTime={end} NodeList=node1"
)


def _wrapped(task: int) -> list[str]:
    """The task's command as a user wraps it: the trainer inside a shell's script."""
    return ["bash", "-c", "cd . && exec " + TRAIN.format(lr=PARAMS[task]["lr"]).replace("python", sys.executable, 1)]


def _sweep(tmp_path) -> None:
    """Each task of the sweep, here, as run_slurm.sh runs it: its records under its own directory."""
    (tmp_path / SWEEP_FILE).write_text(grid_jsonl(PARAMS))
    for task in range(len(PARAMS)):
        env = {
            **os.environ,
            "SLURM_JOB_ID": str(int(ARRAY) + task),
            "SLURM_ARRAY_JOB_ID": ARRAY,
            "SLURM_ARRAY_TASK_ID": str(task),
            "SLURM_SUBMIT_DIR": str(tmp_path),
            envvars.GROUP: f"slurm-{ARRAY}_{task}",
            envvars.SWEEP_INDEX: str(task),
            envvars.SWEEP_FILE: SWEEP_FILE,
        }
        proc = subprocess.run(_wrapped(task), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (tmp_path / "runs" / f"job-{ARRAY}_{task}" / "tracking" / f"slurm-{ARRAY}_{task}").is_dir()


def _stand_in_slurm(tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    end = datetime.now().isoformat(timespec="seconds")  # Slurm's form, its local time
    lines = [SCONTROL.format(job=int(ARRAY) + t, task=t, end=end) for t in range(len(PARAMS))]
    (bin_dir / "scontrol.txt").write_text("\n".join(lines) + "\n")
    for name, body in (("scontrol", f"cat '{bin_dir / 'scontrol.txt'}'"), ("sacct", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def own_coordinator(serve, tmp_path, monkeypatch):
    """`slurmgen serve` with the stand-in scontrol first on its PATH, after the sweep ran, and an
    agent (a group's Start needs a worker to act)."""
    _sweep(tmp_path)
    _stand_in_slurm(tmp_path, monkeypatch)
    return serve(agents=("127.0.0.1",))


def test_a_wrapped_sweeps_page_draws_a_curve_per_task_and_the_list_its_best_loss(page, own_coordinator, tmp_path):
    """The task grid showed the losses while the chart said "No metrics", the list showed no loss:
    the records were looked for under runs/job-<array id> and the trainer not found in `bash -c`."""
    coordinator, p = own_coordinator, page
    info = {
        "nodes": 1,
        "gpus": 1,
        "array": len(PARAMS),
        "sweep_file": str(tmp_path / SWEEP_FILE),
        "log_dir": str(tmp_path / "logs"),
        "workdir": str(tmp_path),
        "launcher": "srun",
        "command": _wrapped(0)[:2] + ["cd . && exec " + TRAIN.format(lr="$LR")],
    }
    with Registry.open(coordinator.env["SLURMGEN_REGISTRY"], create=True) as reg:
        record = JobRecord(ARRAY, "sweep", str(tmp_path / "out"), 0.0, None, "RUNNING", None, info)
        reg.add(record)
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/runs/{record.seq}")
    loss = p.page.locator("figure[data-metric=loss]")
    expect(loss.locator(".uplot")).to_have_count(1, timeout=10_000)
    expect(p.page.locator("#curves-empty")).to_have_count(0)
    for task, params in enumerate(PARAMS):
        expect(loss.locator(".u-legend")).to_contain_text(f"train #{task} lr={params['lr']}")
    x_ticks = loss.get_attribute("data-x-ticks").split()
    assert x_ticks and all(t.isdigit() for t in x_ticks) and int(x_ticks[-1]) <= 40, x_ticks
    # One colour per task in every chart (task #1 was green in loss, red in lr), its val series too.
    lr = p.page.locator("figure[data-metric=lr]")
    expect(lr.locator(".uplot")).to_have_count(1)
    in_loss, in_lr = _colours(loss), _colours(lr)
    for task, params in enumerate(PARAMS):
        name = f"#{task} lr={params['lr']}"
        assert in_loss[f"train {name}"] == in_lr[f"train {name}"] == in_loss[f"val {name}"], (in_loss, in_lr)
    assert len({in_lr[f"train #{t} lr={params['lr']}"] for t, params in enumerate(PARAMS)}) == len(PARAMS), in_lr
    p.shot("sweep-curves")
    p.page.goto(f"{coordinator.url}/ui/runs")
    best = p.page.locator(f'tr[data-run="{record.seq}"] td.run-loss')
    expect(best).to_contain_text("(best of 2)")
    p.shot("sweep-best-loss")


def _colours(figure) -> dict[str, str]:
    """A chart's series by their legend's label: the colour of its marker."""
    return figure.evaluate(
        """f => Object.fromEntries([...f.querySelectorAll(".u-legend .u-series")].map(s => [
            s.querySelector(".u-label").textContent,
            getComputedStyle(s.querySelector(".u-marker")).borderColor,
        ]))"""
    )


def test_an_unknown_run_is_a_404_page_and_a_group_without_a_command_opens_its_settings(page, own_coordinator):
    """/ui/runs/99999 silently redirected to the list; Start on a group without a command answered
    with `slurmgen group config NAME -- CMD` on a page that has a Settings form for it. The state
    filter offered "idle", which no run is."""
    coordinator, p = own_coordinator, page
    p.log_in(coordinator.token)
    answer = p.page.goto(f"{coordinator.url}/ui/runs/99999")
    assert answer is not None and answer.status == 404 and answer.url.endswith("/ui/runs/99999")
    expect(p.page.get_by_role("heading", level=1)).to_have_text("No such run")
    expect(p.page.locator("main")).to_contain_text("There is no run 99999")
    p.shot("no-such-run")
    p.page.get_by_role("link", name="All runs").click()
    p.page.wait_for_url(f"{coordinator.url}/ui/runs")
    offered = p.page.locator("#filter-state option").all_inner_texts()
    assert "idle" not in offered and "running" in offered, offered

    assert coordinator.api("POST", "/api/groups", {"name": "bare"})[0] == 201
    worker = coordinator.wait_workers(1)[0]["name"]
    assert coordinator.api("POST", "/api/workers/move", {"workers": [worker], "group": "bare"})[0] == 200
    p.page.goto(f"{coordinator.url}/ui/groups/bare")
    p.page.get_by_role("button", name="Start group bare", exact=True).click()
    p.page.wait_for_url(f"{coordinator.url}/ui/groups/bare/settings")
    expect(p.page.locator(".notice")).to_contain_text("set its Command below and save, then start it")
    expect(p.page.locator("#command")).to_have_attribute("aria-invalid", "true")
    expect(p.page.locator("body")).not_to_contain_text("slurmgen group config")
    p.shot("group-without-command")
