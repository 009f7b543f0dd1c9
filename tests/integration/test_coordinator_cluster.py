"""`slurmgen serve` in the root namespace and `slurmgen agent --workers 2` inside each node.

One session, several phases (the cluster is shared and time is short): a group of 4 running
the torch.distributed probe with master node1; a failing rank stopping the whole group; the
server restarted while a group runs; an agent SIGKILLed; and requests without a valid token.
Then the network faults: a server away for longer than its agent timeout (the ranks go on),
and a node cut off by nftables (its agent stops its ranks while the partition lasts).
"""

from __future__ import annotations

import json
import signal
import sys
import time

import httpx
import pytest
from faults import cut_off
from helpers import AGENT_TIMEOUT, Coord, wait_for

from slurmgen.coordinator.node_agent import CUT_OFF_MARGIN
from slurmgen.train.checkpoint import sharded

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")
pytest.importorskip("fastapi", reason="the serve extra is not installed: run scripts/setup.sh --test")

PY = sys.executable


@pytest.fixture
def coord(cluster, tmp_path):
    c = Coord(cluster, tmp_path)
    try:
        yield c
    finally:
        c.close()
    assert not [p for m in ("slurmgen-rank-marker", "slurmgen.train") for p in c.rank_procs(m)], "ranks left behind"


def test_coordinator_on_the_cluster(coord, cluster):
    # No token / wrong token: 401 and nothing changed.
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert httpx.post(f"{coord.url}/api/groups", json={"name": "evil"}, headers=headers).status_code == 401
        assert httpx.get(f"{coord.url}/api/workers", headers=headers).status_code == 401
    assert coord.call("GET", "/api/groups") == []

    assert [n.name for n in cluster.nodes[:2]] == ["node1", "node2"]
    coord.form_group()

    # 1. The probe: every rank agrees, ranks follow the rule (node1 = master first).
    coord.run(PY, "-m", "slurmgen.train.probe", "--backend", "gloo", "--timeout", "60")
    g = coord.wait({"succeeded", "failed"}, 120)
    assert g["state"] == "succeeded", coord.logs()
    probes = [
        json.loads(ln["line"].split(" ", 1)[1])
        for ln in coord.call("GET", "/api/groups/exp1/logs")
        if ln["line"].startswith("SLURMGEN_PROBE ")
    ]
    assert sorted((p["rank"], p["host"], p["local_rank"], p["node_rank"]) for p in probes) == [
        (0, "node1", 0, 0),
        (1, "node1", 1, 0),
        (2, "node2", 0, 1),
        (3, "node2", 1, 1),
    ]
    assert all(p["problems"] == [] and p["sum"] == p["expected_sum"] for p in probes)
    assert all(p["master_addr"] == "node1" and p["master_port"] == 29500 for p in probes)
    assert coord.call("POST", "/api/groups/exp1/stop")["state"] == "succeeded"  # stopping a finished group: no-op

    # 2. One rank fails: the group fails with its code and every rank is gone.
    coord.run(
        PY, "-m", "slurmgen.train.probe", "--backend", "gloo", "--fail-rank", "2", "--sleep", "1", "--timeout", "60"
    )
    g = coord.wait({"succeeded", "failed"}, 120)
    assert (g["state"], g["exit_code"]) == ("failed", 1) and "rank 2 (node2-0)" in g["reason"], g
    wait_for(lambda: not coord.rank_procs("slurmgen.train.probe"), 10, "probe ranks to be gone")

    # 3. The server restarts during a run: the ranks go on, the state comes back.
    sleeper = [PY, "-c", "import time, sys; time.sleep(120)", "slurmgen-rank-marker"]
    coord.run(*sleeper)
    coord.wait({"running"}, 60)
    before = {p.pid for p in coord.rank_procs("slurmgen-rank-marker")}
    assert len(before) == 4
    coord.server.send_signal(signal.SIGTERM)
    coord.server.wait(15)
    time.sleep(1.5)
    assert {p.pid for p in coord.rank_procs("slurmgen-rank-marker")} == before
    coord.server = coord.start_server()
    detail = coord.group()
    assert (detail["group"]["state"], detail["group"]["attempt"]) == ("running", 3)
    assert [a["state"] for a in detail["attempts"]] == ["succeeded", "failed", "running"]
    wait_for(lambda: all(w["state"] == "running" and w["pid"] for w in coord.group()["workers"]), 10, "re-attach")

    # 4. An agent SIGKILLed: its ranks die with it, the group fails within the timeout + 2 s.
    killed = time.monotonic()
    coord.agents["node2"].kill()
    coord.agents["node2"].wait()
    gone = wait_for(
        lambda: not [p for p in coord.rank_procs("slurmgen-rank-marker") if p.node == "node2"],
        5,
        "node2's ranks to die with their agent",
    )
    g = coord.wait({"failed"}, AGENT_TIMEOUT + 2)
    failed = time.monotonic()
    assert g["exit_code"] == 255 and "node2" in g["reason"], g
    wait_for(lambda: not coord.rank_procs("slurmgen-rank-marker"), 10, "node1's ranks to be stopped")
    print(f"agent SIGKILL: ranks gone after {gone - killed:.2f} s, group failed after {failed - killed:.2f} s")


