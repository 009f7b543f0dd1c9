"""The coordinator's API over a real SQLite file, driven by simulated agent heartbeats.

Fast and in-process (Starlette's TestClient, a fake clock); the real agents, processes and
nodes are in tests/integration/test_coordinator_cluster.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def api(tmp_path):
    clock = Clock()
    store = Store(tmp_path / "c.db")
    client = TestClient(create_app(Coordinator(store, agent_timeout=10, clock=clock), TOKEN))
    client.clock, client.db = clock, tmp_path / "c.db"
    yield client
    store.close()


def beat(api, host, *slots):
    workers = [s if isinstance(s, dict) else {"id": s, "state": "idle"} for s in slots]
    r = api.post("/api/agents/heartbeat", headers=AUTH, json={"host": host, "instance": host, "workers": workers})
    assert r.status_code == 200, r.text
    return r.json()


def setup_group(api, argv=("python", "train.py"), **config):
    beat(api, "gn6", 0, 1)
    beat(api, "gn7", 0, 1)
    assert api.post("/api/groups", headers=AUTH, json={"name": "exp1"}).status_code == 201
    moved = api.post("/api/workers/move", headers=AUTH,
                     json={"workers": ["gn6-0", "gn6-1", "gn7-0", "gn7-1"], "group": "exp1"})
    assert moved.status_code == 200, moved.text
    r = api.put("/api/groups/exp1/config", headers=AUTH,
                json={"master": "gn7", "backend": "gloo", "argv": list(argv), **config})
    assert r.status_code == 200, r.text


def running(group, attempt, *ids):
    return [{"id": i, "state": "running", "group": group, "attempt": attempt, "pid": 100 + i} for i in ids]


def group_state(api):
    return api.get("/api/groups/exp1", headers=AUTH).json()["group"]


def test_no_or_wrong_token_is_401_and_changes_nothing(api):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        assert api.post("/api/groups", headers=headers, json={"name": "x"}).status_code == 401
        assert api.get("/api/workers", headers=headers).status_code == 401
        assert api.post("/api/agents/heartbeat", headers=headers,
                        json={"host": "gn6", "instance": "i", "workers": [{"id": 0, "state": "idle"}]}).status_code == 401
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
        (0, 0, "0", "gn7"), (1, 1, "0", "gn7")]
    assert orders["start"][0]["env"]["SLURMGEN_GROUP"] == "exp1"
    beat(api, "gn6", 0, 1)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    assert group_state(api)["state"] == "running"

    # gn6-1 (rank 3) exits 3: the group fails with that code, everyone else is told to stop.
    beat(api, "gn6", running("exp1", 1, 0)[0], {"id": 1, "state": "exited", "group": "exp1", "attempt": 1,
                                                "exit_code": 3})
    g = group_state(api)
    assert (g["state"], g["exit_code"]) == ("failed", 3) and "rank 3 (gn6-1)" in g["reason"]
    assert [s["worker"] for s in beat(api, "gn7", *running("exp1", 1, 0, 1))["stop"]] == [0, 1]
    # A restarted server (a new process on the same file) has it all back.
    again = TestClient(create_app(Coordinator(Store(api.db), clock=api.clock), TOKEN))
    detail = again.get("/api/groups/exp1", headers=AUTH).json()
    assert detail["group"]["state"] == "failed" and detail["attempts"][0]["exit_codes"] == {"3": 3}


def test_max_restarts_starts_a_fresh_attempt_after_the_old_ranks_are_gone(api):
    setup_group(api, max_restarts=1)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0), {"id": 1, "state": "exited", "group": "exp1", "attempt": 1,
                                             "exit_code": 1})
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
    r = api.post("/api/agents/heartbeat", headers=AUTH,
                 json={"host": "gn7", "instance": "gn7", "workers": running("exp1", 1, 0, 1), "lines": [line]})
    assert r.status_code == 200
    logs = api.get("/api/groups/exp1/logs", headers=AUTH, params={"rank": 0}).json()
    assert [(ln["worker"], ln["line"]) for ln in logs] == [("gn7-0", "hello")]
    more = [{**line, "line": f"l{i}"} for i in range(5)]
    api.post("/api/agents/heartbeat", headers=AUTH,
             json={"host": "gn7", "instance": "gn7", "workers": running("exp1", 1, 0, 1), "lines": more})
    tail = api.get("/api/groups/exp1/logs", headers=AUTH, params={"limit": 2, "tail": True}).json()
    assert [ln["line"] for ln in tail] == ["l3", "l4"]
    after = api.get("/api/groups/exp1/logs", headers=AUTH, params={"limit": 2, "after": logs[0]["id"]}).json()
    assert [ln["line"] for ln in after] == ["l0", "l1"]
    assert api.post("/api/groups/exp1/stop", headers=AUTH).json()["state"] == "stopped"
    assert len(beat(api, "gn7", *running("exp1", 1, 0, 1))["stop"]) == 2


def test_second_live_agent_for_a_host_is_refused(api):
    beat(api, "gn6", 0)
    r = api.post("/api/agents/heartbeat", headers=AUTH,
                 json={"host": "gn6", "instance": "other", "workers": [{"id": 0, "state": "idle"}]})
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
