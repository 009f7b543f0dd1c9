"""The runs list of the coordinator's page (issue 22 part 2) on a real SQLite registry holding a
run of each kind: rows newest first, the filters, escaping, the live JSON behind the session."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slurmgen.contract.states import State  # noqa: E402
from slurmgen.coordinator.group_runs import GroupRuns  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.coordinator.web import runs_page  # noqa: E402
from slurmgen.runs.model import Failure, NewRun, Recorder, add_run, end_run, start_attempt  # noqa: E402
from slurmgen.runs.registry import JobRecord, Registry  # noqa: E402

TOKEN = "t0ken-for-runs-page"
HOSTILE = "<img src=x onerror=alert(1)>"


def fill(path, now: float = 1_000_000.0) -> None:
    """A Slurm job (oldest), an SSH launch that failed on rank 3, a group named HOSTILE (newest)."""
    with Registry.open(path, create=True) as reg:
        reg.add(
            JobRecord(
                "4242",
                "train-slurm",
                "/w/a",
                now - 300,
                None,
                "RUNNING",
                None,
                {"nodes": 2, "gpus": 2, "log_dir": "/w/a/logs", "command": ["true"], "time_limit": "60"},
            )
        )
        reg.remember_states({}, attempt_started={1: now - 120})  # its attempt's start, as Slurm told it
        launch = add_run(reg, NewRun("launch", "20261125-1", "sweep-launch", "/w", 2, 4), now - 200)
        start_attempt(reg, launch, 1, now - 200)
        end_run(reg, launch, State.FAILED, 1, Failure("rank 3 exited 1", 3, "node2", 1), now - 100)
        group = add_run(reg, NewRun("group", f"{HOSTILE}.1", HOSTILE, "/w", 1, 2), now - 50)
        start_attempt(reg, group, 1, now - 50)
        reg.db.commit()


@pytest.fixture
def client(tmp_path):
    registry = tmp_path / "jobs.sqlite"
    fill(registry)
    store = Store(tmp_path / "c.db")
    coordinator = Coordinator(store, runs=GroupRuns(Recorder(registry)))
    with TestClient(create_app(coordinator, TOKEN), base_url="http://testserver") as c:
        c.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://testserver"})
        yield c
    store.close()


def names(html: str) -> list[str]:
    return re.findall(r'<td class="run-name">(?:<a [^>]*>)?(.*?)(?:</a>)?</td>', html)


def test_every_run_of_the_registry_newest_first_with_its_facts(client):
    html = client.get("/ui/runs").text
    assert names(html) == ["&lt;img src=x onerror=alert(1)&gt;", "sweep-launch", "train-slurm"]
    assert HOSTILE not in html  # autoescaped: shown as text, never as an element
    row = re.search(r'<tr data-run="\d+" data-kind="launch">(.*?)</tr>', html, re.S).group(1)
    assert "failed" in row and "<td>2x2</td>" in row and "1 — rank 3 on node2 code 1 (rank 3 exited 1)" in row
    assert "1 min 40 s" in row  # ended: its elapsed time is fixed
    slurm = re.search(r'data-kind="slurm">(.*?)</tr>', html, re.S).group(1)
    assert "<td>2x2</td>" in slurm and " / 1 h 00 min</span>" in slurm  # elapsed / the limit it was submitted with
    assert " / " not in re.search(r"<td>(?:<span[^>]*>)?([^<]*)</span></td>", row).group(1)  # a launch has no limit
    assert 'href="/ui/runs"' in client.get("/ui/").text  # linked from the groups page's header


@pytest.mark.parametrize(
    "query, expected",
    [
        ("kind=slurm", ["train-slurm"]),
        ("state=failed", ["sweep-launch"]),
        ("kind=group&state=running", ["&lt;img src=x onerror=alert(1)&gt;"]),
        ("kind=launch&state=running", []),
    ],
)
def test_filters_by_kind_and_state(client, query, expected):
    assert names(client.get(f"/ui/runs?{query}").text) == expected


def test_the_state_filter_offers_the_states_a_run_can_be_in_and_not_idle(client):
    """idle is a coordinator group's or a worker's word (nothing to run), never a run's (issue 33 item 11)."""
    picker = client.get("/ui/runs").text.split('<select id="filter-state" name="state">')[1].split("</select>")[0]
    offered = re.findall(r'<option value="([a-z]+)"', picker)
    assert "idle" not in offered and {"pending", "running", "failed", "stopped", "lost"} <= set(offered), offered
    assert "state: expected one of pending," in client.get("/ui/runs?state=idle").text


