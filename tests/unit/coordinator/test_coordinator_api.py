"""The coordinator's API over a real SQLite file, driven by simulated agent heartbeats.

Fast and in-process (Starlette's TestClient, a fake clock); the real agents, processes and
nodes are in tests/integration/test_coordinator_cluster.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from helpers import AUTH, TOKEN, Clock, beat, running, setup_group
from helpers import run as run_cli

from slurmgen.contract import exitcodes  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402


@pytest.fixture
def api(tmp_path):
    clock = Clock()
    store = Store(tmp_path / "c.db")
    client = TestClient(create_app(Coordinator(store, agent_timeout=10, clock=clock), TOKEN))
    client.clock, client.db = clock, tmp_path / "c.db"
    yield client
    store.close()


def group_state(api):
    return api.get("/api/groups/exp1", headers=AUTH).json()["group"]


def test_no_or_wrong_token_is_401_and_changes_nothing(api):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        assert api.post("/api/groups", headers=headers, json={"name": "x"}).status_code == 401
        assert api.get("/api/workers", headers=headers).status_code == 401
        assert (
            api.post(
                "/api/agents/heartbeat",
                headers=headers,
                json={"host": "gn6", "instance": "i", "workers": [{"id": 0, "state": "idle"}]},
            ).status_code
            == 401
        )
    assert api.get("/api/groups", headers=AUTH).json() == []
    assert api.get("/api/workers", headers=AUTH).json() == []
    assert api.get("/api/health").status_code == 200


def test_security_headers(api):
    r = api.get("/api/groups", headers=AUTH)
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["cache-control"] == "no-store"


def test_bad_bodies_are_422_naming_the_field(api):
    setup_group(api)
    r = api.put("/api/groups/exp1/config", headers=AUTH, json={"master": "gn6-0"})
    assert r.status_code == 422 and "give 'gn6'" in r.json()["detail"]
    r = api.put("/api/groups/exp1/config", headers=AUTH, json={"env": {"WORLD_SIZE": "9"}})
    assert r.status_code == 422 and "WORLD_SIZE" in str(r.json()["detail"])
    r = api.put("/api/groups/exp1/config", headers=AUTH, json={"world_size": 5})
    assert r.status_code == 422 and "5 processes" in r.json()["detail"] and "only 4" in r.json()["detail"]
    assert api.post("/api/groups", headers=AUTH, json={"name": "a/b"}).status_code == 422
    assert group_state(api)["config"]["master"] == "gn7"  # nothing changed


def test_start_runs_ranks_and_fails_as_one(api):
    setup_group(api)
    start = api.post("/api/groups/exp1/start", headers=AUTH)
    assert start.status_code == 200 and start.json()["state"] == "starting"
    assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 409
    moved = api.post("/api/workers/move", headers=AUTH, json={"workers": ["gn6-0"], "group": None})
    assert moved.status_code == 409 and "running" in moved.json()["detail"]

    orders = beat(api, "gn7", 0, 1)
    assert [(o["worker"], o["rank"], o["env"]["NODE_RANK"], o["env"]["MASTER_ADDR"]) for o in orders["start"]] == [
        (0, 0, "0", "gn7"),
        (1, 1, "0", "gn7"),
    ]
    assert orders["start"][0]["env"]["SLURMGEN_GROUP"] == "exp1"
    beat(api, "gn6", 0, 1)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    assert group_state(api)["state"] == "running"

    # gn6-1 (rank 3) exits 3: the group fails with that code, everyone else is told to stop.
    beat(
        api,
        "gn6",
        running("exp1", 1, 0)[0],
        {"id": 1, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 3},
    )
    g = group_state(api)
    assert (g["state"], g["exit_code"]) == ("failed", 3) and "rank 3 (gn6-1)" in g["reason"]
    assert [s["worker"] for s in beat(api, "gn7", *running("exp1", 1, 0, 1))["stop"]] == [0, 1]
    # A restarted server (a new process on the same file) has it all back.
    again = TestClient(create_app(Coordinator(Store(api.db), clock=api.clock), TOKEN))
    detail = again.get("/api/groups/exp1", headers=AUTH).json()
    assert detail["group"]["state"] == "failed" and detail["attempts"][0]["exit_codes"] == {"3": 3}


def test_each_rank_says_its_own_end_the_failed_one_its_cause_the_stopped_ones_after_whom(api):
    """Issue 33: after rank 3 failed, the ranks the server stopped because of it exited 143; the API
    says so per rank (stopped_after 3, a cause of their own), not only the failing rank's text."""
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    failed = {"id": 1, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 3}
    beat(api, "gn6", {"id": 0, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 0}, failed)
    stopped = [{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 143} for i in (0, 1)]
    beat(api, "gn7", *stopped)
    reason = group_state(api)["reason"]
    workers = {w["name"]: w for w in api.get("/api/groups/exp1", headers=AUTH).json()["workers"]}
    seen = {n: (w["exit_code"], w["stopped"], w["stopped_after"], w["cause"]) for n, w in workers.items()}
    assert seen == {
        "gn6-0": (0, False, None, None),  # exited 0 before rank 3 failed: its own clean end
        "gn6-1": (3, False, None, reason),  # the failure, with its cause
        "gn7-0": (143, False, 3, f"stopped (after rank 3): {reason}"),
        "gn7-1": (143, False, 3, f"stopped (after rank 3): {reason}"),
    }
    # A stop asked for: every rank it stopped says so, none "after" a rank.
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 2, 0, 1))
    beat(api, "gn6", *running("exp1", 2, 0, 1))
    api.post("/api/groups/exp1/stop", headers=AUTH)
    for host in ("gn6", "gn7"):
        beat(
            api, host, *[{"id": i, "state": "exited", "group": "exp1", "attempt": 2, "exit_code": 143} for i in (0, 1)]
        )
    workers = api.get("/api/groups/exp1", headers=AUTH).json()["workers"]
    assert {(w["stopped"], w["stopped_after"], w["cause"]) for w in workers} == {(True, None, "stopped by you")}


