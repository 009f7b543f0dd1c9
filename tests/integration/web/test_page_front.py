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
SKIPPED = re.compile(r"… (at least )?[\d,]+ (lines skipped|earlier lines not shown)|… more lines skipped")


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
    assert re.fullmatch(r"newest 5,000 lines shown, (at least )?[\d,]+ not shown", probe["status"]), probe["status"]
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


# Rank 0 records a step every 0.3 s: a falling loss and an lr whose ticks need many digits.
RECORDING = """
import os, sys, time
from slurmgen import tracking
run = tracking.init(sys.argv[1], group=os.environ["SLURMGEN_GROUP"])
for step in range(1, 81):
    run.log(type="train", metrics={"loss": 4.0 / step, "lr": 0.001 * (1 - step / 100000)}, step=step)
    time.sleep(0.3)
run.finish()
"""
# The y axis's longest label against the width uPlot gave the axis.
Y_LABELS_FIT = """figure => {
  const axis = figure.querySelectorAll(".u-axis")[1];
  const longest = figure.getAttribute("data-y-ticks").split(" ").reduce((a, l) => (l.length > a.length ? l : a), "");
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif';
  return [axis.getBoundingClientRect().width, ctx.measureText(longest).width + 15, longest];
}"""


def _last_step(figure) -> int:
    return int(re.search(r"at step (\d+)", figure.locator(".chart-summary").text_content()).group(1))


def test_charts_append_points_and_keep_the_users_zoom(page, coordinator, tmp_path):
    """Issue 33 item 7: the charts were rebuilt every 5 s, losing the user's zoom; the lr chart's
    y labels were clipped. Item 11: a chart had no text alternative."""
    p, name = page, "charts"
    workers = [w["name"] for w in coordinator.wait_workers(4)]
    assert coordinator.api("POST", "/api/groups", {"name": name})[0] == 201
    assert coordinator.api("POST", "/api/workers/move", {"workers": workers[:1], "group": name})[0] == 200
    argv = [sys.executable, "-c", RECORDING, str(tmp_path / "tracking")]
    assert coordinator.api("PUT", f"/api/groups/{name}/config", {"backend": "gloo", "argv": argv})[0] == 200
    assert coordinator.api("POST", f"/api/groups/{name}/start")[0] == 200
    try:
        p.log_in(coordinator.token)
        p.page.goto(f"{coordinator.url}/ui/groups/{name}")
        loss, lr = p.page.locator("figure[data-metric=loss]"), p.page.locator("figure[data-metric=lr]")
        expect(loss.locator(".uplot")).to_have_count(1, timeout=15_000)
        expect(loss.locator(".chart-summary")).to_contain_text(re.compile(r"^loss by step: train [\d.]+ at step \d+"))
        assert loss.get_attribute("aria-describedby") == loss.locator(".chart-summary").get_attribute("id")
        width, needed, longest = lr.evaluate(Y_LABELS_FIT)
        assert width >= needed, f"the lr axis is {width:.0f} px wide, its label {longest!r} needs {needed:.0f}"
        while _last_step(loss) < 12:
            p.page.wait_for_timeout(500)
        loss.evaluate("f => { f.__kept = true; }")
        loss.scroll_into_view_if_needed()
        box = loss.locator(".u-over").bounding_box()
        p.page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
        p.page.mouse.down()
        p.page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2, steps=5)
        p.page.mouse.up()
        zoomed = [int(t) for t in loss.get_attribute("data-x-ticks").split()]
        before = _last_step(loss)
        p.shot("zoomed")
        deadline = time.monotonic() + 15
        while _last_step(loss) <= before + 5:  # new points came in (one poll or more)
            assert time.monotonic() < deadline, "no new points on the chart"
            p.page.wait_for_timeout(500)
        assert loss.evaluate("f => f.__kept === true"), "the chart was rebuilt"
        kept = [int(t) for t in loss.get_attribute("data-x-ticks").split()]
        assert kept[-1] <= zoomed[-1] < _last_step(loss), (zoomed, kept)  # still the user's range
        p.shot("zoom-kept")
        loss.locator(".u-over").dblclick()
        expect(loss).to_have_attribute("data-x-ticks", re.compile(r"\d+$"))
        whole = [int(t) for t in loss.get_attribute("data-x-ticks").split()]
        assert whole[-1] > zoomed[-1], (zoomed, whole)
    finally:
        coordinator.api("POST", f"/api/groups/{name}/stop")


