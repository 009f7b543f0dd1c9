"""The coordinator (`slurmgen serve` + `slurmgen agent`) on this machine: start, crash, load.

    python benchmarks/bench_coordinator.py [--repeat 3] [--seconds 10] [--loads 125x8,1000x1,2000x1]
                                           [--no-start] [--profile FILE]

Runs a real server and real agents as local processes (two agents named gn6 and gn7 with 2
workers each stand for 2 nodes x 2 GPUs; no test cluster needed, so it never waits for it).

1. Start to all ranks running, 2 x 2: from `POST /groups/exp1/start` to the moment the last
   rank has written its own timestamp. Baseline: the same 4 rank commands started directly
   with subprocess.Popen (what any launcher pays at least). The gap is mostly the agents'
   heartbeat interval (1 s): orders travel on the next heartbeat.
2. Crash to last worker gone: rank 3 writes a timestamp and exits 3; the time until the
   last of the other ranks' processes has left /proc (scanned every 10 ms). Goal <= 2 s.
3. Load: N simulated agents post a heartbeat once a second each (threads with keep-alive
   http.client connections in two child processes): 125 agents x 8 workers = 1,000 workers,
   then 1,000 agents x 1 worker (1,000 requests a second, the worst case), then 2,000 x 1.
   Heartbeat latency p50/p99 beside the latency of /api/health in the same run (baseline), and
   the server's CPU use from /proc/PID/stat, in cores and in ms per heartbeat.
   Goal: p99 < 100 ms and < 0.5 core (< 0.5 ms per heartbeat) for 1,000 x 1; the server keeps
   up at 2,000 (p99 < 1 s); CPU per heartbeat flat from 125 to 2,000 agents. The load generator
   shares the machine's 2 cores with the server, so the figures are an upper bound.
   Last, the same heartbeats straight into the ASGI app in this process (no network, no
   uvicorn): the CPU the coordinator's own code costs per heartbeat, a figure that holds on a
   busy machine (app_cpu).
   --profile FILE: where a heartbeat's time goes (cProfile of the server's main thread, which
   serves the heartbeat route; cProfile slows it, so latencies under it are no figures).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PY = sys.executable
RANK_CMD = (
    "import os, sys, time; d = sys.argv[1]; r = os.environ.get('RANK', sys.argv[2]);"
    "open(f'{d}/up-{r}', 'w').write(repr(time.time()));"
    "time.sleep(2 if r == '3' else float(sys.argv[3]));"
    "open(f'{d}/crash-{r}', 'w').write(repr(time.time())) if r == '3' else None;"
    "sys.exit(3 if r == '3' else 0)"
)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(self, tmp: Path, profile: str | None = None):
        self.tmp, self.port = tmp, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        # --profile: the server runs under cProfile (its main thread, where the async heartbeat
        # route runs), which writes the file when the server exits
        python = [PY, "-m", "cProfile", "-o", profile] if profile else [PY]
        self.server = self.spawn("serve", "--port", str(self.port), "--db", str(tmp / "c.db"), python=python)
        # uvicorn re-raises a SIGTERM once it has shut down, which kills cProfile before it
        # writes; SIGINT ends in a KeyboardInterrupt, after which cProfile writes its file
        self.server_stop = signal.SIGINT if profile else signal.SIGTERM
        for _ in range(150):
            try:
                httpx.get(self.url + "/api/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        token = (tmp / "token").read_text().strip()
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        self.token = token

    def spawn(self, *args: str, python: list[str] | None = None) -> subprocess.Popen:
        p = subprocess.Popen(
            [*(python or [PY]), "-m", "slurmgen", *args, "--token-file", str(self.tmp / "token")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "SLURMGEN_SERVER": getattr(self, "url", "")},
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in reversed(self.procs):
            p.send_signal(self.server_stop if p is self.server else signal.SIGTERM)
            p.wait(60)


def wait_files(d: Path, prefix: str, n: int, timeout: float = 60) -> list[float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(d.glob(prefix + "*"))
        if len(found) == n and all(f.stat().st_size for f in found):
            return [float(f.read_text()) for f in found]
        time.sleep(0.005)
    raise SystemExit(f"timed out waiting for {n} {prefix} files in {d}")


def rank_pids(marker: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and marker.encode() in (p / "cmdline").read_bytes():
                pids.append(int(p.name))
        except OSError:
            pass
    return pids


def start_and_crash(stack: Stack, repeat: int) -> None:
    stack.spawn("agent", "--server", stack.url, "--workers", "2", "--name", "gn6", "--state-dir", str(stack.tmp / "a"))
    stack.spawn("agent", "--server", stack.url, "--workers", "2", "--name", "gn7", "--state-dir", str(stack.tmp / "a"))
    names = ["gn6-0", "gn6-1", "gn7-0", "gn7-1"]
    while len(stack.http.get("/api/workers").json()) < 4:
        time.sleep(0.1)
    stack.http.post("/api/groups", json={"name": "exp1"})
    stack.http.post("/api/workers/move", json={"workers": names, "group": "exp1"})
    starts, base, crashes = [], [], []
    for i in range(repeat):
        d = Path(tempfile.mkdtemp(dir=stack.tmp))
        marker = f"bench-rank-{i}-{os.getpid()}"
        argv = [PY, "-c", RANK_CMD, str(d), "x", "60", marker]
        stack.http.put("/api/groups/exp1/config", json={"master": "gn6", "argv": argv, "stop_grace": 5})
        t0 = time.time()
        assert stack.http.post("/api/groups/exp1/start").status_code == 200
        starts.append(max(wait_files(d, "up-", 4)) - t0)
        crash = wait_files(d, "crash-", 1)[0]
        while rank_pids(marker):
            time.sleep(0.01)
        crashes.append(time.time() - crash)
        # baseline: the same four commands, started directly
        d2 = Path(tempfile.mkdtemp(dir=stack.tmp))
        t0 = time.time()
        ps = [subprocess.Popen([PY, "-c", RANK_CMD, str(d2), str(r), "0.5"]) for r in (0, 1, 2, 4)]
        base.append(max(wait_files(d2, "up-", 4)) - t0)
        for p in ps:
            p.wait()
        while stack.http.get("/api/groups/exp1").json()["group"]["state"] in ("starting", "running"):
            time.sleep(0.05)
    s, b, c = statistics.median(starts), statistics.median(base), statistics.median(crashes)
    print(
        f"start to all 4 ranks running (2 x 2): median {s:.3f} s; direct Popen of the same 4: {b:.3f} s "
        f"(x{s / b:.1f}); runs {[round(x, 3) for x in starts]}"
    )
    print(f"crash to last worker gone: median {c:.3f} s (goal <= 2 s); runs {[round(x, 3) for x in crashes]}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _agent_thread(
    url: str, token: str, host: str, workers: int, offset: float, warm: float, stop: float, out: list
) -> None:
    """One simulated agent: a keep-alive connection, a heartbeat a second (http.client: the
    load generator must cost less than the server it loads)."""
    import http.client
    import json
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    body = json.dumps(
        {"host": host, "instance": "bench", "workers": [{"id": w, "state": "idle"} for w in range(workers)]}
    )
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    time.sleep(offset)  # spread over the second, as real agents drift apart
    while time.time() < stop:
        t = time.time()
        conn.request(
            "POST" if host else "GET",
            "/api/agents/heartbeat" if host else "/api/health",
            body=body if host else None,
            headers=headers,
        )
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status
        if t > warm:
            out.append(time.time() - t)
        time.sleep(max(0.0, (1.0 if host else 0.1) - (time.time() - t)))


def _load_child(
    url: str, token: str, first: int, count: int, workers: int, total: int, warm: float, stop: float, queue
) -> None:
    import threading

    out: list = []
    threads = [
        threading.Thread(
            target=_agent_thread, args=(url, token, f"sim{i:04d}", workers, i / total, warm, stop, out), daemon=True
        )
        for i in range(first, first + count)
    ]
    if first == 0:  # the baseline: /api/health ten times a second on the same server
        health: list = []
        threads.append(threading.Thread(target=_agent_thread, args=(url, token, "", 0, 0, warm, stop, health)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    queue.put((out, health if first == 0 else None))


def load(stack: Stack, agents: int, per_agent: int, seconds: float, procs: int = 2) -> None:
    import multiprocessing as mp

    queue = mp.get_context("fork").Queue()
    warm = time.time() + 3
    stop = warm + seconds
    share = -(-agents // procs)
    children = [
        mp.get_context("fork").Process(
            target=_load_child,
            args=(
                stack.url,
                stack.token,
                i * share,
                min(share, agents - i * share),
                per_agent,
                agents,
                warm,
                stop,
                queue,
            ),
        )
        for i in range(procs)
    ]
    for c in children:
        c.start()
    time.sleep(max(0.0, warm - time.time()))
    cpu0, t0 = cpu_seconds(stack.server.pid), time.time()
    results = [queue.get(timeout=seconds + 120) for _ in children]
    cpu = (cpu_seconds(stack.server.pid) - cpu0) / (time.time() - t0)
    for c in children:
        c.join()
    latencies = [x for out, _ in results for x in out]
    health = next(h for _, h in results if h is not None)
    q = statistics.quantiles(latencies, n=100)
    h = statistics.quantiles(health, n=100)
    rate = len(latencies) / seconds
    print(
        f"{agents} agents x {per_agent} workers ({agents * per_agent} workers, {rate:.0f} "
        f"heartbeats/s): p50 {q[49] * 1000:.1f} ms, p99 {q[98] * 1000:.1f} ms; /api/health p99 "
        f"{h[98] * 1000:.1f} ms (x{q[98] / h[98]:.1f}); server CPU {cpu:.2f} core, {cpu / rate * 1000:.3f} ms "
        f"per heartbeat (goal p99 < 100 ms, < 0.5 core at 1,000; CPU per heartbeat flat)"
    )


def app_cpu(agents: int, per_agent: int, rounds: int = 5) -> float:
    """The server's own code alone, in this process: the ASGI app (the Gate, the middlewares, the
    route or its shortcut, the service, SQLite) called directly for every agent's heartbeat, no
    network, no uvicorn. CPU ms per heartbeat, of the best of `rounds` rounds (process time, so
    the figure holds on a busy machine, where the load rows' CPU per heartbeat drops as a starved
    server handles requests in batches)."""
    import asyncio
    import json

    from slurmgen.coordinator.server import create_app
    from slurmgen.coordinator.service import Coordinator
    from slurmgen.coordinator.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "c.db")
        app = create_app(Coordinator(store), "t")
        headers = [(b"authorization", b"Bearer t"), (b"content-type", b"application/json")]
        bodies = [
            json.dumps(
                {
                    "host": f"sim{i:04d}",
                    "instance": "b",
                    "workers": [{"id": w, "state": "idle"} for w in range(per_agent)],
                }
            ).encode()
            for i in range(agents)
        ]

        async def one(body: bytes) -> None:
            scope = {"type": "http", "method": "POST", "path": "/api/agents/heartbeat", "headers": headers}
            scope.update(http_version="1.1", scheme="http", query_string=b"", root_path="", client=("127.0.0.1", 1))
            scope.update(raw_path=scope["path"].encode(), server=("127.0.0.1", 80), asgi={"version": "3.0"})
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            status = []

            async def receive():
                return messages.pop() if messages else await asyncio.sleep(3600)

            async def send(message):
                status.extend([message["status"]] if "status" in message else [])

            await app(scope, receive, send)
            assert status == [200], status

        async def beats() -> float:
            for b in bodies:  # every slot's first report adds its row: not the steady cost
                await one(b)
            best = float("inf")
            for _ in range(rounds):  # the least disturbed round: others' work on the cores only adds
                t0 = time.process_time()
                for b in bodies:
                    await one(b)
                best = min(best, time.process_time() - t0)
            return best / agents * 1000

        try:
            return asyncio.run(beats())
        finally:
            store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument(
        "--loads",
        default="125x8,1000x1,2000x1",
        help="the load rows, AGENTSxWORKERS, comma-separated, in order (default: %(default)s)",
    )
    ap.add_argument("--no-start", action="store_true", help="skip parts 1 and 2 (start, crash): the load only")
    ap.add_argument(
        "--profile",
        metavar="FILE",
        help="run the server under cProfile and write its profile to FILE when it exits "
        "(read it with: python -c \"import pstats; pstats.Stats('FILE').sort_stats('cumtime').print_stats(40)\")",
    )
    args = ap.parse_args()
    loads = [tuple(int(n) for n in row.split("x")) for row in args.loads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp), args.profile and str(Path(args.profile).resolve()))
        try:
            if not args.no_start:
                start_and_crash(stack, args.repeat)
            for agents, per_agent in loads:
                load(stack, agents, per_agent, args.seconds)
        finally:
            stack.close()
    figures = [f"{a} x {w}: {app_cpu(a, w):.3f} ms" for a, w in loads]
    print(f"the app alone, in process (no network, no uvicorn), CPU per heartbeat: {'; '.join(figures)}")


if __name__ == "__main__":
    main()