def test_max_restarts_starts_a_fresh_attempt_after_the_old_ranks_are_gone(api):
    setup_group(api, max_restarts=1)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(
        api, "gn6", *running("exp1", 1, 0), {"id": 1, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 1}
    )
    g = group_state(api)
    assert (g["state"], g["attempt"], g["restarts"]) == ("starting", 2, 1)
    orders = beat(api, "gn7", *running("exp1", 1, 0, 1))
    assert orders["start"] == [] and len(orders["stop"]) == 2  # old ranks first
    exited = [{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 143} for i in (0, 1)]
    assert [o["attempt"] for o in beat(api, "gn7", *exited)["start"]] == [2, 2]


def test_silent_agent_fails_the_group_as_lost(api):
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    api.clock.now += 8
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    api.clock.now += 3  # gn6 silent for 11 s > 10 s
    api.app.state.coordinator.tick()
    g = group_state(api)
    assert (g["state"], g["exit_code"]) == ("failed", 255) and "gn6" in g["reason"]
    workers = {w["name"]: w["state"] for w in api.get("/api/workers", headers=AUTH).json()}
    assert workers["gn6-0"] == "lost" and workers["gn7-0"] == "running"
    assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 409  # cannot start on a lost worker
    # Every answer tells the agents the timeout, so that a cut-off one knows when to stop its ranks.
    assert beat(api, "gn7", *running("exp1", 1, 0, 1))["agent_timeout"] == 10


def test_stop_and_logs(api):
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    line = {"worker": 0, "group": "exp1", "attempt": 1, "rank": 0, "time": 1.0, "line": "hello"}
    r = api.post(
        "/api/agents/heartbeat",
        headers=AUTH,
        json={"host": "gn7", "instance": "gn7", "workers": running("exp1", 1, 0, 1), "lines": [line]},
    )
    assert r.status_code == 200
    logs = api.get("/api/groups/exp1/logs", headers=AUTH, params={"rank": 0}).json()
    assert [(ln["worker"], ln["line"]) for ln in logs] == [("gn7-0", "hello")]
    more = [{**line, "line": f"l{i}"} for i in range(5)]
    api.post(
        "/api/agents/heartbeat",
        headers=AUTH,
        json={"host": "gn7", "instance": "gn7", "workers": running("exp1", 1, 0, 1), "lines": more},
    )
    tail = api.get("/api/groups/exp1/logs", headers=AUTH, params={"limit": 2, "tail": True})
    assert [ln["line"] for ln in tail.json()] == ["l3", "l4"]
    assert tail.headers["X-Lines-Skipped"] == "4"  # "hello", l0-l2: a follower says it skipped them
    newer = api.get(
        "/api/groups/exp1/logs", headers=AUTH, params={"limit": 2, "tail": True, "after": tail.json()[0]["id"]}
    )
    assert [ln["line"] for ln in newer.json()] == ["l4"] and newer.headers["X-Lines-Skipped"] == "0"
    after = api.get("/api/groups/exp1/logs", headers=AUTH, params={"limit": 2, "after": logs[0]["id"]}).json()
    assert [ln["line"] for ln in after] == ["l0", "l1"]
    assert api.post("/api/groups/exp1/stop", headers=AUTH).json()["state"] == "stopping"  # gn7's ranks run
    assert len(beat(api, "gn7", *running("exp1", 1, 0, 1))["stop"]) == 2


def test_lines_let_go_unread_make_the_skipped_count_a_lower_bound(api, monkeypatch):
    """Past the lines a group keeps, a reader that fell behind is told its count is "at least"
    (issue 33 item 8: a flood's lines were never dropped silently)."""
    from slurmgen.coordinator import store

    monkeypatch.setattr(store, "LOG_LINES_KEPT", 3)
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    line = {"worker": 0, "group": "exp1", "attempt": 1, "rank": 0, "time": 1.0}
    report = {"host": "gn7", "instance": "gn7", "workers": running("exp1", 1, 0, 1)}
    api.post("/api/agents/heartbeat", headers=AUTH, json={**report, "lines": [{**line, "line": "first"}]})
    seen = api.get("/api/groups/exp1/logs", headers=AUTH).json()[-1]["id"]
    more = [{**line, "line": f"l{i}"} for i in range(10)]
    api.post("/api/agents/heartbeat", headers=AUTH, json={**report, "lines": more})
    api.app.state.coordinator.tick()  # keeps the newest 3 of 11: l0-l6 go unread
    tail = api.get("/api/groups/exp1/logs", headers=AUTH, params={"limit": 2, "tail": True, "after": seen})
    assert [ln["line"] for ln in tail.json()] == ["l8", "l9"] and tail.headers["X-Lines-Skipped"] == "1+"
    newest = tail.json()[-1]["id"]
    assert (
        api.get("/api/groups/exp1/logs", headers=AUTH, params={"tail": True, "after": newest}).headers[
            "X-Lines-Skipped"
        ]
        == "0"
    )


