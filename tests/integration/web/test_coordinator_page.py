"""The coordinator's page in a real browser against a real `slurmgen serve` and real agents:
the seed's whole workflow from the page alone, a failing worker, a refused world size,
hostile names, and the login wall (fixtures in conftest.py)."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

expect = pytest.importorskip("playwright.sync_api", reason="the test extra installs playwright").expect

HOSTILE = "<img src=x onerror=alert(1)>"
LIVE = 2_500  # ms: the page promises changes within 2 s; a little slack for 2 shared cores


def _tick_and_move(p, workers: list[str], group: str) -> None:
    p.page.get_by_label(f"Select worker {workers[0]}").press("Space")  # the keyboard works too
    expect(p.page.get_by_label(f"Select worker {workers[0]}")).to_be_checked()
    for name in workers[1:]:
        p.page.get_by_label(f"Select worker {name}").check()
    p.page.get_by_label("Move selected to").select_option(group)
    p.page.get_by_role("button", name="Move to").click()
    for name in workers:
        expect(p.page.locator("tr", has=p.page.get_by_label(f"Select worker {name}"))).to_contain_text(group)


def _create_group(p, name: str) -> None:
    p.page.get_by_label("New group").fill(name)
    p.page.get_by_role("button", name="Create group").click()


# The probe, after rank 0 recorded a loss curve as a trainer would (under the group's working
# directory, without telling anyone where: the rank announces its record itself).
PROBE_RECORDING = """
import os, runpy, sys
from slurmgen import tracking
run = tracking.init("runs", group=os.environ["SLURMGEN_GROUP"])
for step in range(1, 21):
    run.log(type="train", metrics={"loss": 2.0 / step}, step=step)
run.finish()
sys.argv = ["probe"]
runpy.run_module("slurmgen.train.probe", run_name="__main__")
"""


# The badges' colours (app.css): a failure's red, a stop's neutral slate.
BAD, STOP = "rgb(185, 28, 28)", "rgb(71, 85, 105)"


def _reads(badge, text: str, colour: str) -> None:
    """A state badge says `text` on `colour`, as the user sees it (the peers' exits arrive after the failure's)."""
    expect(badge).to_have_text(text, timeout=LIVE * 4)
    expect(badge).to_have_css("background-color", colour)


def _card(p, group: str):
    return p.page.locator("article.card", has=p.page.get_by_role("heading", name=group, exact=True))


def _save_settings(p, **fields: str) -> None:
    for label, value in fields.items():
        box = p.page.get_by_label(label, exact=True)
        if label == "Backend":
            box.select_option(value)
        else:
            box.fill(value)
    p.page.get_by_role("button", name="Save settings").click()


def test_seed_workflow_from_the_page_on_the_cluster(page, cluster_coordinator, tmp_path):
    """Two nodes of the test cluster, 2 workers each, the seed's example config."""
    p, coordinator = page, cluster_coordinator
    names = [w["name"] for w in coordinator.wait_workers(4)]
    p.log_in(coordinator.token)
    _create_group(p, "exp1")
    expect(_card(p, "exp1")).to_be_visible()
    _tick_and_move(p, names, "exp1")
    p.shot("moved")

    _card(p, "exp1").get_by_role("link", name="Settings of group exp1").click()
    expect(p.page.locator("#preview tbody tr")).to_have_count(4)  # the live preview by the rule
    p.page.get_by_label("World size", exact=True).fill("2")
    expect(p.page.locator("#preview tbody tr")).to_have_count(2)
    _save_settings(p, **{"World size": "9"})
    expect(p.page.locator("#world_size-error")).to_contain_text("9")
    p.shot("bad-world-size")
    status, group = coordinator.api("GET", "/api/groups/exp1")
    assert status == 200 and group["group"]["config"]["world_size"] is None, "a refused world size changed nothing"

    first_node = sorted({n.rpartition("-")[0] for n in names})[0]
    (tmp_path / "probe_recording.py").write_text(PROBE_RECORDING)
    _save_settings(
        p,
        **{
            "Master address": first_node,
            "World size": "4",
            "Master port": "29500",
            "Backend": "gloo",
            "Command": "python probe_recording.py",
            "Working directory": str(tmp_path),
        },
    )
    p.page.wait_for_url(coordinator.url + "/ui/")
    card = _card(p, "exp1")
    expect(card).to_contain_text("gloo")
    expect(card).to_contain_text(first_node)
    p.shot("configured")

    card.get_by_role("button", name="Start group exp1", exact=True).click()
    card.get_by_role("link", name="exp1", exact=True).click()
    log = p.page.locator("#log-view")
    for rank in range(4):
        line = log.locator(".log-line", has_text=f"[rank {rank}]").filter(has_text="SLURMGEN_PROBE")
        expect(line).to_have_count(1, timeout=30_000)
        identity = json.loads(line.inner_text().split("SLURMGEN_PROBE ", 1)[1])
        assert (identity["rank"], identity["world_size"], identity["master_addr"]) == (rank, 4, first_node)
        assert identity["local_rank"] == rank % 2
    p.page.get_by_label("Rank").select_option("2")
    expect(log.locator(".log-line").first).to_contain_text("[rank 2]")
    expect(log.locator(".log-line", has_text="[rank 0]")).to_have_count(0)
    p.shot("group-page-logs")

    expect(p.page.locator("#group-title .state")).to_have_text("succeeded", timeout=30_000)
    expect(p.page.locator("#curves .uplot")).to_have_count(1)  # loss from the record rank 0 announced
    p.shot("succeeded-with-curves")
    text = (tmp_path / "runs" / "exp1" / "status.html").read_text()
    assert "succeeded" in text and f"{first_node}-1" in text and "<polyline" in text
    assert "per-rank timeline of attempt 1" in text  # the run's timeline, tmp_path/slurmgen-exp1.1.timeline.jsonl

    # Stop: a long command this time, started and stopped from the page.
    p.page.goto(coordinator.url + "/ui/groups/exp1/settings")
    _save_settings(p, Command="python -c 'import time; time.sleep(120)'")
    _card(p, "exp1").get_by_role("button", name="Start group exp1", exact=True).click()
    expect(_card(p, "exp1").locator(".state")).to_have_text("running", timeout=LIVE * 4)
    p.will_answer(True)  # 4 ranks on 2 nodes: asked first (issue 33, item 10)
    _card(p, "exp1").get_by_role("button", name="Stop group exp1", exact=True).click()
    # "stopping" until its ranks are gone, then the user's stop in its own words (issue 33, item 10)
    expect(_card(p, "exp1").locator(".state")).to_have_text("stopped by you", timeout=LIVE * 4)
    assert p.asked == ["Stop group exp1: 4 ranks on 2 nodes?"]
    p.shot("stopped")


