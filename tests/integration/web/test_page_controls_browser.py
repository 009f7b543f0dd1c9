"""The page's controls of issue 22 part 3, in Chromium against the test cluster: a real `slurmgen
launch` over the nodes' sshd stopped with its run page's "Stop launch" button (no process left
on any node, exit 143, state stopped, "stopped by you"); a failed Slurm job requeued with
"Requeue" (pending or running again in squeue); a group's limits set in the settings form, its
command and env on its page, and its deletion; an array job's task grid and each task's log."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import Run, base_args

from slurmgen.contract.states import STOPPED_BY_YOU
from slurmgen.runs.model import list_rows
from slurmgen.runs.registry import Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
PROBE = [sys.executable, "-m", "slurmgen.train.probe", "--timeout", "60"]
# Each rank says it is alive twice a second until stopped (its last argument: the test's marker).
ALIVE = "import os, time\nwhile True:\n    print('alive', os.environ['RANK'], flush=True)\n    time.sleep(0.5)\n"


def _registry(coordinator):
    return coordinator.home / "state" / "slurmgen" / "jobs.sqlite"  # what `slurmgen serve` reads


def _open_run(p, coordinator, kind: str, key: str) -> None:
    p.page.goto(coordinator.url + f"/ui/runs?kind={kind}")
    p.page.locator(f"tr[data-kind={kind}]", has=p.page.locator("td.run-key", has_text=key)).get_by_role("link").click()
    expect(p.page.locator("#run-title")).to_contain_text(f"{kind} {key}:")


def _left(cluster) -> list:
    """Every process on the nodes but slurmd, the sshd listener and the coordinator's agents
    (which this module's coordinator runs there): the launch's ranks, node scripts and SSH
    sessions, while they last."""
    return [p for p in cluster.job_pids(None) if "slurmgen agent" not in p.cmdline and "watchdog.py" not in p.cmdline]


def _marked(cluster, marker: str) -> list:
    return [p for n in cluster.nodes for p in cluster.pids_on(n) if marker in p.cmdline]


def test_stop_an_ssh_launch_from_its_page(page, cluster_coordinator, cluster, tmp_path):
    coordinator, p = cluster_coordinator, page
    marker = f"marker-7{random.randint(100, 999)}"
    run = Run(
        [
            *base_args(cluster, tmp_path),
            "--registry",
            str(_registry(coordinator)),
            "--hosts",
            "node1,node2",
            "--gpus",
            "2",
            "--",
            sys.executable,
            "-c",
            ALIVE,
            marker,
        ]
    )
    try:
        run.wait_for(r"all 2 node\(s\) running", timeout=60)
        deadline = time.monotonic() + 30  # started: a rank's shell may not have run its program yet
        while len(_marked(cluster, marker)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_marked(cluster, marker)) >= 4, "the 4 ranks run before the stop"
        with Registry.open(_registry(coordinator)) as reg:
            launch_id = list_rows(reg, kinds=["launch"], limit=1)[0]["job_id"]
        p.log_in(coordinator.token)
        _open_run(p, coordinator, "launch", launch_id)
        expect(p.page.get_by_role("button", name="Stop launch")).to_be_enabled()
        p.page.get_by_label("Rank", exact=True).select_option("3")  # the launch's log, kept by its launcher here
        expect(p.page.locator("#log-view")).to_contain_text("alive 3")
        assert set(p.page.locator("#log-view").inner_text().split("\n")) <= {"[rank 3] alive 3", ""}
        p.shot("run-page-launch-running")
        p.will_answer(True)  # 4 ranks on 2 nodes: asked first
        p.page.get_by_role("button", name="Stop launch").click()
        expect(p.page.locator(".notice")).to_contain_text(f"launch {launch_id}: the launcher is stopping every rank")
        assert "/stop" not in p.page.url  # POST-redirect-GET
        deadline = time.monotonic() + 10
        while (_left(cluster) or _marked(cluster, marker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        code = run.finish(30)
        left = _left(cluster) + _marked(cluster, marker)
        assert not left, [(x.node, x.cmdline) for x in left]
        assert code == 143, run.text()
        assert f"stopping all nodes: {STOPPED_BY_YOU} from the page" in run.err, run.text()
        p.page.reload()
        expect(p.page.locator(".state").first).to_have_text("stopped by you")  # a user's stop, not a failure
        expect(p.page.get_by_role("button", name="Stop launch")).to_be_disabled()
        expect(p.page.locator("#why-stop")).to_have_text("Stop launch: the launch has ended (stopped by you)")
        expect(p.page.locator("dl.facts")).to_contain_text(f"{STOPPED_BY_YOU} from the page (exit code 143)")
        p.shot("run-page-launch-stopped")
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.finish(10)


def _submit_failing_job(coordinator, cluster, cwd: Path, out: str) -> str:
    """`slurmgen submit` of a one-node job whose command fails, into the coordinator's registry."""
    argv = [
        sys.executable,
        "-m",
        "slurmgen",
        "submit",
        "--registry",
        str(_registry(coordinator)),
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--time",
        "5",
        "-o",
        out,
        "--",
        "false",
    ]
    proc = subprocess.run(argv, cwd=cwd, env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_requeue_a_failed_slurm_job_from_its_page(page, cluster_coordinator, cluster, tmp_path):
    coordinator, p = cluster_coordinator, page
    job = _submit_failing_job(coordinator, cluster, tmp_path, "page-requeue")
    try:
        assert cluster.wait_state(job, {"FAILED", "COMPLETED"}, timeout=60) == "FAILED"
        p.log_in(coordinator.token)
        _open_run(p, coordinator, "slurm", job)
        expect(p.page.get_by_role("button", name="Requeue")).to_be_enabled()
        p.page.get_by_role("button", name="Requeue").click()
        expect(p.page.locator(".notice")).to_contain_text(f"requeued job {job} (it was FAILED)", timeout=30_000)
        squeue = cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False)
        assert squeue.stdout.strip() in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "FAILED"), squeue.stdout
        assert squeue.stdout.strip() != "", "requeued: back in the queue"
        expect(p.page.get_by_role("button", name="Requeue")).to_be_disabled()  # no longer failed
        p.shot("run-page-slurm-requeued")
    finally:
        cluster.cancel(job)