def test_second_live_agent_for_a_host_is_refused(api):
    beat(api, "gn6", 0)
    r = api.post(
        "/api/agents/heartbeat",
        headers=AUTH,
        json={"host": "gn6", "instance": "other", "workers": [{"id": 0, "state": "idle"}]},
    )
    assert r.status_code == 409 and "one agent per node" in r.json()["detail"]


def test_client_errors_are_one_line_naming_field_and_value(api):
    from slurmgen.coordinator.client import Client, ClientError

    setup_group(api)
    client = Client("http://testserver", TOKEN)
    client.http = api  # Starlette's TestClient is an httpx.Client
    api.headers["Authorization"] = f"Bearer {TOKEN}"
    with pytest.raises(ClientError) as e:
        client.configure("exp1", {"world_size": 0})
    assert (e.value.status, e.value.exit_code) == (422, 2)
    assert str(e.value) == "world_size: Input should be greater than or equal to 1 (got 0)"
    client.start("exp1")
    with pytest.raises(ClientError, match="already starting") as e:
        client.start("exp1")
    assert e.value.status == 409
    bad = Client("http://testserver", "wrong")
    bad.http = type(api)(api.app, headers={"Authorization": "Bearer wrong"})
    with pytest.raises(ClientError, match="refused the token"):
        bad.groups()


def test_patch_changes_only_the_fields_given_and_put_replaces(api):
    """The CLI merged, the API replaced: a partial PUT reset the command and the master."""
    setup_group(api, max_restarts=2)
    r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"world_size": 2, "env": {"A": "1"}})
    assert r.status_code == 200, r.text
    config = r.json()["config"]
    assert (config["world_size"], config["env"], config["master"], config["argv"], config["max_restarts"]) == (
        2,
        {"A": "1"},
        "gn7",
        ["python", "train.py"],
        2,
    )
    r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"world_size": None, "master_port": None})
    assert (r.json()["config"]["world_size"], r.json()["config"]["master_port"]) == (None, 29500), "null: the default"
    r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"world_size": 0, "nonsense": 1})
    assert r.status_code == 422
    assert {tuple(e["loc"]) for e in r.json()["detail"]} == {("body", "world_size"), ("body", "nonsense")}
    assert api.get("/api/groups/exp1", headers=AUTH).json()["group"]["config"]["argv"] == ["python", "train.py"]
    r = api.put("/api/groups/exp1/config", headers=AUTH, json={"argv": ["x"]})
    assert r.json()["config"]["master"] is None and r.json()["config"]["max_restarts"] == 0, "PUT is the whole config"
    assert api.patch("/api/groups/nope/config", headers=AUTH, json={}).status_code == 404


def test_cli_group_config_sends_only_the_flags_given(api, monkeypatch):
    from typer.testing import CliRunner

    from slurmgen.cli import app
    from slurmgen.coordinator import client as client_module

    setup_group(api, env={"KEEP": "1"})
    sent = []
    api.headers["Authorization"] = f"Bearer {TOKEN}"
    real = api.request

    def recording(method, url, **kwargs):
        sent.append((method, url, kwargs.get("json")))
        return real(method, url, **kwargs)

    monkeypatch.setattr(api, "request", recording)
    monkeypatch.setattr(client_module.httpx, "Client", lambda **kwargs: api)
    result = CliRunner().invoke(
        app,
        ["group", "config", "exp1", "--world-size", "2", "--server", "http://testserver"],
        env={"SLURMGEN_TOKEN": TOKEN},
    )
    assert result.exit_code == 0, result.output
    assert sent == [("PATCH", "/api/groups/exp1/config", {"world_size": 2})]
    config = api.get("/api/groups/exp1", headers=AUTH).json()["group"]["config"]
    assert (config["world_size"], config["env"], config["master"]) == (2, {"KEEP": "1"}, "gn7")


def test_no_token_is_401_before_the_body_is_parsed(api):
    """Malformed JSON without a token got 422 (the body parsed first)."""
    junk = {"Content-Type": "application/json"}
    assert api.post("/api/groups", content=b"{not json", headers=junk).status_code == 401
    assert (
        api.post("/api/groups", content=b"{not json", headers={**junk, "Authorization": "Bearer wrong"}).status_code
        == 401
    )
    assert api.post("/api/groups", content=b"{not json", headers={**junk, **AUTH}).status_code == 422
    assert api.get("/api/health").status_code == 200


