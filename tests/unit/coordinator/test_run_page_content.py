"""The run page's content (issues 22 and 23): a Slurm job's per-rank timeline as SVG, stragglers
and goodput, its log followed by byte offset, its array tasks, its curves from its own records,
and a "checkpoint and stop" exit shown as preempted with its elapsed time. Slurm is a pair of
fake `scontrol`/`sacct` scripts printing what Slurm 22.05 prints; the registry, the files beside
the logs and the run records are real."""

from __future__ import annotations

import json
import re
import stat
from datetime import datetime
from pathlib import Path

import pytest
from helpers import srun_label, tqdm_bar

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slurmgen import tracking  # noqa: E402
from slurmgen.contract import exitcodes  # noqa: E402
from slurmgen.contract.files import TIMELINE_NAME  # noqa: E402
from slurmgen.contract.grid import SWEEP_FILE, grid_jsonl  # noqa: E402
from slurmgen.contract.states import State, from_slurm  # noqa: E402
from slurmgen.coordinator.group_runs import GroupRuns  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.coordinator.web import status_page  # noqa: E402
from slurmgen.runs.model import (  # noqa: E402
    Failure,
    NewRun,
    Recorder,
    add_run,
    end_attempt,
    get_row,
    start_attempt,
)
from slurmgen.runs.registry import JobRecord, Registry  # noqa: E402

TOKEN = "t0ken-for-run-page"
HOSTILE = "<svg onload=alert(1)>"
T0 = 1_790_000_000.0
END = "2026-11-25T10:00:00"


def scontrol_line(job: str, state: str, code: str, **extra: str) -> str:
    fields = {
        "JobId": job,
        "JobName": "train",
        "JobState": state,
        "Reason": "None",
        "Restarts": "1",
        "ExitCode": code,
        "RunTime": "00:02:05",
        "TimeLimit": "00:05:00",
        "StartTime": "2026-11-25T09:57:55",
        "EndTime": END,
        "NodeList": "node[1-2]",
        **extra,
    }
    return " ".join(f"{k}={v}" for k, v in fields.items())


def fake_slurm(tmp_path, monkeypatch, lines: list[str]) -> None:
    """`scontrol show job -o ID` prints `lines`; `sacct` knows nothing more."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "out.txt").write_text("\n".join(lines) + "\n")
    for name, body in (("scontrol", f"cat {bin_dir / 'out.txt'}"), ("sacct", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755 | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")


def timeline_events() -> list[dict]:
    """3 ranks: rank 2 (on a host named like an HTML tag) is the slowest to import and works 4x
    the others' time per step for 30 steps; a checkpoint at step 20; every rank ends preempted."""
    out = []
    for rank, host, work in ((0, "node1", 0.1), (1, "node1", 0.1), (2, HOSTILE, 0.4)):
        late = 2.0 if rank == 2 else 0.0
        for event, t, more in (
            ("process", 1.0, {}),
            ("imports", 3.0 + late, {}),
            ("rendezvous", 6.0, {}),
            ("first_step", 7.0, {"step": 1}),
            ("checkpoint", 10.0, {"step": 20, "stall": 0.5}),
            ("steps", 12.0, {"step": 30, "work": 30 * work}),
            ("end", 13.0, {"status": "preempted"}),
        ):
            out.append({"event": event, "rank": rank, "attempt": 1, "time": T0 + t, "host": host, "pid": 1, **more})
    return out


@pytest.fixture
def served(tmp_path):
    registry = tmp_path / "jobs.sqlite"
    Registry.open(registry, create=True).close()
    store = Store(tmp_path / "c.db")
    coordinator = Coordinator(store, runs=GroupRuns(Recorder(registry)))
    with TestClient(create_app(coordinator, TOKEN), base_url="http://testserver") as c:
        c.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://testserver"})
        yield c, registry
    store.close()


def add_job(registry, tmp_path, job: str, **info) -> int:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    base = {
        "nodes": 1,
        "gpus": 3,
        "log_dir": str(logs),
        "workdir": str(tmp_path),
        "launcher": "srun",
        "command": ["python", "-m", "slurmgen.train", "--out-dir", "R"],
    }
    with Registry.open(registry) as reg:
        record = JobRecord(job, "train", str(tmp_path / "out"), T0 - 30, None, "RUNNING", None, {**base, **info})
        reg.add(record)
        return record.seq


def test_checkpointed_job_page_timeline_stragglers_goodput_and_elapsed(served, tmp_path, monkeypatch):
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("77", "FAILED", "75:0")])
    seq = add_job(registry, tmp_path, "77")
    (tmp_path / "logs" / TIMELINE_NAME.format(job_id="77")).write_text(
        "".join(json.dumps(e) + "\n" for e in timeline_events())
    )
    html = client.get(f"/ui/runs/{seq}").text
    # exit 75 after "checkpoint and stop": preempted, not failed; Slurm's word kept beside it
    assert '<span class="state state-preempted">preempted</span> (Slurm: FAILED)' in html
    assert "Stopped to checkpoint" in html and "First failure" not in html
    assert "<p>checkpointed and asked to run again (Slurm: FAILED)" in html
    assert "log is not readable" not in html  # no rank failed: there is no rank's log to speak of
    assert "<dt>Elapsed</dt><dd>—" not in html and "<dt>Requeued</dt><dd>1&times;" in html
    assert "<dt>Nodes</dt><dd>node[1-2]</dd>" in html
    with Registry.open(registry) as reg:
        row = get_row(reg, seq)
    assert row["state"] == State.PREEMPTED.value and row["ended"] == datetime.fromisoformat(END).timestamp()
    # the timeline: one SVG row per rank, the hostile host name escaped, rank 2 flagged and named slowest
    svg = html.split('aria-label="per-rank timeline of attempt 1">')[1].split("</svg>")[0]
    assert svg.count('<g class="rank-row') == 3 and HOSTILE not in html
    assert "&#9873; rank 2 &lt;svg onload=alert(1)&gt;" in svg
    assert "<title>rank 2 imports: 0.00-4.00 s</title>" in svg
    assert "imports: rank 2 at 4.00 s" in html
    assert "rank 2: 4.0&times; the median step work for 30 steps (1-30, attempt 1)" in html
    assert 'id="goodput">Goodput <strong>' in html and 'data-part="checkpoint"><td>' in html
    # the rank table of the last attempt: node, how each rank ended, its last step, its checkpoints
    table = html.split('id="rank-table"')[1].split("</table>")[0]
    assert '<h3 id="ranks-title">Ranks of attempt 1</h3>' in html and table.count("<tr data-rank=") == 3
    assert (
        '<tr data-rank="2"><td>2 &#9873;</td><td>&lt;svg onload=alert(1)&gt;</td><td>preempted</td>'
        "<td>30</td><td>1</td></tr>"
    ) in table