def test_a_bad_filter_is_named_and_ignored(client):
    html = client.get("/ui/runs?kind=<b>x</b>").text
    assert "kind: expected one of slurm, launch, group (got &#39;&lt;b&gt;x&lt;/b&gt;&#39;)" in html
    assert len(names(html)) == 3


def test_live_json_needs_the_session_and_follows_the_filter(client, tmp_path):
    live = client.get("/ui/live/runs?kind=launch").json()
    assert live["count"] == 1 and live["fields"][0][1] == "1 min 40 s"
    shape = client.get("/ui/live/runs").json()["shape"]
    with Registry.open(tmp_path / "jobs.sqlite") as reg:  # a new run changes the shape: the page redraws
        add_run(reg, NewRun("launch", "20261125-2", "another", "/w", 1, 1), 1_000_001.0)
        reg.db.commit()
    assert client.get("/ui/live/runs").json()["shape"] != shape
    client.cookies.clear()
    assert client.get("/ui/live/runs").status_code == 401
    assert client.get("/ui/runs", follow_redirects=False).headers["location"] == "/ui/login?next=/ui/runs"


def test_no_registry_yet_is_an_empty_list_with_the_reason(tmp_path):
    rows, counts, error = runs_page.read_runs(tmp_path / "none.sqlite", [], [])
    assert rows == [] and counts == {"total": 0, "active": 0} and "no job registry" in error


@pytest.mark.parametrize(
    "started, ended, now, text",
    [(None, None, 5, "—"), (0, 12, 99, "12 s"), (0, None, 185, "3 min 05 s"), (0, None, 3720, "1 h 02 min")],
)
def test_elapsed(started, ended, now, text):
    assert runs_page.elapsed(started, ended, now) == text


def _seq(client, kind: str) -> str:
    return re.search(rf'<tr data-run="(\d+)" data-kind="{kind}">', client.get("/ui/runs").text).group(1)


def test_a_launch_page_shows_its_attempts_and_failure_and_no_slurm_control(client):
    seq = _seq(client, "launch")
    html = client.get(f"/ui/runs/{seq}").text
    assert "sweep-launch" in html and "1 — rank 3 on node2 code 1 (rank 3 exited 1)" in html
    assert ">Cancel</button>" not in html and ">Checkpoint and stop</button>" not in html
    assert ">Stop launch</button>" in html
    # a POST anyway (no JavaScript needed to bypass a disabled button) is refused, after a redirect
    csrf = re.search(r'name="csrf" value="([A-Za-z0-9_-]+)"', html).group(1)
    reply = client.post(
        f"/ui/runs/{seq}/cancel", data={"csrf": csrf}, headers={"Origin": "http://testserver"}, follow_redirects=False
    )
    assert reply.status_code == 303 and reply.headers["location"] == f"/ui/runs/{seq}"
    assert "is not a Slurm job of this machine&#39;s registry: nothing was sent" in client.get(f"/ui/runs/{seq}").text


def test_run_actions_need_csrf(client):
    seq = _seq(client, "launch")
    assert client.post(f"/ui/runs/{seq}/cancel", headers={"Origin": "http://testserver"}).status_code == 403


def test_a_slurm_job_page_shows_pending_reason_failure_log_and_enables_what_applies(client, monkeypatch):
    """Slurm's answer is canned here (commands.status against a real Slurm: tests/integration)."""
    from slurmgen.coordinator.web import run_detail

    seq = _seq(client, "slurm")
    monkeypatch.setattr(
        run_detail,
        "slurm_status",
        lambda reg, s: {
            "state": "PENDING",
            "pending": "requeued, eligible at 15:00:00 (in 30 s)",
            "first_failure": None,
        },
    )
    html = client.get(f"/ui/runs/{seq}").text
    assert "requeued, eligible at 15:00:00 (in 30 s)" in html and "(Slurm: PENDING)" in html
    assert '<button type="submit">Cancel</button>' in html
    assert 'title="the job is PENDING, not running: nothing to save">Checkpoint and stop' in html
    monkeypatch.setattr(
        run_detail,
        "slurm_status",
        lambda reg, s: {
            "state": "FAILED",
            "first_failure": {"state": "FAILED", "rank": 1, "node": "node2", "exit_code": 3, "what": HOSTILE},
            "log_tail": ["Traceback (most recent call last):", HOSTILE],
        },
    )
    html = client.get(f"/ui/runs/{seq}").text
    assert "FAILED, rank 1 on node2, exit code 3" in html and "Traceback (most recent call last):" in html
    assert HOSTILE not in html and "not readable" not in html
    assert 'disabled title="the job has ended (FAILED)">Cancel' in html
    monkeypatch.setattr(
        run_detail,
        "slurm_status",
        lambda reg, s: {  # the rank's log is on a node we cannot read
            "state": "FAILED",
            "first_failure": {"state": "FAILED", "rank": 1, "node": "node2", "exit_code": 3, "what": None},
            "log_tail": [],
        },
    )
    assert "The rank's log is not readable from this machine." in client.get(f"/ui/runs/{seq}").text
    monkeypatch.setattr(
        run_detail,
        "slurm_status",
        lambda reg, s: {  # no rank to blame (a lost node): no rank's log
            "state": "NODE_FAIL",
            "first_failure": {"state": "NODE_FAIL", "rank": None, "node": "node2", "exit_code": None, "what": None},
            "log_tail": [],
        },
    )
    html = client.get(f"/ui/runs/{seq}").text
    assert "NODE_FAIL on node2" in html and "not readable" not in html


