"""Issue 35, item 4 for coordinator groups: warm restarts (GroupConfig.restart_mode warm).

The pure decisions (state.warm_restart, start_anew, superseded), the server over a real SQLite
file driven by simulated agent heartbeats (a fake clock), and the agent's side with real
processes: the warm dir a rank is given, the world written where it waits. The real agents and
gloo ranks of the bundled trainer are in tests/integration/web/test_group_warm.py.
"""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from helpers import AUTH, TOKEN, Clock, beat, running, setup_group  # noqa: E402

from slurmgen.contract import envvars, exitcodes, warm  # noqa: E402
from slurmgen.contract.states import State  # noqa: E402
from slurmgen.coordinator import state as st  # noqa: E402
from slurmgen.coordinator.models import AgentOrders, StartOrder, WorldOrder  # noqa: E402
from slurmgen.coordinator.node_agent import WorkerAgent  # noqa: E402
from slurmgen.coordinator.procs import write_world  # noqa: E402
from slurmgen.coordinator.server import create_app  # noqa: E402
from slurmgen.coordinator.service import Coordinator  # noqa: E402
from slurmgen.coordinator.store import Store  # noqa: E402
from slurmgen.coordinator.web.views import attempt_text  # noqa: E402

RANKS = {"gn7-0": 0, "gn7-1": 1, "gn6-0": 2, "gn6-1": 3}
KILLED = "rank 3 (gn6-1) exited with code 137"
PORT = 29500


def killed(code: int = 137, worker: str = "gn6-1") -> st.Outcome:
    return st.Outcome(State.FAILED.value, f"rank {RANKS[worker]} ({worker}) exited with code {code}", code, worker)


def decide(
    outcome=None, attempt_state="running", exits=None, troubled=frozenset(), met=None, last=(0, None), now=100.0, used=0
):
    outcome = outcome or killed()
    exits = {"gn6-1": outcome.exit_code} if exits is None else exits
    met = set(RANKS) if met is None else met
    return st.warm_restart(outcome, attempt_state, RANKS, exits, troubled, met, last, now, (used, 2), PORT)


# ---- the pure decisions ----------------------------------------------------------------------
def test_a_killed_rank_of_a_running_attempt_is_started_anew_in_the_next_generation():
    assert decide() == st.WarmRestart(
        1, "gn6-1", 3, warm.port_for(PORT, 1), f"warm restart 1: rank 3 started anew after {KILLED}"
    )
    again = decide(last=(1, 100.0), now=100.0 + warm.SETTLE + 0.1, used=1)
    assert again is not None and (again.generation, again.port) == (2, PORT + 2)


@pytest.mark.parametrize(
    "why, case",
    [
        ("a second failure within SETTLE: the program does not take part", dict(last=(1, 95.0), now=100.0)),
        ("no restart left: each warm restart counts", dict(used=2)),
        ("the attempt is still starting: its ranks may not have met", dict(attempt_state="starting")),
        ("a worker is lost or hung: its ranks cannot wait", dict(troubled={"gn7-0"})),
        ("the failed rank died before the rendezvous: the others wait in it", dict(met=set(RANKS) - {"gn6-1"})),
        ("a rank has not met yet: no new world reaches it", dict(met=set(RANKS) - {"gn7-0"})),
        ("no rank says it met: the program does not take part", dict(met=set())),
        ("bad input is never retried", dict(outcome=killed(exitcodes.BAD_INPUT))),
        ("a preemption is never retried", dict(outcome=killed(exitcodes.PREEMPTED))),
        ("a hang or a lost agent is no exit", dict(exits={})),
        ("the attempt did not fail", dict(outcome=st.Outcome(State.SUCCEEDED.value, "every rank exited 0", 0))),
    ],
)
def test_every_other_failure_restarts_whole_as_before(why, case):
    assert decide(**case) is None, why


def test_a_rank_is_started_anew_once_and_its_old_exit_is_not_judged_again():
    assert st.start_anew("exited", 0, 1) and not st.start_anew("running", 0, 1) and not st.start_anew("exited", 1, 1)
    assert st.superseded(0, 1) and not st.superseded(1, 1)


# ---- the server, over simulated agents --------------------------------------------------------
@pytest.fixture
def api(tmp_path):
    from slurmgen.coordinator.group_runs import GroupRuns
    from slurmgen.runs.model import Recorder

    clock = Clock()
    store = Store(tmp_path / "c.db")
    coordinator = Coordinator(store, agent_timeout=10, clock=clock, runs=GroupRuns(Recorder(tmp_path / "r.sqlite")))
    client = TestClient(create_app(coordinator, TOKEN))
    client.clock, client.coordinator, client.registry = clock, coordinator, tmp_path / "r.sqlite"
    yield client
    store.close()