def _group_run(tmp_path, events: list[dict], ended: float, failure: Failure | None = None) -> Path:
    """A registry holding group g's run g.1 (as group_runs.py records it), its timeline file
    written with `events`, its one attempt started at T0 and ended at `ended`: the registry."""
    registry, timeline = tmp_path / "jobs.sqlite", tmp_path / TIMELINE_NAME.format(job_id="g.1")
    timeline.write_text("".join(json.dumps(e) + "\n" for e in events))
    with Registry.open(registry, create=True) as reg:
        info = {"timeline": str(timeline)}
        seq = add_run(reg, NewRun("group", "g.1", "g", str(tmp_path), 2, 3, run_id="g", info=info), T0)
        start_attempt(reg, seq, 1, T0)
        end_attempt(reg, seq, 1, State.FAILED if failure else State.PREEMPTED, failure, ended)
    return registry


def test_status_html_draws_the_same_time_report(tmp_path):
    registry = _group_run(tmp_path, timeline_events(), T0 + 13)
    group = {"name": "g", "state": "stopped", "attempt": 1, "restarts": 0, "reason": None, "config": {}}
    detail = {"group": group, "workers": [], "attempts": []}
    html = status_page.render_status(detail, [], {}, status_page.group_time(registry, group))
    assert 'aria-label="per-rank timeline of attempt 1"' in html and "&#9873; rank 2" in html and HOSTILE not in html
    assert "Goodput <strong>" in html
    for other in ({**group, "name": "none"}, {**group, "attempt": None}):
        assert status_page.group_time(registry, other) == {}
        assert "per-rank timeline" not in status_page.render_status({**detail, "group": other}, [], {}, {})
    assert status_page.group_time(tmp_path / "no-registry.sqlite", group) == {}


def test_a_hung_groups_status_html_counts_the_hang_as_its_run_page_does(tmp_path):
    """A group's status.html analysed its timeline without the run's attempts (and looked for it
    under the group's name, where the ranks write it under the run's, GROUP.N): a hang read as
    training, the hung rank's bar green to the end, and the straggler rule not cut at the hang. Rank
    1 of 2 stops beating at step 40 (t=40); the attempt ends hung at t=61."""
    events = []
    for rank in (0, 1):
        events.append({"event": "first_step", "rank": rank, "attempt": 1, "time": T0, "step": 1, "host": "n", "pid": 1})
        for s in (10, 20, 30, 40):
            events.append({"event": "steps", "rank": rank, "attempt": 1, "time": T0 + s, "step": s, "work": 0.1})
    hung = Failure(cause="rank 1 on node2 stopped beating at step 40", rank=1, node="node2", code=exitcodes.HUNG)
    registry = _group_run(tmp_path, events, T0 + 61, hung)
    group = {"name": "g", "state": "failed", "attempt": 1, "restarts": 0, "reason": hung.cause, "config": {}}
    view = status_page.group_time(registry, group)
    assert view["goodput"]["breakdown"]["hung"] == pytest.approx(21.0), view["goodput"]
    html = status_page.render_status({"group": group, "workers": [], "attempts": []}, [], {}, view)
    assert "<title>rank 1 hung: 40.00-61.00 s" in html, html
    assert 'data-part="hung"' in html


def test_slurm_state_of_the_preemption_exit():
    assert from_slurm("FAILED", 75) is State.PREEMPTED
    assert from_slurm("FAILED", 1) is State.FAILED and from_slurm("COMPLETED", 0) is State.SUCCEEDED


def test_log_follows_by_offset_and_the_rank_filter_keeps_one_rank(served, tmp_path, monkeypatch):
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("78", "RUNNING", "0:0")])
    seq = add_job(registry, tmp_path, "78")
    log = tmp_path / "logs" / "train-78.out"
    log.write_text("batch starts\n0: step 1\n1: step 1\n2: step 1\n1: half a li")
    first = client.get(f"/ui/live/runs/{seq}/logs").json()
    assert [(x["rank"], x["text"]) for x in first["lines"]] == [
        (None, "batch starts"),
        (0, "step 1"),
        (1, "step 1"),
        (2, "step 1"),
    ]
    with log.open("a") as f:
        f.write("ne\n0: step 2\n")
    more = client.get(f"/ui/live/runs/{seq}/logs", params={"after": first["next"]}).json()
    assert [(x["rank"], x["text"]) for x in more["lines"]] == [(1, "half a line"), (0, "step 2")]
    only = client.get(f"/ui/live/runs/{seq}/logs", params={"rank": 1}).json()
    assert {x["rank"] for x in only["lines"]} == {1} and only["rank"] == 1
    assert f'data-logs-url="/ui/live/runs/{seq}/logs"' in client.get(f"/ui/runs/{seq}").text