def test_a_cut_off_agent_stops_its_ranks_and_a_long_server_restart_keeps_them(coord, cluster):
    coord.form_group()
    sleeper = [PY, "-c", "import time; time.sleep(300)", "slurmgen-rank-marker"]
    coord.run(*sleeper)
    coord.wait({"running"}, 60)
    before = {p.pid for p in coord.rank_procs("slurmgen-rank-marker")}
    assert len(before) == 4

    # 1. The server is away for longer than its own --agent-timeout, shorter than the agents'
    # cut-off (that timeout + the margin): a restart, not a partition. The ranks go on.
    stopped = time.monotonic()
    coord.server.send_signal(signal.SIGTERM)
    coord.server.wait(15)
    time.sleep(max(0.0, stopped + AGENT_TIMEOUT - 1.5 - time.monotonic()))
    coord.server = coord.start_server()
    away = time.monotonic() - stopped
    assert away < AGENT_TIMEOUT + CUT_OFF_MARGIN - 2, f"the restart took {away:.1f} s: not a short one"
    # Re-attached: every agent has reported to the new server (the rows alone predate it).
    wait_for(
        lambda: all(
            w["state"] == "running" and w["seen_ago"] is not None and w["seen_ago"] < 2
            for w in coord.group()["workers"]
        ),
        10,
        "re-attach",
    )
    assert coord.group()["group"]["state"] == "running"
    assert {p.pid for p in coord.rank_procs("slurmgen-rank-marker")} == before
    print(f"server away {away:.1f} s: ranks kept")

    # 2. node2 cut off: the server fails the group after its agent timeout and stops node1's
    # ranks; node2's agent stops its own once it has not reached the server for the timeout
    # + the margin, while the partition still lasts.
    node2 = cluster.node("node2")
    on_node2 = lambda: [p for p in coord.rank_procs("slurmgen-rank-marker") if p.node == "node2"]  # noqa: E731
    with cut_off(node2.netns):
        cut = time.monotonic()
        g = coord.wait({"failed"}, AGENT_TIMEOUT + 3)
        failed = time.monotonic()
        assert g["exit_code"] == 255 and "node2" in g["reason"], g
        bound = AGENT_TIMEOUT + CUT_OFF_MARGIN + 1 + 3 + 1.5  # + heartbeat interval + rank grace + slack
        gone = wait_for(lambda: not on_node2(), bound, "node2's ranks to be stopped by their cut-off agent")
        assert not coord.rank_procs("slurmgen-rank-marker")
        assert coord.agents["node2"].poll() is None  # the agent stays, to re-attach after the partition
    print(f"node2 cut off: group failed after {failed - cut:.1f} s, node2's ranks gone after {gone - cut:.1f} s")
    said = (coord.tmp / "agent-node2.log").read_text()
    # Not before the cut-off (the last answer came at most a heartbeat interval before the cut).
    assert gone - cut > AGENT_TIMEOUT + CUT_OFF_MARGIN - 1.5, said
    assert (
        "longer than the server's agent timeout (5 s) + 5 s: it has failed this node's groups; stopping 2 rank(s)"
        in said
    )


def test_a_group_with_strategy_fsdp_trains_writes_a_shard_per_rank_and_resumes(coord, tmp_path):
    """The group's strategy setting (not the command) makes the bundled trainer shard: 4 ranks on
    2 agents write one shard each; the group started again with more steps resumes from it."""
    out = tmp_path / "run"
    train = [
        PY,
        "-m",
        "slurmgen.train",
        "--out-dir",
        str(out),
        "--model",
        "mlp",
        "--mlp-hidden",
        "32",
        "--synthetic-samples",
        "512",
        "--batch-size",
        "8",
        "--threads",
        "1",
        "--init-timeout",
        "30",
        "--progress",
        "lines",
        "--log-every",
        "1",
        "--eval-iters",
        "2",
        "--save-every",
        "0",
    ]
    coord.form_group()
    for steps in (4, 7):
        coord.call(
            "PUT",
            "/api/groups/exp1/config",
            json={
                "master": "node1",
                "backend": "gloo",
                "strategy": "fsdp",
                "cwd": str(tmp_path),
                "argv": [*train, "--max-steps", str(steps)],
                "stop_grace": 3,
            },
        )
        coord.call("POST", "/api/groups/exp1/start")
        g = coord.wait({"succeeded", "failed"}, 120)
        assert g["state"] == "succeeded", coord.logs()
    logs = coord.logs()
    assert logs.count("world_size=4 ") == 2 and "launcher=env" in logs, logs
    first = out / "checkpoints" / sharded.checkpoint_name(4)
    assert f"resumed from {first} at step 4" in logs and "done: step 7," in logs, logs
    # Both checkpoints are sharded, 4 ways, by fsdp: one shard file per rank, DCP's index, meta.pt.
    for step in (4, 7):
        path = out / "checkpoints" / sharded.checkpoint_name(step)
        info = sharded.describe(path)
        assert (info["complete"], info["step"], info["world_size"], info["strategy"]) == (True, step, 4, "fsdp"), info
        assert sorted(info["files"]) == [".metadata", *(f"__{k}_0.distcp" for k in range(4)), "meta.pt"], info
    assert (out / "checkpoints" / "latest").read_text().strip() == sharded.checkpoint_name(7)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == list(range(1, 8))
