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
import subprocess
import sys
import time

import httpx
import pytest
from faults import cut_off
from train_helpers import free_port

from slurmgen.coordinator.agent import CUT_OFF_MARGIN

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="torch is not installed: run scripts/setup.sh")
pytest.importorskip("fastapi", reason="the serve extra is not installed: run scripts/setup.sh --test")

AGENT_TIMEOUT = 5.0
PY = sys.executable


class Coord:
    """The server, the agents and an authenticated client, all torn down at the end."""

    def __init__(self, cluster, tmp_path):
        self.cluster, self.tmp = cluster, tmp_path
        self.port = free_port()
        self.url = f"http://{cluster.controller_ip}:{self.port}"
        self.server = self.start_server()
        self.token = (tmp_path / "token").read_text().strip()
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10)
        # Two nodes whatever the cluster's size (SLURMGEN_TEST_NODES): the group of 4 is 2 x 2.
        self.agents = {n.name: self.start_agent(n) for n in cluster.nodes[:2]}

    def start_server(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [PY, "-m", "slurmgen", "serve", "--host", self.cluster.controller_ip, "--port", str(self.port),
             "--db", str(self.tmp / "c.db"), "--token-file", str(self.tmp / "token"),
             "--agent-timeout", str(AGENT_TIMEOUT)],
            stdout=open(self.tmp / "serve.log", "a"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/health", timeout=1).status_code == 200:
                    return proc
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("server did not come up:\n" + (self.tmp / "serve.log").read_text())

    def start_agent(self, node) -> subprocess.Popen:
        # nsenter execs the agent (no fork), so the Popen pid is the agent itself.
        argv = ["nsenter", f"--net=/run/netns/{node.netns}", f"--uts=/proc/{node.slurmd_pid}/ns/uts", "--",
                PY, "-m", "slurmgen", "agent", "--server", self.url, "--token-file", str(self.tmp / "token"),
                "--workers", "2", "--state-dir", str(self.tmp / "agents"), "--grace", "3"]
        return subprocess.Popen(argv, env=self.cluster.env(), stdout=open(self.tmp / f"agent-{node.name}.log", "a"),
                                stderr=subprocess.STDOUT)

    def call(self, method, path, **kw):
        r = self.http.request(method, path, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r.json() if r.content else None

    def group(self):
        return self.call("GET", "/api/groups/exp1")

    def wait(self, states, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            g = self.group()["group"]
            if g["state"] in states:
                return g
            time.sleep(0.2)
        raise AssertionError(f"group never reached {states}: {self.group()}\n{self.logs()}")

    def logs(self):
        return "\n".join(f"[{ln['rank']}] {ln['line']}" for ln in self.call("GET", "/api/groups/exp1/logs"))

    def rank_procs(self, marker):
        return [p for n in self.cluster.nodes for p in self.cluster.pids_on(n) if marker in p.cmdline]

    def form_group(self) -> list[str]:
        """Group exp1 of node1-0, node1-1, node2-0, node2-1, once all four workers are there."""
        names = [f"{n}-{i}" for n in ("node1", "node2") for i in (0, 1)]
        wait_for(lambda: sorted(w["name"] for w in self.call("GET", "/api/workers")) == names, 30, "4 workers")
        self.call("POST", "/api/groups", json={"name": "exp1"})
        self.call("POST", "/api/workers/move", json={"workers": names, "group": "exp1"})
        return names

    def run(self, *argv):
        self.call("PUT", "/api/groups/exp1/config",
                  json={"master": "node1", "backend": "gloo", "argv": list(argv), "stop_grace": 3})
        return self.call("POST", "/api/groups/exp1/start")

    def close(self):
        for proc in [*self.agents.values(), self.server]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.agents.values(), self.server]:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.http.close()


def wait_for(check, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def coord(cluster, tmp_path):
    c = Coord(cluster, tmp_path)
    try:
        yield c
    finally:
        c.close()
    assert not c.rank_procs("slurmgen-rank-marker") and not c.rank_procs("slurmgen.train.probe"), "ranks left behind"


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
    probes = [json.loads(ln["line"].split(" ", 1)[1]) for ln in coord.call("GET", "/api/groups/exp1/logs")
              if ln["line"].startswith("SLURMGEN_PROBE ")]
    assert sorted((p["rank"], p["host"], p["local_rank"], p["node_rank"]) for p in probes) == [
        (0, "node1", 0, 0), (1, "node1", 1, 0), (2, "node2", 0, 1), (3, "node2", 1, 1)]
    assert all(p["problems"] == [] and p["sum"] == p["expected_sum"] for p in probes)
    assert all(p["master_addr"] == "node1" and p["master_port"] == 29500 for p in probes)
    assert coord.call("POST", "/api/groups/exp1/stop")["state"] == "succeeded"  # stopping a finished group: no-op

    # 2. One rank fails: the group fails with its code and every rank is gone.
    coord.run(PY, "-m", "slurmgen.train.probe", "--backend", "gloo", "--fail-rank", "2", "--sleep", "1",
              "--timeout", "60")
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
    gone = wait_for(lambda: not [p for p in coord.rank_procs("slurmgen-rank-marker") if p.node == "node2"], 5,
                    "node2's ranks to die with their agent")
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
    wait_for(lambda: all(w["state"] == "running" and w["seen_ago"] is not None and w["seen_ago"] < 2
                         for w in coord.group()["workers"]), 10, "re-attach")
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
    assert "longer than the server's agent timeout (5 s) + 5 s: it has failed this node's groups; stopping 2 rank(s)" in said