def test_a_flood_gives_the_newest_batch_and_counts_what_it_skipped(served, tmp_path, monkeypatch):
    """Issue 33 item 8: a poll answered every line since the last one (307,837 rows in the view,
    the newest line 4.7 s late). Now at most LOG_BATCH lines, the newest, with the rest counted;
    past READ_MOST bytes the older ones are counted without being read into lines."""
    from slurmgen.coordinator.web import run_logs
    from slurmgen.coordinator.web.live import LOG_BATCH

    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("80", "RUNNING", "0:0")])
    seq = add_job(registry, tmp_path, "80")
    log = tmp_path / "logs" / "train-80.out"
    log.write_text("0: start\n")
    after = client.get(f"/ui/live/runs/{seq}/logs").json()["next"]
    with log.open("a") as f:
        f.writelines(f"{i % 2}: flood {i}\n" for i in range(LOG_BATCH + 300))
    body = client.get(f"/ui/live/runs/{seq}/logs", params={"after": after}).json()
    assert body["skipped"] == 300 and len(body["lines"]) == LOG_BATCH
    assert body["lines"][-1]["text"] == f"flood {LOG_BATCH + 299}"
    assert client.get(f"/ui/live/runs/{seq}/logs", params={"after": body["next"]}).json() == {
        **body,
        "lines": [],
        "skipped": 0,
    }

    monkeypatch.setattr(run_logs, "READ_MOST", 1000)  # 1,000 bytes: the last 71-72 lines
    with log.open("a") as f:
        f.writelines(f"{i % 2}: more {i:05d}\n" for i in range(5000))
    fewer = client.get(f"/ui/live/runs/{seq}/logs", params={"after": body["next"], "rank": 1}).json()
    texts = [x["text"] for x in fewer["lines"]]
    assert texts[-1] == "more 04999" and all(x["rank"] == 1 for x in fewer["lines"])
    assert fewer["skipped"] == int(texts[0].split()[1]) // 2  # rank 1's lines before the bytes read (odd i)


@pytest.mark.parametrize("rank", [None, 1])
def test_lines_shown_and_skipped_add_up_to_the_lines_written(served, tmp_path, monkeypatch, rank):
    """Issue 33: the view's "N lines skipped" markers must count each line not shown once, and
    only the lines the view would show (a rank filter's rank): polled as the page polls, through
    bursts over LOG_BATCH and catch-ups past READ_MOST, shown + skipped == written."""
    from slurmgen.coordinator.web import run_logs
    from slurmgen.coordinator.web.live import LOG_BATCH

    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("81", "RUNNING", "0:0")])
    seq = add_job(registry, tmp_path, "81")
    log = tmp_path / "logs" / "train-81.out"
    log.write_text("batch starts\n")
    monkeypatch.setattr(run_logs, "READ_MOST", 40_000)  # about 2,000 lines of 3 ranks
    params = {} if rank is None else {"rank": rank}
    first = client.get(f"/ui/live/runs/{seq}/logs", params=params).json()
    after, shown, skipped, written, n = first["next"], 0, 0, 0, 0
    for burst in (10, LOG_BATCH - 1, LOG_BATCH + 7, 3 * LOG_BATCH, 11, 5 * LOG_BATCH + 3, 0):
        with log.open("a") as f:
            for _ in range(burst):
                f.write(f"{n % 3}: line {n:07d}\n" if n % 50 else f"batch line {n:07d}\n")
                written += rank is None or (n % 50 != 0 and n % 3 == rank)
                n += 1
            f.write(f"{n % 3}: half a li")  # a line being written: neither shown nor skipped yet
        body = client.get(f"/ui/live/runs/{seq}/logs", params={**params, "after": after}).json()
        assert all(rank is None or x["rank"] == rank for x in body["lines"])
        after, shown, skipped = body["next"], shown + len(body["lines"]), skipped + body["skipped"]
        with log.open("a") as f:
            f.write("ne\n" if n % 50 else "\n")
        written += rank is None or (n % 50 != 0 and n % 3 == rank)
        n += 1
    body = client.get(f"/ui/live/runs/{seq}/logs", params={**params, "after": after}).json()
    shown, skipped = shown + len(body["lines"]), skipped + body["skipped"]
    assert skipped > 0 and shown + skipped == written


def test_a_progress_bar_stays_one_line_of_its_rank_on_the_page(served, tmp_path, monkeypatch):
    """tqdm's updates come after "\r"s on one line (issue 34, item 2): split there, the bar's pieces
    and the warning after it lost their rank, and the rank filter dropped them."""
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("79", "RUNNING", "0:0")])
    seq = add_job(registry, tmp_path, "79")
    (tmp_path / "logs" / "train-79.out").write_text(srun_label(1, tqdm_bar()) + "2: no bar\n")
    lines = client.get(f"/ui/live/runs/{seq}/logs", params={"rank": 1}).json()["lines"]
    assert [x["rank"] for x in lines] == [1, 1, 1] and not any("\r" in x["text"] for x in lines)
    assert lines[0]["text"].startswith("Epoch 0:  50%|") and lines[0]["text"].endswith("UserWarning: lr is large")
    assert "| 4/4 [" in lines[2]["text"]


