"""Issue 33: a coordinator group's newest line reached the page a heartbeat late (the agent sent
its ranks' lines only with its heartbeat). A real `slurmgen agent` beating every 5 s against a real
`slurmgen serve`: each line a rank prints is on the server within a second, long before the next
heartbeat would have carried it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

BEAT = 5.0  # the agent's heartbeat interval here (its flag's maximum)
PRINTS = (2.0, 3.3, 4.6)  # seconds after the rank starts: at most one of them can be near a beat

RANK = f"""
import sys, time
start = time.time()
for at in {PRINTS!r}:
    time.sleep(max(0.0, start + at - time.time()))
    print("printed at", repr(time.time()), flush=True)
time.sleep(120)
"""


def _wait(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.02)
    return found


def test_a_line_reaches_the_server_before_the_next_heartbeat_would_carry_it(serve, tmp_path):
    coordinator = serve()
    token_file = coordinator.home / "config" / "slurmgen" / "token"
    argv = [sys.executable, "-m", "slurmgen", "agent", "--server", coordinator.url, "--token-file", str(token_file)]
    argv += ["--workers", "1", "--name", "127.0.0.1", "--interval", str(BEAT), "--grace", "3"]
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            argv, env=coordinator.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        (worker,) = [w["name"] for w in coordinator.wait_workers(1)]
        assert coordinator.api("POST", "/api/groups", {"name": "lines"})[0] == 201
        assert coordinator.api("POST", "/api/workers/move", {"workers": [worker], "group": "lines"})[0] == 200
        config = {"argv": [sys.executable, "-c", RANK], "backend": "gloo", "cwd": str(tmp_path)}
        assert coordinator.api("PATCH", "/api/groups/lines/config", config)[0] == 200
        assert coordinator.api("POST", "/api/groups/lines/start")[0] == 200
        seen: dict[str, float] = {}

        def arrived() -> bool:
            status, lines = coordinator.api("GET", "/api/groups/lines/logs")
            assert status == 200, lines
            now = time.time()
            for ln in lines:
                seen.setdefault(ln["line"], now)
            return len([text for text in seen if text.startswith("printed at")]) == len(PRINTS)

        _wait(arrived, 30 + BEAT)
        waits = sorted(seen[text] - float(text.split()[-1]) for text in seen if text.startswith("printed at"))
        # with the lines only in heartbeats 5 s apart, two of three lines 1.3 s apart wait over 1 s
        assert waits[-1] < 1.0, (waits, (tmp_path / "agent.log").read_text())
    finally:
        coordinator.api("POST", "/api/groups/lines/stop")
        os.killpg(agent.pid, signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
