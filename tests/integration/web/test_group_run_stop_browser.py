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


def _free(coordinator, one_node: bool) -> list[str]:
    """Two free workers: both of one node, or one on each of two (the agents `127.0.0.1`, `localhost`)."""
    free = [w for w in coordinator.wait_workers(4) if w["state"] in ("idle", "exited")]
    hosts = sorted({w["host"] for w in free})
    if one_node:
        return [w["name"] for w in free if w["host"] == hosts[0]][:2]
    return [next(w["name"] for w in free if w["host"] == host) for host in hosts[:2]]


def _start(coordinator, name: str, workers: list[str], cwd) -> tuple[str, int]:
    """Group `name` of `workers` running a long sleep: its run's key and registry seq."""
    assert coordinator.api("POST", "/api/groups", {"name": name})[0] == 201
    assert coordinator.api("POST", "/api/workers/move", {"workers": workers, "group": name})[0] == 200
    config = {"argv": ["python", "-c", "import time; time.sleep(120)"], "backend": "gloo", "cwd": str(cwd)}
    assert coordinator.api("PATCH", f"/api/groups/{name}/config", config)[0] == 200
    status, group = coordinator.api("POST", f"/api/groups/{name}/start")
    assert status == 200, group
    _wait(lambda: coordinator.api("GET", f"/api/groups/{name}")[1]["group"]["state"] == "running")
    key = f"{name}.{group['attempt']}"
    with Registry.open(coordinator.home / "state" / "slurmgen" / "jobs.sqlite") as reg:
        seq = find_run(reg, "group", key)
    assert seq is not None
    return key, seq


def test_a_stop_on_two_nodes_is_asked_first_and_no_stops_nothing(page, coordinator, tmp_path):
    """Issue 33, item 10: one click stopped a run on every node. A run on two nodes asks, naming
    what will stop; dismissed, nothing is posted and the ranks run on; accepted, the run stops."""
    names = _free(coordinator, one_node=False)
    key, seq = _start(coordinator, "asked", names, tmp_path)
    p = page
    p.log_in(coordinator.token)
    p.page.goto(f"{coordinator.url}/ui/groups/asked")  # the group's own Stop and Restart ask too
    for label in ("Stop", "Restart"):
        p.will_answer(False)
        p.page.get_by_role("button", name=f"{label} group asked", exact=True).click()
        _wait(lambda: not p.answers, 5)
    assert p.asked == ["Stop group asked: 2 ranks on 2 nodes?", "Restart group asked: 2 ranks on 2 nodes?"]
    p.shot("group-page-dismissed")
    p.asked.clear()
    p.page.goto(f"{coordinator.url}/ui/runs/{seq}")
    stop = p.page.get_by_role("button", name="Stop", exact=True)
    p.will_answer(False)
    stop.click()
    _wait(lambda: p.asked, 5)
    assert p.asked == [f"Stop run {key}: 2 ranks on 2 nodes?"]
    time.sleep(2)  # a posted stop is taken on the server's next tick (under a second)
    assert p.page.url == f"{coordinator.url}/ui/runs/{seq}" and p.page.locator(".notice").count() == 0
    assert coordinator.api("GET", "/api/groups/asked")[1]["group"]["state"] == "running"
    expect(stop).to_be_enabled()
    p.shot("dismissed-still-running")
    p.will_answer(True)
    stop.click()
    expect(p.page.locator(".notice")).to_contain_text(f"group run {key}: the coordinator (slurmgen serve) is stopping")
    assert p.asked[1:] == [f"Stop run {key}: 2 ranks on 2 nodes?"]
    _wait(lambda: coordinator.api("GET", "/api/groups/asked")[1]["group"]["state"] == "stopped")
    p.page.reload()
    expect(p.page.locator("#why-stop")).to_have_text("Stop: the group run has ended (stopped by you)")
    p.shot("accepted-stopped")


def test_a_group_runs_stop_button_stops_its_ranks_through_the_runs_controls(page, coordinator, tmp_path):
    names = _free(coordinator, one_node=True)  # one node: its Stop is not asked first
    key, seq = _start(coordinator, "stopme", names, tmp_path)

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
