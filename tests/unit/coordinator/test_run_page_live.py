"""A running job's page follows the run (issue 33, items 1 and 11): seen on the test cluster, an open
page's Elapsed stayed at the 0-1 s of its first render while the job ran 16 s, its Ranks table said
"Last step —" while the log was at step 330, and a COMPLETED job read "running (Slurm: RUNNING)".
Here Slurm is a fake `scontrol` printing what Slurm 22.05 prints; the registry (real SQLite), the
timeline file beside the logs and the server (its page and its live JSON) are real."""

from __future__ import annotations

import json
import re
import stat
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slurmgen.contract.files import TIMELINE_NAME  # noqa: E402
from slurmgen.coordinator.group_runs import GroupRuns  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.coordinator.web import run_live, runs_page  # noqa: E402
from slurmgen.runs.model import Recorder  # noqa: E402
from slurmgen.runs.registry import JobRecord, Registry  # noqa: E402

TOKEN = "t0ken-for-live-run-page"


@pytest.fixture
def served(tmp_path, monkeypatch):
    registry = tmp_path / "jobs.sqlite"
    Registry.open(registry, create=True).close()
    store = Store(tmp_path / "c.db")
    monkeypatch.setattr(runs_page.REFRESHER, "every", 0.0)  # Slurm asked at every poll, not every 5 s
    with TestClient(create_app(Coordinator(store, runs=GroupRuns(Recorder(registry))), TOKEN)) as c:
        c.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://testserver"})
        yield c, registry
    store.close()