def test_bodies_over_the_limit_get_413_before_parsing(api):
    from slurmgen.coordinator import server

    big = b"x" * (server.PAGE_BODY_LIMIT + 1)
    assert (
        api.post("/ui/login", content=big, headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code
        == 413
    )

    def chunks():  # no Content-Length: counted as it streams in
        for _ in range(40):
            yield b"y" * 65536

    assert (
        api.post("/api/groups", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}).status_code
        == 413
    )
    huge = b'{"name": "' + b"a" * server.API_BODY_LIMIT + b'"}'
    assert (
        api.post("/api/groups", content=huge, headers={**AUTH, "Content-Type": "application/json"}).status_code == 413
    )


def test_a_refused_value_is_not_echoed_whole(api):
    """A 50 MB group name came back twice in the 422."""
    name = "-" + "a" * 500_000
    r = api.post("/api/groups", headers=AUTH, json={"name": name})
    assert r.status_code == 422 and len(r.content) < 2000, len(r.content)
    assert r.json()["detail"][0]["loc"] == ["body", "name"] and "500001 characters" in r.json()["detail"][0]["input"]


def test_no_docs_pages_and_the_schema_needs_the_token(api):
    """/docs loaded Swagger UI from a CDN (blank here); /redoc and /openapi.json were open."""
    assert api.get("/docs").status_code == 404
    assert api.get("/redoc").status_code == 404
    assert api.get("/openapi.json").status_code == 401
    schema = api.get("/openapi.json", headers=AUTH)
    assert schema.status_code == 200 and "patch" in schema.json()["paths"]["/api/groups/{name}/config"]


def test_closing_answers_open_long_polls_at_once():
    """Shutdown waited for the agents' 25 s polls, then cancelled them with an ERROR line."""
    import asyncio

    from slurmgen.coordinator.changes import Changes

    async def scenario() -> float:
        changes = Changes()
        changes.bind(asyncio.get_running_loop())
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiter = asyncio.create_task(changes.wait(0, 25))
        await asyncio.sleep(0.05)
        changes.close()
        await waiter
        assert await changes.wait(0, 25) == 0  # a poll after the close returns at once too
        return loop.time() - started

    assert asyncio.run(scenario()) < 1


def test_an_attempt_keeps_the_run_records_its_ranks_announced(api, tmp_path):
    from slurmgen import tracking

    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    with tracking.init(tmp_path, group="exp1", place={"rank": 0, "world_size": 1}, environ={}) as run:
        run.log(type="train", metrics={"loss": 2.0}, step=7)
    ranks = running("exp1", 1, 0, 1)
    ranks[0]["runs"] = [str(run.dir)]
    beat(api, "gn7", *ranks)
    beat(api, "gn7", *ranks)  # announced again: kept once
    attempts = api.get("/api/groups/exp1", headers=AUTH).json()["attempts"]
    assert attempts[0]["runs"] == [str(run.dir)]
    api.post("/api/groups/exp1/stop", headers=AUTH)
    beat(api, "gn7", *[{**r, "state": "exited", "exit_code": 143} for r in ranks])
    beat(api, "gn6", *[{**r, "state": "exited", "exit_code": 143} for r in running("exp1", 1, 0, 1)])
    assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 200
    assert api.get("/api/groups/exp1", headers=AUTH).json()["attempts"][1]["runs"] == [], "a new attempt starts bare"


def test_a_database_from_before_run_records_gets_the_column(tmp_path):
    import sqlite3

    old = sqlite3.connect(tmp_path / "old.db")
    old.executescript(
        "CREATE TABLE attempts (grp TEXT NOT NULL, number INTEGER NOT NULL, state TEXT NOT NULL, "
        "started REAL NOT NULL, ended REAL, reason TEXT, exit_code INTEGER, plan TEXT NOT NULL, "
        "exit_codes TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (grp, number));"
        "INSERT INTO attempts (grp, number, state, started, plan) VALUES ('g', 1, 'failed', 1.0, '{}');"
    )
    old.commit()
    old.close()
    store = Store(tmp_path / "old.db")
    assert store.attempt("g", 1)["runs"] == []
    store.close()


def test_each_row_shape_of_the_store_is_its_tables_columns(tmp_path):
    """The TypedDicts the type checker holds the store's rows to name the table's columns, in order."""
    from slurmgen.coordinator import store as rows

    store = Store(tmp_path / "c.db")
    shapes = {"workers": rows.WorkerRow, "groups": rows.GroupRow, "attempts": rows.AttemptRow, "logs": rows.LineRow}
    for table, shape in shapes.items():
        columns = [r["name"] for r in store.db.execute(f"PRAGMA table_info({table})")]
        assert columns == list(shape.__annotations__), table
    store.close()


