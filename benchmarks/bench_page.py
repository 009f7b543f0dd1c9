"""The page of `slurmgen serve` with 1,000 runs in its registry (50 active), beside the plain
Slurm calls of the same run (issue 22, Speed).

    python benchmarks/bench_page.py [--repeat 7] [--runs 1000] [--lines 20] [--real-slurm | --test-cluster]
    python benchmarks/bench_page.py --flood [--rates 2000,10000] [--kinds launch,group,slurm] [--flood-seconds 8]

A real `slurmgen serve` (uvicorn, its own token and state in a temp dir) over a registry filled
as bench_registry.py fills it (each run with a run record of 200 train steps, whose last loss the
list shows), plus one Slurm job whose log the run page follows. Measured over
HTTP with a logged-in session, medians:

- GET /ui/runs: the list rendered, its newest page of runs_page.PAGE rows (goal < 200 ms), and
  the first such GET apart, when every row's last loss is read from its record (then kept);
- GET /ui/live/runs: what the page's script asks every second to refresh the list in place;
- GET /ui/runs/SEQ: the Slurm job's page (it asks scontrol and sacct, as `slurmgen status` does);
- the newest log line: a line is appended to the job's log at a random moment while a client
  polls /ui/live/runs/SEQ/logs as the page's script does (every 0.25 s, from the last offset);
  the time from the write to the answer that holds it (goal < 1 s);
- beside them `squeue`, `scontrol show job -o ID` and `sacct -j ID` as a person would type them.

Slurm here is a set of stand-in scripts (scontrol, squeue, sacct) that print the test cluster's
recorded answers (tests/unit/jobs/data/slurm/) after a 20 ms pause, a local controller's usual
answer time: this bench needs no cluster, and measures the page, not Slurm; the bench writes
the job's log lines itself.

--real-slurm uses the Slurm clients on $PATH and $SLURM_CONF (a configured cluster): the job is
a real 2-node job submitted with `slurmgen submit`, whose rank 0 prints the lines (each with its
time of writing) through srun into its log, so the latency includes Slurm's output forwarding.

--test-cluster (implies --real-slurm) runs it on the tests' throwaway cluster, as root:

    python benchmarks/bench_page.py --test-cluster

It holds the cluster lock (/run/lock/slurmgen-cluster.lock, which scripts/cluster/up.sh and
down.sh take) for the whole run, brings the cluster up with scripts/cluster/up.sh 2 as its owner
(a pytest session that wants it waits, as for another session), waits while another live session
owns it, and at the end cancels its job and tears the cluster down. Two runs of it on two busy
cores (2026-11-27): list 15.8 / 23.7 ms, refresh 3.4 / 4.2 ms, run page 111 / 110 ms, newest
log line median 0.28 / 0.23 s (max 0.48 / 0.53 s); plain squeue 6 / 8 ms, scontrol 11 / 8 ms,
sacct 96 / 96 ms.

--flood measures the log view under a flood (issue 33 item 8) in Debian's Chromium, for each kind
of run at each rate: a line's wait from its writing to the first update of the view that shows
it (median, 95th percentile, max), the longest main-thread task (PerformanceObserver longtask),
the rows the view holds at the end and the lines its markers say it skipped. A launch is fed
through the log file its page follows; a group through 4 ranks under 2 real local agents; a Slurm
job, with --test-cluster (or --real-slurm), is a real 2-node job per rate whose 2 ranks print the
lines through srun into its log, else the stand-in's job whose log file the bench writes (srun's
forwarding not in the figure). Figures: docs/measurements.md.

    python benchmarks/bench_page.py --flood --test-cluster --kinds slurm
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from http.cookiejar import CookieJar
from pathlib import Path

from bench_registry import fill

from slurmgen.runs.registry import JobRecord, Registry

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "unit" / "jobs" / "data" / "slurm"
POLL = 0.25  # the page's log poll (static/app.js LOG_POLL_MS)
CLUSTER = REPO / "scripts" / "cluster"
CLUSTER_LOCK = Path("/run/lock/slurmgen-cluster.lock")  # scripts/cluster/lib.sh SG_LOCK
# The real job: rank 0 waits for the bench to start polling ($GO appears), then prints $LINES
# lines 0.2-0.9 s apart, each with the time it was written; then every rank waits to be cancelled.
JOB = (
    'if [[ $RANK == 0 ]]; then while [[ ! -e $GO ]]; do sleep 0.05; done; for i in $(seq "$LINES"); do '
    'sleep 0.$((RANDOM % 8 + 2)); echo "line $i $(date +%s.%N)"; done; fi; sleep 600'
)


def stand_in_slurm(bin_dir: Path) -> None:
    """scontrol/squeue/sacct that answer like the test cluster's Slurm 22.05 after 20 ms."""
    bin_dir.mkdir()
    running = (RECORDED / "scontrol_running.txt").read_text().split("#STDERR")[0].replace("JobId=1 ", "JobId=4242 ", 1)
    sacct = (RECORDED / "sacct_completed.txt").read_text().split("#STDERR")[0]
    answers = {
        "scontrol": running,
        "sacct": sacct,
        "squeue": "JOBID PARTITION NAME USER ST TIME NODES NODELIST(REASON)\n"
        "  4242     debug train root  R 0:42     2 node[1-2]\n",
    }
    for name, text in answers.items():
        (bin_dir / f"{name}.txt").write_text(text)
        (bin_dir / name).write_text(f"#!/bin/sh\nsleep 0.02\ncat '{bin_dir / name}.txt'\n")
        (bin_dir / name).chmod(0o755)


