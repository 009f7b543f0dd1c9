"""A coordinator group's run page in a real Chromium against a real `slurmgen serve` and real
local agents (issue 33, item 9). Before: the runs list linked the run to the group's current
state; the run's page had no log, named every node by this machine's hostname (`vm`) where the
group's page says the agents' names, showed the coordinator's database path as "Logs" and a Slurm
job's Cancel and Checkpoint buttons, always disabled."""

from __future__ import annotations

import socket
import sys
import time

import pytest

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.timeout(180)]

# Each rank says hello with markup in it, then exits 0.
HELLO = "import os; print(f\"r{os.environ['RANK']} hello <b>bold</b>\", flush=True)"


def _wait_state(coordinator, name: str, states: tuple[str, ...], timeout: float = 40.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        group = coordinator.api("GET", f"/api/groups/{name}")[1]["group"]
        if group["state"] in states:
            return group
        time.sleep(0.2)
    raise AssertionError(f"group {name} still {group['state']} after {timeout} s")


def test_a_group_runs_page_has_its_log_its_nodes_names_and_only_its_controls(page, coordinator, tmp_path):
    p = page
    workers = [w["name"] for w in coordinator.wait_workers(4)]
    assert coordinator.api("POST", "/api/groups", {"name": "runpage"})[0] == 201
    assert coordinator.api("POST", "/api/workers/move", {"workers": workers, "group": "runpage"})[0] == 200
    config = {"backend": "gloo", "argv": [sys.executable, "-c", HELLO], "cwd": str(tmp_path)}  # cwd: a timeline
    assert coordinator.api("PUT", "/api/groups/runpage/config", config)[0] == 200
    assert coordinator.api("POST", "/api/groups/runpage/start")[0] == 200
    assert _wait_state(coordinator, "runpage", ("succeeded", "failed"))["state"] == "succeeded"

    p.log_in(coordinator.token)
    p.page.goto(coordinator.url + "/ui/runs?kind=group")
    p.page.locator("tr[data-kind=group]", has=p.page.get_by_role("link", name="runpage", exact=True)).first.get_by_role(
        "link"
    ).click()
    expect(p.page.locator("#run-title")).to_contain_text("group runpage.")  # the run's page, not the group's
    assert "/ui/runs/" in p.page.url

    view = p.page.locator("#log-view")
    for rank in range(4):
        expect(view.locator(".log-line", has_text=f"r{rank} hello <b>bold</b>")).to_have_count(1, timeout=10_000)
    assert view.locator("b").count() == 0  # the markup is text
    expect(view.locator(".log-attempt").first).to_have_text("── attempt 1 ──")
    p.page.get_by_label("Rank", exact=True).select_option("2")
    expect(view.locator(".log-line")).to_have_count(1)
    expect(view.locator(".log-line")).to_contain_text("r2 hello")
    p.page.get_by_label("Rank", exact=True).select_option("")
    expect(view.locator(".log-line", has_text="hello")).to_have_count(4)

    facts = p.page.locator(".facts")
    expect(facts.locator("dt", has_text="Logs")).to_have_count(0)  # the coordinator's database is no log
    expect(facts.get_by_role("link", name="runpage")).to_have_attribute("href", "/ui/groups/runpage")
    for label in ("Cancel", "Checkpoint and stop"):
        expect(p.page.get_by_role("button", name=label)).to_have_count(0)

    nodes = p.page.locator("#rank-table tbody tr td:nth-child(2)")
    expect(nodes).to_have_count(4)
    assert sorted(set(nodes.all_inner_texts())) == ["127.0.0.1", "localhost"]  # the agents' names
    if socket.gethostname() not in ("127.0.0.1", "localhost"):
        expect(p.page.locator("#rank-table")).not_to_contain_text(socket.gethostname())
    assert not p.console_errors
    p.shot("group-run-page")