def test_a_hung_rank_is_stopped_after_its_stack_and_the_reason_says_where_it_was_stuck(tmp_path):
    """gn6-1 (rank 3) reports a stopped rank past the limit: the server names it, asks gn6's
    agent for its stack with the stop order (and no one else's), and tells where it was stuck
    once the agent reports the frames: the group, its attempt and the run registry's row."""
    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.runs.model import Recorder, attempts_of, list_rows
    from slurmgen.runs.registry import Registry

    store = Store(tmp_path / "c.db")
    api = TestClient(
        create_app(Coordinator(store, clock=Clock(), runs=GroupRuns(Recorder(tmp_path / "r.sqlite"))), TOKEN)
    )
    setup_group(api, heartbeat_timeout=4.0)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    frozen = {**running("exp1", 1, 1)[0], "beat": {"age": 4.1, "step": 20, "stopped": True}}
    beat(api, "gn6", *running("exp1", 1, 0), frozen)
    g = group_state(api)
    assert (g["state"], g["exit_code"]) == ("failed", 124) and g["reason"].startswith(
        "rank 3 on gn6 stopped beating"
    ), g
    orders = beat(api, "gn6", *running("exp1", 1, 0), frozen)  # the orders that follow the verdict
    assert [(s["worker"], s["stack"]) for s in orders["stop"]] == [(0, False), (1, True)]
    assert [s["stack"] for s in beat(api, "gn7", *running("exp1", 1, 0, 1))["stop"]] == [False, False]
    told = {**frozen, "stack": ["/x/train.py:12 train_loop", "/x/train.py:30 <module>"]}
    beat(api, "gn7", *running("exp1", 1, 0), {**told, "id": 1, "pid": 101})  # gn7-1 was not asked
    assert group_state(api)["reason"] == g["reason"]
    beat(api, "gn6", *running("exp1", 1, 0), told)
    assert group_state(api)["reason"] == g["reason"] + "; stuck in /x/train.py:12 in train_loop()"
    attempt = api.get("/api/groups/exp1", headers=AUTH).json()["attempts"][0]
    assert attempt["reason"].endswith("in train_loop()")
    store.close()
    with Registry.open(tmp_path / "r.sqlite") as reg:
        (row,) = list_rows(reg)
        assert row["failure"]["cause"] == attempt["reason"] and row["failure"]["code"] == 124, row
        assert [a["cause"] for a in attempts_of(reg, row["seq"])] == [attempt["reason"]]
        # the hung rank and its node, as the cause names them (issue 33: the row said rank "—")
        assert [(a["rank"], a["node"], a["code"]) for a in attempts_of(reg, row["seq"])] == [(3, "gn6", 124)]
        assert (row["failure"]["rank"], row["failure"]["node"]) == (3, "gn6")


def test_cli_group_wait_exits_with_the_groups_code(api, monkeypatch, capsys):
    from slurmgen.coordinator import client as client_module

    setup_group(api)
    api.headers["Authorization"] = f"Bearer {TOKEN}"
    monkeypatch.setattr(client_module.httpx, "Client", lambda **kwargs: api)
    monkeypatch.setenv("SLURMGEN_TOKEN", TOKEN)

    def wait():
        return run_cli(capsys, "group", "wait", "exp1", "--timeout", "0.2", "--server", "http://testserver")

    assert wait()[:2] == (0, "group exp1: idle\n")  # never started: nothing to wait for
    assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 200
    assert wait() == (exitcodes.HUNG, "", "slurmgen: error: group exp1: still starting after 0.2 s\n")
    assert api.post("/api/groups/exp1/stop", headers=AUTH).status_code == 200
    assert wait()[:2] == (exitcodes.TERMINATED, "group exp1: stopped - stopped by you\n")


def test_each_start_of_a_group_is_a_run_whose_attempts_count_from_1(tmp_path):
    """Two starts, the second restarted once: the second run (exp1.2) has attempts 1 and 2 in the
    registry, its ranks are told attempt 1 then 2, and the API and page say attempt 2 of that
    run, not the group's third start (issue 33, item 2)."""
    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.coordinator.web.views import attempt_text, attempts_view
    from slurmgen.runs.model import Recorder, attempts_of, list_rows
    from slurmgen.runs.registry import Registry

    store = Store(tmp_path / "c.db")
    api = TestClient(
        create_app(Coordinator(store, clock=Clock(), runs=GroupRuns(Recorder(tmp_path / "r.sqlite"))), TOKEN)
    )
    setup_group(api, max_restarts=1)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    api.post("/api/groups/exp1/stop", headers=AUTH)
    for host in ("gn7", "gn6"):
        beat(
            api, host, *[{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 143} for i in (0, 1)]
        )
    assert api.post("/api/groups/exp1/start", headers=AUTH).json()["run_attempt"] == 1
    told = [o["env"]["SLURMGEN_ATTEMPT"] for o in beat(api, "gn7", 0, 1)["start"]]
    assert told == ["1", "1"]
    beat(api, "gn6", 0, 1)
    beat(api, "gn7", *running("exp1", 2, 0, 1))
    beat(
        api, "gn6", *running("exp1", 2, 0), {"id": 1, "state": "exited", "group": "exp1", "attempt": 2, "exit_code": 1}
    )
    detail = api.get("/api/groups/exp1", headers=AUTH).json()
    g = detail["group"]
    assert (g["attempt"], g["restarts"], g["run_attempt"]) == (3, 1, 2)
    assert attempt_text(g, {"max_restarts": 1}) == "2 (restart 1 of 1)"
    assert [a["number"] for a in attempts_view(detail["attempts"])] == [2, 1, 1]
    exited = [{"id": i, "state": "exited", "group": "exp1", "attempt": 2, "exit_code": 143} for i in (0, 1)]
    assert [o["env"]["SLURMGEN_ATTEMPT"] for o in beat(api, "gn7", *exited)["start"]] == ["2", "2"]
    store.close()
    with Registry.open(tmp_path / "r.sqlite") as reg:
        second, first = list_rows(reg)
        assert (first["job_id"], second["job_id"]) == ("exp1.1", "exp1.2")
        assert [a["number"] for a in attempts_of(reg, first["seq"])] == [1]
        assert [(a["number"], a["state"]) for a in attempts_of(reg, second["seq"])] == [(1, "failed"), (2, "running")]


