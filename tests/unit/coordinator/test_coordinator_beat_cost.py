"""What a heartbeat costs the server: flat in history, trimmed on the tick, taken past the router.

1,000 agents send 1,000 heartbeats a second (benchmarks/bench_coordinator.py), so a heartbeat
must not read what grows with time (ended attempts, output lines), and what it leaves to a timer
(trimming lines) must still be done within one tick. The shortcut past FastAPI's router must
answer exactly as the route does.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from helpers import AUTH, TOKEN, Clock, beat, running, setup_group  # noqa: E402

from slurmgen.coordinator import store as store_module  # noqa: E402
from slurmgen.coordinator.server import TOKEN_COOKIE, create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402


@pytest.fixture
def served(tmp_path):
    store = Store(tmp_path / "c.db")
    coordinator = Coordinator(store, agent_timeout=10, clock=Clock())
    yield TestClient(create_app(coordinator, TOKEN)), coordinator
    store.close()


def statements_of(store: Store, action) -> list[str]:
    seen: list[str] = []
    store.db.set_trace_callback(seen.append)
    try:
        action()
    finally:
        store.db.set_trace_callback(None)
    return seen


def test_a_steady_heartbeat_reads_only_its_agents_workers_however_long_the_history(served):
    """Twenty ended attempts and their lines later, a beat that changes nothing is the same three
    statements as the first one: nothing of attempts or logs is read, nothing is written."""
    api, c = served
    setup_group(api)
    steady = ["BEGIN IMMEDIATE", "SELECT * FROM workers WHERE host = 'gn6' ORDER BY idx", "COMMIT"]
    beat(api, "gn6", 0, 1)
    assert statements_of(c.store, lambda: beat(api, "gn6", 0, 1)) == steady
    line = {"worker": 0, "group": "exp1", "rank": 0, "time": 1.0, "line": "x"}
    for n in range(1, 21):
        assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 200
        lines = [{**line, "attempt": n}] * 50
        body = {"host": "gn7", "instance": "gn7", "workers": running("exp1", n, 0, 1), "lines": lines}
        assert api.post("/api/agents/heartbeat", headers=AUTH, json=body).status_code == 200
        assert api.post("/api/groups/exp1/stop", headers=AUTH).status_code == 200
        beat(api, "gn6", 0, 1)
        beat(api, "gn7", 0, 1)
    beat(api, "gn6", 0, 1)
    assert statements_of(c.store, lambda: beat(api, "gn6", 0, 1)) == steady


def test_a_running_attempt_is_decoded_once_not_at_every_heartbeat(served):
    """While an attempt runs, its ranks' steady beats read no attempt row: the store keeps the
    active attempts until one of them changes, and sees the change at once."""
    api, c = served
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    assert api.get("/api/groups/exp1", headers=AUTH).json()["group"]["state"] == "running"
    beat(api, "gn6", *running("exp1", 1, 0, 1))  # the first beat after the change reads it
    seen = statements_of(c.store, lambda: beat(api, "gn6", *running("exp1", 1, 0, 1)))
    assert not [s for s in seen if "attempts" in s or "logs" in s], seen
    exited = {**running("exp1", 1, 1)[0], "state": "exited", "exit_code": 3}
    beat(api, "gn6", *running("exp1", 1, 0), exited)
    assert 1 not in [a["number"] for a in c.store.active_attempts()]  # the change, seen at once
    assert [s["worker"] for s in beat(api, "gn6", *running("exp1", 1, 0), exited)["stop"]] == [0]


def test_the_active_attempts_kept_follow_a_rolled_back_transaction(tmp_path):
    store = Store(tmp_path / "c.db")
    plan = {"ranks": {}, "env": {}, "argv": ["x"], "cwd": None, "stop_grace": 1.0, "heartbeat_timeout": 1.0}
    with pytest.raises(RuntimeError), store.transaction():
        store.add_attempt("g", 1, 1.0, plan)
        assert [a["number"] for a in store.active_attempts()] == [1]
        raise RuntimeError("undone")
    assert store.active_attempts() == []
    with store.transaction():
        store.add_attempt("g", 1, 1.0, plan)
    copy = store.active_attempts()[0]
    copy["state"] = "mine"  # a caller's change of its copy is its own
    assert [a["state"] for a in store.active_attempts()] == ["starting"]
    with store.transaction():
        store.update_attempt("g", 1, state="failed")
    assert store.active_attempts() == []
    store.close()


def test_output_lines_are_trimmed_by_the_tick_within_one_period(served, monkeypatch):
    """A beat's lines are stored at once; the oldest beyond the kept number go at the next tick
    (twice a second), not at every beat that brings lines."""
    api, c = served
    monkeypatch.setattr(store_module, "LOG_LINES_KEPT", 3)
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    lines = [{"worker": 0, "group": "exp1", "attempt": 1, "rank": 0, "time": 1.0, "line": f"l{i}"} for i in range(5)]
    body = {"host": "gn7", "instance": "gn7", "workers": running("exp1", 1, 0, 1), "lines": lines}
    assert api.post("/api/agents/heartbeat", headers=AUTH, json=body).status_code == 200

    def shown():
        return [ln["line"] for ln in api.get("/api/groups/exp1/logs", headers=AUTH).json()]

    assert shown() == ["l0", "l1", "l2", "l3", "l4"]
    c.tick()
    assert shown() == ["l2", "l3", "l4"]
    assert not [s for s in statements_of(c.store, c.tick) if "logs" in s]  # no new lines: no trim


def test_the_heartbeat_shortcut_answers_as_the_route_does(served):
    """The same heartbeat through the shortcut (token in the header) and through the route (the
    token only in a cookie, which the shortcut leaves to the route): the same orders, status and
    headers. A body the model refuses is the route's 422, naming the field."""
    api, _ = served
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    body = {"host": "gn6", "instance": "gn6", "workers": [{"id": 0, "state": "idle"}, {"id": 1, "state": "idle"}]}
    fast = api.post("/api/agents/heartbeat", headers=AUTH, json=body)
    api.cookies.set(TOKEN_COOKIE, TOKEN)
    routed = api.post("/api/agents/heartbeat", json=body)
    api.cookies.clear()
    assert fast.status_code == routed.status_code == 200
    assert fast.json() == routed.json() and len(fast.json()["start"]) == 2
    assert dict(fast.headers) == dict(routed.headers)
    bad = api.post("/api/agents/heartbeat", headers=AUTH, json={"host": "gn6", "instance": "gn6", "workers": "x"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "workers"]
    other = api.post("/api/agents/heartbeat", headers=AUTH, json={**body, "instance": "other"})
    assert other.status_code == 409 and "one agent per node" in other.json()["detail"]
    assert dict(other.headers).keys() == dict(fast.headers).keys()


def test_lines_sent_between_beats_are_kept_and_answered_as_the_route_does(served):
    """Issue 33: an agent sends its output lines as soon as they wait (POST /api/agents/lines),
    not with its next heartbeat. The shortcut and the route keep them the same way and answer
    alike; a second live agent for the host is refused, as its heartbeat is; a refused body is
    the route's 422."""
    api, _ = served
    setup_group(api)
    api.post("/api/groups/exp1/start", headers=AUTH)
    beat(api, "gn6", *running("exp1", 1, 0, 1))

    def sent(i: int) -> dict:
        line = {"worker": 0, "group": "exp1", "attempt": 1, "rank": 0, "time": float(i), "line": f"line {i}"}
        return {"host": "gn6", "instance": "gn6", "lines": [line]}

    fast = api.post("/api/agents/lines", headers=AUTH, json=sent(1))
    api.cookies.set(TOKEN_COOKIE, TOKEN)
    routed = api.post("/api/agents/lines", json=sent(2))
    api.cookies.clear()
    assert fast.status_code == routed.status_code == 204 and fast.content == routed.content == b""
    assert dict(fast.headers).keys() == dict(routed.headers).keys()
    logs = api.get("/api/groups/exp1/logs", headers=AUTH).json()
    assert [(ln["worker"], ln["line"]) for ln in logs] == [("gn6-0", "line 1"), ("gn6-0", "line 2")]
    other = api.post("/api/agents/lines", headers=AUTH, json={**sent(3), "instance": "other"})
    assert other.status_code == 409 and "another live agent" in other.json()["detail"]
    bad = api.post("/api/agents/lines", headers=AUTH, json={"host": "gn6", "instance": "gn6", "lines": "x"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "lines"]
    assert len(api.get("/api/groups/exp1/logs", headers=AUTH).json()) == 2