def test_an_array_jobs_log_is_the_chosen_tasks_and_the_page_offers_every_task(served, tmp_path, monkeypatch):
    client, registry = served
    lines = [
        scontrol_line(str(90 + t), state, "0:0", ArrayJobId="90", ArrayTaskId=str(t), Restarts="0")
        for t, state in ((0, "COMPLETED"), (1, "RUNNING"), (2, "PENDING"))
    ]
    fake_slurm(tmp_path, monkeypatch, lines)
    seq = add_job(registry, tmp_path, "90", array=3)
    for task in (0, 1):
        (tmp_path / "logs" / f"train-90_{task}.out").write_text(f"0: task {task} says {HOSTILE}\n")
    first = client.get(f"/ui/live/runs/{seq}/logs").json()  # the first task's unless told
    assert (first["task"], [x["text"] for x in first["lines"]]) == (0, [f"task 0 says {HOSTILE}"])
    second = client.get(f"/ui/live/runs/{seq}/logs", params={"task": 1, "rank": 0}).json()
    assert (second["task"], second["rank"], [x["text"] for x in second["lines"]]) == (1, 0, [f"task 1 says {HOSTILE}"])
    assert client.get(f"/ui/live/runs/{seq}/logs", params={"task": 2}).json()["lines"] == []  # pending: no log yet
    refused = client.get(f"/ui/live/runs/{seq}/logs", params={"task": 7})
    assert (refused.status_code, refused.json()["detail"]) == (
        422,
        "task: expected one of the tasks of array job 90 (0-2), got 7",
    )
    assert client.get(f"/ui/live/runs/{seq}/logs", params={"task": "x"}).status_code == 422
    html = client.get(f"/ui/runs/{seq}").text
    picker = html.split('<select id="task-filter">')[1].split("</select>")[0]
    assert picker.count("<option") == 3 and '<option value="1">task 1 (running)</option>' in picker, picker
    # Each cell of the grid links to its task's log: the page with that task picked for the log view.
    cells = html.split('id="task-grid"')[1].split("</ul>")[0]
    links = re.findall(r'<a class="task-log" href="([^"]*)" aria-label="Log of task (\d)">log</a>', cells)
    assert links == [(f"/ui/runs/{seq}?task={t}#logs", str(t)) for t in range(3)], cells
    assert 'id="logs"' in html and "selected" not in picker  # unpicked: the first task's, as the log endpoint
    picked = client.get(links[1][0].split("#")[0]).text.split('<select id="task-filter">')[1].split("</select>")[0]
    assert '<option value="1" selected>task 1 (running)</option>' in picked and picked.count("selected") == 1, picked
    odd = client.get(f"/ui/runs/{seq}", params={"task": HOSTILE}).text  # not a task: nothing picked, nothing echoed
    assert odd.count(" selected>") == 0 and HOSTILE not in odd
    # A job that is no array offers no picker and refuses a task.
    plain = add_job(registry, tmp_path, "91")
    assert 'id="task-filter"' not in client.get(f"/ui/runs/{plain}").text
    assert client.get(f"/ui/live/runs/{plain}/logs", params={"task": 0}).status_code == 422


def test_array_task_ids_are_read_from_what_the_job_was_submitted_with():
    from slurmgen.jobs.logs import array_tasks, tasks_text

    assert array_tasks({"array": 4}) == [0, 1, 2, 3] and array_tasks({}) == []
    assert array_tasks({"array": "0-6:3%2"}) == [0, 3, 6] and array_tasks({"array": "1,3,5-6"}) == [1, 3, 5, 6]
    assert array_tasks({"array": "%4"}) == [] and array_tasks({"array": "a-b"}) == []
    assert tasks_text([0, 1, 2, 3]) == "0-3" and tasks_text([1, 3, 5, 6]) == "1, 3, 5-6"


def test_array_tasks_grid_and_the_sweeps_curves_in_one_chart(served, tmp_path, monkeypatch):
    client, registry = served
    lines = [
        scontrol_line(str(80 + t), state, code, ArrayJobId="80", ArrayTaskId=str(t), Restarts="0")
        for t, state, code in ((0, "COMPLETED", "0:0"), (1, "FAILED", "75:0"), (2, "RUNNING", "0:0"))
    ]
    fake_slurm(tmp_path, monkeypatch, lines)
    out = tmp_path / "out"
    out.mkdir()
    params = [{"lr": 0.1}, {"lr": 0.01}, {"lr": "<b>x</b>"}]
    (out / SWEEP_FILE).write_text(grid_jsonl(params))
    for task in range(len(params)):
        environ = {
            "SLURM_ARRAY_JOB_ID": "80",
            "SLURMGEN_SWEEP_INDEX": str(task),
            "SLURMGEN_SWEEP_FILE": str(out / SWEEP_FILE),
        }
        run = tracking.init(tmp_path / "R" / "tracking", group=f"slurm-80_{task}", name=f"t{task}", environ=environ)
        for step in (1, 2, 3):
            run.log("train", {"loss": 1.0 / (step + task)}, step=step)
        run.finish()
    seq = add_job(registry, tmp_path, "80", array=3, sweep_file=str(out / SWEEP_FILE))
    html = client.get(f"/ui/runs/{seq}").text
    cells = html.split('id="task-grid"')[1].split("</ul>")[0]
    assert cells.count('class="task-cell') == 3 and "<b>x</b>" not in cells
    assert (
        'data-task="1"' in cells
        and "task-preempted" in cells
        and "lr=0.01" in cells
        and "lr=&lt;b&gt;x&lt;/b&gt;" in cells
    )
    curves = client.get(f"/ui/live/runs/{seq}/metrics").json()
    assert sorted(curves["metrics"]["loss"]) == ["train #0 lr=0.1", "train #1 lr=0.01", "train #2 lr=<b>x</b>"]
    listed = client.get("/ui/runs").text.split(f'data-run="{seq}"')[1].split("</tr>")[0]
    assert (
        '<td class="run-loss"><span data-live=' in listed and ">0.2 (best of 3)</span>" in listed
    )  # task 2's last, 1/5
    assert curves["metrics"]["loss"]["train #1 lr=0.01"] == [[1, 2, 3], [0.5, 1 / 3, 0.25]]


def test_the_list_shows_a_runs_last_training_loss_read_from_its_records_tail(served, tmp_path):
    """The last train loss of the run's own record (not val's), also when the metrics file is longer
    than the tail the list reads; refreshed by the live JSON once LOSS_FRESH has passed."""
    from slurmgen.coordinator.web import run_records
    from slurmgen.runs.model import NewRun, add_run

    client, registry = served
    run = tracking.init(tmp_path / "L" / "tracking", group="launch-1", name="r0", environ={})
    for step in range(1, 3001):  # ~300 KB: more than the 64 KB the list reads
        run.log("train", {"loss": 10.0 / step}, step=step)
    run.log("val", {"loss": 99.0}, step=3000)
    with Registry.open(registry) as reg:
        seq = add_run(reg, NewRun("launch", "L1", "lossy", "/w", 1, 1, record_dir=str(tmp_path / "L")), T0)
    listed = client.get("/ui/runs").text.split(f'data-run="{seq}"')[1].split("</tr>")[0]
    assert ">0.003333</span>" in listed, listed
    run.log("train", {"loss": 0.25}, step=3001)
    run.finish()
    live = {tuple(key): text for key, text, _ in client.get("/ui/live/runs").json()["fields"]}
    assert live[("r", seq, "loss")] == "0.003333"  # kept: read again after LOSS_FRESH seconds
    run_records._LOSSES.clear()
    live = {tuple(key): text for key, text, _ in client.get("/ui/live/runs").json()["fields"]}
    assert live[("r", seq, "loss")] == "0.25"