def test_a_stop_reads_stopping_until_the_ranks_are_gone_then_stopped_by_you(api):
    """Issue 33, item 10: the group said `stopped` while its ranks ran on for ~5 s, and the ranks
    that died of the stop (the trainer exits 75 on TERM) read as red "exited 75"."""
    from slurmgen.coordinator.web import views

    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    assert api.post("/api/groups/exp1/stop", headers=AUTH).json()["state"] == "stopping"
    beat(api, "gn7", *[{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 75} for i in (0, 1)])
    assert group_state(api)["state"] == "stopping"  # gn6's ranks still run
    beat(api, "gn6", *[{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 143} for i in (0, 1)])
    detail = api.get("/api/groups/exp1", headers=AUTH).json()
    assert (detail["group"]["state"], detail["group"]["reason"]) == ("stopped", "stopped by you")
    assert {views.worker_state(w) for w in detail["workers"]} == {"stopped by you"}
    assert views.group_view(detail["group"], [])["state"] == "stopped by you"
    assert [a["state"] for a in views.attempts_view(detail["attempts"])] == ["stopped by you"]
    # a rank that failed on its own still reads as its exit
    assert views.worker_state({"state": "exited", "exit_code": 3, "stopped": False}) == "exited 3"


def test_a_runs_stop_request_reaches_the_attempt_it_is_on_after_a_restart(tmp_path):
    """A run's Stop from outside the server (jobs/control.py: the run page, `slurmgen cancel
    GROUP.N`, the JSON API) is a request in the run's stop channel, taken by the server's tick;
    after a restart the run (exp1.1) is on the group's second attempt, which is the one stopped."""
    import threading
    import time

    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.jobs import control
    from slurmgen.runs.model import Recorder, attempts_of, find_run, get_row
    from slurmgen.runs.registry import Registry

    registry = tmp_path / "r.sqlite"
    coordinator = Coordinator(Store(tmp_path / "c.db"), clock=Clock(), runs=GroupRuns(Recorder(registry)))
    api = TestClient(create_app(coordinator, TOKEN))
    setup_group(api, max_restarts=1)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(
        api, "gn6", *running("exp1", 1, 0), {"id": 1, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 1}
    )
    assert (group_state(api)["restarts"], group_state(api)["state"]) == (1, "starting")
    coordinator.tick()  # no request: nothing happens
    assert group_state(api)["state"] == "starting"
    done: list = []

    def stopper() -> None:
        with Registry.open(registry) as reg:
            run = control.read(reg, find_run(reg, "group", "exp1.1"))
            done.append(control.perform(reg, run, control.RunControl.STOP, None, "from a test"))

    thread = threading.Thread(target=stopper)
    thread.start()
    while thread.is_alive():  # the server's ticker, twice a second in `slurmgen serve`
        coordinator.tick()
        time.sleep(0.02)
    assert done[0].done, done
    g = group_state(api)
    assert (g["state"], g["reason"], g["attempt"]) == ("stopped", "stopped by you from a test", 2)
    with Registry.open(registry) as reg:
        seq = find_run(reg, "group", "exp1.1")
        assert get_row(reg, seq)["state"] == "stopped"
        assert [(a["number"], a["state"]) for a in attempts_of(reg, seq)] == [(1, "failed"), (2, "stopped")]
    assert not (tmp_path / "control" / "group-exp1.1.stop").exists()
    coordinator.store.close()