def test_failing_worker_fails_the_group_with_its_code(page, coordinator, tmp_path):
    p, names = page, [w["name"] for w in coordinator.wait_workers(4)]
    p.log_in(coordinator.token)
    _create_group(p, "crash")
    _tick_and_move(p, names, "crash")
    _card(p, "crash").get_by_role("link", name="Settings of group crash").click()
    code = (
        "import os, sys, time; print(sys.argv[1], flush=True); time.sleep(0.5); "
        "os.environ['RANK'] == '1' and sys.exit(3); time.sleep(60)"
    )
    _save_settings(
        p,
        **{
            "Backend": "gloo",
            "Command": f"python -c \"{code}\" '{HOSTILE}'",
            "Environment (one KEY=VALUE a line)": f"NOTE={HOSTILE}",
            "Working directory": str(tmp_path),
        },
    )
    p.page.wait_for_url(coordinator.url + "/ui/")
    _card(p, "crash").get_by_role("button", name="Start group crash", exact=True).click()
    expect(_card(p, "crash").locator(".state")).to_have_text("failed 3", timeout=20_000)
    ranks = {r["worker"]: r["rank"] for r in coordinator.api("GET", "/api/groups/crash/ranks")[1]}
    rank1 = next(w for w, r in ranks.items() if r == 1)
    # Each rank's own end (issue 33): the failure in red, the ranks stopped because of it neutral.
    for worker, rank in ranks.items():
        badge = p.page.locator("tr", has=p.page.get_by_label(f"Select worker {worker}")).locator(".state")
        _reads(badge, "exited 3" if rank == 1 else "stopped (after rank 1)", BAD if rank == 1 else STOP)
    p.shot("failed")
    _card(p, "crash").get_by_role("link", name="crash", exact=True).click()
    for worker, rank in ranks.items():
        row = p.page.locator("table.ranks tbody tr", has=p.page.get_by_role("rowheader", name=worker, exact=True))
        _reads(row.locator(".state"), "exited 3" if rank == 1 else "stopped (after rank 1)", BAD if rank == 1 else STOP)
        prefix = "" if rank == 1 else "stopped (after rank 1): "
        expect(row.locator("td").last).to_have_text(
            re.compile("^" + re.escape(f"{prefix}rank 1 ({rank1}) exited with code 3"))
        )
    p.shot("group-page-failed")
    expect(p.page.locator("#log-view")).to_contain_text(HOSTILE)  # a hostile log line shows as text
    expect(p.page.locator("table.attempts")).to_contain_text("3")
    p.page.goto(coordinator.url + "/ui/groups/crash/settings")
    expect(p.page.get_by_label("Environment (one KEY=VALUE a line)")).to_have_value(f"NOTE={HOSTILE}")
    p.shot("hostile-as-text")
    assert p.page.locator("img").count() == 0