def test_the_list_shows_a_page_of_runs_and_links_the_older_ones(served):
    """1,000 rows took 0.6 s to render (benchmarks/bench_page.py): the list shows pages of 100."""
    from slurmgen.coordinator.web.runs_page import PAGE
    from slurmgen.runs.model import NewRun, add_run

    client, registry = served
    with Registry.open(registry) as reg:
        for i in range(PAGE * 2 + 5):
            add_run(reg, NewRun("launch", f"k{i}", f"run{i}", "/w", 1, 1), T0 + i)
    first = client.get("/ui/runs?kind=launch").text
    assert first.count('data-kind="launch"') == PAGE and ">run204<" in first and ">run104<" not in first
    assert f"Runs 1–{PAGE} of {PAGE * 2 + 5} ({PAGE * 2 + 5} not ended)" in first
    assert 'href="/ui/runs?kind=launch&amp;page=2">older' in first
    last = client.get("/ui/runs?kind=launch&page=3").text
    assert last.count('data-kind="launch"') == 5 and ">run0<" in last and "older &rarr;" not in last
    assert len({key[1] for key, _, _ in client.get("/ui/live/runs?page=3").json()["fields"]}) == 5  # its 5 runs


def test_slurms_end_time_is_kept_and_a_requeue_clears_it():
    from slurmgen.jobs.slurm import parse_scontrol
    from slurmgen.jobs.view import ended_at

    assert ended_at(parse_scontrol(scontrol_line("5", "FAILED", "75:0"))) == (
        True,
        datetime.fromisoformat(END).timestamp(),
    )
    assert ended_at(parse_scontrol(scontrol_line("5", "RUNNING", "0:0"))) == (True, None)  # EndTime is then the limit's
    assert ended_at(parse_scontrol(scontrol_line("5", "FAILED", "1:0", EndTime="Unknown"))) == (False, None)


def test_an_array_jobs_attempts_are_those_of_the_task_shown():
    from slurmgen.coordinator.web.run_detail import task_attempts

    start = {"event": "start", "attempt": 1, "time": 1_700_000_000, "host": "n1"}
    again = {"event": "end", "exit_code": 143, "time": 1_700_000_010}
    tasks = [
        {"job": "7_0", "state": "RUNNING", "attempts": [start]},
        {"job": "7_1", "state": "RUNNING", "attempts": [start, again, {**start, "attempt": 2}]},
    ]
    shown, rows = task_attempts({"tasks": tasks}, "1")
    assert shown == "1" and [(r["number"], r["state"], r["code"]) for r in rows] == [
        (1, "failed", 143),
        (2, "running", None),
    ]
    tasks[1]["state"] = "CANCELLED"  # the task's own state ends its last attempt
    assert [r["state"] for r in task_attempts({"tasks": tasks}, "1")[1]] == ["failed", "stopped"]
    assert task_attempts({"tasks": tasks}, "<b>9")[0] == "0"  # no such task: the first, as the log view picks
    assert task_attempts({"state": "RUNNING"}, "1") == (None, [])  # not an array: the job's own attempts


def test_a_rank_without_an_end_is_running_while_its_attempt_lasts_and_unsaid_after():
    from slurmgen.coordinator.web.timeline_svg import rank_rows

    attempt = {
        "ranks": [
            {"rank": 0, "host": "n1", "status": "done", "last_step": 9, "checkpoints": 2},
            {"rank": 1, "host": None, "status": None, "last_step": None},
            {"rank": 2, "status": "failed", "code": 143},
            {"rank": 3, "status": "failed", "code": 3},
        ]
    }
    assert [(r["node"], r["status"], r["last_step"], r["straggler"]) for r in rank_rows(attempt, {1}, True)] == [
        ("n1", "done", 9, False),
        ("—", "running", "—", True),
        ("—", "terminated", "—", False),
        ("—", "failed (exit 3)", "—", False),
    ]
    assert rank_rows(attempt, set(), False)[1]["status"] == "—"  # killed: it never said how it ended


def test_a_chains_link_page_lists_every_link_and_why_the_chain_ended(served, tmp_path, monkeypatch):
    from slurmgen.contract.files import CHAIN_ENDED_NAME

    client, registry = served
    fake_slurm(
        tmp_path, monkeypatch, [scontrol_line("91", "COMPLETED", "0:0"), scontrol_line("92", "CANCELLED", "0:0")]
    )
    seqs = [
        add_job(registry, tmp_path, job, chain={"id": "91", "links": ["91", "92"], "link": n})
        for n, job in enumerate(("91", "92"), 1)
    ]
    (tmp_path / "logs" / CHAIN_ENDED_NAME.format(job_id="91")).write_text("the run finished in link 91\n")
    page = client.get(f"/ui/runs/{seqs[1]}").text
    assert "<dt>Chain 91</dt>" in page
    assert f'<a href="/ui/runs/{seqs[0]}">91</a> COMPLETED' in page, page
    assert "; ended: the run finished in link 91</dd>" in page
    assert "train (link 2/2 of chain 91)" in client.get("/ui/runs").text


def test_the_ranks_table_marks_the_hung_or_failed_rank_and_the_ranks_that_only_waited():
    """Issue 33, item 4: the hung (or crashed) rank read "—" and the rank that only waited "failed"."""
    from slurmgen.coordinator.web.timeline_svg import rank_rows

    ranks = [
        {"rank": 0, "host": "n1", "status": "failed", "code": 1},  # its collective broke when rank 1 was killed
        {"rank": 1, "host": "n2", "status": None, "code": 137},
    ]
    hung = {"ranks": ranks, "code": 124, "hung_rank": 1, "state": "failed"}
    assert [r["status"] for r in rank_rows(hung, set(), False)] == ["stopped (after rank 1)", "hung"]
    crashed = {"ranks": [{**ranks[0], "code": None}, {**ranks[1], "code": 143}], "code": 3, "rank": 0}
    assert [r["status"] for r in rank_rows(crashed, set(), False)] == ["failed (exit 3)", "stopped (after rank 0)"]