def test_a_lost_node_moves_to_a_spare_node_which_the_registry_and_the_attempts_name(tmp_path):
    """Issue 35, item 2 for groups: with `spare_nodes 1`, gn8 (last in the order gn7, gn6, gn8)
    runs nothing; when gn6's agent goes silent the restart puts node 1 (ranks 2 and 3) on gn8,
    the rest as it was. A failure with no spare heard restarts where it ran; gn6 back, it is the
    spare that takes the next failed node."""
    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.coordinator.web.views import attempts_view
    from slurmgen.runs.model import Recorder, find_run, get_row, recoveries_of
    from slurmgen.runs.registry import Registry

    coordinator = Coordinator(
        Store(tmp_path / "c.db"), agent_timeout=10, clock=Clock(), runs=GroupRuns(Recorder(tmp_path / "r.sqlite"))
    )
    api = TestClient(create_app(coordinator, TOKEN))
    api.clock = coordinator.clock
    beat(api, "gn8", 0, 1)
    setup_group(api, max_restarts=3, spare_nodes=1)
    more = api.post("/api/workers/move", headers=AUTH, json={"workers": ["gn8-0", "gn8-1"], "group": "exp1"})
    assert more.status_code == 200, more.text
    api.post("/api/groups/exp1/start", headers=AUTH)
    assert [r["worker"] for r in api.get("/api/groups/exp1/ranks", headers=AUTH).json()] == [
        "gn7-0",
        "gn7-1",
        "gn6-0",
        "gn6-1",
    ]
    assert beat(api, "gn8", 0, 1)["start"] == []  # the spare stays idle
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    api.clock.now += 8
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn8", 0, 1)
    api.clock.now += 3  # gn6 silent for 11 s
    coordinator.tick()
    moved = "node 1 moved from gn6 to the spare host gn8"
    g = group_state(api)
    assert (g["state"], g["attempt"], g["restarts"]) == ("starting", 2, 1) and g["reason"].endswith(f"; {moved}"), g
    orders = beat(api, "gn8", 0, 1)["start"]
    assert [
        (o["worker"], o["rank"], o["env"]["NODE_RANK"], o["env"]["WORLD_SIZE"], o["env"]["MASTER_ADDR"]) for o in orders
    ] == [
        (0, 2, "1", "4", "gn7"),
        (1, 3, "1", "4", "gn7"),
    ]
    exited = [{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 143} for i in (0, 1)]
    assert [o["rank"] for o in beat(api, "gn7", *exited)["start"]] == [0, 1]
    ranks = api.get("/api/groups/exp1/ranks", headers=AUTH).json()  # the page's rank table: where they run now
    assert [(r["worker"], r["rank"], r["node_rank"]) for r in ranks][2:] == [("gn8-0", 2, 1), ("gn8-1", 3, 1)]
    detail = api.get("/api/groups/exp1", headers=AUTH).json()
    assert [(a["number"], a["moved"]) for a in detail["attempts"]] == [(1, []), (2, [moved])]
    assert [a["moved"] for a in attempts_view(detail["attempts"])] == [[moved], []]  # the page's attempts, newest first

    # gn8's rank 3 is killed while gn6 (the spare now) is lost: the restart stays where it ran.
    def fails(host, attempt, code=137):
        ended = [{"id": 0, "state": "exited", "group": "exp1", "attempt": attempt, "exit_code": 143}]
        beat(api, "gn7", *running("exp1", attempt, 0, 1))
        beat(api, host, *ended, {"id": 1, "state": "exited", "group": "exp1", "attempt": attempt, "exit_code": code})
        return group_state(api)

    g = fails("gn8", 2)
    assert (g["attempt"], g["restarts"]) == (3, 2) and "moved" not in g["reason"], g
    assert [o["rank"] for o in beat(api, "gn8", *[{"id": i, "state": "exited"} for i in (0, 1)])["start"]] == [2, 3]
    # gn6 is back (an idle spare) when gn8 fails again: node 1 moves to it.
    beat(api, "gn6", 0, 1)
    g = fails("gn8", 3)
    assert g["reason"].endswith("; node 1 moved from gn8 to the spare host gn6"), g
    coordinator.store.close()
    with Registry.open(tmp_path / "r.sqlite") as reg:
        info = get_row(reg, find_run(reg, "group", "exp1.1"))["info"]
        assert recoveries_of(info) == {2: [moved], 4: ["node 1 moved from gn8 to the spare host gn6"]}


def test_a_node_lost_after_the_restart_began_is_swapped_for_a_spare_inside_the_attempt(tmp_path):
    """When gn6's node dies, gn7's ranks fail first (exit 1: their peer is gone), which names no
    node to move; the restart starts on gn7 and gn6 again. Once gn6's agent counts as lost, its
    ranks never having started, attempt 2 goes on with gn8 in its place: no second restart, and
    gn7's ranks (which may already wait in the rendezvous) keep their orders."""
    coordinator = Coordinator(Store(tmp_path / "c.db"), agent_timeout=10, clock=Clock())
    api = TestClient(create_app(coordinator, TOKEN))
    api.clock = coordinator.clock
    beat(api, "gn8", 0, 1)
    setup_group(api, max_restarts=1, spare_nodes=1)
    assert (
        api.post("/api/workers/move", headers=AUTH, json={"workers": ["gn8-0", "gn8-1"], "group": "exp1"}).status_code
        == 200
    )
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn6", *running("exp1", 1, 0, 1))  # gn6's last beat
    api.clock.now += 2
    ended = [{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 1} for i in (0, 1)]
    beat(api, "gn7", *ended)
    g = group_state(api)
    assert (g["state"], g["attempt"], g["restarts"]) == ("starting", 2, 1) and "moved" not in g["reason"], g
    started = beat(api, "gn7", *ended)["start"]
    assert [o["rank"] for o in started] == [0, 1]
    beat(api, "gn7", *running("exp1", 2, 0, 1))
    assert beat(api, "gn8", 0, 1)["start"] == []
    api.clock.now += 9  # gn6 silent for 11 s
    beat(api, "gn7", *running("exp1", 2, 0, 1))
    coordinator.tick()
    g = group_state(api)
    assert (g["state"], g["attempt"], g["restarts"]) == ("starting", 2, 1), g
    assert g["reason"].endswith("; node 1 moved from gn6 to the spare host gn8"), g
    orders = beat(api, "gn8", 0, 1)["start"]
    assert [(o["attempt"], o["rank"], o["env"]["NODE_RANK"], o["env"]["MASTER_ADDR"]) for o in orders] == [
        (2, 2, "1", "gn7"),
        (2, 3, "1", "gn7"),
    ]
    assert beat(api, "gn7", *running("exp1", 2, 0, 1)) == {
        "start": [],
        "stop": [],
        "worlds": [],
        "warm": [],
        "agent_timeout": 10.0,
    }
    beat(api, "gn8", *running("exp1", 2, 0, 1))
    assert group_state(api)["state"] == "running"
    coordinator.store.close()


