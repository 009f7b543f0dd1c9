"""The run pages' log view, charts and layout in a real Chromium against a real `slurmgen serve`
and real local agents (issue 33 items 7, 8 and 11): a flood of output leaves the view small,
current and honest about what it skipped; charts keep the user's zoom; the basics of
accessibility hold (one h1, a skip link, a text alternative per chart, contrast, a narrow screen)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmgen.contract import envvars
from slurmgen.runs.model import NewRun, add_run
from slurmgen.runs.registry import Registry

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

pytestmark = [pytest.mark.timeout(240)]

# In the page, before its own script: the longest main-thread task (PerformanceObserver
# longtask) and, a frame after each append to the log view, how old its newest line is (each
# flooded line ends with the time it was written).
PROBE = """
window.__probe = { longest: 0, ages: [] };
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) __probe.longest = Math.max(__probe.longest, e.duration);
}).observe({ type: "longtask", buffered: true });
document.addEventListener("DOMContentLoaded", () => {
  const view = document.getElementById("log-view");
  if (view) new MutationObserver(() => requestAnimationFrame(() => {
    const m = /(\\d{10}\\.\\d+)$/.exec(view.lastElementChild ? view.lastElementChild.textContent : "");
    if (m) __probe.ages.push(Date.now() / 1000 - Number(m[1]));
  })).observe(view, { childList: true });
});
"""
# argv: rate (lines a second), seconds; each line "r<rank> <i> <time>"; stdout or argv[3]'s file.
FLOOD = """
import os, sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
out = open(sys.argv[3], "a") if len(sys.argv) > 3 else sys.stdout
tag = f"r{os.environ['RANK']}" if "RANK" in os.environ else None
start, i = time.time(), 0
while (now := time.time()) < start + seconds:
    due = int((now - start) * rate)
    out.write("".join(f"{tag or n % 2}{' ' if tag else ': '}{n} {time.time():.6f}\\n" for n in range(i, due)))
    out.flush()
    i = due
    time.sleep(0.005)
"""
SKIPPED = re.compile(r"… [\d,]+ (lines skipped|earlier lines not shown)")


def _watch_flood(p, path: str, start, seconds: float) -> dict:
    """The page at `path` through a flood `start()` begins: the probe, the rows, the markers."""
    p.page.add_init_script(PROBE)
    p.page.goto(p.origin + path)
    expect(p.page.locator("#log-view")).to_be_visible()
    start()
    p.page.wait_for_timeout(seconds * 1000)
    probe = p.page.evaluate("window.__probe")
    probe["rows"] = p.page.locator("#log-view .log-line").count()
    probe["markers"] = p.page.locator("#log-view .log-gap, #log-view .log-trimmed:visible").all_text_contents()
    probe["status"] = p.page.locator(".log-controls .log-status").inner_text()
    return probe


def _judge_flood(p, probe: dict, name: str) -> None:
    """At most the newest 5,000 rows, what went said, the newest line current, no long stall."""
    p.shot(name)
    ages = sorted(probe["ages"][len(probe["ages"]) // 3 :])  # once the flood is under way
    print(f"{name}: rows {probe['rows']}, newest line's age median {ages[len(ages) // 2]:.2f} s, max {ages[-1]:.2f} s")
    print(f"{name}: longest main-thread task {probe['longest']:.0f} ms; {probe['status']}; {probe['markers'][:3]}")
    assert 0 < probe["rows"] <= 5000, probe["rows"]
    assert probe["markers"] and all(SKIPPED.match(m) for m in probe["markers"]), probe["markers"]
    assert re.fullmatch(r"newest 5,000 lines shown, [\d,]+ not shown", probe["status"]), probe["status"]
    assert ages[len(ages) // 2] < 1.0, ages  # the median: this machine is shared, its max is printed
    assert probe["longest"] < 1000, probe["longest"]


def test_a_groups_log_view_under_a_flood_stays_current_and_says_what_it_skipped(page, coordinator):
    """Issue 33 item 8: at ~9k lines/s the newest line arrived 4.7 s late, the main thread stalled
    up to 6.2 s and the view held 307,837 rows; a group's view dropped lines without saying so."""
    p, name = page, "flood"
    workers = [w["name"] for w in coordinator.wait_workers(4)]
    assert coordinator.api("POST", "/api/groups", {"name": name})[0] == 201
    assert coordinator.api("POST", "/api/workers/move", {"workers": workers, "group": name})[0] == 200
    argv = [sys.executable, "-c", FLOOD, "2500", "8"]  # 4 ranks: 10,000 lines a second
    assert coordinator.api("PUT", f"/api/groups/{name}/config", {"backend": "gloo", "argv": argv})[0] == 200
    p.log_in(coordinator.token)
    try:
        probe = _watch_flood(p, f"/ui/groups/{name}", lambda: coordinator.api("POST", f"/api/groups/{name}/start"), 7)
    finally:
        coordinator.api("POST", f"/api/groups/{name}/stop")
    _judge_flood(p, probe, "group-flood")


def test_a_launchs_log_view_under_a_flood_stays_current_and_says_what_it_skipped(page, coordinator, tmp_path):
    """The same for a launch's log (a Slurm job's is read the same way, by byte offset)."""
    p, log = page, tmp_path / "launch.log"
    log.write_text("0: starting\n")
    registry = (
        coordinator.env.get(envvars.REGISTRY) or Path(coordinator.env["XDG_STATE_HOME"]) / "slurmgen" / "jobs.sqlite"
    )
    with Registry.open(registry, create=True) as reg:  # the one the server reads (runs/registry.py default_path)
        info = {"command": ["flood"], "log_file": str(log)}
        seq = add_run(reg, NewRun("launch", "LFLOOD", "flood", str(tmp_path), 1, 2, info=info), time.time())
    p.log_in(coordinator.token)
    writers: list[subprocess.Popen] = []
    start = lambda: writers.append(subprocess.Popen([sys.executable, "-c", FLOOD, "10000", "8", str(log)]))  # noqa: E731
    try:
        probe = _watch_flood(p, f"/ui/runs/{seq}", start, 7)
    finally:
        for w in writers:
            w.wait(30)
    _judge_flood(p, probe, "launch-flood")