def _buttons_refused(p, group: str, why: dict[str, str | None]) -> None:
    """Each of the group's buttons enabled (None) or disabled with a title containing its reason."""
    for label, reason in why.items():
        button = p.page.get_by_role("button", name=f"{label} group {group}", exact=True)
        if reason is None:
            expect(button).to_be_enabled()
        else:
            expect(button).to_be_disabled()
            expect(button).to_have_attribute("title", re.compile(re.escape(reason)))


def test_an_empty_group_page_says_what_it_waits_for(page, coordinator):
    """Issue 33: a group with no workers (or never started) showed a header-only rank table,
    "master —", Stop and Restart enabled and an empty log box."""
    p = page
    assert coordinator.api("POST", "/api/groups", {"name": "empty"})[0] == 201
    p.log_in(coordinator.token)
    p.page.goto(coordinator.url + "/ui/groups/empty")
    expect(p.page.locator("#group-empty")).to_contain_text("No worker has joined group empty yet")
    expect(p.page.locator("#group-empty")).to_contain_text("move them to this group")
    expect(p.page.locator("table.ranks")).to_have_count(0)
    expect(p.page.locator("main")).not_to_contain_text("master —")
    _buttons_refused(p, "empty", {label: "no worker has joined" for label in ("Start", "Stop", "Restart")})
    expect(p.page.locator("#log-view .log-empty")).to_have_text(
        "No output yet: the ranks' lines appear here once the group runs."
    )
    expect(p.page.locator("#log-view .log-empty")).to_be_visible()
    p.shot("empty-group")

    # Workers join (moved elsewhere, here the API): the page redraws itself into a group not started.
    workers = [w["name"] for w in coordinator.wait_workers(4)][:2]
    assert coordinator.api("POST", "/api/workers/move", {"workers": workers, "group": "empty"})[0] == 200
    expect(p.page.locator("#group-empty")).to_contain_text("Group empty has not started yet", timeout=LIVE)
    expect(p.page.locator("#group-empty")).to_contain_text("set its command in Settings")
    expect(p.page.locator("table.ranks tbody tr")).to_have_count(2)
    # ...whose ranks ended in group crash: that group's ends, not this one's
    expect(p.page.locator("table.ranks .state")).to_have_text(["idle", "idle"])
    expect(p.page.locator("table.ranks td.rank-cause")).to_have_text(["—", "—"])
    _buttons_refused(p, "empty", {"Start": None, "Stop": "has not started", "Restart": "use Start"})
    expect(p.page.locator("#log-view .log-empty")).to_be_visible()
    p.shot("not-started-group")
    p.page.goto(coordinator.url + "/ui/")
    _buttons_refused(p, "empty", {"Start": None, "Stop": "has not started", "Restart": "use Start"})
    assert coordinator.api("POST", "/api/workers/move", {"workers": workers, "group": None})[0] == 200


def test_hostile_group_name_renders_as_text_and_changes_arrive_live(page, coordinator):
    p = page
    p.log_in(coordinator.token)
    _create_group(p, HOSTILE)
    expect(p.page.get_by_role("alert")).to_contain_text(HOSTILE)
    assert p.page.locator("img").count() == 0

    # A change made elsewhere (the CLI, another browser) shows without a reload within 2 s.
    p.page.goto(coordinator.url + "/ui/")
    p.page.evaluate("window.notReloaded = true")
    assert coordinator.api("POST", "/api/groups", {"name": "from-cli"})[0] == 201
    expect(_card(p, "from-cli")).to_be_visible(timeout=LIVE)
    assert p.page.evaluate("window.notReloaded === true")
    p.shot("live-update")
    p.page.set_viewport_size({"width": 390, "height": 844})
    p.page.goto(coordinator.url + "/ui/")
    assert p.page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), "page wider than a phone"
    p.shot("narrow")


def test_without_a_session_the_page_asks_for_the_token(page, coordinator):
    p = page
    p.page.goto(coordinator.url + "/ui/groups/exp1")
    expect(p.page).to_have_url(re.compile(r"/ui/login"))
    p.page.get_by_label("Token").fill("not-the-token")
    p.page.get_by_role("button", name="Log in").click()
    expect(p.page.locator("#token-error")).to_be_visible()
    p.shot("login-refused")
    assert coordinator.api("GET", "/api/groups", token=None)[0] == 401
    assert coordinator.api("GET", "/api/groups", token="wrong")[0] == 401
    forged = urllib.request.Request(
        coordinator.url + "/ui/groups", data=b"name=forged", method="POST", headers={"Origin": "http://evil.example"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=10)
    assert refused.value.code in (401, 403)
    p.log_in(coordinator.token)
    forged_in_session = p.page.request.post(coordinator.url + "/ui/groups", form={"name": "forged"})
    assert forged_in_session.status == 403, "a POST without the CSRF value is refused even with the cookie"
    cookie = next(c for c in p.page.context.cookies() if c["name"] == "slurmgen_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert coordinator.token not in cookie["value"]
    p.page.get_by_role("button", name="Log out").click()
    expect(p.page).to_have_url(re.compile(r"/ui/login"))