def test_a_lost_node_with_no_spare_leaves_a_smaller_world_which_the_registry_and_the_attempts_name(tmp_path):
    """Issue 35, item 3 for groups: with `min_nodes 1` and no spare, gn6's agent going silent ends
    attempt 1 and attempt 2 runs on gn7 alone: ranks 0 and 1 of a world of 2, master gn7, in the
    words launch and Slurm use ("2 -> 1 nodes: gn6 lost, --min-nodes 1"), kept with the attempt in
    the run registry; it ends done. With `min_nodes 2` the same loss restarts nowhere, as before."""
    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.runs.model import Recorder, find_run, get_row, recoveries_of
    from slurmgen.runs.registry import Registry

    coordinator = Coordinator(
        Store(tmp_path / "c.db"), agent_timeout=10, clock=Clock(), runs=GroupRuns(Recorder(tmp_path / "r.sqlite"))
    )
    api = TestClient(create_app(coordinator, TOKEN))
    api.clock = coordinator.clock
    setup_group(api, max_restarts=1, min_nodes=1)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    api.clock.now += 8
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    api.clock.now += 3  # gn6 silent for 11 s
    coordinator.tick()
    told = "2 -> 1 nodes: gn6 lost, --min-nodes 1"
    g = group_state(api)
    assert (g["state"], g["attempt"], g["restarts"]) == ("starting", 2, 1) and g["reason"].endswith(f"; {told}"), g
    ranks = api.get("/api/groups/exp1/ranks", headers=AUTH).json()
    assert [(r["worker"], r["rank"], r["node_rank"], r["world_size"]) for r in ranks] == [
        ("gn7-0", 0, 0, 2),
        ("gn7-1", 1, 0, 2),
    ]
    exited = [{"id": i, "state": "exited", "group": "exp1", "attempt": 1, "exit_code": 143} for i in (0, 1)]
    orders = beat(api, "gn7", *exited)["start"]
    assert [(o["rank"], o["env"]["NODE_RANK"], o["env"]["WORLD_SIZE"], o["env"]["MASTER_ADDR"]) for o in orders] == [
        (0, "0", "2", "gn7"),
        (1, "0", "2", "gn7"),
    ]
    detail = api.get("/api/groups/exp1", headers=AUTH).json()
    assert [(a["number"], a["moved"]) for a in detail["attempts"]] == [(1, []), (2, [told])]
    assert detail["group"]["world_size"] == 2  # the smaller world's, which the group's page shows
    done = [{"id": i, "state": "exited", "group": "exp1", "attempt": 2, "exit_code": 0} for i in (0, 1)]
    beat(api, "gn7", *done)
    assert group_state(api)["state"] == "succeeded"
    coordinator.store.close()
    with Registry.open(tmp_path / "r.sqlite") as reg:
        row = get_row(reg, find_run(reg, "group", "exp1.1"))
        assert (row["state"], recoveries_of(row["info"])) == ("succeeded", {2: [told]}), row


def test_below_min_nodes_a_lost_node_ends_the_group_as_without_it(api):
    """min_nodes 2 of 2 nodes: gn6 lost leaves 1, too few; the restart cannot run without gn6."""
    setup_group(api, max_restarts=1, min_nodes=2)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    api.clock.now += 11
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    g = group_state(api)
    assert (g["state"], g["attempt"]) == ("failed", 1) and "no restart: worker 'gn6-0' is lost" in g["reason"], g


def test_min_nodes_below_its_rule_is_a_422_naming_the_field_and_nothing_changes(api):
    setup_group(api, max_restarts=1)
    for body, words in (
        ({"min_nodes": 3}, "min_nodes: 3 is more than nodes (2); expected 1 to 2"),
        ({"min_nodes": 0}, "min_nodes: 0 is fewer than 1; expected at least 1"),
        ({"min_nodes": 1, "max_restarts": 0}, "min_nodes: 1 is the fewest nodes a restart goes on with"),
    ):
        r = api.patch("/api/groups/exp1/config", headers=AUTH, json=body)
        assert r.status_code == 422 and words in str(r.json()["detail"]), r.text
    assert group_state(api)["config"]["min_nodes"] is None
    from slurmgen.coordinator.client import Client, ClientError

    client = Client("http://testserver", TOKEN)
    client.http = api  # Starlette's TestClient is an httpx.Client: the CLI's exit code and line
    api.headers["Authorization"] = f"Bearer {TOKEN}"
    with pytest.raises(ClientError) as e:
        client.update_config("exp1", {"min_nodes": 3})
    assert (e.value.exit_code, str(e.value)) == (2, "min_nodes: 3 is more than nodes (2); expected 1 to 2")