def serve(home: Path, registry: Path, env: dict) -> tuple[subprocess.Popen, str, str]:
    port = 20000 + random.randrange(20000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmgen", "serve", "--port", str(port), "--registry", str(registry)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
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


def log_latency(opener, url: str, seq: int, lines: int, start_writing) -> list[float]:
    """Seconds from each line's write (the time the line carries: "line I TIME") to the poll answer
    that holds it, polling as the page does from the newest offset; `start_writing()` once polling."""
    seen: list[float] = []
    after = json.load(opener.open(f"{url}/ui/live/runs/{seq}/logs"))["next"]
    start_writing()
    deadline = time.monotonic() + 30 + lines
    while len(seen) < lines and time.monotonic() < deadline:
        body = json.load(opener.open(f"{url}/ui/live/runs/{seq}/logs?after={after}"))
        now, after = time.time(), body["next"]
        seen += [now - float(x["text"].split()[2]) for x in body["lines"] if x["text"].startswith("line ")]
        time.sleep(POLL)
    if len(seen) < lines:
        raise SystemExit(f"the page showed {len(seen)} of {lines} log lines in time")
    return seen


def write_lines(log: Path, lines: int) -> threading.Thread:
    """The stand-in job's rank 0: `lines` lines 0.2-0.9 s apart, as the real job's prints them."""

    def writer() -> None:
        for i in range(lines):
            time.sleep(random.uniform(0.2, 0.9))
            with log.open("a") as f:
                f.write(f"0: line {i} {time.time()}\n")

    thread = threading.Thread(target=writer)
    thread.start()
    return thread


def add_slurm_job(registry: Path, work: Path) -> tuple[int, Path]:
    """The stand-in's job 4242 (which the stand-in scontrol says is running), with a long log."""
    (work / "logs").mkdir(parents=True)
    log = work / "logs" / "train-4242.out"
    log.write_text("".join(f"{r}: step {s}\n" for s in range(2000) for r in range(2)))
    with Registry.open(registry) as reg:
        record = JobRecord(
            "4242",
            "train",
            str(work / "out"),
            time.time(),
            None,
            "RUNNING",
            None,
            {"nodes": 2, "gpus": 1, "log_dir": str(work / "logs"), "workdir": str(work), "command": ["true"]},
        )
        reg.add(record)
    return int(record.seq or 0), log


def submit_job(registry: Path, work: Path, env: dict, script: str, **job_env: object) -> tuple[int, str, Path]:
    """A real 2-node job (`slurmgen submit` into the bench's registry) running bash `script` with
    GO (a file it waits for) and `job_env` in its environment, running: (row, id, go file)."""
    work.mkdir(parents=True)
    go = work / "go"
    extra = [a for k, v in job_env.items() for a in ("-e", f"{k}={v}")]
    submitted = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmgen",
            "submit",
            "--registry",
            str(registry),
            "--nodes",
            "2",
            "--backend",
            "gloo",
            "--time",
            "10",
            "-o",
            "out",
            "-e",
            f"GO={go}",
            *extra,
            "--",
            "bash",
            "-c",
            script,
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    if submitted.returncode != 0:
        raise SystemExit(f"slurmgen submit exited {submitted.returncode}: {submitted.stderr}")
    job = submitted.stdout.strip()
    deadline = time.monotonic() + 60
    while (
        "JobState=RUNNING"
        not in subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True).stdout
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"job {job} did not start within 60 s")
        time.sleep(0.2)
    with Registry.open(registry) as reg:
        record = reg.get(job)
    return int(record.seq or 0) if record else 0, job, go


