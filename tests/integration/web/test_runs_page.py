"""The runs list in a real Chromium against a real `slurmgen serve` (issue 22 part 2): the rows of
its registry (a Slurm job with its time limit, a failed SSH launch with its last loss, a run with a
hostile name), the filters, the escaping (no dialog: the fixture fails the test on one), and a new
run appearing without a reload."""

from __future__ import annotations

import re

import pytest

from slurmgen import tracking
from slurmgen.contract.states import State
from slurmgen.runs.model import Failure, NewRun, add_run, end_run, start_attempt
from slurmgen.runs.registry import JobRecord, Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

HOSTILE = "<img src=x onerror=alert(1)>"
LIVE = 2_500  # ms: the page polls every second; slack for 2 shared cores


def _registry(coordinator):
    """The registry `slurmgen serve` records into: its default under the test's XDG_STATE_HOME."""
    return Registry.open(coordinator.home / "state" / "slurmgen" / "jobs.sqlite", create=True)


def _fill(coordinator, now: float, records) -> None:
    run = tracking.init(records / "tracking", group="sweep-launch", name="r0", environ={})
    for step in (1, 2, 3):
        run.log("train", {"loss": 1.5 / step}, step=step)
    run.finish()
    with _registry(coordinator) as reg:
        slurm = JobRecord(
            "4242",
            "train-slurm",
            "/w/a",
            now - 300,
            None,
            "RUNNING",
            None,
            {"nodes": 2, "gpus": 2, "log_dir": "/w/a/logs", "command": ["true"], "time_limit": "1:00:00"},
        )
        reg.add(slurm)
        # As a `status` now would keep it: running, in an attempt Slurm says started 5 min ago.
        reg.remember_states({slurm.seq: ("RUNNING", None)}, attempt_started={slurm.seq: now - 300}, now=now)
        launch = add_run(
            reg, NewRun("launch", "20261125-1", "sweep-launch", "/w", 2, 4, record_dir=str(records)), now - 200
        )
        start_attempt(reg, launch, 1, now - 200)
        end_run(reg, launch, State.FAILED, 1, Failure("rank 3 exited 1", 3, "node2", 1), now - 100)
        hostile = add_run(reg, NewRun("launch", "20261125-2", HOSTILE, "/w", 1, 2), now - 50)
        start_attempt(reg, hostile, 1, now - 50)
        reg.db.commit()


def _names(p) -> list[str]:
    return p.page.locator("#runs-table td.run-name").all_inner_texts()


def test_runs_list_rows_filter_escaping_and_live_rows(page, coordinator, tmp_path):
    import time

    p = page
    _fill(coordinator, time.time(), tmp_path / "records")
    p.log_in(coordinator.token)
    p.page.get_by_role("link", name="Runs", exact=True).click()
    p.page.wait_for_url(coordinator.url + "/ui/runs")
    expect(p.page.locator("#runs-table td.run-name")).to_have_count(3)
    assert _names(p) == [HOSTILE, "sweep-launch", "train-slurm"]  # newest first, the name shown as text
    assert p.page.locator("#runs-table img").count() == 0
    failed = p.page.locator("tr[data-kind=launch]", has_text="sweep-launch")
    expect(failed).to_contain_text("rank 3 on node2 code 1 (rank 3 exited 1)")
    expect(failed).to_contain_text("2x2")  # 2 nodes of 2 ranks: 4 ranks
    expect(failed.locator("td.run-loss")).to_have_text("0.5")  # its last train loss, 1.5 / 3
    slurm = p.page.locator("tr[data-kind=slurm] td")
    expect(slurm.nth(6)).to_have_text(re.compile(r"^5 min 0\d s / 1 h 00 min$"))  # elapsed / its limit
    expect(slurm.nth(7)).to_have_text("1")  # running: its first attempt, though no count was kept yet
    p.shot("runs-list")

    p.page.get_by_label("State").select_option("failed")
    p.page.get_by_role("button", name="Filter").click()
    p.page.wait_for_url("**/ui/runs?kind=&state=failed")
    expect(p.page.locator("#runs-table td.run-name")).to_have_count(1)
    assert _names(p) == ["sweep-launch"]
    p.page.get_by_label("Kind").select_option("slurm")
    p.page.get_by_label("State").select_option("")
    p.page.get_by_role("button", name="Filter").click()
    expect(p.page.locator("#runs-table td.run-name")).to_have_text(["train-slurm"])
    p.shot("runs-filter-slurm")

    p.page.goto(coordinator.url + "/ui/runs")
    p.page.evaluate("window.__notReloaded = true")
    with _registry(coordinator) as reg:
        add_run(reg, NewRun("launch", "20261125-3", "arrives-live", "/w", 1, 1), time.time())
        reg.db.commit()
    expect(p.page.locator("#runs-table td.run-name").first).to_have_text("arrives-live", timeout=LIVE)
    assert p.page.evaluate("window.__notReloaded") is True  # redrawn in place, not reloaded
    p.shot("runs-live-row")