# Every visible text against the background it is drawn on (the ancestors' colours composited):
# WCAG's 4.5:1, 3:1 for large text; disabled controls are exempt, as WCAG says.
LOW_CONTRAST = """() => {
  const parse = (c) => {
    const v = (c.match(/rgba?\\(([^)]+)\\)/) || [null, ""])[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return v.length >= 3 ? [v[0], v[1], v[2], v.length > 3 ? v[3] : 1] : null;
  };
  const lum = (rgb) => rgb.map((c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; })
    .reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
  const under = (el) => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    return layers.reverse().reduce((out, c) => out.map((v, i) => v * (1 - c[3]) + c[i] * c[3]), [255, 255, 255]);
  };
  const bad = [];
  for (const el of document.querySelectorAll("body *")) {
    if (!Array.from(el.childNodes).some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    if (el.closest("[disabled], .sr-only, [hidden]") || !el.getClientRects().length) continue;
    const st = getComputedStyle(el);
    if (st.visibility !== "visible") continue;
    const bg = under(el), fg = parse(st.color);
    const shown = fg.slice(0, 3).map((v, i) => v * fg[3] + bg[i] * (1 - fg[3]));
    const [hi, lo] = [lum(shown), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05), size = parseFloat(st.fontSize);
    const need = size >= 24 || (Number(st.fontWeight) >= 700 && size >= 18.66) ? 3 : 4.5;
    const text = el.textContent.trim().slice(0, 30);
    if (ratio < need) bad.push(`${el.tagName}.${el.className} "${text}" ${ratio.toFixed(2)}`);
  }
  return bad;
}"""
# Table cells narrower than their longest word (a line may break at a space or after a hyphen,
# nowhere else): the letters stack.
STACKED = """() => {
  const ctx = document.createElement("canvas").getContext("2d");
  const bad = [];
  for (const cell of document.querySelectorAll("th, td")) {
    if (!cell.getClientRects().length || cell.closest(".sr-only")) continue;
    const st = getComputedStyle(cell);
    ctx.font = `${st.fontStyle} ${st.fontWeight} ${st.fontSize} ${st.fontFamily}`;
    const room = cell.clientWidth - parseFloat(st.paddingLeft) - parseFloat(st.paddingRight);
    const shown = cell.cloneNode(true);  // what the cell shows: not its screen readers' words
    shown.querySelectorAll(".sr-only").forEach((e) => e.remove());
    const word = shown.textContent.split(/\\s+|(?<=-)/).reduce((a, w) => (w.length > a.length ? w : a), "");
    if (word && ctx.measureText(word).width > room + 1) bad.push(`${word} in ${Math.round(room)} px`);
  }
  return bad;
}"""


def _launch_with_log(coordinator, tmp_path, key: str, name: str) -> int:
    """A launch's row in the server's registry, with a log of two ranks' lines: its run's seq."""
    log = tmp_path / f"{key}.log"
    log.write_text("".join(f"{r}: step {s} loss 0.{s}\n" for s in range(5) for r in range(2)))
    registry = (
        coordinator.env.get(envvars.REGISTRY) or Path(coordinator.env["XDG_STATE_HOME"]) / "slurmgen" / "jobs.sqlite"
    )
    with Registry.open(registry, create=True) as reg:  # the one the server reads (runs/registry.py default_path)
        info = {"command": ["train"], "log_file": str(log)}
        return add_run(reg, NewRun("launch", key, name, str(tmp_path), 1, 2, info=info), time.time())


def test_accessibility_basics_on_every_page(page, coordinator, tmp_path):
    """Issue 33 item 11: two h1 on the overview, no skip link, no focus ring on the log view, text
    and timeline colours under WCAG's contrast, and at 390 px the tables stacked letters."""
    p = page
    seq = _launch_with_log(coordinator, tmp_path, "LA11Y", "arunnamewithnoplaceatalltobreakit")
    if coordinator.api("GET", "/api/groups/a11y")[0] == 404:
        assert coordinator.api("POST", "/api/groups", {"name": "a11y"})[0] == 201
    p.log_in(coordinator.token)
    for path in ("/ui/", "/ui/runs", f"/ui/runs/{seq}", "/ui/groups/a11y", "/ui/groups/a11y/settings"):
        p.page.goto(coordinator.url + path)
        expect(p.page.locator("h1")).to_have_count(1)
        assert p.page.evaluate(LOW_CONTRAST) == [], path
        p.page.keyboard.press("Tab")
        skip = p.page.locator(".skip-link")
        expect(skip).to_be_focused()
        assert skip.bounding_box()["y"] >= 0, "the skip link shows when focused"
        p.page.keyboard.press("Enter")
        expect(p.page.locator("main")).to_be_focused()
    p.page.goto(f"{coordinator.url}/ui/runs/{seq}")
    expect(p.page.locator("#log-view .log-line")).to_have_count(10)
    p.page.locator("#follow").focus()
    p.page.keyboard.press("Tab")
    view = p.page.locator("#log-view")
    expect(view).to_be_focused()
    ring = view.evaluate("v => [getComputedStyle(v).outlineStyle, parseFloat(getComputedStyle(v).outlineWidth)]")
    assert ring[0] != "none" and ring[1] >= 2, ring
    p.shot("log-view-focused")

    p.page.set_viewport_size({"width": 390, "height": 800})
    for path in ("/ui/runs", f"/ui/runs/{seq}", "/ui/"):
        p.page.goto(coordinator.url + path)
        assert p.page.evaluate(STACKED) == [], path
        assert p.page.evaluate("document.documentElement.scrollWidth") <= 390, f"{path}: the page, not a table, scrolls"
        p.shot("narrow-" + path.strip("/").replace("/", "-"))
    wrap = p.page.locator(".table-wrap").first
    p.page.goto(coordinator.url + "/ui/runs")
    assert wrap.evaluate("w => w.scrollWidth > w.clientWidth"), "the runs table scrolls sideways in its box"
