"""Issue 35, item 4 for coordinator groups: a warm restart keeps the healthy ranks' processes.

A real `slurmgen serve` and two real agents of 2 workers each, named after loopback addresses so
every rank's MASTER_ADDR resolves here; the group (`restart_mode warm`, `max_restarts 1`, world
size 3) runs the bundled trainer as 3 real gloo ranks: ranks 0 and 1 on 127.0.0.1, rank 2 on
127.0.0.2. Once a checkpoint is written, rank 1's process is SIGKILLed. Asserted: the attempt goes
on (no second attempt), ranks 0 and 2 keep their processes (their pids unchanged) and join
generation 1, rank 1 starts anew in its node's warm spare (a process with torch imported, started
with the attempt), every rank resumes from the checkpoint and the run ends done; the group's
attempts (API and page) and the run record name the warm restart, and no process of the run is
left, nor its heartbeat and warm-world directories. The fault to every rank stepping again is
printed.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from helpers import free_port, group_of_every_worker, processes_naming, small_trainer, train_steps, wait_value

pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")

AGENTS = ("127.0.0.1", "127.0.0.2")
STEPS = 200
STEPPING = re.compile(r"warm restart: generation 1 stepping again at step (\d+), .* \(at ([\d.]+)\)")


def _lines(coord) -> list[dict]:
    return coord.api("GET", "/api/groups/warm/logs?limit=5000")[1]


def _pids(coord) -> dict[str, int | None]:
    return {w["name"]: w["pid"] for w in coord.api("GET", "/api/groups/warm")[1]["workers"]}


def test_a_killed_rank_restarts_warm_and_the_healthy_ranks_keep_their_processes(serve, tmp_path):
    coord = serve(agents=AGENTS)
    out = tmp_path / "run"
    group_of_every_worker(coord, "warm")
    train = small_trainer(out, STEPS)
    config = {
        "argv": train,
        "backend": "gloo",
        "master_port": free_port(),  # not 29500: other tests on this machine may hold it
        "world_size": 3,
        "cwd": str(tmp_path),
        "max_restarts": 1,
        "restart_mode": "warm",
        "stop_grace": 3,
        "env": {"SLURMGEN_TRAIN_SLOW": "0:0.05"},  # rank 0 sleeps 50 ms a step: training outlasts start-up
    }
    status, body = coord.api("PATCH", "/api/groups/warm/config", config)
    assert status == 200, body
    ranks = coord.api("GET", "/api/groups/warm/ranks")[1]
    assert [r["worker"] for r in ranks] == ["127.0.0.1-0", "127.0.0.1-1", "127.0.0.2-0"], ranks
    assert coord.api("POST", "/api/groups/warm/start")[0] == 200

    wait_value(lambda: list((out / "checkpoints").glob("ckpt-*.pt")), 120, "a checkpoint")
    before = _pids(coord)
    # One per node, idle; this run's only (its command line names --out-dir): others' tests may run spares too.
    spares = {int(p.split(":")[0]) for p in processes_naming("slurmgen.train.spare") if str(out) in p}
    assert len(spares) == 2, spares
    assert all(before[w] for w in ("127.0.0.1-0", "127.0.0.1-1", "127.0.0.2-0")), before
    agents = tmp_path / "state" / "slurmgen" / "agent"  # each agent's heartbeat and warm-world directories
    assert sorted(str(p.relative_to(agents)) for p in agents.glob("*/warm/*")) == [
        "127.0.0.1/warm/warm-1",
        "127.0.0.2/warm/warm-1",
    ]
    os.kill(before["127.0.0.1-1"], signal.SIGKILL)  # rank 1's process
    fault = time.time()

    def every_rank_stepping() -> dict[int, tuple[int, float]] | None:
        seen = {ln["rank"]: m for ln in _lines(coord) if ln["attempt"] == 1 and (m := STEPPING.search(ln["line"]))}
        return {r: (int(m[1]), float(m[2])) for r, m in seen.items()} if len(seen) == 3 else None

    stepping = wait_value(every_rank_stepping, 120, "every rank stepping again in generation 1")
    again = max(at for _, at in stepping.values())
    print(
        f"\nfault -> every rank stepping again (warm, coordinator group): {again - fault:.2f} s "
        f"(load {os.getloadavg()[0]:.1f}; per rank { ({r: round(at - fault, 2) for r, (_, at) in stepping.items()}) })"
    )
    assert min(step for step, _ in stepping.values()) >= 20, stepping  # resumed from a checkpoint
    after = wait_value(
        lambda: (p := _pids(coord))["127.0.0.1-1"] not in (None, before["127.0.0.1-1"]) and p, 10, "rank 1's pid"
    )
    assert [after[w] for w in ("127.0.0.1-0", "127.0.0.2-0")] == [before[w] for w in ("127.0.0.1-0", "127.0.0.2-0")]
    assert after["127.0.0.1-1"] in spares, (after, spares)  # rank 1 goes on in its node's warm spare

    group = wait_value(
        lambda: (g := coord.api("GET", "/api/groups/warm")[1])["group"]["state"] in ("succeeded", "failed") and g,
        180,
        "the group's end",
    )
    assert group["group"]["state"] == "succeeded" and group["group"]["restarts"] == 0, group["group"]
    (attempt,) = group["attempts"]
    (told,) = attempt["warm"]
    assert told.startswith("warm restart 1: rank 1 started anew after rank 1 (127.0.0.1-1) exited with code 137"), told
    assert attempt["exit_codes"] == {"0": 0, "1": 0, "2": 0}, attempt
    ran = {w["name"]: (w["rank"], w["attempt"], w["exit_code"]) for w in group["workers"]}
    assert [ran[w] for w in ("127.0.0.1-0", "127.0.0.1-1", "127.0.0.2-0")] == [(r, 1, 0) for r in range(3)], ran
    text = "\n".join(ln["line"] for ln in _lines(coord))
    # The healthy ranks stayed in their processes: each joined generation 1 itself.
    joined = {ln["rank"] for ln in _lines(coord) if "warm restart: joined generation 1, resumed from" in ln["line"]}
    assert joined == {0, 2}, text[-3000:]
    assert f"done: step {STEPS}," in text and max(train_steps(out)) == STEPS, text[-3000:]
    # The run registry keeps the warm restart, which the run page and `slurmgen status` show.
    from slurmgen.contract import envvars
    from slurmgen.runs.model import find_run, get_row, recoveries_of
    from slurmgen.runs.registry import Registry

    with Registry.open(coord.env[envvars.REGISTRY]) as reg:
        row = get_row(reg, find_run(reg, "group", "warm.1"))
        assert recoveries_of(row["info"]) == {1: [told]} and row["state"] == "succeeded", row
    wait_value(lambda: not processes_naming(str(out)), 15, f"the run's processes gone: {processes_naming(str(out))}")
    # ... nor its heartbeat and warm-world directories on either node (the ranks' logs stay).
    wait_value(
        lambda: not [*agents.glob("*/heartbeats/*"), *agents.glob("*/warm/*")], 15, "the attempt's directories gone"
    )
    assert len(list(agents.glob("*/logs/warm/attempt-1/rank-*.log"))) == 3