def test_the_hung_ranks_last_step_says_the_step_its_verdict_names():
    """Issue 33, item 11: "stopped beating at step 61" beside "Last step 63" for the hung rank (woken
    by the watcher to give its stack, it stepped on). The table shows both, each true."""
    from slurmgen.coordinator.web.timeline_svg import rank_rows
    from slurmgen.observe import timeline

    def steps(rank, last, t):
        return [{"event": "steps", "rank": rank, "attempt": 1, "time": T0 + t, "step": last, "work": 1.0}]

    events = steps(0, 61, 20) + steps(1, 61, 20) + steps(1, 63, 36.9) + steps(0, 64, 36.9)
    end = {"event": "end", "attempt": 1, "time": T0 + 37, "exit_code": 124, "hung_rank": 1, "hung_step": 61}
    (attempt,) = timeline.build(events, [{"event": "start", "attempt": 1, "time": T0}, end])["attempts"]
    assert [r["last_step"] for r in rank_rows(attempt, set(), False)] == [64, "63 (hung at 61)"]
    judged_there = {**attempt, "hung_step": 63}
    assert [r["last_step"] for r in rank_rows(judged_there, set(), False)] == [64, 63]
    assert [r["last_step"] for r in rank_rows({**attempt, "hung_step": None}, set(), False)] == [64, 63]


def test_a_hung_attempts_row_names_the_hung_rank_its_cause_names():
    """Issue 33, item 4: the attempts row read Rank "—" beside "hung: rank 1 on node2 stopped beating"
    (run_slurm.sh's end line has rank null and the watchers' hung_rank 1), seen on the cluster."""
    from slurmgen.coordinator.web.run_detail import slurm_attempts

    start = {"event": "start", "job": "2", "attempt": 1, "time": 10.0, "host": "node1"}
    end = {"event": "end", "job": "2", "attempt": 1, "time": 18.0, "exit_code": 124, "rank": None, "node": "node2"}
    verdict = "rank 1 on node2 stopped beating at step 63 (no heartbeat for 4.1 s); rank 0 waited in a collective"
    (row,) = slurm_attempts([start, {**end, "hung_rank": 1, "hung_step": 63, "verdict": verdict}], State.FAILED)
    assert (row["rank"], row["node"], row["code"]) == (1, "node2", 124), row
    (crashed,) = slurm_attempts([start, {**end, "exit_code": 3, "rank": 0, "node": "node1"}], State.FAILED)
    assert crashed["rank"] == 0, crashed


def test_the_hung_ranks_bar_is_hung_from_its_last_beat_not_training_to_the_end():
    from slurmgen.coordinator.web.timeline_svg import attempt_chart

    rank = {"rank": 1, "process": 0.5, "imports": 1.0, "rendezvous": 2.0, "first_step": 3.0, "end": 37.0}
    attempt = {"attempt": 1, "start": 0.0, "end": 37.0, "hung_rank": 1, "ranks": [{**rank, "last_at": 22.0}]}
    (row,) = attempt_chart(attempt, set())["rows"]
    names = [r["title"].split(":")[0] for r in row["rects"]]
    assert names[-2:] == ["rank 1 training", "rank 1 hung"], names
    assert row["rects"][-1]["title"].startswith("rank 1 hung: 22.00-37.00 s")
    healthy = attempt_chart({**attempt, "hung_rank": None}, set())["rows"][0]
    assert [r["title"].split(":")[0] for r in healthy["rects"]][-1] == "rank 1 training"


def test_a_program_that_took_no_step_ran_it_did_not_train():
    """A launch of a program that is not a trainer (`sleep`, a probe: no heartbeat, no step) drew
    a green "training" bar from its start to its end, and named its slowest rank's "training"."""
    from slurmgen.coordinator.web.timeline_svg import COLOUR, attempt_chart

    ranks = [{"rank": r, "process": 0.5 + r, "end": 30.0 + r} for r in (0, 1)]
    chart = attempt_chart(
        {"attempt": 1, "start": 0.0, "end": 32.0, "ranks": ranks, "slowest": {"end": {"rank": 1, "at": 31.0}}}, set()
    )
    assert [[r["title"].split(":")[0] for r in row["rects"]] for row in chart["rows"]] == [
        ["rank 0 launch", "rank 0 running"],
        ["rank 1 launch", "rank 1 running"],
    ]
    assert chart["rows"][0]["rects"][1]["colour"] == COLOUR["running"] != COLOUR["training"]
    assert chart["slowest"] == [{"phase": "running", "rank": 1, "at": 31.0}]


def test_a_cancelled_jobs_page_says_it_was_stopped_not_a_failure(served, tmp_path, monkeypatch):
    """A user's cancel reads as stopped (status has no first failure for it): the page still says so."""
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("78", "CANCELLED", "0:15")])
    seq = add_job(registry, tmp_path, "78")
    html = client.get(f"/ui/runs/{seq}").text
    assert '<h2 id="failure-title">Stopped</h2>' in html and "First failure" not in html, html
    # one wording, as every view says it; the raw code beside it, never as a failure
    assert "<p>stopped by you (Slurm: CANCELLED, exit code 143)</p>" in html, html
    assert "<dt>Exit / first failure</dt><dd>stopped by you (exit code 143)</dd>" in html, html