def slurm_says(tmp_path, monkeypatch, **fields: str) -> None:
    """`scontrol show job` prints one job with these fields (from now on); `sacct` nothing."""
    line = {"JobId": "91", "JobName": "train", "Reason": "None", "Restarts": "0", "TimeLimit": "00:05:00"}
    line |= {"NodeList": "node1", "StartTime": "2026-11-28T17:00:00", **fields}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "out.txt").write_text(" ".join(f"{k}={v}" for k, v in line.items()) + "\n")
    for name, body in (("scontrol", f"cat {bin_dir / 'out.txt'}"), ("sacct", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")


def running_job(registry, tmp_path, steps: int) -> int:
    """A one-node, two-rank job submitted a minute ago with a 5 min limit, whose ranks have written
    step samples up to `steps` to its timeline file (as the trainer does once a heartbeat period)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    now = time.time()
    events = [{"event": "first_step", "rank": r, "attempt": 1, "time": now - 15, "step": 1} for r in (0, 1)]
    events += [
        {"event": "steps", "rank": r, "attempt": 1, "time": now - 15 + s / 20, "step": s, "work": 0.05}
        for s in range(20, steps + 1, 20)
        for r in (0, 1)
    ]
    (logs / TIMELINE_NAME.format(job_id="91")).write_text("".join(json.dumps(e) + "\n" for e in events))
    info = {"nodes": 1, "gpus": 2, "log_dir": str(logs), "workdir": str(tmp_path), "time_limit": "5"}
    with Registry.open(registry) as reg:
        record = JobRecord("91", "train", str(tmp_path / "out"), now - 60, None, "PENDING", None, info)
        reg.add(record)
        return record.seq


def fields_of(answer: dict) -> dict[tuple, str]:
    return {tuple(key): text for key, text, _ in answer["fields"]}


def test_an_open_running_jobs_page_follows_its_elapsed_time_last_steps_and_end(served, tmp_path, monkeypatch):
    client, registry = served
    slurm_says(tmp_path, monkeypatch, JobState="RUNNING", ExitCode="0:0", RunTime="00:00:01")
    seq = running_job(registry, tmp_path, steps=40)
    html = client.get(f"/ui/runs/{seq}").text
    shape = re.search(rf'data-live-url="/ui/live/runs/{seq}" data-page-url="/ui/runs/{seq}" data-shape="(\w+)"', html)
    assert shape, "the page does not follow the run"
    keys = {tuple(json.loads(k.replace("&#34;", '"'))) for k in re.findall(r'data-live="([^"]+)"', html)}
    assert {("run", seq, "elapsed"), ("run", seq, "state"), ("rank", 1, 0, "step"), ("rank", 1, 1, "step")} <= keys

    # 16 s later: the job is at step 330, and the page's poll says so, its elapsed time the attempt's
    slurm_says(tmp_path, monkeypatch, JobState="RUNNING", ExitCode="0:0", RunTime="00:00:16")
    (tmp_path / "logs" / TIMELINE_NAME.format(job_id="91")).open("a").write(
        "".join(
            json.dumps({"event": "steps", "rank": r, "attempt": 1, "time": time.time(), "step": 330}) + "\n"
            for r in (0, 1)
        )
    )
    answer = client.get(f"/ui/live/runs/{seq}").json()
    seen = fields_of(answer)
    assert answer["shape"] == shape.group(1)  # still running: values move, nothing is redrawn
    assert re.fullmatch(r"1[67] s / 5 min 00 s", seen[("run", seq, "elapsed")]), seen
    assert seen[("rank", 1, 0, "step")] == seen[("rank", 1, 1, "step")] == "330", seen
    assert seen[("run", seq, "state")] == "running"
    assert set(seen) <= keys  # every value the poll moves is on the page

    # it completed: the next poll's shape differs (the page redraws its facts) and a render says so
    slurm_says(
        tmp_path, monkeypatch, JobState="COMPLETED", ExitCode="0:0", RunTime="00:00:18", EndTime="2026-11-28T17:00:18"
    )
    answer = client.get(f"/ui/live/runs/{seq}").json()
    assert answer["shape"] != shape.group(1) and answer["fields"] == []
    html = client.get(f"/ui/runs/{seq}").text
    assert '<span class="state state-succeeded">succeeded</span> (Slurm: COMPLETED)' in html, html
    assert client.get("/ui/live/runs/9999").status_code == 404


def test_a_state_no_refresh_renewed_is_shown_with_its_age(served, tmp_path, monkeypatch):
    """Slurm's controller stopped answering: the page's state says how old it is, as the list's does."""
    client, registry = served
    slurm_says(tmp_path, monkeypatch, JobState="RUNNING", ExitCode="0:0", RunTime="00:00:05")
    seq = running_job(registry, tmp_path, steps=20)
    client.get(f"/ui/live/runs/{seq}")
    with Registry.open(registry) as reg:  # Slurm last told it 2 min ago
        reg.db.execute("UPDATE jobs SET state_seen = ? WHERE seq = ?", (time.time() - 120, seq))
    (tmp_path / "bin" / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    seen = fields_of(client.get(f"/ui/live/runs/{seq}").json())
    assert seen[("run", seq, "state")] == "running, as of 2 min ago", seen
    assert "running, as of 2 min ago</span>" in client.get(f"/ui/runs/{seq}").text


def test_the_ranks_last_steps_are_read_from_the_timelines_tail_of_the_newest_attempt(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [{"event": "steps", "rank": r, "attempt": 1, "time": 1.0, "step": 900} for r in (0, 1)]
    lines += [{"event": "steps", "rank": 0, "attempt": 2, "time": 2.0 + i, "step": i} for i in range(5000)]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert path.stat().st_size > run_live.TAIL
    assert run_live.last_steps(path) == (2, {0: 4999})  # attempt 1's 900 is not attempt 2's
    assert run_live.last_steps(tmp_path / "none") == (None, {}) == run_live.last_steps(None)


def time_report_of(html: str) -> tuple[str | None, float, str]:
    """(the report's period, its wall time in s, its goodput figure) on a rendered run page."""
    period = re.search(r'<div id="run-time" data-live-part(?: data-report="(\d+)")?>', html)
    goodput = re.search(r"Goodput <strong>([\d.]+%)</strong> of ([\d.]+) s of wall time", html)
    assert period and goodput, html
    return period.group(1), float(goodput.group(2)), goodput.group(1)


def test_an_open_running_jobs_time_report_is_redrawn_every_period(served, tmp_path, monkeypatch):
    """Seen on the test cluster: a job 39 s in read "Goodput 0.0% of 28.4 s", the figure of its first
    render, for as long as the page stayed open. While the run lives, the poll's `report` period moves
    on every REDRAW seconds (a shorter one here) and the page's script then redraws the time report
    alone from a fresh render: its wall time and goodput are the run's now, not its first render's."""
    client, registry = served
    monkeypatch.setattr(run_live, "REDRAW", 1.0)
    slurm_says(tmp_path, monkeypatch, JobState="RUNNING", ExitCode="0:0", RunTime="00:00:15")
    seq = running_job(registry, tmp_path, steps=40)
    time.sleep(1.0 - time.time() % 1.0)  # at a period's start: the render and the poll below fall in it
    html = client.get(f"/ui/runs/{seq}").text
    period, wall, figure = time_report_of(html)
    assert period is not None, "a live run's time report is never redrawn"
    assert client.get(f"/ui/live/runs/{seq}").json()["report"] == period  # within the period: nothing to redraw

    time.sleep(1.1)  # past the period, the ranks stepped on to 200
    (tmp_path / "logs" / TIMELINE_NAME.format(job_id="91")).open("a").write(
        "".join(
            json.dumps({"event": "steps", "rank": r, "attempt": 1, "time": time.time(), "step": s, "work": 0.05}) + "\n"
            for s in range(60, 201, 20)
            for r in (0, 1)
        )
    )
    answer = client.get(f"/ui/live/runs/{seq}").json()
    assert answer["report"] not in (None, period)  # the page's script fetches a fresh render of its report
    later, wall_later, figure_later = time_report_of(client.get(f"/ui/runs/{seq}").text)
    assert later == answer["report"] and wall_later > wall, (wall, wall_later)
    assert float(figure_later.rstrip("%")) > float(figure.rstrip("%")), (figure, figure_later)  # the new steps count

    # ended: no period, the report is drawn once more with the new shape and stays
    slurm_says(
        tmp_path, monkeypatch, JobState="COMPLETED", ExitCode="0:0", RunTime="00:00:18", EndTime="2026-11-28T17:00:18"
    )
    assert client.get(f"/ui/live/runs/{seq}").json()["report"] is None
    assert time_report_of(client.get(f"/ui/runs/{seq}").text)[0] is None
