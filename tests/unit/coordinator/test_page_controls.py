"""The page's controls of issue 22 part 3 beyond cancel and checkpoint, through the real app
(TestClient, a real registry and coordinator store): requeue a Slurm job, stop an SSH launch or
a group's run (the coordinator taking the stop request), a group's limits in the settings form,
its command and env, deleting it, forgetting a lost worker. Each is a POST behind the session
and CSRF value answered with a redirect to a page; each button that cannot apply is disabled
with its reason. In Chromium on the test cluster:
tests/integration/web/test_page_controls_browser.py."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slurmgen.contract.states import STOPPED_BY_YOU, State  # noqa: E402
from slurmgen.coordinator.group_runs import GroupRuns  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.runs import stop_request  # noqa: E402
from slurmgen.runs.model import Failure, NewRun, Recorder, add_run, end_run, find_run, get_row  # noqa: E402
from slurmgen.runs.registry import JobRecord, Registry  # noqa: E402

TOKEN = "t0ken-for-control-tests"
HOSTILE = "<img src=x onerror=alert(1)>"
ORIGIN = {"Origin": "http://testserver"}
AGENT_TIMEOUT = 10.0


@pytest.fixture
def app(tmp_path):
    registry = tmp_path / "state" / "jobs.sqlite"
    stop_file = stop_request.stop_file(registry, "L1")
    with Registry.open(registry, create=True) as reg:
        reg.add(
            JobRecord(
                "4242", "train-slurm", "/w/a", 100.0, None, "FAILED", 1, {"nodes": 1, "gpus": 1, "command": ["true"]}
            )
        )
        add_run(
            reg,
            NewRun("launch", "L1", "live-launch", "/w", 2, 4, info={"pid": os.getpid(), "stop_file": str(stop_file)}),
            time.time(),
        )
        ended = add_run(reg, NewRun("launch", "L0", "old-launch", "/w", 2, 4, info={"pid": 1, "stop_file": "/x"}), 50.0)
        end_run(reg, ended, State.FAILED, 1, Failure("rank 3 exited 1", 3, "node2", 1), 60.0)
    stop_request.prepare(stop_file)
    now = [1000.0]
    store = Store(tmp_path / "c.db")
    coordinator = Coordinator(
        store, agent_timeout=AGENT_TIMEOUT, clock=lambda: now[0], runs=GroupRuns(Recorder(registry))
    )
    with TestClient(create_app(coordinator, TOKEN), base_url="http://testserver") as client:
        client.post("/ui/login", data={"token": TOKEN}, headers=ORIGIN)
        client.now = now
        yield client
    store.close()


def api(client, method, path, body=None):
    return client.request(method, path, json=body, headers={"Authorization": f"Bearer {TOKEN}"})


def csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([A-Za-z0-9_-]+)"', html).group(1)


def post(client, path: str, data: dict | None = None, page: str = "/ui/"):
    """A form's POST as the browser sends it; the 303's target."""
    reply = client.post(
        path, data={"csrf": csrf(client.get(page).text), **(data or {})}, headers=ORIGIN, follow_redirects=False
    )
    assert reply.status_code == 303, reply.text
    return reply.headers["location"]


def seq_of(client, key: str) -> str:
    """The row number of the run whose key (job id, launch id) is `key`, from the runs list."""
    for seq, row in re.findall(r'<tr data-run="(\d+)"[^>]*>(.*?)</tr>', client.get("/ui/runs").text, re.S):
        if f">{key}<" in row:
            return seq
    raise AssertionError(f"no run {key} in the list")


def button(html: str, label: str) -> str:
    return re.search(rf"<button [^>]*>{re.escape(label)}</button>", html).group(0)


# ---- requeue -------------------------------------------------------------------------------------
def test_requeue_is_offered_for_a_failed_job_only_and_posts_through_the_jobs_layer(app, monkeypatch):
    from slurmgen.coordinator.web import run_detail
    from slurmgen.jobs import stopping

    seq = seq_of(app, "4242")
    monkeypatch.setattr(run_detail, "slurm_status", lambda reg, s: {"state": "RUNNING"})
    html = app.get(f"/ui/runs/{seq}").text
    why = "the job is RUNNING, not ended: only a failed or preempted job is requeued"
    assert f'disabled title="{why}" aria-describedby="why-requeue"' in button(html, "Requeue")
    assert f'<p class="hint why" id="why-requeue">Requeue: {why}</p>' in html
    monkeypatch.setattr(run_detail, "slurm_status", lambda reg, s: {"state": "FAILED"})
    assert "disabled" not in button(app.get(f"/ui/runs/{seq}").text, "Requeue")
    assert app.post(f"/ui/runs/{seq}/requeue", headers=ORIGIN).status_code == 403  # no CSRF value
    asked = []
    monkeypatch.setattr(
        stopping,
        "requeue",
        lambda runner, reg, record: asked.append(record.job_id) or (True, f"requeued job {HOSTILE}"),
    )
    assert post(app, f"/ui/runs/{seq}/requeue", page=f"/ui/runs/{seq}") == f"/ui/runs/{seq}"  # POST-redirect-GET
    assert asked == ["4242"]
    html = app.get(f"/ui/runs/{seq}").text
    assert "requeued job &lt;img src=x onerror=alert(1)&gt;" in html and HOSTILE not in html


def test_requeue_refusals_by_slurm_state():
    from slurmgen.jobs.stopping import requeue_refusal

    assert (
        requeue_refusal("FAILED") is None
        and requeue_refusal("PREEMPTED") is None
        and requeue_refusal("NODE_FAIL") is None
    )
    assert (
        requeue_refusal("COMPLETED")
        == "the job is COMPLETED: only a failed or preempted job is requeued (submit it again)"
    )
    assert requeue_refusal("PENDING") == "the job is PENDING, not ended: only a failed or preempted job is requeued"
    assert requeue_refusal(None).startswith("Slurm no longer knows the job")


def launcher_taking_stops(app, key: str) -> tuple[threading.Thread, list]:
    """A started thread that does what launch `key`'s launcher loop does (launch/fanout.py): take
    a stop order from its channel, within 5 s; what it took goes into the returned list."""
    with Registry.open(app.app.state.coordinator.runs.recorder.path) as reg:
        stop_file = stop_request.stop_file(reg.path, key)
    taken: list = []

    def launcher() -> None:
        deadline = time.monotonic() + 5
        while not taken and time.monotonic() < deadline:
            taken.append(stop_request.take(stop_file)) if stop_file.exists() else time.sleep(0.02)

    thread = threading.Thread(target=launcher)
    thread.start()
    return thread, taken


# ---- stopping a launch -------------------------------------------------------------------------
def test_stop_a_running_launch_through_its_channel_and_not_an_ended_one(app):
    live, old = seq_of(app, "L1"), seq_of(app, "L0")
    assert "disabled" not in button(app.get(f"/ui/runs/{live}").text, "Stop launch")
    html = app.get(f"/ui/runs/{old}").text
    assert 'disabled title="the launch has ended (failed)"' in button(html, "Stop launch")
    assert "Requeue" not in html  # only a Slurm job's
    thread, taken = launcher_taking_stops(app, "L1")
    assert post(app, f"/ui/runs/{live}/stop", page=f"/ui/runs/{live}") == f"/ui/runs/{live}"
    thread.join()
    assert taken == [f"{STOPPED_BY_YOU} from the page"]
    assert "launch L1: the launcher is stopping every rank on every node" in app.get(f"/ui/runs/{live}").text
    assert post(app, f"/ui/runs/{old}/stop", page=f"/ui/runs/{old}") == f"/ui/runs/{old}"
    assert "launch L0 was not stopped: the launch has ended (failed)" in app.get(f"/ui/runs/{old}").text


# ---- stopping a group's run: the same entry (jobs/control.py), the coordinator takes it -----------
def started_group(app, name: str) -> int:
    """A group started on gn6's two workers: its run's row number in the registry (key NAME.1)."""
    register(app)
    api(app, "POST", "/api/groups", {"name": name})
    api(app, "POST", "/api/workers/move", {"workers": ["gn6-0", "gn6-1"], "group": name})
    api(app, "PATCH", f"/api/groups/{name}/config", {"argv": ["sleep", "60"]})
    assert api(app, "POST", f"/api/groups/{name}/start").status_code == 200
    with Registry.open(app.app.state.coordinator.runs.recorder.path) as reg:
        return find_run(reg, "group", f"{name}.1")


def group_run_row(app, seq: int):
    with Registry.open(app.app.state.coordinator.runs.recorder.path) as reg:
        return get_row(reg, seq)


def test_a_group_run_is_stopped_from_its_run_page_through_the_runs_controls(app):
    """The run page's Stop of a group's run writes its stop request (jobs/control.perform); the
    server's own ticker takes it and stops the group as its group page's Stop does."""
    seq = started_group(app, "exp4")
    stop_file = Path(group_run_row(app, seq)["info"]["stop_file"])
    assert stop_file.name == "group-exp4.1.stop" and stop_file.parent.stat().st_mode & 0o777 == 0o700
    assert "disabled" not in button(app.get(f"/ui/runs/{seq}").text, "Stop")
    assert post(app, f"/ui/runs/{seq}/stop", page=f"/ui/runs/{seq}") == f"/ui/runs/{seq}"
    html = app.get(f"/ui/runs/{seq}").text
    assert "group run exp4.1: the coordinator (slurmgen serve) is stopping every rank on every node" in html
    group = api(app, "GET", "/api/groups/exp4").json()["group"]
    assert (group["state"], group["reason"]) == ("stopped", f"{STOPPED_BY_YOU} from the page")
    assert group_run_row(app, seq)["state"] == State.STOPPED.value
    assert not stop_file.exists()
    assert 'disabled title="the group run has ended (stopped by you)"' in button(html, "Stop")
    assert post(app, f"/ui/runs/{seq}/stop", page=f"/ui/runs/{seq}") == f"/ui/runs/{seq}"
    said = "group run exp4.1 was not stopped: the group run has ended (stopped by you)"
    assert said in app.get(f"/ui/runs/{seq}").text


def test_the_json_api_stops_a_group_run_and_a_restarted_group_keeps_its_runs_channel(app):
    seq = started_group(app, "exp5")
    reply = api(app, "POST", f"/api/runs/{seq}/actions", {"action": "stop"})
    assert reply.status_code == 200 and reply.json()["said"].startswith("group run exp5.1: the coordinator")
    assert api(app, "GET", "/api/groups/exp5").json()["group"]["reason"] == f"{STOPPED_BY_YOU} through the API"
    reply = api(app, "POST", f"/api/runs/{seq}/actions", {"action": "cancel"})
    assert (reply.status_code, reply.json()["detail"]) == (
        409,
        f"run {seq} is not a Slurm job of this machine's registry: nothing was sent",
    )
    # A new start is a new run with its own channel; the old run's request cannot reach it.
    assert api(app, "POST", "/api/groups/exp5/start").status_code == 200
    with Registry.open(app.app.state.coordinator.runs.recorder.path) as reg:
        second = find_run(reg, "group", "exp5.2")
    assert Path(group_run_row(app, second)["info"]["stop_file"]).name == "group-exp5.2.stop"
    assert api(app, "POST", f"/api/runs/{seq}/actions", {"action": "stop"}).status_code == 409
    assert api(app, "GET", "/api/groups/exp5").json()["group"]["state"] == "starting"
    assert api(app, "POST", f"/api/runs/{second}/actions", {"action": "stop"}).status_code == 200
    assert api(app, "GET", "/api/groups/exp5").json()["group"]["state"] == "stopped"


def test_slurmgen_cancel_of_a_group_runs_key_stops_the_group_through_the_same_entry(app, capsys):
    from helpers import run as run_cli

    seq = started_group(app, "exp6")
    registry = str(app.app.state.coordinator.runs.recorder.path)
    code, out, _ = run_cli(capsys, "cancel", "exp6.1", "--registry", registry, "--json")
    assert code == 0 and json.loads(out) == {
        "job": "exp6.1",
        "kind": "group",
        "stopping": True,
        "said": f"group run exp6.1: the coordinator (slurmgen serve) is stopping every rank on every node "
        f"({STOPPED_BY_YOU})",
    }
    group = api(app, "GET", "/api/groups/exp6").json()["group"]
    assert (group["state"], group["reason"]) == ("stopped", f"{STOPPED_BY_YOU} with slurmgen cancel")
    assert group_run_row(app, seq)["state"] == State.STOPPED.value
    code, out, _ = run_cli(capsys, "cancel", "exp6.1", "--registry", registry)
    assert (code, out) == (1, "group run exp6.1 was not stopped: the group run has ended (stopped by you)\n")


# ---- the same controls as JSON (run_api.py) ----------------------------------------------------
def test_the_json_api_requeues_and_stops_by_the_pages_rules_with_clear_refusals(app, monkeypatch):
    from slurmgen.jobs import stopping

    slurm, live, old = (int(seq_of(app, key)) for key in ("4242", "L1", "L0"))
    asked: list = []
    monkeypatch.setattr(
        stopping, "requeue", lambda runner, reg, record: asked.append(record.job_id) or (True, "requeued job 4242")
    )
    reply = api(app, "POST", f"/api/runs/{slurm}/actions", {"action": "requeue"})
    assert (reply.status_code, reply.json()) == (200, {"run": slurm, "action": "requeue", "said": "requeued job 4242"})
    assert asked == ["4242"]
    refused = "job 4242 was not requeued: the job is RUNNING, not ended: only a failed or preempted job is requeued"
    monkeypatch.setattr(stopping, "requeue", lambda runner, reg, record: (False, refused))
    reply = api(app, "POST", f"/api/runs/{slurm}/actions", {"action": "requeue"})
    assert (reply.status_code, reply.json()) == (409, {"detail": refused})
    # Who may do what: a launch is not requeued, a Slurm job not "stopped", an ended launch not at all.
    reply = api(app, "POST", f"/api/runs/{live}/actions", {"action": "requeue"})
    assert (reply.status_code, reply.json()["detail"]) == (
        409,
        f"run {live} is 'launch', not a Slurm job: only a Slurm job is requeued",
    )
    assert api(app, "POST", f"/api/runs/{slurm}/actions", {"action": "stop"}).status_code == 409
    reply = api(app, "POST", f"/api/runs/{old}/actions", {"action": "stop"})
    assert (reply.status_code, reply.json()["detail"]) == (
        409,
        "launch L0 was not stopped: the launch has ended (failed)",
    )
    reply = api(app, "POST", "/api/runs/999/actions", {"action": "stop"})
    assert (reply.status_code, reply.json()["detail"]) == (
        404,
        "there is no run 999 in this machine's registry: nothing was stopped",
    )
    assert asked == ["4242"]  # no refused call reached Slurm
    # A running launch is stopped through its channel, as the page's button does.
    thread, taken = launcher_taking_stops(app, "L1")
    reply = api(app, "POST", f"/api/runs/{live}/actions", {"action": "stop"})
    thread.join()
    assert reply.status_code == 200 and reply.json()["said"].startswith(
        "launch L1: the launcher is stopping every rank"
    )
    assert taken == [f"{STOPPED_BY_YOU} through the API"]


def test_the_json_api_cancels_and_checkpoints_a_slurm_job_only_while_it_runs(app, monkeypatch):
    from slurmgen.jobs import stopping

    slurm, live = int(seq_of(app, "4242")), int(seq_of(app, "L1"))
    sent: list = []

    def cancel(runner, reg, record, task, signal):
        sent.append(signal)
        return {"said": f"sent {signal} to 4242"} if signal else {"said": "job 4242: CANCELLED"}

    monkeypatch.setattr(stopping, "cancel", cancel)
    monkeypatch.setattr(stopping, "keep_from_requeue", lambda runner, reg, record, by: sent.append(by))
    reply = api(app, "POST", f"/api/runs/{slurm}/actions", {"action": "checkpoint"})
    assert (reply.status_code, reply.json()["said"]) == (200, "sent USR2 to 4242")  # the preemption signal
    assert api(app, "POST", f"/api/runs/{slurm}/actions", {"action": "cancel"}).json()["said"] == "job 4242: CANCELLED"
    assert sent == ["through the API", "USR2", None]  # a checkpoint and stop is kept from requeueing first
    monkeypatch.setattr(
        stopping, "cancel", lambda *a: {"said": "job 4242 had already ended: FAILED", "already_ended": True}
    )
    reply = api(app, "POST", f"/api/runs/{slurm}/actions", {"action": "cancel"})
    assert (reply.status_code, reply.json()["detail"]) == (409, "job 4242 had already ended: FAILED")
    reply = api(app, "POST", f"/api/runs/{live}/actions", {"action": "cancel"})
    assert reply.status_code == 409 and "not a Slurm job" in reply.json()["detail"]


def test_the_json_api_names_the_bad_field_and_wants_the_token(app):
    live = int(seq_of(app, "L1"))
    bad = api(app, "POST", f"/api/runs/{live}/actions", {"action": HOSTILE})
    assert bad.status_code == 422
    (error,) = bad.json()["detail"]
    assert error["loc"] == ["body", "action"] and "'requeue', 'stop', 'cancel' or 'checkpoint'" in error["msg"], error
    (error,) = api(app, "POST", f"/api/runs/{live}/actions", {"action": "stop", "force": True}).json()["detail"]
    assert error["loc"] == ["body", "force"], error
    (error,) = api(app, "POST", "/api/runs/L1/actions", {"action": "stop"}).json()["detail"]
    assert error["loc"] == ["path", "seq"], error
    # The page's session cookie is no API token; a missing token is refused before the body is read.
    assert app.post(f"/api/runs/{live}/actions", json={"action": "stop"}, headers=ORIGIN).status_code == 401
    assert app.post(f"/api/runs/{live}/actions", content=b"{not json", headers=ORIGIN).status_code == 401
    with Registry.open(app.app.state.coordinator.runs.recorder.path) as reg:
        assert not stop_request.stop_file(reg.path, "L1").exists()  # nothing was asked of the launcher


# ---- groups and workers ------------------------------------------------------------------------
def register(app, host: str = "gn6", workers: int = 2) -> None:
    report = {"host": host, "instance": "i1", "workers": [{"id": i, "state": "idle"} for i in range(workers)]}
    assert api(app, "POST", "/api/agents/heartbeat", report).status_code == 200


def test_settings_form_sets_max_restarts_heartbeat_timeout_and_stop_grace(app):
    assert api(app, "POST", "/api/groups", {"name": "exp1"}).status_code == 201
    html = app.get("/ui/groups/exp1/settings").text
    for field, value in (("max_restarts", "0"), ("heartbeat_timeout", "120"), ("stop_grace", "10")):
        assert re.search(rf'<input id="{field}" name="{field}" [^>]*value="{value}"', html), field
    page = "/ui/groups/exp1/settings"
    assert post(app, page, {"max_restarts": "3", "heartbeat_timeout": "soon", "stop_grace": "5"}, page) == page
    html = app.get(page).text
    assert "heartbeat_timeout: expected a number of seconds, e.g. 30 or 2.5 (got &#39;soon&#39;)" in html
    assert re.search(r'id="max_restarts" [^>]*value="3"', html), "the refused form keeps what was typed"
    post(app, page, {"max_restarts": "1001", "heartbeat_timeout": "0.5", "stop_grace": "5"}, page)
    html = app.get(page).text  # the bounds are GroupConfig's, told before the server is asked
    assert (
        '<p id="heartbeat_timeout-error" class="field-error" role="alert">'
        "heartbeat_timeout: expected at least 1 (got &#39;0.5&#39;)" in html
    )
    assert "max_restarts: expected 0 to 1000 (got &#39;1001&#39;)" in html
    assert post(app, page, {"max_restarts": "3", "heartbeat_timeout": "45", "stop_grace": "2.5"}, page) == "/ui/"
    config = api(app, "GET", "/api/groups/exp1").json()["group"]["config"]
    assert (config["max_restarts"], config["heartbeat_timeout"], config["stop_grace"]) == (3, 45.0, 2.5)


def test_settings_form_sets_the_strategy_and_refuses_an_unknown_one(app):
    assert api(app, "POST", "/api/groups", {"name": "exp1"}).status_code == 201
    page = "/ui/groups/exp1/settings"
    assert re.search(r'<option value="ddp" selected>ddp</option><option value="fsdp">fsdp</option>', app.get(page).text)
    assert post(app, page, {"strategy": "fsdp"}, page) == "/ui/"
    assert api(app, "GET", "/api/groups/exp1").json()["group"]["config"]["strategy"] == "fsdp"
    assert '<option value="fsdp" selected>' in app.get(page).text
    assert post(app, page, {"strategy": "<b>zero</b>"}, page) == page
    html = app.get(page).text
    assert "strategy" in html and "<b>zero</b>" not in html  # the server's refusal, escaped
    assert api(app, "GET", "/api/groups/exp1").json()["group"]["config"]["strategy"] == "fsdp"


def test_group_page_shows_command_and_env_escaped_and_deletes_an_idle_group(app):
    api(app, "POST", "/api/groups", {"name": "exp2"})
    api(
        app,
        "PATCH",
        "/api/groups/exp2/config",
        {"argv": ["python", "-c", HOSTILE], "env": {"NOTE": HOSTILE, "API_TOKEN": "s3cret"}, "max_restarts": 2},
    )
    html = app.get("/ui/groups/exp2").text
    assert "<code>python -c &#39;&lt;img src=x onerror=alert(1)&gt;&#39;</code>" in html
    assert "<code>NOTE=&lt;img src=x onerror=alert(1)&gt;</code>" in html and HOSTILE not in html
    assert "API_TOKEN=&lt;hidden&gt;" in html and "s3cret" not in html
    assert "<dt>Max restarts</dt><dd>2</dd>" in html
    assert "disabled" not in button(html, "Delete group")
    assert post(app, "/ui/groups/exp2/delete", page="/ui/groups/exp2") == "/ui/"
    # What was done is a status line; a refusal an alert (styled apart: app.css .notice.done).
    assert '<p class="notice done" role="status">Deleted group &#39;exp2&#39;' in app.get("/ui/").text
    assert api(app, "GET", "/api/groups/exp2").status_code == 404


def test_a_running_group_cannot_be_deleted_and_only_a_lost_worker_is_forgotten(app):
    register(app)
    api(app, "POST", "/api/groups", {"name": "exp3"})
    api(app, "POST", "/api/workers/move", {"workers": ["gn6-0", "gn6-1"], "group": "exp3"})
    api(app, "PATCH", "/api/groups/exp3/config", {"argv": ["sleep", "60"]})
    assert api(app, "POST", "/api/groups/exp3/start").status_code == 200
    html = app.get("/ui/groups/exp3").text
    assert 'disabled title="the group is starting: stop it before deleting it"' in button(html, "Delete group")
    assert (
        post(app, "/ui/groups/exp3/delete", page="/ui/groups/exp3") == "/ui/groups/exp3"
    )  # posted anyway: the API's 409
    assert (
        '<p class="notice" role="alert">Could not delete group &#39;exp3&#39;: '
        "group &#39;exp3&#39; is starting; stop it first" in app.get("/ui/groups/exp3").text
    )

    api(app, "POST", "/api/groups/exp3/stop")
    register(app, "gn7", workers=1)
    html = app.get("/ui/").text
    assert 'disabled title="its agent still reports it (idle): only a lost worker can be forgotten"' in re.search(
        r'<button [^>]*aria-label="Forget worker gn7-0"[^>]*>', html
    ).group(0)
    assert post(app, "/ui/workers/gn7-0/forget") == "/ui/"
    assert (
        '<p class="notice" role="alert">Did not forget worker &#39;gn7-0&#39;: its agent still reports it'
        in app.get("/ui/").text
    )
    app.now[0] += AGENT_TIMEOUT + 1  # every agent silent: its workers are lost
    html = app.get("/ui/").text
    assert "disabled" not in re.search(r'<button [^>]*aria-label="Forget worker gn7-0"[^>]*>', html).group(0)
    assert post(app, "/ui/workers/gn7-0/forget") == "/ui/"
    assert '<p class="notice done" role="status">Forgot worker &#39;gn7-0&#39;.' in app.get("/ui/").text
    assert [w["name"] for w in api(app, "GET", "/api/workers").json()] == ["gn6-0", "gn6-1"]