def test_an_array_jobs_grid_shows_each_task_and_links_to_its_log(page, cluster_coordinator, cluster, tmp_path):
    """A sweep submitted with `slurmgen submit`: its run page shows one cell per task with the task's
    parameters and state, and a task's "log" link opens the page on that task: the log view on its
    lines alone, the attempts table on its attempts."""
    coordinator, p = cluster_coordinator, page
    argv = [
        sys.executable,
        "-m",
        "slurmgen",
        "submit",
        "--registry",
        str(_registry(coordinator)),
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--time",
        "5",
        "-o",
        "page-array",
        "--sweep",
        "lr=0.1,0.01,0.001",
        "--",
        sys.executable,
        "-c",
        "import sys; print('params', *sys.argv[1:])",
    ]
    proc = subprocess.run(argv, cwd=tmp_path, env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    try:
        for task in range(3):
            assert cluster.wait_state(f"{job}_{task}", {"COMPLETED", "FAILED"}, timeout=60) == "COMPLETED"
        p.log_in(coordinator.token)
        _open_run(p, coordinator, "slurm", job)
        cells = p.page.locator("#task-grid li.task-cell")
        expect(cells).to_have_count(3)
        expect(cells.nth(2)).to_contain_text("lr=0.001")
        expect(cells.nth(2).locator(".state")).to_have_text("succeeded")
        cells.nth(2).get_by_role("link", name="Log of task 2").click()
        p.page.wait_for_url("**/ui/runs/*?task=2#logs")
        expect(p.page.locator("#task-filter")).to_have_value("2")
        expect(p.page.locator("#log-view")).to_contain_text("params --lr 0.001")
        expect(p.page.locator("#attempts-title")).to_have_text("Attempts of array task 2")  # a task is requeued alone
        expect(p.page.locator("section[aria-labelledby=attempts-title] tbody tr").first).to_contain_text("1")
        assert "--lr 0.1\n" not in p.page.locator("#log-view").inner_text() + "\n"  # task 0's line is not shown
        p.shot("run-page-array-grid")
    finally:
        cluster.cancel(job)


def test_requeue_and_cancel_a_slurm_job_through_the_json_api(cluster_coordinator, cluster, tmp_path):
    """The page's requeue and cancel as JSON (run_api.py) against the real server and a real failed
    job: requeued (back in squeue), refused while it is queued again, cancelled (gone from squeue),
    refused once ended; the token and the field checked first. No browser: the API is what a
    script would call."""
    coordinator = cluster_coordinator
    job = _submit_failing_job(coordinator, cluster, tmp_path, "api-requeue")
    try:
        with Registry.open(_registry(coordinator)) as reg:
            seq = next(r["seq"] for r in list_rows(reg, kinds=["slurm"], limit=50) if r["job_id"] == job)
        path = f"/api/runs/{seq}/actions"
        assert coordinator.api("POST", path, {"action": "requeue"}, token=None)[0] == 401
        status, body = coordinator.api("POST", path, {"action": "restart"})
        assert status == 422 and body["detail"][0]["loc"] == ["body", "action"], body
        assert cluster.wait_state(job, {"FAILED", "COMPLETED"}, timeout=60) == "FAILED"
        status, body = coordinator.api("POST", path, {"action": "stop"})
        assert status == 409 and "not an SSH launch" in body["detail"], body
        status, body = coordinator.api("POST", path, {"action": "requeue"})
        assert (status, body["action"]) == (200, "requeue") and f"requeued job {job} (it was FAILED)" in body["said"], (
            body
        )
        squeue = cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()
        assert squeue in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"), squeue  # back in the queue
        status, body = coordinator.api("POST", path, {"action": "requeue"})  # Slurm holds it back a while
        assert status == 409 and f"job {job} was not requeued: the job is " in body["detail"], body
        status, body = coordinator.api("POST", path, {"action": "cancel"})  # the queued job, cancelled
        assert (status, body["said"]) == (200, f"job {job}: CANCELLED"), body
        assert cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip() == ""
        status, body = coordinator.api("POST", path, {"action": "cancel"})
        assert status == 409 and body["detail"].startswith(f"job {job} had already ended: CANCELLED"), body
    finally:
        cluster.cancel(job)


def test_group_limits_command_env_and_delete_from_the_page(page, cluster_coordinator):
    coordinator, p = cluster_coordinator, page
    assert coordinator.api("POST", "/api/groups", {"name": "ctl-<b>x"})[0] == 422  # names are a safe alphabet
    assert coordinator.api("POST", "/api/groups", {"name": "ctl1"})[0] == 201
    coordinator.api(
        "PATCH",
        "/api/groups/ctl1/config",
        {
            "argv": ["python", "-c", "print('<b>hi</b>')"],
            "env": {"NOTE": "<script>alert(1)</script>", "HF_TOKEN": "s3cret"},
        },
    )
    p.log_in(coordinator.token)
    p.page.goto(coordinator.url + "/ui/groups/ctl1/settings")
    p.page.get_by_label("Max restarts").fill("2")
    p.page.get_by_label("Heartbeat timeout (s)").fill("0.5")
    p.page.get_by_label("Stop grace (s)").fill("3")
    p.page.get_by_role("button", name="Save settings").click()
    expect(p.page.locator("#heartbeat_timeout-error")).to_have_text(
        "heartbeat_timeout: expected at least 1 (got '0.5')"
    )
    p.shot("settings-limits-refused")
    p.page.get_by_label("Heartbeat timeout (s)").fill("45")
    p.page.get_by_role("button", name="Save settings").click()
    p.page.wait_for_url(coordinator.url + "/ui/")
    p.page.goto(coordinator.url + "/ui/groups/ctl1")
    facts = p.page.locator("dl.config")
    expect(facts).to_contain_text("python -c 'print('\"'\"'<b>hi</b>'\"'\"')'")
    expect(facts).to_contain_text("NOTE=<script>alert(1)</script>")
    expect(facts).to_contain_text("HF_TOKEN=<hidden>")
    expect(facts).to_contain_text("Heartbeat timeout45 s")
    expect(facts).to_contain_text("Stop grace3 s")
    p.shot("group-page-command-env")
    p.page.get_by_role("button", name="Delete group ctl1").click()
    p.page.wait_for_url(coordinator.url + "/ui/")
    expect(p.page.locator(".notice")).to_have_text("Deleted group 'ctl1'; its workers are free.")
    forget = p.page.get_by_role("button", name="Forget worker node1-0")
    expect(forget).to_be_disabled()  # its agent reports it every second
    assert forget.get_attribute("title") == "its agent still reports it (idle): only a lost worker can be forgotten"
    p.shot("overview-forget-disabled")
    assert coordinator.api("GET", "/api/groups/ctl1")[0] == 404
