"""Control of a real Slurm job from the page (issue 22 part 3): a job `slurmgen submit` recorded
in the serving machine's registry is cancelled with the run page's "Cancel" button, and is then
gone from squeue; afterwards both buttons are disabled with the reason."""

from __future__ import annotations

import subprocess
import sys

import pytest

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_cancel_a_slurm_job_from_its_page(page, cluster_coordinator, cluster, tmp_path):
    coordinator, p = cluster_coordinator, page
    registry = coordinator.home / "state" / "slurmgen" / "jobs.sqlite"  # what `slurmgen serve` reads
    argv = [sys.executable, "-m", "slurmgen", "submit", "--registry", str(registry), "--nodes", "2", "--gpus", "1",
            "--backend", "gloo", "--time", "5", "-o", "page-cancel", "--", "sleep", "300"]
    proc = subprocess.run(argv, cwd=tmp_path, env=cluster.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    try:
        cluster.wait_state(job, {"RUNNING"}, timeout=60)
        p.log_in(coordinator.token)
        p.page.goto(coordinator.url + "/ui/runs?kind=slurm")
        p.page.locator("tr[data-kind=slurm]", has_text=job).get_by_role("link").click()
        expect(p.page.locator("#run-title")).to_contain_text(job)
        expect(p.page.get_by_role("button", name="Cancel")).to_be_enabled()
        expect(p.page.get_by_role("button", name="Checkpoint and stop")).to_be_enabled()
        p.shot("run-page-running")
        p.page.get_by_role("button", name="Cancel").click()
        expect(p.page.locator(".notice")).to_contain_text(f"job {job}: CANCELLED", timeout=60_000)
        assert "/cancel" not in p.page.url  # POST-redirect-GET: the address is the run's page
        squeue = cluster.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False)
        assert squeue.stdout.strip() == "", squeue.stdout
        expect(p.page.get_by_role("button", name="Cancel")).to_be_disabled()
        assert p.page.get_by_role("button", name="Cancel").get_attribute("title").startswith("the job has ended (CANCELLED")
        p.shot("run-page-cancelled")
    finally:
        cluster.cancel(job)