def group(api):
    return api.get("/api/groups/exp1", headers=AUTH).json()


def start_running(api, max_restarts=2):
    setup_group(api, max_restarts=max_restarts, master_port=PORT, restart_mode="warm")
    assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 200
    starts = beat(api, "gn7", 0, 1)["start"] + beat(api, "gn6", 0, 1)["start"]
    assert [(o["rank"], o["warm"], o["generation"]) for o in starts] == [(r, True, 0) for r in range(4)]
    beat(api, "gn7", *met(running("exp1", 1, 0, 1)))
    beat(api, "gn6", *met(running("exp1", 1, 0, 1)))
    assert group(api)["group"]["state"] == "running"


def met(reports):
    """Running ranks whose agents say they met their peers (the warm dir's MET_PREFIX files)."""
    return [{**r, "met": True} for r in reports]


def exited(slot, code, generation=0, attempt=1):
    return {
        "id": slot,
        "state": "exited",
        "group": "exp1",
        "attempt": attempt,
        "exit_code": code,
        "generation": generation,
    }


def test_a_killed_rank_restarts_warm_the_others_keep_running_and_the_run_ends_done(api):
    start_running(api)
    what = f"warm restart 1: rank 3 started anew after {KILLED}"
    first = beat(api, "gn6", *running("exp1", 1, 0), exited(1, 137))
    assert first["stop"] == []  # the healthy rank on the failed rank's node keeps its process
    g = group(api)
    assert (g["group"]["state"], g["group"]["restarts"], g["group"]["attempt"]) == ("running", 0, 1), g
    assert g["group"]["reason"].startswith(what) and g["attempts"][0]["warm"] == [g["group"]["reason"]], g
    # The group's page says the budget it spent: a warm restart counts, inside attempt 1.
    assert (g["group"]["warm_restarts"], g["group"]["world_size"]) == (1, 4), g["group"]
    assert attempt_text(g["group"], g["group"]["config"]) == "1 (restart 1 of 2, 1 warm)"
    world = WorldOrder(group="exp1", attempt=1, generation=1, master_addr="gn7", master_port=PORT + 1, world_size=4)
    healthy = beat(api, "gn7", *running("exp1", 1, 0, 1))
    assert (healthy["start"], healthy["stop"], healthy["worlds"]) == ([], [], [world.model_dump()])
    # The killed rank's agent reports the old exit again: it is not judged twice, the rank starts anew.
    again = beat(api, "gn6", *running("exp1", 1, 0), exited(1, 137))
    assert again["worlds"] == [world.model_dump()] and again["stop"] == []
    (order,) = again["start"]
    assert (order["worker"], order["rank"], order["generation"], order["warm"]) == (1, 3, 1, True)
    assert order["env"]["MASTER_PORT"] == str(PORT + 1) and order["env"][envvars.WARM_GENERATION] == "1"
    assert order["env"]["RANK"] == "3" and order["env"]["MASTER_ADDR"] == "gn7"
    assert group(api)["group"]["state"] == "running"
    replaced = [{**running("exp1", 1, 1)[0], "generation": 1, "spare": True}]
    assert beat(api, "gn6", *running("exp1", 1, 0), *replaced)["start"] == []
    # Its agent says the rank went on in its node's warm spare: the attempt says where, once.
    assert group(api)["attempts"][0]["took"] == ["gn6's warm spare (pid 101)"]
    api.clock.now += 5
    beat(api, "gn7", exited(0, 0), exited(1, 0))
    beat(api, "gn6", exited(0, 0), exited(1, 0, generation=1))
    g = group(api)
    assert g["group"]["state"] == "succeeded" and g["attempts"][0]["exit_codes"] == {str(r): 0 for r in range(4)}, g
    from slurmgen.coordinator.web.views import attempts_view
    from slurmgen.runs.model import find_run, get_row, recoveries_of
    from slurmgen.runs.registry import Registry

    assert [a["warm"] for a in attempts_view(g["attempts"])] == [
        [f"{g['attempts'][0]['warm'][0]}; it went on in gn6's warm spare (pid 101)"]
    ]
    with Registry.open(api.registry) as reg:
        row = get_row(reg, find_run(reg, "group", "exp1.1"))
        assert recoveries_of(row["info"]) == {1: [g["attempts"][0]["warm"][0]]} and row["state"] == "succeeded"


