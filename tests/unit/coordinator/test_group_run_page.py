"""A coordinator group's run page (issue 33, item 9): it had no log, named the host `vm` where the
rest said gn6/gn7, showed the coordinator's database path as "Logs", offered a Slurm job's
disabled Cancel and Checkpoint, and the runs list linked the run to the group's current state.
A real coordinator (store, in-process API, TestClient) and a real registry; its lines are put in
the store as the agents' reports put them."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slurmgen.coordinator.group_runs import GroupRuns  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.coordinator.web.run_detail import named_as_workers  # noqa: E402
from slurmgen.runs.model import NewRun, Recorder, add_run, start_attempt  # noqa: E402
from slurmgen.runs.registry import Registry  # noqa: E402

TOKEN = "t0ken-for-group-run-page"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture
def served(tmp_path):
    """Group g: the coordinator's attempt 1 was an earlier run (g.1); the run shown, g.2, had
    attempts 2 and 3 (a restart), each with lines of ranks 0 and 1 on gn6-0 and gn7-0."""
    registry = tmp_path / "jobs.sqlite"
    store = Store(tmp_path / "c.db")
    with TestClient(create_app(Coordinator(store, runs=GroupRuns(Recorder(registry))), TOKEN)) as c:
        assert c.post("/api/groups", json={"name": "g"}, headers=AUTH).status_code == 201
        rows = [("g", 1, 0, "gn6-0", 1.0, "earlier run's line")]
        for number in (2, 3):
            rows += [("g", number, r, f"gn{6 + r}-0", 2.0, f"a{number} r{r} {HOSTILE}") for r in (0, 1)]
        store.add_lines(rows)
        with Registry.open(registry, create=True) as reg:
            seq = add_run(
                reg,
                NewRun(
                    "group",
                    "g.2",
                    "g",
                    "/w",
                    2,
                    2,
                    logs=[{"node": "coordinator", "path": "/s/c.db"}],
                    info={"workers": ["gn6-0", "gn7-0"]},
                ),
                100.0,
            )
            start_attempt(reg, seq, 1, 100.0)
            start_attempt(reg, seq, 2, 110.0)
            reg.db.commit()
        c.post("/ui/login", data={"token": TOKEN}, headers={"Origin": "http://testserver"})
        yield c, seq
    store.close()


def test_a_group_runs_log_holds_its_own_attempts_lines_numbered_within_the_run(served):
    client, seq = served
    got = client.get(f"/ui/live/runs/{seq}/logs").json()
    assert [(x["attempt"], x["rank"], x["text"]) for x in got["lines"]] == [
        (1, 0, f"a2 r0 {HOSTILE}"),
        (1, 1, f"a2 r1 {HOSTILE}"),
        (2, 0, f"a3 r0 {HOSTILE}"),
        (2, 1, f"a3 r1 {HOSTILE}"),
    ]  # not the earlier run's line; the coordinator's attempts 2 and 3 are the run's 1 and 2
    assert got["lines"][-1]["worker"] == "gn7-0" and got["gap"] is False
    only = client.get(f"/ui/live/runs/{seq}/logs", params={"rank": 1}).json()
    assert [x["text"] for x in only["lines"]] == [f"a2 r1 {HOSTILE}", f"a3 r1 {HOSTILE}"] and only["rank"] == 1
    assert client.get(f"/ui/live/runs/{seq}/logs", params={"after": got["next"]}).json()["lines"] == []


def test_a_group_runs_page_shows_its_log_and_group_and_no_slurm_control_nor_database_path(served):
    client, seq = served
    html = client.get(f"/ui/runs/{seq}").text
    assert f'data-logs-url="/ui/live/runs/{seq}/logs"' in html and '<option value="1">rank 1</option>' in html
    assert "<dt>Logs</dt>" not in html and "/s/c.db" not in html
    assert '<dt>Group</dt><dd><a href="/ui/groups/g">g</a>' in html
    assert ">Cancel</button>" not in html and ">Checkpoint and stop</button>" not in html
    row = re.search(rf'<tr data-run="{seq}" data-kind="group">(.*?)</tr>', client.get("/ui/runs").text, re.S)[1]
    assert f'<a href="/ui/runs/{seq}">g</a>' in row  # the run, not the group's current state


def test_a_group_runs_ranks_are_named_by_their_workers_nodes_not_the_machines_hostname():
    view = {"timeline": {"attempts": [{"ranks": [{"rank": 0, "host": "vm"}, {"rank": 1, "host": "vm"}, {"rank": 2}]}]}}
    named_as_workers(view, ["gn6-0", "gn-7-1"])
    assert [r.get("host") for r in view["timeline"]["attempts"][0]["ranks"]] == ["gn6", "gn-7", None]