def plain(argv: list[str], env: dict, repeat: int) -> float:
    return median_ms(
        lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), repeat
    )


def measure(args: argparse.Namespace, tmp: Path, env: dict) -> None:
    env = {**env, "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state")}
    if not args.real_slurm:
        stand_in_slurm(tmp / "bin")
        env["PATH"] = f"{tmp / 'bin'}{os.pathsep}{env['PATH']}"
    registry = tmp / "jobs.sqlite"
    fill(registry, args.runs, tmp / "records")
    if args.real_slurm:
        seq, job, go = submit_job(registry, tmp / "job", env, JOB, LINES=args.lines)
        start_writing = go.touch
    else:
        seq, log = add_slurm_job(registry, tmp / "job")
        job, writers = "4242", []
        start_writing = lambda: writers.append(write_lines(log, args.lines))  # noqa: E731
    try:
        figures = over_http(args, tmp, registry, env, seq, start_writing)
        slurm = {
            name: plain(argv, env, args.repeat)
            for name, argv in (
                ("squeue", ["squeue"]),
                (f"scontrol show job -o {job}", ["scontrol", "show", "job", "-o", job]),
                (f"sacct -j {job}", ["sacct", "--parsable2", "--noheader", "-j", job]),
            )
        }
    finally:
        if args.real_slurm:
            subprocess.run(["scancel", job], env=env, check=False)
        for thread in [] if args.real_slurm else writers:
            thread.join()
    size, first, page, live, run, latency = figures
    print(
        f"registry: {args.runs + 1} runs ({args.runs // 20 + 1} active); Slurm: "
        f"{'real, job ' + job if args.real_slurm else 'stand-in scripts'}"
    )
    print(
        f"GET /ui/runs (newest page, {size // 1024} KiB):  {page:7.1f} ms (goal < 200 ms); "
        f"the first, every last loss read: {first:.1f} ms"
    )
    print(f"GET /ui/live/runs (in-place refresh):  {live:7.1f} ms")
    print(f"GET /ui/runs/{seq} (Slurm job's page):  {run:7.1f} ms")
    print(
        f"newest log line on the page: median {statistics.median(latency):.2f} s, max {latency[-1]:.2f} s "
        f"over {len(latency)} lines (goal < 1 s)"
    )
    for name, ms in slurm.items():
        print(f"plain {name + ':':28} {ms:7.1f} ms")


def over_http(args: argparse.Namespace, tmp: Path, registry: Path, env: dict, seq: int, start_writing) -> tuple:
    """(list page size, list ms, live refresh ms, run page ms, sorted log latencies) from a real server."""
    proc, url, token = serve(tmp, registry, env)
    try:
        opener = session(url, token)
        get = lambda path: opener.open(url + path, timeout=30).read()  # noqa: E731
        first = median_ms(lambda: get("/ui/runs"), 1)  # cold: every run's last loss read from its record
        size = len(get("/ui/runs"))
        page = median_ms(lambda: get("/ui/runs"), args.repeat)
        live = median_ms(lambda: get("/ui/live/runs"), args.repeat)
        run = median_ms(lambda: get(f"/ui/runs/{seq}"), args.repeat)
        latency = sorted(log_latency(opener, url, seq, args.lines, start_writing))
    finally:
        proc.terminate()
        proc.wait(10)
    return size, first, page, live, run, latency