def test_a_second_failure_soon_after_a_warm_restart_restarts_whole_and_counts_both(api):
    """A program that does not take part: its healthy ranks die of the peer's failure within
    SETTLE seconds. The attempt fails and restarts cold; the warm restart used one of the 2
    restarts, the cold one the other, so the next failure ends the group."""
    start_running(api, max_restarts=2)
    beat(api, "gn6", *running("exp1", 1, 0), exited(1, 137))
    api.clock.now += 1
    beat(api, "gn7", exited(0, 1), *running("exp1", 1, 1))
    g = group(api)["group"]
    assert (g["state"], g["attempt"], g["restarts"]) == ("starting", 2, 1) and g["reason"].startswith("restart 1"), g
    assert [o["rank"] for o in beat(api, "gn7", exited(0, 1), exited(1, 143))["start"]] == [0, 1]
    beat(api, "gn6", exited(0, 143), exited(1, 137))
    beat(api, "gn7", *met(running("exp1", 2, 0, 1)))
    beat(api, "gn6", *met(running("exp1", 2, 0, 1)))
    api.clock.now += warm.SETTLE / 2
    beat(api, "gn7", *running("exp1", 2, 0, 1))
    api.clock.now += warm.SETTLE / 2 + 1
    beat(api, "gn6", *running("exp1", 2, 0), exited(1, 137, attempt=2))
    g = group(api)["group"]
    assert (g["state"], g["restarts"], g["exit_code"]) == ("failed", 1, 137), g


def test_each_warm_restart_counts_against_max_restarts(api):
    start_running(api, max_restarts=1)
    beat(api, "gn6", *running("exp1", 1, 0), exited(1, 137))
    assert group(api)["group"]["state"] == "running"
    beat(api, "gn6", *running("exp1", 1, 0), {**running("exp1", 1, 1)[0], "generation": 1})
    api.clock.now += warm.SETTLE / 2
    beat(api, "gn6", *running("exp1", 1, 0), {**running("exp1", 1, 1)[0], "generation": 1})
    api.clock.now += warm.SETTLE / 2 + 1
    beat(api, "gn7", exited(0, 137), *running("exp1", 1, 1))  # budget spent: the group fails
    g = group(api)
    assert (g["group"]["state"], g["group"]["exit_code"], len(g["attempts"])) == ("failed", 137, 1), g


def test_ranks_that_fail_before_they_met_restart_whole_until_the_restarts_run_out(api):
    """Every process runs (the attempt is running) but rank 3 exits 1 before the ranks met: the
    others sit in the first rendezvous, which no new world reaches, so the attempt restarts whole
    (no warm restart spent), and when the restarts run out the group fails on that exit."""
    setup_group(api, max_restarts=1, master_port=PORT, restart_mode="warm")
    assert api.post("/api/groups/exp1/start", headers=AUTH).status_code == 200
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *met(running("exp1", 1, 0)), *running("exp1", 1, 1))  # rank 2 met no one yet either
    assert group(api)["group"]["state"] == "running"
    for _ in range(2):  # however long the processes ran (both agents heard: none is lost)
        api.clock.now += warm.SETTLE / 2 + 1
        beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0), exited(1, 1))
    g = group(api)
    assert (g["group"]["state"], g["group"]["attempt"], g["group"]["restarts"]) == ("starting", 2, 1), g
    assert g["attempts"][0]["warm"] == [] and g["group"]["reason"].startswith("restart 1 after: rank 3 (gn6-1)"), g
    beat(api, "gn7", *running("exp1", 2, 0, 1))
    beat(api, "gn6", *running("exp1", 2, 0), exited(1, 1, attempt=2))
    g = group(api)
    assert [(a["state"], a["warm"]) for a in g["attempts"]] == [("failed", [])] * 2, g["attempts"]
    assert (g["group"]["state"], g["group"]["exit_code"]) == ("failed", 1), g["group"]
    assert g["group"]["reason"] == "rank 3 (gn6-1) exited with code 1 (failed)", g["group"]


