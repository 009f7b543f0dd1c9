"""A coordinator group's run stopped from its run page (/ui/runs/SEQ) in a real browser, against
a real `slurmgen serve` and real agents (the local `coordinator` fixture): the page's Stop goes
through jobs/control.py, the one entry of a run's controls, as `slurmgen cancel GROUP.N` does;
the server takes the stop request on its tick and its agents end the ranks."""

from __future__ import annotations

import re
import time

import pytest

from slurmgen.runs.model import find_run
from slurmgen.runs.registry import Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect


def _wait(what, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.2)
    return found


def test_a_group_runs_stop_button_stops_its_ranks_through_the_runs_controls(page, coordinator, tmp_path):
    names = [w["name"] for w in coordinator.wait_workers(2)][:2]
    assert coordinator.api("POST", "/api/groups", {"name": "stopme"})[0] == 201
    assert coordinator.api("POST", "/api/workers/move", {"workers": names, "group": "stopme"})[0] == 200
    config = {"argv": ["python", "-c", "import time; time.sleep(120)"], "backend": "gloo", "cwd": str(tmp_path)}
    assert coordinator.api("PATCH", "/api/groups/stopme/config", config)[0] == 200
    status, group = coordinator.api("POST", "/api/groups/stopme/start")
    assert status == 200, group
    _wait(lambda: coordinator.api("GET", "/api/groups/stopme")[1]["group"]["state"] == "running")
    key = f"stopme.{group['attempt']}"
    with Registry.open(coordinator.home / "state" / "slurmgen" / "jobs.sqlite") as reg:
        seq = find_run(reg, "group", key)
    assert seq is not None

    p = page
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/runs/{seq}")
    stop = p.page.get_by_role("button", name="Stop", exact=True)
    expect(stop).to_be_enabled()
    p.shot("group-run-running")
    stop.click()
    expect(p.page.locator(".notice")).to_contain_text(
        f"group run {key}: the coordinator (slurmgen serve) is stopping every rank on every node"
    )
    expect(p.page.get_by_role("button", name="Stop", exact=True)).to_be_disabled()
    expect(p.page.locator("#why-stop")).to_have_text("Stop: the group run has ended (stopped by you)")
    workers = _wait(
        lambda: (
            [w for w in coordinator.api("GET", "/api/workers")[1] if w["name"] in names and w["state"] == "exited"]
            if all(w["state"] == "exited" for w in coordinator.api("GET", "/api/workers")[1] if w["name"] in names)
            else None
        )
    )
    assert len(workers) == 2 and all(w["stopped"] for w in workers), workers
    group = coordinator.api("GET", "/api/groups/stopme")[1]["group"]
    assert (group["state"], group["reason"]) == ("stopped", "stopped by you from the page")
    p.page.reload()
    p.shot("group-run-stopped")
    said = _stop_reads_as_yours(p.page, seq)
    p.page.goto(f"{coordinator.url}/ui/runs")  # the list's cell is the run page's, by one rule
    row = p.page.locator(f"tr[data-run='{seq}']")
    expect(row.locator(".state")).to_have_text("stopped by you")
    expect(row.locator(".run-outcome")).to_have_text(said)
    p.shot("group-run-stopped-in-list")


def _stop_reads_as_yours(page, seq: int) -> str:
    """Issue 33: "Exit / first failure" read "143" (and a red badge) for the person's own stop. It
    reads "stopped by you", the code beside it, and nothing on the page is coloured as a failure."""
    cell = page.locator("dl.facts dt:text-is('Exit / first failure') + dd")
    expect(cell).to_have_text(re.compile(r"^stopped by you( from the page)?( \(exit code \d+\))?$"))
    expect(page.locator(".facts .state")).to_have_text("stopped by you")
    expect(page.locator("section[aria-labelledby='attempts-title'] tbody td:nth-child(2)")).to_have_text(
        ["stopped by you"]
    )
    expect(page.locator(".state-failed, .state-exited")).to_have_count(0)
    assert "143 —" not in page.locator("main").inner_text()
    return cell.inner_text()