def test_a_sweep_without_out_dir_draws_each_tasks_curve_from_its_own_directory(served, tmp_path, monkeypatch):
    """Without --out-dir each task of a sweep writes under runs/job-<array id>_<task> (the trainer's
    default, train/config.default_out_dir): the chart has a series per task and the list its best loss."""
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("81", "RUNNING", "0:0", ArrayJobId="81", ArrayTaskId="0")])
    for task in range(2):
        environ = {"SLURM_ARRAY_JOB_ID": "81", "SLURM_ARRAY_TASK_ID": str(task), "SLURMGEN_SWEEP_INDEX": str(task)}
        root = tmp_path / "runs" / f"job-81_{task}" / "tracking"
        run = tracking.init(root, group=f"slurm-81_{task}", name=f"t{task}", environ=environ)
        for step in (1, 2):
            run.log("train", {"loss": 1.0 / (step + task)}, step=step)
        run.finish()
    seq = add_job(registry, tmp_path, "81", array=2, command=["python", "-m", "slurmgen.train"])
    curves = client.get(f"/ui/live/runs/{seq}/metrics").json()
    assert sorted(curves["metrics"]["loss"]) == ["train #0", "train #1"], curves
    assert curves["metrics"]["loss"]["train #1"] == [[1, 2], [0.5, 1 / 3]]
    listed = client.get("/ui/runs").text.split(f'data-run="{seq}"')[1].split("</tr>")[0]
    assert ">0.3333 (best of 2)</span>" in listed, listed


def test_the_trainer_under_a_shell_wrapper_has_its_curves(served, tmp_path, monkeypatch):
    """`bash -c 'cd . && python -m slurmgen.train --out-dir W'`: the trainer and its --out-dir are
    found inside the shell's script, so the job's record directory is known and its curves drawn."""
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("82", "RUNNING", "0:0")])
    run = tracking.init(tmp_path / "W" / "tracking", group="slurm-82", name="wrapped", environ={})
    for step in (10, 20):
        run.log("train", {"loss": 2.0 / step}, step=step)
    run.finish()
    wrapped = ["bash", "-c", "cd . && exec python -m slurmgen.train --out-dir 'W' --max-steps 20"]
    seq = add_job(registry, tmp_path, "82", command=wrapped)
    assert get_row(Registry.open(registry), seq)["record_dir"] == str(tmp_path / "W" / "tracking" / "slurm-82")
    curves = client.get(f"/ui/live/runs/{seq}/metrics").json()
    assert curves["metrics"]["loss"] == {"train": [[10, 20], [0.2, 0.1]]}, curves


def test_a_launch_that_resumed_another_launchs_checkpoint_draws_every_attempts_steps(served, tmp_path):
    """A second launch in the same --out-dir resumes the first one's checkpoint and goes on writing
    its run record (the checkpoint's group): the second launch's page draws that record, the steps
    its first attempt logged (the first launch's) and those of its second, by step."""
    from slurmgen.contract import envvars
    from slurmgen.runs.model import NewRun, add_run

    client, registry = served
    root = tmp_path / "runs" / "train" / "tracking"
    first = tracking.init(root, group="launch-A", name="r", environ={envvars.LAUNCH_ID: "A"})
    for step in range(10, 410, 10):  # attempt 1: 400 steps, a record every 10
        first.log("train", {"loss": 100.0 / step}, step=step)
    first.finish("failed", exit_code=1)
    second = tracking.init(root, group="launch-A", name="r", resume_step=400, environ={envvars.LAUNCH_ID: "B"})
    for step in (410, 420):
        second.log("train", {"loss": 0.2}, step=step)
    elsewhere = tracking.init(root, group="launch-C", name="r", environ={envvars.LAUNCH_ID: "C"})
    elsewhere.log("train", {"loss": 9.0}, step=5)
    with Registry.open(registry) as reg:
        info = {"command": ["python", "-m", "slurmgen.train"]}
        seq = add_run(
            reg, NewRun("launch", "B", "b", str(tmp_path), 1, 1, "launch-B", str(root / "launch-B"), info=info), T0
        )
    steps, losses = client.get(f"/ui/live/runs/{seq}/metrics").json()["metrics"]["loss"]["train"]
    assert steps == list(range(10, 430, 10)) and losses[0] == 10.0 and losses[-1] == 0.2
    listed = client.get("/ui/runs").text.split(f'data-run="{seq}"')[1].split("</tr>")[0]
    assert ">0.2</span>" in listed, listed


def test_the_list_names_the_hung_rank_of_a_slurm_job_once_its_page_or_status_read_it(served, tmp_path, monkeypatch):
    """Issue 33 item 11: the list said "124" for a Slurm job where a launch's row names its rank.
    `slurmgen status` (here: the job's page) keeps the first failure of the attempts record in the
    row: the hung rank and its node, with the watchers' verdict."""
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("84", "FAILED", "124:0", Restarts="0")])
    seq = add_job(registry, tmp_path, "84")
    verdict = "rank 1 on node2 stopped beating at step 220 (no heartbeat for 10.4 s)"
    end = {"event": "end", "job": "84", "attempt": 1, "time": T0, "exit_code": 124, "rank": 0, "node": "node2"}
    lines = [
        {"event": "start", "job": "84", "attempt": 1, "time": T0 - 20},
        {**end, "hung_rank": 1, "verdict": verdict},
    ]
    (tmp_path / "logs" / "slurmgen-84.attempts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with Registry.open(registry) as reg:  # known failed already: the list's refresh asks Slurm no more
        reg.remember_states({seq: ("FAILED", 124)})
    before = client.get("/ui/runs").text.split(f'data-run="{seq}"')[1].split("</tr>")[0]
    assert "rank 1" not in before
    assert client.get(f"/ui/runs/{seq}").status_code == 200
    listed = client.get("/ui/runs").text.split(f'data-run="{seq}"')[1].split("</tr>")[0]
    assert f"124 — rank 1 on node2 code 124 ({verdict})" in listed, listed


def test_a_cancelled_attempt_ends_when_slurm_says_the_job_ended(served, tmp_path, monkeypatch):
    """Issue 33 item 11: a cancel kills the batch shell before it writes its attempt's end line, so
    the attempt had no end on the page; it ends at Slurm's EndTime of the job."""
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("79", "CANCELLED", "0:15", Restarts="0")])
    seq = add_job(registry, tmp_path, "79")
    start = {"event": "start", "job": "79", "attempt": 1, "time": T0 - 20, "host": "node1"}
    (tmp_path / "logs" / "slurmgen-79.attempts.jsonl").write_text(json.dumps(start) + "\n")
    html = client.get(f"/ui/runs/{seq}").text
    rows = html.split('id="attempts-title"')[1].split("</tbody>")[0]
    ended = datetime.fromisoformat(END).strftime("%Y-%m-%d %H:%M:%S")
    assert rows.count("<tr>") == 2 and ended in rows, rows  # the header and attempt 1, which ended