def test_an_unknown_run_answers_404_with_a_page_saying_so_where_it_was_asked(client):
    """Not a redirect to the list (issue 33 item 11): the address stays, its status says it is
    wrong, and the page says which run there is not and links to those there are."""
    reply = client.get("/ui/runs/99999", follow_redirects=False)
    assert reply.status_code == 404 and "location" not in reply.headers
    assert '<h1 id="no-run-title">No such run</h1>' in reply.text and "There is no run 99999" in reply.text
    assert 'href="/ui/runs">All runs</a>' in reply.text


def test_a_slurm_jobs_attempts_file_becomes_attempt_rows_with_causes():
    from slurmgen.coordinator.web import run_detail

    # Numbered as the file numbers them, as the timeline does (contract/attempts.py: from 1); here
    # the record of attempt 1 was lost with a log directory the batch nodes do not share.
    rows = run_detail.slurm_attempts(
        [
            {"event": "start", "attempt": 2, "time": 100.0, "host": "node1"},
            {
                "event": "end",
                "attempt": 2,
                "time": 160.0,
                "host": "node1",
                "exit_code": 3,
                "rank": 5,
                "node": "node2",
                "task": 5,
            },
            {"event": "start", "attempt": 3, "time": 200.0, "host": "node1"},
        ]
    )
    assert [(r["number"], r["state"], r["rank"], r["node"], r["code"]) for r in rows] == [
        (2, "failed", 5, "node2", 3),
        (3, "running", None, "node1", None),
    ]
    assert rows[0]["cause"] == "exit 3 (rank 5 on node2)" and rows[1]["ended"] is None


def test_a_slurm_jobs_attempts_speak_the_runs_states_not_the_files_event_words():
    from slurmgen.contract.states import State
    from slurmgen.coordinator.web.run_detail import slurm_attempts

    def start(n):
        return {"event": "start", "attempt": n, "time": 100.0 * n, "host": "node1"}

    def end(n, code):
        return {"event": "end", "attempt": n, "time": 100.0 * n + 50, "exit_code": code}

    # 1 checkpointed on the warning signal, 2 lost with its node (no end line), 3 failed, 4 done.
    record = [start(1), end(1, 75), start(2), start(3), end(3, 1), start(4), end(4, 0)]
    assert [r["state"] for r in slurm_attempts(record, State.SUCCEEDED)] == ["preempted", "lost", "failed", "succeeded"]
    # A cancel ends the job with the 143 of its TERM: the job's own state names the last attempt.
    assert [r["state"] for r in slurm_attempts([start(1), end(1, 143)], State.STOPPED)] == ["stopped"]
    assert [r["state"] for r in slurm_attempts([start(1)], State.STOPPED)] == ["stopped"]  # killed before its end line
    assert [r["state"] for r in slurm_attempts([start(1)], State.RUNNING)] == ["running"]
    # ...and its cause: a person's "checkpoint and stop" read "preempted (rank 0 on node1)".
    stopped = {**end(1, 75), "rank": 0, "node": "node1"}
    assert [(r["cause"], r["rank"]) for r in slurm_attempts([start(1), stopped], State.STOPPED)] == [
        ("stopped by you", 0)
    ]
    assert [r["state"] for r in slurm_attempts([start(1), end(1, 0), {**start(2), "event": "skipped"}], None)] == [
        "succeeded",
        "skipped",
    ]  # a requeue after the end ran nothing


def test_an_ended_run_without_an_end_time_shows_no_growing_elapsed_time():
    row = {
        "seq": 1,
        "kind": "slurm",
        "job_id": "7",
        "name": "j",
        "state": "stopped",
        "nodes": 1,
        "ranks": 1,
        "started": 0.0,
        "ended": None,
        "attempts": 0,
        "failure": None,
        "last_exit": 143,
    }
    assert runs_page.run_view(row, 500.0)["elapsed"] == "—"
    assert runs_page.run_view({**row, "state": "running"}, 500.0)["elapsed"] == "8 min 20 s"