@contextmanager
def test_cluster(wait: float, nodes: int = 2) -> Iterator[dict]:
    """The tests' throwaway cluster of `nodes` nodes, up for this process: the environment its
    Slurm clients need (bench_recovery.py brings up 3 with it).

    Holds the cluster lock throughout (up.sh and down.sh run with SG_LOCKED=1: the lock is ours),
    and owns the cluster (SLURMGEN_CLUSTER_OWNER: a test session's up.sh answers busy and waits).
    While another live session owns it, up.sh answers 4: the lock is let go and asked again."""
    state = Path(os.environ.get("SLURMGEN_CLUSTER_DIR", "/tmp/slurmgen-cluster"))
    scripts = {
        **os.environ,
        "SG_LOCKED": "1",
        "SLURMGEN_CLUSTER_DIR": str(state),
        "SLURMGEN_CLUSTER_OWNER": str(os.getpid()),
    }
    deadline = time.monotonic() + wait
    CLUSTER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with CLUSTER_LOCK.open("a") as lock:
        while True:
            fcntl.flock(lock, fcntl.LOCK_EX)
            up = subprocess.run(
                ["bash", str(CLUSTER / "up.sh"), str(nodes)], env=scripts, capture_output=True, text=True, timeout=180
            )
            if up.returncode != 4 or time.monotonic() > deadline:
                break
            fcntl.flock(lock, fcntl.LOCK_UN)  # another live session owns the cluster: let it finish
            time.sleep(5)
        if up.returncode != 0:
            raise SystemExit(f"scripts/cluster/up.sh {nodes} exited {up.returncode}:\n{up.stderr[-3000:]}")
        try:
            facts = json.loads((state / "cluster.json").read_text())
            yield {
                **os.environ,
                "SLURM_CONF": facts["slurm_conf"],
                "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
            }
        finally:
            down = subprocess.run(
                ["bash", str(CLUSTER / "down.sh")], env=scripts, capture_output=True, text=True, timeout=120
            )
            if down.returncode != 0:
                print(f"scripts/cluster/down.sh exited {down.returncode}:\n{down.stderr[-3000:]}", file=sys.stderr)


# --- a flood of output: the newest line's delay in a real Chromium, and its longest stall ------
# A writer prints RATE lines a second, each "<time of writing> <i>", for --flood-seconds; the
# page is open in Chromium (Debian's, off the network) and a probe in it notes, a frame after
# each append to the log view, the time and the newest line's; a line's wait is the time from
# its writing to the first update showing it (at worst: an update's time minus the newest line
# of the update before), reported for the worst-placed line of each update; and the longest main-thread task
# (PerformanceObserver longtask). Each kind of run is fed as it is in real use: a launch's and a
# stand-in Slurm job's lines go to the log file its page follows, a real Slurm job's are printed
# by its 2 ranks through srun, a group's by its 4 ranks under 2 real local agents.
FLOOD_KINDS = ("launch", "group", "slurm")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-sync",
]
PROBE = """
window.__probe = { shown: [], longest: 0, stalls: 0, on: false };
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) { __probe.longest = Math.max(__probe.longest, e.duration); __probe.stalls += 1; }
}).observe({ type: "longtask", buffered: true });
document.addEventListener("DOMContentLoaded", () => {
  const view = document.getElementById("log-view");
  if (!view) return;
  new MutationObserver(() => {
    const m = /(\\d{10}\\.\\d+) \\d+$/.exec(view.lastElementChild ? view.lastElementChild.textContent : "");
    if (m && __probe.on) requestAnimationFrame(() => __probe.shown.push([Date.now() / 1000, Number(m[1])]));
  }).observe(view, { childList: true });
});
"""
FILE_FLOOD = """
import sys, time
path, rate, seconds, ranks = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), 2
start, i = time.time(), 0
with open(path, "a") as f:
    while (now := time.time()) < start + seconds:
        due = int((now - start) * rate)
        f.write("".join(f"{n % ranks}: {time.time():.6f} {n}\\n" for n in range(i, due)))
        f.flush()
        i = due
        time.sleep(0.005)
"""
RANK_FLOOD = """
import os, sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
start, i = time.time(), 0
while (now := time.time()) < start + seconds:
    due = int((now - start) * rate)
    sys.stdout.write("".join(f"r{os.environ['RANK']} {time.time():.6f} {n}\\n" for n in range(i, due)))
    sys.stdout.flush()
    i = due
    time.sleep(0.005)
"""