def in_job_restarts(job: str) -> list[dict]:
    """The attempts record of a job with --restarts 2 --spare-nodes 1 (templates/run_slurm_restart.sh.j2):
    rank 1 killed on node2, node3 (the spare) took its node rank; then rank 0 crashed, same nodes."""
    base = {"job": job, "host": "node1"}
    return [
        {**base, "event": "start", "attempt": 1, "time": T0 - 60, "nodes": "node1,node2", "restart": 0},
        {
            **base,
            "event": "end",
            "attempt": 1,
            "time": T0 - 50,
            "exit_code": 137,
            "rank": 1,
            "node": "node2",
            "task": 1,
            "action": "restart",
            "exclude": "node2",
        },  # fmt: skip
        {**base, "event": "start", "attempt": 2, "time": T0 - 45, "nodes": "node1,node3", "restart": 1},
        {
            **base,
            "event": "end",
            "attempt": 2,
            "time": T0 - 30,
            "exit_code": 1,
            "rank": 0,
            "node": "node1",
            "task": 0,
            "action": "restart",
            "exclude": None,
        },  # fmt: skip
        {**base, "event": "start", "attempt": 3, "time": T0 - 28, "nodes": "node1,node3", "restart": 2},
    ]


def test_each_in_job_attempt_is_a_row_that_says_where_it_restarted_and_which_spare_took_over(
    served, tmp_path, monkeypatch
):
    """Issue 35: an in-job restart (a new job step in the same allocation, which Slurm's restart
    count never sees) is its own row: its cause, the failed rank and node, and where the next step
    went on, the spare that took the failed node's place named, as `slurmgen status` says it."""
    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("85", "RUNNING", "0:0", Restarts="0", NodeList="node[1-3]")])
    seq = add_job(registry, tmp_path, "85", nodes=2, restarts=2, spare_nodes=1)
    lines = "".join(json.dumps(x) + "\n" for x in in_job_restarts("85"))
    (tmp_path / "logs" / "slurmgen-85.attempts.jsonl").write_text(lines)
    html = client.get(f"/ui/runs/{seq}").text
    table = html.split('id="attempts-title"')[1].split("</tbody>")[0]
    rows = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r)).strip() for r in table.split("<tr>")[2:]]
    assert len(rows) == 3, rows
    assert rows[0].startswith("1 failed") and "killed by signal 9 (rank 1 on node2) 1 node2 137" in rows[0], rows
    assert rows[0].endswith("restarted on node1,node3 (node2 left out, spare node3 took its place)"), rows
    assert rows[1].startswith("2 failed") and "failed (rank 0 on node1) 0 node1 1" in rows[1], rows
    assert rows[1].endswith("restarted on node1,node3"), rows  # no node left out: the same nodes again
    assert rows[2].startswith("3 running") and rows[2].endswith("—"), rows


def test_a_launchs_warm_restarts_and_spare_host_moves_are_on_its_attempts(served):
    """Issue 35: what a launch recovered inside an attempt (a warm restart) or after it (a node
    moved to a spare host) is on the attempt's row, as the launcher kept it in the registry."""
    from slurmgen.runs.model import Failure, NewRun

    client, registry = served
    rec = Recorder(registry)
    run = rec.started(NewRun("launch", "L85", "warm", "/w", 2, 4, info={"hosts": ["h0", "h1"], "max_restarts": 3}))
    rec.attempt_started(run, 1)
    rec.recovered(run, 1, "warm restart 1: rank 3 started anew after rank 3 exited with code 137 on h1")
    rec.attempt_ended(run, 1, State.FAILED, Failure("lost the connection to h1", None, "h1", 255))
    rec.recovered(run, 1, "node 1 moved from h1 to the spare host h2")
    rec.attempt_started(run, 2)
    table = client.get(f"/ui/runs/{run}").text.split('id="attempts-title"')[1].split("</tbody>")[0]
    rows = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r)).strip() for r in table.split("<tr>")[2:]]
    assert rows[0].endswith(
        "warm restart 1: rank 3 started anew after rank 3 exited with code 137 on h1; "
        "node 1 moved from h1 to the spare host h2"
    ), rows
    assert rows[1].startswith("2 running") and rows[1].endswith("—"), rows


@pytest.mark.parametrize(("asked", "word"), [(True, "stopped by you"), (False, "preempted")])
def test_a_slurm_jobs_ranks_read_as_the_job_ended_not_failed_exit_75(served, tmp_path, monkeypatch, asked, word):
    """Issue 33, item 10: after "Checkpoint and stop" the job read "stopped by you" but its ranks
    table "failed (exit 75)": the launcher records each rank's 75 as a failure, and a Slurm job's
    attempts record says no state. The last attempt ends as the job did; a rank's 75 in it is the
    stop's (or the preemption's), never a failure."""
    from slurmgen.contract.states import STOP_ASKED

    client, registry = served
    fake_slurm(tmp_path, monkeypatch, [scontrol_line("78", "FAILED", "75:0")])
    seq = add_job(registry, tmp_path, "78", **({STOP_ASKED: {"time": T0, "by": "page"}} if asked else {}))
    launcher = [
        {"event": "end", "rank": r, "attempt": 1, "time": T0 + 14, "status": "failed", "code": 75, "by": "launcher"}
        for r in range(3)
    ]
    (tmp_path / "logs" / TIMELINE_NAME.format(job_id="78")).write_text(
        "".join(json.dumps(e) + "\n" for e in [*timeline_events(), *launcher])
    )
    html = client.get(f"/ui/runs/{seq}").text
    table = html.split('id="rank-table"')[1].split("</table>")[0]
    assert "failed" not in table and table.count(f"<td>{word}</td>") == 3, table