def test_a_lost_agent_restarts_whole_on_the_spare(api):
    beat(api, "gn8", 0, 1)
    setup_group(api, max_restarts=2, master_port=PORT, restart_mode="warm", spare_nodes=1)
    more = api.post("/api/workers/move", headers=AUTH, json={"workers": ["gn8-0", "gn8-1"], "group": "exp1"})
    assert more.status_code == 200 and api.post("/api/groups/exp1/start", headers=AUTH).status_code == 200
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn6", *running("exp1", 1, 0, 1))
    api.clock.now += 8
    beat(api, "gn7", *running("exp1", 1, 0, 1))
    beat(api, "gn8", 0, 1)
    api.clock.now += 3  # gn6 silent for 11 s
    api.coordinator.tick()
    g = group(api)["group"]
    assert (g["state"], g["attempt"], g["restarts"]) == ("starting", 2, 1) and "warm" not in g["reason"], g
    assert g["reason"].endswith("node 1 moved from gn6 to the spare host gn8"), g


def test_warm_asks_for_a_restart_to_spend_and_a_mode_it_knows(api):
    setup_group(api)
    r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"restart_mode": "warm"})
    assert r.status_code == 422 and "warm needs max_restarts of at least 1" in r.text, r.text
    r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"restart_mode": "hot", "max_restarts": 1})
    assert r.status_code == 422 and "restart_mode" in r.text and "'cold' or 'warm'" in r.text, r.text
    r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"restart_mode": "warm", "max_restarts": 1})
    assert r.status_code == 200 and r.json()["config"]["restart_mode"] == "warm", r.text


def test_warm_is_refused_to_a_program_that_does_not_take_part(api, tmp_path):
    """launch's rule (generate/preflight.py) on every way a config is set: the API (PUT, PATCH) and
    the settings form (which PUTs); the script read under cwd, a relative one without cwd let be."""
    from slurmgen.coordinator.web.forms import errors_from_response

    (tmp_path / "plain.py").write_text("import torch\n")
    (tmp_path / "mine.py").write_text("from slurmgen.train import warm\n")
    setup_group(api, argv=("python", "plain.py"), cwd=str(tmp_path), max_restarts=1)
    r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"restart_mode": "warm"})
    refusal = (
        "restart_mode: warm needs a program that takes part in it (the bundled trainer, or slurmgen.train.warm), "
        "and plain.py does not use slurmgen.train"
    )
    assert (r.status_code, r.json()) == (422, {"detail": refusal}), r.text
    assert group(api)["group"]["config"]["restart_mode"] == "cold"  # nothing written
    assert errors_from_response(r.status_code, r.json()) == {"restart_mode": refusal}  # the form shows it there
    torchrun = {"argv": ["torchrun", "mine.py"], "cwd": str(tmp_path), "max_restarts": 1, "restart_mode": "warm"}
    r = api.put("/api/groups/exp1/config", headers=AUTH, json=torchrun)
    assert r.status_code == 422 and "torchrun restarts its workers itself" in r.json()["detail"], r.text
    for argv, cwd in ((["python", "mine.py"], str(tmp_path)), (["python", "plain.py"], None)):
        r = api.patch("/api/groups/exp1/config", headers=AUTH, json={"argv": argv, "cwd": cwd, "restart_mode": "warm"})
        assert r.status_code == 200 and r.json()["config"]["restart_mode"] == "warm", r.text


def test_cli_group_config_warm_refused_is_one_line_exit_2(api, tmp_path, capsys, monkeypatch):
    from helpers import run

    from slurmgen.coordinator import client as client_module

    (tmp_path / "plain.py").write_text("import torch\n")
    setup_group(api, argv=("python", "plain.py"), cwd=str(tmp_path), max_restarts=1)
    monkeypatch.setattr(client_module.httpx, "Client", lambda **kwargs: api)  # as test_coordinator_api.py does
    monkeypatch.setitem(api.headers, "Authorization", f"Bearer {TOKEN}")
    monkeypatch.setenv("SLURMGEN_TOKEN", TOKEN)
    code, out, err = run(capsys, "group", "config", "exp1", "--restart-mode", "warm", "--server", "http://testserver")
    assert (code, out) == (2, "") and err == (
        "slurmgen: error: restart_mode: warm needs a program that takes part in it (the bundled trainer, or "
        "slurmgen.train.warm), and plain.py does not use slurmgen.train\n"
    ), err
    assert group(api)["group"]["config"]["restart_mode"] == "cold"


def test_the_settings_form_carries_the_restart_mode():
    from slurmgen.coordinator.web.forms import config_from_form, form_from_config

    assert form_from_config({})["restart_mode"] == "cold"
    assert form_from_config({"restart_mode": "warm"})["restart_mode"] == "warm"
    body = config_from_form({"restart_mode": "warm", "max_restarts": "1"}, [], [], {"restart_mode": "cold"})
    assert body["restart_mode"] == "warm"


