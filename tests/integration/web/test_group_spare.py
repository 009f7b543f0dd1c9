"""Issue 35, item 2 for coordinator groups: a spare node takes a lost node's ranks.

A real `slurmgen serve` (agent timeout 3 s) and three real agents of 2 workers each, named after
loopback addresses so every rank's MASTER_ADDR resolves here; the group asks `spare_nodes 1`, so
127.0.0.3 (last in its order) runs nothing. The bundled trainer runs 4 real gloo ranks and
checkpoints; once a checkpoint is written, 127.0.0.2's agent is SIGKILLed (its watchdog kills
its ranks). The restart puts node 1 (ranks 2 and 3) on the spare's workers, the group's attempts
and its run record say so, the trainer resumes from the checkpoint with the same world size and
finishes, and no process of the run is left. The fault to training again is printed.

Item 3 for groups, a smaller world: two agents, `min_nodes 1` and no spare; 127.0.0.2's agent is
SIGKILLed after a checkpoint and the group goes on with 127.0.0.1's two ranks alone (a world of 2),
from the checkpoint, its global batch kept by gradient accumulation, to the end.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from helpers import free_port, group_of_every_worker, processes_naming, small_trainer, train_steps, wait_value

pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

AGENTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
STEPS = 150
MOVED = "node 1 moved from 127.0.0.2 to the spare host 127.0.0.3"


def test_a_spare_node_takes_the_ranks_of_a_node_whose_agent_died(serve, tmp_path):
    coord = serve(agents=AGENTS, serve_args=("--agent-timeout", "3"))
    out = tmp_path / "run"
    group_of_every_worker(coord, "spare")
    train = small_trainer(out, STEPS)
    config = {
        "argv": train,
        "backend": "gloo",
        "master_port": free_port(),  # not 29500: other tests on this machine may hold it
        "cwd": str(tmp_path),
        "spare_nodes": 1,
        "max_restarts": 1,
        "stop_grace": 3,
        "env": {"SLURMGEN_TRAIN_SLOW": "0:0.05"},  # rank 0 sleeps 50 ms a step: training outlasts start-up
    }
    status, body = coord.api("PATCH", "/api/groups/spare/config", config)
    assert status == 200, body
    ranks = coord.api("GET", "/api/groups/spare/ranks")[1]
    assert [r["worker"] for r in ranks] == ["127.0.0.1-0", "127.0.0.1-1", "127.0.0.2-0", "127.0.0.2-1"], ranks
    assert coord.api("POST", "/api/groups/spare/start")[0] == 200

    wait_value(lambda: list((out / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint")
    agent = coord.procs[1 + AGENTS.index("127.0.0.2")]
    os.killpg(agent.pid, signal.SIGKILL)  # the node's agent dies; its watchdog kills its ranks
    fault = time.time()
    agent.wait()

    def resumed() -> re.Match | None:
        lines = coord.api("GET", "/api/groups/spare/logs?limit=5000")[1]
        text = "\n".join(ln["line"] for ln in lines if ln["attempt"] == 2)
        return re.search(r"resumed from \S+ckpt-0*(\d+)\.pt at step (\d+)", text)

    step = int(wait_value(resumed, 120, "attempt 2 resuming")[2])
    assert step >= 20
    wait_value(lambda: step + 1 in train_steps(out), 60, "a step after the resume")
    print(f"fault -> training again on the spare: {time.time() - fault:.1f} s (resumed at step {step})")

    group = wait_value(
        lambda: (g := coord.api("GET", "/api/groups/spare")[1])["group"]["state"] in ("succeeded", "failed") and g,
        180,
        "the group's end",
    )
    assert group["group"]["state"] == "succeeded", group
    assert [(a["number"], a["moved"]) for a in group["attempts"]] == [(1, []), (2, [MOVED])], group["attempts"]
    # Attempt 1 failed on its first report: a rank of 127.0.0.1 whose peer died (exit 1), or the
    # silent agent, whichever the server saw first; either way attempt 2 runs on the spare.
    assert group["attempts"][0]["state"] == "failed" and group["group"]["restarts"] == 1, group
    ran = {w["name"]: (w["rank"], w["attempt"], w["exit_code"]) for w in group["workers"]}
    assert [ran[f"127.0.0.{n}-{i}"] for n in (1, 3) for i in (0, 1)] == [(r, 2, 0) for r in range(4)], ran
    assert [ran[f"127.0.0.2-{i}"][:2] for i in (0, 1)] == [(None, 1)] * 2, ran  # no rank since, its last run 1
    lines = coord.api("GET", "/api/groups/spare/logs?limit=5000")[1]
    text = "\n".join(ln["line"] for ln in lines if ln["attempt"] == 2)
    assert "world_size=4 " in text and f"done: step {STEPS}," in text, text[-3000:]
    assert max(train_steps(out)) == STEPS
    # The run registry keeps the move, which the run page and `slurmgen status` show.
    from slurmgen.contract import envvars
    from slurmgen.runs.model import find_run, get_row, recoveries_of
    from slurmgen.runs.registry import Registry

    registry = coord.env[envvars.REGISTRY]  # the test's own (tests/conftest.py), which serve inherits
    with Registry.open(registry) as reg:
        assert recoveries_of(get_row(reg, find_run(reg, "group", "spare.1"))["info"]) == {
            2: [MOVED]
        }  # with the attempt that ran on the spare
    wait_value(lambda: not processes_naming(str(out)), 15, f"the run's processes gone: {processes_naming(str(out))}")


def test_a_group_with_no_spare_goes_on_in_a_smaller_world_when_a_nodes_agent_dies(serve, tmp_path):
    coord = serve(agents=AGENTS[:2], serve_args=("--agent-timeout", "3"))
    out = tmp_path / "run"
    group_of_every_worker(coord, "fewer")
    train = small_trainer(out, STEPS)
    config = {
        "argv": train,
        "backend": "gloo",
        "master_port": free_port(),
        "cwd": str(tmp_path),
        "min_nodes": 1,
        # Two: the healthy node's ranks may fail first (their peer is gone), before the dead agent
        # counts as lost; that restart begins on both nodes, and the next one goes on without it.
        "max_restarts": 2,
        "stop_grace": 3,
        "env": {"SLURMGEN_TRAIN_SLOW": "0:0.05"},
    }
    status, body = coord.api("PATCH", "/api/groups/fewer/config", config)
    assert status == 200, body
    assert coord.api("POST", "/api/groups/fewer/start")[0] == 200

    wait_value(lambda: list((out / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint")
    agent = coord.procs[1 + AGENTS.index("127.0.0.2")]
    os.killpg(agent.pid, signal.SIGKILL)  # the node's agent dies; its watchdog kills its ranks
    fault = time.time()
    agent.wait()
    told = "2 -> 1 nodes: 127.0.0.2 lost, --min-nodes 1"

    def resumed() -> tuple[int, re.Match] | None:
        attempts = coord.api("GET", "/api/groups/fewer")[1]["attempts"]
        last = next((a["number"] for a in attempts if a["moved"] == [told]), None)
        lines = coord.api("GET", "/api/groups/fewer/logs?limit=5000")[1]
        text = "\n".join(ln["line"] for ln in lines if ln["attempt"] == last)
        found = re.search(r"resumed from \S+ckpt-0*(\d+)\.pt at step (\d+)", text)
        return (last, found) if last and found else None

    last, found = wait_value(resumed, 150, "the smaller world resuming")
    step = int(found[2])
    assert step >= 20
    wait_value(lambda: step + 1 in train_steps(out), 60, "a step after the resume")
    print(f"fault -> training again in the smaller world: {time.time() - fault:.1f} s (attempt {last}, step {step})")

    group = wait_value(
        lambda: (g := coord.api("GET", "/api/groups/fewer")[1])["group"]["state"] in ("succeeded", "failed") and g,
        180,
        "the group's end",
    )
    assert group["group"]["state"] == "succeeded", group
    assert [a["moved"] for a in group["attempts"]] == [[]] * (last - 1) + [[told]], group["attempts"]
    assert all(a["state"] == "failed" for a in group["attempts"][:-1]) and group["group"]["restarts"] == last - 1
    ran = {w["name"]: (w["rank"], w["attempt"], w["exit_code"]) for w in group["workers"]}
    assert [ran[f"127.0.0.1-{i}"] for i in (0, 1)] == [(0, last, 0), (1, last, 0)], ran
    lines = coord.api("GET", "/api/groups/fewer/logs?limit=5000")[1]
    text = "\n".join(ln["line"] for ln in lines if ln["attempt"] == last)
    assert "world_size=2 " in text and f"done: step {STEPS}," in text, text[-3000:]
    assert "gradient accumulation 1 -> 2 keeps the global batch of 32 samples" in text, text[-3000:]
    assert max(train_steps(out)) == STEPS
    ranks = coord.api("GET", "/api/groups/fewer/ranks")[1]  # the group ended: what a new start would run
    assert len(ranks) == 4, ranks
    from slurmgen.contract import envvars
    from slurmgen.runs.model import find_run, get_row, recoveries_of
    from slurmgen.runs.registry import Registry

    with Registry.open(coord.env[envvars.REGISTRY]) as reg:
        assert recoveries_of(get_row(reg, find_run(reg, "group", "fewer.1"))["info"]) == {last: [told]}
    wait_value(lambda: not processes_naming(str(out)), 15, f"the run's processes gone: {processes_naming(str(out))}")
