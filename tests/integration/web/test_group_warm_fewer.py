"""Issue 35, items 3 and 4 on one coordinator group: warm restarts and a smaller world together.

A real `slurmgen serve` (agent timeout 3 s) and two real agents of 2 workers each, named after
loopback addresses so every rank's MASTER_ADDR resolves here; the group (`restart_mode warm`,
`max_restarts 3`, `min_nodes 1`) runs the bundled trainer as 4 real gloo ranks, 2 per node.

1. Once a checkpoint is written, rank 1's process is SIGKILLed: a warm restart answers it (the
   attempt goes on, the healthy ranks keep their pids, rank 1 goes on in its node's warm spare).
   The group's page, in Chromium, names that warm restart in its attempts listing.
2. Past warm.SETTLE, 127.0.0.2's agent is SIGKILLed (its watchdog kills its ranks): a lost node
   is no failure a warm restart can answer, so the attempt ends and the next one runs on
   127.0.0.1 alone (2 ranks), from the checkpoint, its global batch kept by gradient
   accumulation, to the end.

Asserted: the path each fault took, the attempts as the API and the run record keep them, and
that no process of the run is left.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from helpers import free_port, group_of_every_worker, processes_naming, small_trainer, train_steps, wait_value

from slurmgen.contract import warm

pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

AGENTS = ("127.0.0.1", "127.0.0.2")
STEPS = 400
STEPPING = re.compile(r"warm restart: generation 1 stepping again at step (\d+)")
FEWER = "2 -> 1 nodes: 127.0.0.2 lost, --min-nodes 1"
WORKERS = ("127.0.0.1-0", "127.0.0.1-1", "127.0.0.2-0", "127.0.0.2-1")


@pytest.fixture
def own_coordinator(serve):
    return serve(agents=AGENTS, serve_args=("--agent-timeout", "3"))


def _group(coord) -> dict:
    return coord.api("GET", "/api/groups/both")[1]


def _lines(coord, attempt: int) -> list[dict]:
    return [ln for ln in coord.api("GET", "/api/groups/both/logs?limit=5000")[1] if ln["attempt"] == attempt]


def _start(coord, tmp_path) -> None:
    group_of_every_worker(coord, "both")
    config = {
        "argv": small_trainer(tmp_path / "run", STEPS),
        "backend": "gloo",
        "master_port": free_port(),  # not 29500: other tests on this machine may hold it
        "cwd": str(tmp_path),
        "restart_mode": "warm",
        "max_restarts": 3,
        "min_nodes": 1,
        "stop_grace": 3,
        "env": {"SLURMGEN_TRAIN_SLOW": "0:0.05"},  # rank 0 sleeps 50 ms a step: training outlasts both faults
    }
    status, body = coord.api("PATCH", "/api/groups/both/config", config)
    assert status == 200, body
    assert [r["worker"] for r in coord.api("GET", "/api/groups/both/ranks")[1]] == list(WORKERS)
    assert coord.api("POST", "/api/groups/both/start")[0] == 200


def _warm_restart(coord, out) -> tuple[str, int]:
    """Fault 1: rank 1 SIGKILLed; answered warm. What the attempt says of it, and rank 1's new pid."""
    wait_value(lambda: list((out / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint")
    before = {w["name"]: w["pid"] for w in _group(coord)["workers"]}
    spares = {int(p.split(":")[0]) for p in processes_naming("slurmgen.train.spare") if str(out) in p}
    assert len(spares) == 2 and all(before[w] for w in WORKERS), (spares, before)
    os.kill(before["127.0.0.1-1"], signal.SIGKILL)

    def every_rank_stepping() -> set | None:
        seen = {ln["rank"] for ln in _lines(coord, 1) if STEPPING.search(ln["line"])}
        return seen if seen == {0, 1, 2, 3} else None

    wait_value(every_rank_stepping, 120, "every rank stepping again in generation 1")
    after = wait_value(
        lambda: (
            (p := {w["name"]: w["pid"] for w in _group(coord)["workers"]})["127.0.0.1-1"]
            not in (None, before["127.0.0.1-1"])
            and p
        ),
        10,
        "rank 1's pid",
    )
    group = _group(coord)
    assert [after[w] for w in WORKERS if w != "127.0.0.1-1"] == [before[w] for w in WORKERS if w != "127.0.0.1-1"]
    assert after["127.0.0.1-1"] in spares, (after, spares)  # rank 1 goes on in its node's warm spare
    (attempt,) = group["attempts"]
    (told,) = attempt["warm"]
    assert attempt["state"] == "running" and group["group"]["restarts"] == 0, group
    assert told.startswith("warm restart 1: rank 1 started anew after rank 1 (127.0.0.1-1) exited with code 137"), told
    assert attempt["took"] == [f"127.0.0.1's warm spare (pid {after['127.0.0.1-1']})"], attempt
    return told, after["127.0.0.1-1"]


def _page_names_the_warm_restart(p, coord, pid: int) -> None:
    p.log_in(coord.token)
    p.page.goto(coord.url + "/ui/groups/both")
    listing = p.page.locator("table.attempts")
    row = listing.locator("tbody tr").first
    text = row.inner_text()
    assert "warm restart 1: rank 1 started anew after rank 1 (127.0.0.1-1) exited with code 137" in text, text
    assert f"it went on in 127.0.0.1's warm spare (pid {pid})" in text, text  # the spare that took over
    # The warm restart spent one of the 3 restarts, inside attempt 1 (the page once said "restart 0 of 3").
    header = p.page.locator("#group-title + p").inner_text()
    assert "Attempt 1 (restart 1 of 3, 1 warm)" in header and "world size 4" in header, header
    p.shot("warm-restart-attempts")


def _page_names_the_smaller_world(p, coord) -> None:
    """After the lost node: attempt 2 ran 2 ranks (the page once kept saying world size 4)."""
    p.page.goto(coord.url + "/ui/groups/both")
    header = p.page.locator("#group-title + p").inner_text()
    assert "Attempt 2 (restart 2 of 3, 1 warm)" in header and "world size 2" in header, header
    p.shot("smaller-world-attempts")


def test_a_group_restarts_warm_then_goes_on_in_a_smaller_world(page, own_coordinator, tmp_path):
    coord, out = own_coordinator, tmp_path / "run"
    _start(coord, tmp_path)
    told, pid = _warm_restart(coord, out)
    warmed = time.time()
    _page_names_the_warm_restart(page, coord, pid)

    time.sleep(max(0.0, warm.SETTLE + 1 - (time.time() - warmed)))  # a failure past SETTLE: judged on its own
    agent = coord.procs[1 + AGENTS.index("127.0.0.2")]
    os.killpg(agent.pid, signal.SIGKILL)  # the node's agent dies; its watchdog kills its ranks
    fault = time.time()
    agent.wait()

    def resumed() -> tuple[int, re.Match] | None:
        attempts = _group(coord)["attempts"]
        last = next((a["number"] for a in attempts if a["moved"] == [FEWER]), None)
        text = "\n".join(ln["line"] for ln in _lines(coord, last)) if last else ""
        found = re.search(r"resumed from \S+ckpt-0*(\d+)\.pt at step (\d+)", text)
        return (last, found) if found else None

    last, found = wait_value(resumed, 150, "the smaller world resuming")
    step = int(found[2])
    wait_value(lambda: step + 1 in train_steps(out), 60, "a step after the resume")
    print(f"\nfault -> training again in the smaller world: {time.time() - fault:.1f} s (attempt {last}, step {step})")

    group = wait_value(
        lambda: (g := _group(coord))["group"]["state"] in ("succeeded", "failed") and g, 240, "the group's end"
    )
    attempts = group["attempts"]
    assert group["group"]["state"] == "succeeded", group["group"]
    # The lost node is answered whole, never warm: attempt 1 keeps its one warm restart and fails on
    # the lost node, attempt 2 runs on the node left.
    assert [(a["number"], a["state"], a["warm"], a["moved"]) for a in attempts] == [
        (1, "failed", [told], []),
        (2, "succeeded", [], [FEWER]),
    ], attempts
    assert "127.0.0.2" in (attempts[0]["reason"] or ""), attempts[0]
    assert group["group"]["restarts"] == 1, group["group"]
    ran = {w["name"]: (w["rank"], w["attempt"], w["exit_code"]) for w in group["workers"]}
    assert [ran[w] for w in WORKERS[:2]] == [(0, 2, 0), (1, 2, 0)], ran
    text = "\n".join(ln["line"] for ln in _lines(coord, 2))
    assert "world_size=2 " in text and f"done: step {STEPS}," in text, text[-3000:]
    assert "gradient accumulation 1 -> 2 keeps the global batch of 32 samples" in text, text[-3000:]
    assert step >= 20 and max(train_steps(out)) == STEPS
    _page_names_the_smaller_world(page, coord)
    from slurmgen.contract import envvars
    from slurmgen.runs.model import find_run, get_row, recoveries_of
    from slurmgen.runs.registry import Registry

    with Registry.open(coord.env[envvars.REGISTRY]) as reg:
        assert recoveries_of(get_row(reg, find_run(reg, "group", "both.1"))["info"]) == {1: [told], 2: [FEWER]}
    # Its ranks and its warm spares (whose command lines name the run's --out-dir too).
    wait_value(lambda: not processes_naming(str(out)), 15, f"the run's processes gone: {processes_naming(str(out))}")


# Rank 1 of the first attempt fails before it ever meets the others (3 s in, once every process runs
# and the others wait in the rendezvous); every other process is the bundled trainer.
ONCE = """import os, runpy, sys, time
flag = os.path.join(os.environ["OUT"], "failed-once")
if os.environ["RANK"] == "1" and not os.path.exists(flag):
    time.sleep(3)
    open(flag, "w").close()
    sys.exit(1)
sys.argv = ["slurmgen.train", *sys.argv[1:]]
runpy.run_module("slurmgen.train", run_name="__main__", alter_sys=True)
"""


def test_a_rank_that_fails_before_the_ranks_met_restarts_the_group_whole_not_warm(serve, tmp_path):
    """Warm restarts need every rank to have met (its process group formed): before that the
    others sit in the first rendezvous, which no new world reaches, and a warm restart would leave
    them there until --init-timeout (60 s). The attempt restarts whole at once and runs to the end."""
    coord = serve(agents=AGENTS)
    out = tmp_path / "run"
    out.mkdir()
    group_of_every_worker(coord, "both")
    train = small_trainer(out, 30)
    config = {
        "argv": [train[0], "-c", ONCE, *train[3:]],  # the trainer's own arguments after `-m slurmgen.train`
        "backend": "gloo",
        "master_port": free_port(),
        "cwd": str(tmp_path),
        "restart_mode": "warm",
        "max_restarts": 1,
        "stop_grace": 3,
        "env": {"OUT": str(out)},
    }
    assert coord.api("PATCH", "/api/groups/both/config", config)[0] == 200
    began = time.time()
    assert coord.api("POST", "/api/groups/both/start")[0] == 200
    group = wait_value(
        lambda: (g := _group(coord))["group"]["state"] in ("succeeded", "failed") and g, 120, "the group's end"
    )
    took = time.time() - began
    attempts = group["attempts"]
    assert [(a["number"], a["state"], a["warm"]) for a in attempts] == [(1, "failed", []), (2, "succeeded", [])], (
        attempts
    )
    assert attempts[0]["reason"] == "rank 1 (127.0.0.1-1) exited with code 1 (failed)", attempts[0]
    assert group["group"]["restarts"] == 1 and took < 60, (group["group"], took)  # never waited out --init-timeout
    assert "done: step 30," in "\n".join(ln["line"] for ln in _lines(coord, 2))
    wait_value(lambda: not processes_naming(str(out)), 15, f"the run's processes gone: {processes_naming(str(out))}")