def flood_runs(registry: Path, work: Path, env: dict, real_slurm: bool) -> dict[str, object]:
    """A launch and a Slurm job whose logs the page follows: kind -> (row, log file), the stand-in
    job's too; with real Slurm, the "slurm" kind is a function that submits a job per rate."""
    from slurmgen.runs.model import NewRun, add_run

    seq, slurm_log = add_slurm_job(registry, work / "slurm")
    launch_log = work / "launch.log"
    launch_log.write_text("".join(f"{r}: starting\n" for r in range(2)))
    with Registry.open(registry) as reg:
        row = add_run(
            reg,
            NewRun("launch", "L1", "flood", str(work), 1, 2, info={"command": ["flood"], "log_file": str(launch_log)}),
            time.time(),
        )
    runs: dict[str, object] = {"slurm": (seq, slurm_log), "launch": (row, launch_log)}
    if real_slurm:
        runs["slurm"] = lambda rate, seconds: slurm_flood(registry, work / f"slurm-{rate}", env, rate, seconds)
    return runs


def slurm_flood(registry: Path, work: Path, env: dict, rate: int, seconds: float):
    """A real 2-node job whose 2 ranks print `rate` lines a second between them through srun into
    its log, once its go file is there: (row, start, cancel)."""
    work.mkdir(parents=True)
    (work / "flood.py").write_text(RANK_FLOOD)
    script = 'while [[ ! -e $GO ]]; do sleep 0.05; done; exec "$PY" "$FLOOD" "$RATE" "$SECONDS"'
    seq, job, go = submit_job(
        registry, work / "job", env, script, PY=sys.executable, FLOOD=work / "flood.py", RATE=rate / 2, SECONDS=seconds
    )
    return seq, go.touch, lambda: subprocess.run(["scancel", job], env=env, check=False)