# ---- the agent, with real processes -----------------------------------------------------------
def test_the_agent_gives_a_warm_groups_ranks_their_dir_and_writes_each_world_once(tmp_path):
    agent = WorkerAgent(client=None, workers=1, host="gn6", state_dir=tmp_path)
    show = "import os; print(os.environ['SLURMGEN_WARM_DIR'], os.environ.get('SLURMGEN_WARM_GENERATION', '-'))"
    order = StartOrder(
        worker=0,
        group="g",
        attempt=1,
        rank=3,
        argv=[sys.executable, "-c", show],
        cwd=None,
        env={"RANK": "3", envvars.WARM_GENERATION: "1"},
        heartbeat_timeout=60,
        warm=True,
        generation=1,
    )
    world = WorldOrder(group="g", attempt=1, generation=1, master_addr="gn7", master_port=29501, world_size=4)
    try:
        agent.apply(AgentOrders(start=[order], worlds=[world], warm=[("g", 1)]))  # as the server lists it
        deadline = time.monotonic() + 10
        while agent.procs.slots[0].exit_code is None and time.monotonic() < deadline:
            time.sleep(0.02)
        where = tmp_path / "gn6" / "warm" / "g-1"
        log = (tmp_path / "gn6" / "logs" / "g" / "attempt-1" / "rank-3.log").read_text()
        assert log.split() == [str(where), "1"], log
        assert warm.read(str(where)) == warm.World(1, "gn7", 29501, 4)
        assert (where.stat().st_mode & 0o777) == 0o700
        report = agent.procs.slots[0].report()
        assert (report.generation, report.exit_code, report.met) == (1, 0, False)  # it never joined a world
        warm.note_met(str(where), 3)  # what a rank's process group forming says (train/dist.py, train/warm.py)
        assert agent.procs.slots[0].report().met
        assert not write_world(tmp_path / "gn6" / "warm", world)  # the same generation: left as it is
        assert write_world(tmp_path / "gn6" / "warm", world.model_copy(update={"generation": 2, "master_port": 29502}))
        assert warm.read(str(where)) == warm.World(2, "gn7", 29502, 4)
    finally:
        agent.procs.stop_all(1)


def test_a_warm_groups_python_rank_is_started_anew_in_the_nodes_warm_spare(tmp_path):
    """The agent keeps one spare per warm attempt on its node (torch imported, idle): a warm
    restart's start goes to it (the same process, no interpreter start), a new spare takes its
    place, and the spares of attempts the server no longer names are killed."""
    agent = WorkerAgent(client=None, workers=2, host="gn6", state_dir=tmp_path)
    show = "import os; print(os.environ['RANK'], os.environ.get('SLURMGEN_WARM_GENERATION', '-'), os.getpid())"
    env = {"MASTER_ADDR": "gn7", "MASTER_PORT": str(PORT), "WORLD_SIZE": "2", "LOCAL_RANK": "0"}

    def order(worker, rank, generation):
        port = {"MASTER_PORT": str(warm.port_for(PORT, generation))}
        return StartOrder(
            worker=worker,
            group="g",
            attempt=1,
            rank=rank,
            argv=[sys.executable, "-c", show],
            cwd=None,
            env={**env, **port, "RANK": str(rank), envvars.WARM_GENERATION: str(generation)},
            heartbeat_timeout=60,
            warm=True,
            generation=generation,
        )

    def ended(slot):
        deadline = time.monotonic() + 60
        while agent.procs.slots[slot].exit_code is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return agent.procs.slots[slot].exit_code

    try:
        agent.apply(AgentOrders(start=[order(0, 0, 0)], warm=[("g", 1)]))
        ((first, _),) = agent.procs.spares.values()
        assert ended(0) == 0
        agent.apply(AgentOrders(start=[order(1, 1, 1)], warm=[("g", 1)]))
        assert agent.procs.slots[1].proc.pid == first.pid  # the spare became rank 1
        assert agent.procs.slots[1].report().spare and not agent.procs.slots[0].report().spare  # and its agent says so
        ((second, _),) = agent.procs.spares.values()
        assert second.pid != first.pid  # and a new one stands by
        assert ended(1) == 0
        log = (tmp_path / "gn6" / "logs" / "g" / "attempt-1" / "rank-1.log").read_text()
        assert log.split() == ["1", "1", str(first.pid)], log  # its output, not the spare's tag
        agent.apply(AgentOrders())  # the attempt is over for this node
        assert agent.procs.spares == {} and second.poll() is not None
    finally:
        agent.procs.stop_all(1)
