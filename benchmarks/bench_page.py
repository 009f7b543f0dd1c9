"""The page of `slurmgen serve` with 1,000 runs in its registry (50 active), beside the plain
Slurm calls of the same run (issue 22, Speed).

    python benchmarks/bench_page.py [--repeat 7] [--runs 1000] [--lines 20]

A real `slurmgen serve` (uvicorn, its own token and state in a temp dir) over a registry filled
as bench_registry.py fills it, plus one Slurm job whose log the run page follows. Measured over
HTTP with a logged-in session, medians:

- GET /ui/runs: the list rendered, its newest page of runs_page.PAGE rows (goal < 200 ms);
- GET /ui/live/runs: what the page's script asks every second to refresh the list in place;
- GET /ui/runs/SEQ: the Slurm job's page (it asks scontrol and sacct, as `slurmgen status` does);
- the newest log line: a line is appended to the job's log at a random moment while a client
  polls /ui/live/runs/SEQ/logs as the page's script does (every 0.5 s, from the last offset);
  the time from the write to the answer that holds it (goal < 1 s);
- beside them `squeue`, `scontrol show job -o ID` and `sacct -j ID` as a person would type them.

Slurm here is a set of stand-in scripts (scontrol, squeue, sacct) that print the test cluster's
recorded answers (tests/unit/jobs/data/slurm/) after a 20 ms pause, a local controller's usual
answer time: this bench needs no cluster, and measures the page, not Slurm. Pass --real-slurm
to use the Slurm clients on $PATH instead (a configured cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

from bench_registry import fill

from slurmgen.jobs.registry import JobRecord, Registry

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "unit" / "jobs" / "data" / "slurm"
POLL = 0.5  # the page's log poll (static/app.js LOG_POLL_MS)


def stand_in_slurm(bin_dir: Path) -> None:
    """scontrol/squeue/sacct that answer like the test cluster's Slurm 22.05 after 20 ms."""
    bin_dir.mkdir()
    running = (RECORDED / "scontrol_running.txt").read_text().split("#STDERR")[0].replace("JobId=1 ", "JobId=4242 ", 1)
    sacct = (RECORDED / "sacct_completed.txt").read_text().split("#STDERR")[0]
    answers = {"scontrol": running, "sacct": sacct,
               "squeue": "JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)\n"
                         "  4242     debug train root  R 0:42     2 node[1-2]\n"}
    for name, text in answers.items():
        (bin_dir / f"{name}.txt").write_text(text)
        (bin_dir / name).write_text(f"#!/bin/sh\nsleep 0.02\ncat '{bin_dir / name}.txt'\n")
        (bin_dir / name).chmod(0o755)


def serve(home: Path, registry: Path, env: dict) -> tuple[subprocess.Popen, str, str]:
    port = 20000 + random.randrange(20000)
    proc = subprocess.Popen([sys.executable, "-m", "slurmgen", "serve", "--port", str(port), "--registry", str(registry)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url, token_file = f"http://127.0.0.1:{port}", home / "config" / "slurmgen" / "token"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/api/health", timeout=1).close()
            if token_file.exists():
                return proc, url, token_file.read_text().strip()
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("slurmgen serve did not start")


def session(url: str, token: str) -> urllib.request.OpenerDirector:
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
    request = urllib.request.Request(url + "/ui/login", data=f"token={token}".encode(), headers={"Origin": url})
    opener.open(request, timeout=10).close()
    return opener


def median_ms(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def log_latency(opener, url: str, seq: int, log: Path, lines: int) -> list[float]:
    """Seconds from each line's write to the poll answer that holds it, polling as the page does."""
    written: dict[str, float] = {}
    seen: list[float] = []
    after = json.load(opener.open(f"{url}/ui/live/runs/{seq}/logs"))["next"]

    def writer() -> None:
        for i in range(lines):
            time.sleep(random.uniform(0.2, 0.9))
            with log.open("a") as f:
                written[f"line {i}"] = time.time()
                f.write(f"0: line {i}\n")

    thread = threading.Thread(target=writer)
    thread.start()
    while len(seen) < lines:
        body = json.load(opener.open(f"{url}/ui/live/runs/{seq}/logs?after={after}"))
        now, after = time.time(), body["next"]
        seen += [now - written[x["text"]] for x in body["lines"] if x["text"] in written]
        time.sleep(POLL)
    thread.join()
    return seen


def add_slurm_job(registry: Path, work: Path) -> tuple[int, Path]:
    (work / "logs").mkdir(parents=True)
    log = work / "logs" / "train-4242.out"
    log.write_text("".join(f"{r}: step {s}\n" for s in range(2000) for r in range(2)))
    with Registry.open(registry) as reg:
        record = JobRecord("4242", "train", str(work / "out"), time.time(), None, "RUNNING", None,
                           {"nodes": 2, "gpus": 1, "log_dir": str(work / "logs"), "workdir": str(work), "command": ["true"]})
        reg.add(record)
    return int(record.seq or 0), log


def plain(argv: list[str], env: dict, repeat: int) -> float:
    return median_ms(lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), repeat)


def measure(args: argparse.Namespace, tmp: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state")}
    if not args.real_slurm:
        stand_in_slurm(tmp / "bin")
        env["PATH"] = f"{tmp / 'bin'}{os.pathsep}{env['PATH']}"
    registry = tmp / "jobs.sqlite"
    fill(registry, args.runs)
    seq, log = add_slurm_job(registry, tmp / "job")
    proc, url, token = serve(tmp, registry, env)
    try:
        opener = session(url, token)
        get = lambda path: opener.open(url + path, timeout=30).read()  # noqa: E731
        size = len(get("/ui/runs"))
        page = median_ms(lambda: get("/ui/runs"), args.repeat)
        live = median_ms(lambda: get("/ui/live/runs"), args.repeat)
        run = median_ms(lambda: get(f"/ui/runs/{seq}"), args.repeat)
        latency = sorted(log_latency(opener, url, seq, log, args.lines))
    finally:
        proc.terminate()
        proc.wait(10)
    slurm = {name: plain(argv, env, args.repeat) for name, argv in
             (("squeue", ["squeue"]), ("scontrol show job -o 4242", ["scontrol", "show", "job", "-o", "4242"]),
              ("sacct -j 4242", ["sacct", "--parsable2", "--noheader", "-j", "4242"]))}
    print(f"registry: {args.runs + 1} runs ({args.runs // 20} active); Slurm: {'real' if args.real_slurm else 'stand-in scripts'}")
    print(f"GET /ui/runs (newest page, {size // 1024} KiB):  {page:7.1f} ms (goal < 200 ms)")
    print(f"GET /ui/live/runs (in-place refresh):  {live:7.1f} ms")
    print(f"GET /ui/runs/{seq} (Slurm job's page):  {run:7.1f} ms")
    print(f"newest log line on the page: median {statistics.median(latency):.2f} s, max {latency[-1]:.2f} s "
          f"over {len(latency)} lines (goal < 1 s)")
    for name, ms in slurm.items():
        print(f"plain {name + ':':28} {ms:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--real-slurm", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-page-"))
    try:
        measure(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