def agents(url: str, home: Path, env: dict) -> list[subprocess.Popen]:
    """Two local agents with 2 workers each (named after loopback hosts, as the page's tests do)."""
    token = home / "config" / "slurmgen" / "token"
    return [
        subprocess.Popen(
            [sys.executable, "-m", "slurmgen", "agent", "--server", url, "--token-file", str(token)]
            + ["--workers", "2", "--name", host, "--grace", "3"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for host in ("127.0.0.1", "localhost")
    ]


def api(url: str, token: str, method: str, path: str, body: object = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def group_flood(url: str, token: str, name: str, rate: int, seconds: float):
    """A group on the 4 workers whose ranks will print `rate` lines a second between them: its
    start, to call once the page is open."""
    deadline = time.monotonic() + 30
    while len(workers := [w["name"] for w in api(url, token, "GET", "/api/workers") if w["state"] != "running"]) < 4:
        if time.monotonic() > deadline:
            raise SystemExit(f"4 free workers did not register in 30 s: {workers}")
        time.sleep(0.2)
    api(url, token, "POST", "/api/groups", {"name": name})
    api(url, token, "POST", "/api/workers/move", {"workers": workers, "group": name})
    argv = [sys.executable, "-c", RANK_FLOOD, str(rate / 4), str(seconds)]
    api(url, token, "PUT", f"/api/groups/{name}/config", {"backend": "gloo", "argv": argv})
    return lambda: api(url, token, "POST", f"/api/groups/{name}/start")


def watch(browser, url: str, token: str, path: str, start, seconds: float) -> dict:
    """Open `path` logged in, start the flood, and read the probe after `seconds` and 2 s more."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.add_init_script(PROBE)
    page.goto(url + "/ui/login")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(url + "/ui/")
    page.goto(url + path)
    page.wait_for_timeout(1500)
    page.evaluate("window.__probe.on = true")
    start()
    page.wait_for_timeout((seconds + 2) * 1000)
    probe = page.evaluate("window.__probe")
    probe["rows"] = page.locator("#log-view .log-line").count()
    probe["markers"] = page.locator("#log-view .log-gap, #log-view .log-trimmed:visible").all_text_contents()
    context.close()
    return probe


def flood(args: argparse.Namespace, tmp: Path, env: dict) -> None:
    """Every kind at every rate: the newest line's delay (median, 95th percentile, max), the
    longest main-thread task, the rows the view held at the end."""
    from playwright.sync_api import sync_playwright

    env = {**env, "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state"), "PYTHONUNBUFFERED": "1"}
    if not args.real_slurm:
        stand_in_slurm(tmp / "bin")
    env["PATH"] = f"{tmp / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    registry = tmp / "jobs.sqlite"
    Registry.open(registry, create=True).close()
    runs = flood_runs(registry, tmp / "runs", env, args.real_slurm)
    proc, url, token = serve(tmp, registry, env)
    helpers = agents(url, tmp, env) if "group" in args.kinds else []
    if args.real_slurm:
        print("the slurm kind: a real 2-node job per rate, its ranks printing through srun into its log")
    else:
        print("the slurm kind: the stand-in's job, its log written here (--test-cluster: a real job)")
    print("kind    lines/s  a line's wait: median   p95    max   longest task  rows kept  skipped markers")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=CHROMIUM_FLAGS)
            for kind in args.kinds:
                for rate in args.rates:
                    print(flood_row(kind, rate, browser, url, token, runs, args.flood_seconds))
            browser.close()
    finally:
        for child in [*helpers, proc]:
            child.terminate()
            child.wait(10)


def flood_row(kind: str, rate: int, browser, url: str, token: str, runs: dict, seconds: float) -> str:
    writers: list[subprocess.Popen] = []
    done = None
    if kind == "group":
        name = f"flood{rate}"
        path, start = f"/ui/groups/{name}", group_flood(url, token, name, rate, seconds)
    elif callable(runs[kind]):
        seq, start, done = runs[kind](rate, seconds)
        path = f"/ui/runs/{seq}"
    else:
        seq, log = runs[kind]
        path = f"/ui/runs/{seq}"
        argv = [sys.executable, "-c", FILE_FLOOD, str(log), str(rate), str(seconds)]
        start = lambda: writers.append(subprocess.Popen(argv))  # noqa: E731
    try:
        probe = watch(browser, url, token, path, start, seconds)
    finally:
        if done:
            done()
    for w in writers:
        w.wait(30)
    # A line written just after the newest line of one update waits for the next update: its
    # wait is that update's time minus the previous one's newest line.
    shown = probe["shown"]
    d = sorted(now - before[1] for before, (now, _) in zip(shown, shown[1:])) or [float("nan")]
    q = lambda f: d[min(len(d) - 1, int(f * len(d)))]  # noqa: E731
    skipped = sum(int(m.group(1).replace(",", "")) for t in probe["markers"] if (m := re.match(r"… ([\d,]+)", t)))
    return (
        f"{kind:7} {rate:7}  {q(0.5):18.2f} s {q(0.95):5.2f} s {d[-1]:5.2f} s {probe['longest']:9.0f} ms"
        f"  {probe['rows']:9}  {skipped:7} in {len(probe['markers'])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--real-slurm", action="store_true", help="the Slurm clients on $PATH, a real job")
    parser.add_argument("--test-cluster", action="store_true", help="on the tests' cluster (root; see above)")
    parser.add_argument("--cluster-wait", type=float, default=600, help="seconds to wait while a test session owns it")
    parser.add_argument("--flood", action="store_true", help="the log view under a flood, in Chromium (see above)")
    parser.add_argument("--rates", default="2000,10000", help="--flood: lines a second, comma-separated")
    parser.add_argument("--kinds", default=",".join(FLOOD_KINDS), help="--flood: kinds of run, comma-separated")
    parser.add_argument("--flood-seconds", type=float, default=8)
    args = parser.parse_args()
    args.real_slurm = args.real_slurm or args.test_cluster
    args.rates = [int(r) for r in args.rates.split(",")]
    args.kinds = args.kinds.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="bench-page-"))
    try:
        if args.flood:
            with test_cluster(args.cluster_wait) if args.test_cluster else nullcontext(dict(os.environ)) as env:
                flood(args, tmp, env)
        elif args.test_cluster:
            with test_cluster(args.cluster_wait) as env:
                measure(args, tmp, env)
        else:
            measure(args, tmp, dict(os.environ))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
