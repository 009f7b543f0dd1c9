"""Goodput under failures (issue 35): the recovery paths side by side, the same faults for each.

    sudo python benchmarks/bench_recovery.py [--minutes 10] [--every 60] [--faults kill,stop,node]
        [--paths requeue,restart,spare,warm,launch-cold,launch-warm,group-cold,group-warm]
        [--save-every 40] [--reuse] [--wait 600] [--keep DIR]

The `slurmgen launch` paths run on two local "hosts" (as tests/unit/launch/test_launch_warm.py
runs them: real bash, node scripts, gloo ranks; no cluster, no root), 2 x 2 ranks of the same
trainer, a SIGKILL of rank 1 or 3 (alternately, so each node's warm spare serves once) every
--every seconds:

- launch-cold: `--max-restarts` (today's path): every process of every node starts again;
- launch-warm: `--restart-mode warm`: the healthy ranks keep their processes and rejoin, the
  killed rank goes on in its node's warm spare (replaced by a new one each time it is used).

The coordinator group paths run the same ranks and faults as a group of a real `slurmgen serve`
(127.0.0.1, a free port, its own token, registry and home in a temp dir) and two real agents of
2 workers each, named 127.0.0.1 and 127.0.0.2 (as tests/integration/web/test_group_warm.py runs
them; no cluster, no root; the server and the agents, with every rank and spare, are stopped at
the end and on Ctrl-C):

- group-cold: `max_restarts` (today's path): a new attempt starts every rank again;
- group-warm: `restart_mode warm`: the healthy ranks keep their processes, the killed rank goes
  on in its agent's warm spare (each agent starts a new one once its spare is promoted).

For those, the time from a fault to every rank stepping again comes from the ranks' own words
(the timeline's first steps of the next attempt; a warm restart's "stepping again ... (at T)"),
the steps lost from rank 0's last sampled step before the fault and the step it resumed from, and
goodput is the steps gained over the steps the run made per second before its first fault,
times the wall time (`progress`); `goodput` is slurmgen's own (observe/goodput.py, over the run's
timeline), which accounts each warm restart as a recovery inside its attempt; a group's is its run
record's (the server's time report when the group is stopped). What each restart was is printed
below the row: `spare` or `fresh` (a warm restart's new rank: in the warm spare or a new process),
`whole` (a group's new attempt).

The Slurm paths need root and the test cluster, and are skipped, with the reason printed, without
them. They hold the cluster lock (scripts/cluster/lib.sh's, which up.sh and down.sh take) for as
long as they use the cluster, as benchmarks/bench_page.py does: they bring it up with
scripts/cluster/up.sh 3 as its owner (a test session's up.sh waits meanwhile; while a test
session owns the cluster, this waits up to --wait s), unless --reuse (then the lock only, around
a cluster brought up by hand), and tear it down at the end. Each path submits (`slurmgen
submit`, so `slurmgen status` accounts for it) the bundled trainer on 2 nodes x 2 ranks (gloo,
CPU; a small GPT, asynchronous checkpoints every --save-every steps, `--heartbeat-timeout 10`),
the third node idle or the path's spare, and, from its first step on, injects a fault every
--every s for --minutes, then cancels it. The faults take turns, the same for every path: a
SIGKILL of one rank, a SIGSTOP of one rank (a hang: the watcher finds it), and a node lost (every
process of the job on a node killed and its slurmd stopped with SIGSTOP until the job steps again
without it, then continued, as after a reboot, so that the node may serve again). The rank is
rank 1 and rank 3 in turn, so that each node's warm spare serves; the node lost is ranks 2-3's,
never the batch script's (its loss ends the allocation: Slurm's own requeue, no path of
slurmgen's, recovers from it; an in-job restart may have moved ranks 0-1 off it). Every path
starts with every node idle (a node a lost-node fault left DOWN is resumed, as after a reboot)
and may requeue as its last resort (`--retries`):

- requeue: `--retries` alone (today's path): every fault ends the job, which waits in the queue
  again (Slurm holds a requeued job about 2 minutes before it may start);
- restart: `--restarts` (in-job restart): a new job step in the same allocation; a lost node
  leaves too few nodes, and the job requeues;
- spare: `--restarts --spare-nodes 1`: the same, on 3 nodes: a lost node's ranks go to the spare;
- warm: `--restarts --spare-nodes 1 --restart-mode warm`: a killed or hung rank goes on in its
  node's warm spare process, the healthy ranks in their processes; a lost node as `spare`.

A fault waits until every rank steps in the current world (a fault during start-up would measure
nothing): an attempt, or a warm restart's generation inside one (every rank writes `first_step`
again there, contract/phases.py). Printed per path, from slurmgen's own records: the faults
injected, the time from each fault to every rank's first step of the next world (median and max;
the timeline), by fault too, the steps done twice (goodput's lost steps) and the run's goodput
(`slurmgen status --json`), and how each attempt ended or went on: each path's row as soon as it
is measured (a path that fails is said, and the others still run). The issue's
figure is 10 minutes with a fault every 60 s; --minutes 2 --every 40 is a quick look.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import io
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_page import CLUSTER_LOCK, test_cluster  # noqa: E402

from slurmgen.contract import envvars, phases  # noqa: E402
from slurmgen.contract.files import ATTEMPTS_NAME, TIMELINE_NAME  # noqa: E402
from slurmgen.coordinator.group_runs import run_key  # noqa: E402
from slurmgen.jsonl import objects  # noqa: E402
from slurmgen.observe import goodput  # noqa: E402

CLUSTER = Path(os.environ.get("SLURMGEN_CLUSTER_DIR", "/tmp/slurmgen-cluster"))
PY = sys.executable
TRAIN = [
    *(PY, "-m", "slurmgen.train", "--model", "gpt", "--batch-size", "8", "--max-steps", "1000000"),
    *("--threads", "1", "--init-timeout", "60", "--log-every", "10", "--heartbeat-every", "0.5"),
    *("--keep-last", "3", "--checkpoint-async"),
]
# Steps between checkpoints: Young's interval, sqrt(2 x a checkpoint's cost x the time between
# faults), for a fault a minute and this trainer's stall of about 30 ms per asynchronous
# checkpoint (~1.9 s, some 40 of its ~20 steps a second here). More often and the stalls cost
# more than the steps a fault makes it redo; 10 (the figures before 2026-11-29 08:00) stalled
# training 5% of the time.
SAVE_EVERY = 40


def trainer(save_every: int) -> list[str]:
    """The bundled trainer's command line, checkpointing every `save_every` steps."""
    return [*TRAIN, "--save-every", str(save_every)]


PATHS = {
    "requeue": [],
    "restart": ["--restarts", "20"],
    "spare": ["--restarts", "20", "--spare-nodes", "1"],
    "warm": ["--restarts", "20", "--spare-nodes", "1", "--restart-mode", "warm"],
}
# Every Slurm path: the same hang watch, and a requeue as the last resort.
SLURM_ARGS = ["--nodes", "2", "--gpus", "2", "--backend", "gloo", "--time", "60", "--heartbeat-timeout", "10"]
SLURM_ARGS += ["--retries", "20", "--retry-on", "1,124,137,143,255"]
FAULTS = ("kill", "stop", "node")
LAUNCH_PATHS = {"launch-cold": "cold", "launch-warm": "warm"}
GROUP_PATHS = {"group-cold": "cold", "group-warm": "warm"}  # the group's restart_mode
# The group's agents, named after loopback addresses so that every rank's MASTER_ADDR resolves here.
GROUP_AGENTS = ("127.0.0.1", "127.0.0.2")
GROUP = "bench"
# A warm restart's first step, on each rank (slurmgen/train/trainer.py), and a resume.
AGAIN = re.compile(
    r"\[rank (\d+)\] warning: warm restart: generation (\d+) stepping again at step \d+, .* \(at ([\d.]+)\)"
)
RESUMED = re.compile(r"\[(?:rank 0|h0/0)\] .*resumed from \S+ at step (\d+)")


@contextlib.contextmanager
def slurm_cluster(reuse: bool, wait: float) -> Iterator[None]:
    """The test cluster for the Slurm paths, the cluster lock held for as long as they use it, so
    that a test session cannot bring it up or tear it down under them (see the module's docstring)."""
    if not reuse:
        with test_cluster(wait, nodes=3):
            yield
        return
    CLUSTER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with CLUSTER_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def cluster_env() -> dict[str, str]:
    facts = json.loads((CLUSTER / "cluster.json").read_text())
    return {**os.environ, "SLURM_CONF": facts["slurm_conf"], "PATH": f"{Path(PY).parent}:{os.environ['PATH']}"}


def nodes() -> dict[str, dict]:
    return {n["name"]: n for n in json.loads((CLUSTER / "cluster.json").read_text())["nodes"]}


def slurmgen(*args: str, cwd: Path) -> str:
    proc = subprocess.run([PY, "-m", "slurmgen", *args], cwd=cwd, env=cluster_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"slurmgen {' '.join(args[:2])} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def job_processes(job: str, netns: str | None = None) -> list[tuple[int, dict[str, str], str]]:
    """(pid, environment, command line) of the job's processes on the nodes (or on one node)."""
    where = [netns] if netns else [n["netns"] for n in nodes().values()]
    found = []
    for ns in where:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        for word in out.split():
            try:
                environ = Path(f"/proc/{word}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{word}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            env = dict(v.decode(errors="replace").split("=", 1) for v in environ if b"=" in v)
            if env.get("SLURM_JOB_ID") == job or f"[{job}." in cmdline:
                found.append((int(word), env, cmdline))
    return found


def records(logs: Path, name: str, job: str) -> list[dict]:
    path = logs / name.format(job_id=job)
    return list(objects(path.read_text().splitlines())) if path.exists() else []


def worlds(logs: Path, job: str) -> dict[tuple[int, int], dict[int, float]]:
    """Each world of the job, (attempt, generation), to when each of its ranks made its first step."""
    found: dict[tuple[int, int], dict[int, float]] = {}
    for e in records(logs, TIMELINE_NAME, job):
        if e.get("event") == "first_step":
            key = (e.get("attempt", 1), e.get("generation") or 0)
            found.setdefault(key, {})[e["rank"]] = e["time"]
    return found


def stepping(logs: Path, job: str) -> tuple[tuple[int, int], float] | None:
    """(the job's latest world in which every rank stepped, when the last of them did), once one has."""
    whole = {key: max(ranks.values()) for key, ranks in worlds(logs, job).items() if len(ranks) == 4}
    return (max(whole), whole[max(whole)]) if whole else None


def rank_pid(logs: Path, job: str, rank: int) -> int:
    """The process of `rank` now: the pid of its newest timeline line (a promoted warm spare's own)."""
    mine = [e for e in records(logs, TIMELINE_NAME, job) if e.get("rank") == rank and "pid" in e and "by" not in e]
    return max(mine, key=lambda e: e["time"])["pid"]


def lost_node(logs: Path, job: str) -> str:
    """The node a "node" fault takes: the one of ranks 2-3, or of ranks 0-1 when that is the batch
    script's (an in-job restart moves a failed node's ranks, so either may be). A promoted warm
    spare has no RANK of its own, so a node is known by any of its two ranks."""
    batch = [r["host"] for r in records(logs, ATTEMPTS_NAME, job) if r.get("event") == "start"][-1]
    hosts = {env.get("RANK"): env.get("SLURMD_NODENAME") for _, env, _ in job_processes(job) if env.get("RANK")}
    ranks_2_3 = hosts.get("2") or hosts.get("3")
    return ranks_2_3 if ranks_2_3 != batch else hosts.get("0") or hosts["1"]


def inject(kind: str, rank: int, logs: Path, job: str) -> tuple[float, str | None]:
    """A fault of `kind` at `rank` (FAULTS), now: (when, the node whose slurmd it stopped, or None)."""
    if kind != "node":
        os.kill(rank_pid(logs, job, rank), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        return time.time(), None
    host = lost_node(logs, job)
    node = nodes()[host]
    os.kill(int(node["slurmd_pid"]), signal.SIGSTOP)
    when = time.time()
    for pid, _, _ in job_processes(job, node["netns"]):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return when, host


def nodes_idle(wait: float = 180) -> None:
    """Every node idle before a path submits. A node lost in the path before (its slurmd stopped
    past SlurmdTimeout, then continued) may stay DOWN, which nothing of a job brings back: a
    3-node request then can never start (sbatch --test-only), and the path would measure nothing.
    Such a node is told to resume, as an administrator would after a reboot."""
    deadline = time.monotonic() + wait
    while True:
        listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=cluster_env(), capture_output=True, text=True)
        states = dict(line.split() for line in listed.stdout.splitlines() if len(line.split()) == 2)
        if states and all(state == "idle" for state in states.values()):
            return
        if down := [n for n, state in states.items() if state.rstrip("*~#$@").startswith(("down", "drain", "fail"))]:
            subprocess.run(["scontrol", "update", f"NodeName={','.join(down)}", "State=RESUME"], env=cluster_env())
        if time.monotonic() > deadline:
            sys.exit(f"the nodes are not idle after {wait:g} s: {states}")
        time.sleep(1)


def run_path(
    path: str, minutes: float, every: float, work: Path, train: list[str], kinds: tuple[str, ...] = FAULTS
) -> dict:
    out = work / path
    out.mkdir()
    nodes_idle()
    args = [*SLURM_ARGS, *PATHS[path]]
    job = slurmgen("submit", "--registry", "jobs.sqlite", "-o", "out", *args, "--", *train, cwd=out).split()[-1]
    logs = out / "out" / "logs"
    while (now := stepping(logs, job)) is None:
        time.sleep(0.5)
    end, next_fault, stopped = now[1] + minutes * 60, now[1] + every, None
    faults: list[tuple[float, tuple[int, int], str]] = []  # (when, the world it struck, kind)
    while time.time() < end:
        now = stepping(logs, job)
        if stopped and now and now[0] > faults[-1][1]:  # stepping without the lost node: it comes back
            os.kill(int(nodes()[stopped]["slurmd_pid"]), signal.SIGCONT)
            stopped = None
        if time.time() >= next_fault and now and (not faults or now[0] > faults[-1][1]):
            kind, rank = kinds[len(faults) % len(kinds)], (1, 3)[len(faults) % 2]
            when, stopped = inject(kind, rank, logs, job)
            faults.append((when, now[0], kind))
            next_fault = max(next_fault + every, time.time() + 1)
        time.sleep(0.25)
    view = json.loads(slurmgen("status", "--registry", "jobs.sqlite", job, "--json", cwd=out))
    subprocess.run(["scancel", job], env=cluster_env())
    if stopped:
        os.kill(int(nodes()[stopped]["slurmd_pid"]), signal.SIGCONT)
    return slurm_row(path, faults, worlds(logs, job), view, records(logs, ATTEMPTS_NAME, job))


def slurm_row(path: str, faults: list, seen: dict, view: dict, attempts: list[dict]) -> dict:
    """The table's row of a Slurm path: each fault to the first next world in which every rank stepped."""
    again: dict[str, list[float]] = {kind: [] for kind in FAULTS}
    for when, struck, kind in faults:
        later = [max(ranks.values()) for key, ranks in seen.items() if key > struck and len(ranks) == 4]
        if later:
            again[kind].append(min(later) - when)
    every = [t for times in again.values() for t in times]
    good = view.get("goodput") or {}
    return {
        "path": path,
        "faults": len(faults),
        "recovered": len(every),
        "median": statistics.median(every) if every else None,
        "max": max(every) if every else None,
        "by_fault": {kind: (sum(1 for f in faults if f[2] == kind), times) for kind, times in again.items()},
        "lost_steps": sum(lost["steps"] for lost in good.get("lost_steps", [])),
        "goodput": good.get("goodput"),
        "actions": [r.get("action") or ("warm" if r.get("event") == "recovery" else None)
                    for r in attempts if r.get("event") in ("end", "recovery")],
    }  # fmt: skip


def launch_again(timeline: Path, text: str, after: float) -> float | None:
    """When every rank stepped again after the fault at `after`: the first next attempt (cold) or
    warm generation in which all 4 ranks made a first step; None until then."""
    done: dict[tuple[str, int], dict[int, float]] = {}
    for e in records(timeline.parent, timeline.name, ""):
        if e.get("event") == "first_step" and e["time"] > after:
            done.setdefault(("attempt", e["attempt"]), {})[e["rank"]] = e["time"]
    for rank, gen, at in AGAIN.findall(text):
        if float(at) > after:
            done.setdefault(("generation", int(gen)), {})[int(rank)] = float(at)
    whole = [max(ranks.values()) for ranks in done.values() if len(ranks) == 4]
    return min(whole) if whole else None


def launch_faults(ctx: dict, minutes: float, every: float) -> None:
    """Thread: from the first step on, SIGKILL rank 1 or 3 (by its pid on the timeline) every
    `every` s once the last fault is recovered from; then `ctx["stop"]()` (a launcher's SIGTERM, a
    group's stop). `ctx["out"].getvalue()` is the ranks' words so far, in the launcher's form."""
    timeline, out = ctx["timeline"], ctx["out"]
    while launch_again(timeline, out.getvalue(), 0.0) is None:
        time.sleep(0.25)
    ctx["began"] = began = launch_again(timeline, out.getvalue(), 0.0)
    end, next_fault, faults = began + minutes * 60, began + every, ctx["faults"]
    while time.time() < end:
        recovered = not faults or faults[-1][1] is not None
        if faults and faults[-1][1] is None:
            faults[-1][1] = launch_again(timeline, out.getvalue(), faults[-1][0])
        if time.time() >= next_fault and recovered:
            rank = 1 if len(faults) % 2 == 0 else 3
            events = [e for e in records(timeline.parent, timeline.name, "") if e["rank"] == rank and "by" not in e]
            ctx["before"].append(max((e["step"] for e in events if "step" in e), default=0))
            with contextlib.suppress(ProcessLookupError):
                os.kill(max(events, key=lambda e: e["time"])["pid"], signal.SIGKILL)
            faults.append([time.time(), None])
            next_fault = max(next_fault + every, time.time() + 1)
        time.sleep(0.25)
    ctx["ended"] = time.time()
    ctx["stop"]()


def run_launch_path(path: str, minutes: float, every: float, work: Path, train: list[str]) -> dict:
    """`slurmgen launch` on two local hosts, 2 x 2 ranks, cold or warm, under `launch_faults`."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import kill_local_nodes, local_connector, local_plan

    from slurmgen.launch.fanout import Launcher
    from slurmgen.ssh.connect import SSHOptions

    run = work / path
    run.mkdir()
    timeline = run / "timeline.jsonl"
    command = [*train, "--out-dir", str(run / "train")]
    plan = local_plan(
        run, command, slots=(2, 2), max_restarts=100, restart_mode=LAUNCH_PATHS[path],
        env={envvars.TIMELINE_FILE: str(timeline)},
    )  # fmt: skip
    out, err, made = io.StringIO(), io.StringIO(), {}
    ctx = {"timeline": timeline, "out": out, "faults": [], "before": []}
    ctx["stop"] = lambda: os.kill(os.getpid(), signal.SIGTERM)  # the launcher's stop
    launcher = Launcher(plan, SSHOptions(), out=out, err=err, colour=False, connector=local_connector(made))
    threading.Thread(target=launch_faults, args=(ctx, minutes, every), daemon=True).start()
    try:
        launcher.run()
    finally:
        kill_local_nodes(made)
    return launch_row(path, ctx, timeline, out.getvalue())


def launch_row(
    path: str, ctx: dict, timeline: Path, text: str, accounted: dict | None = None, actions: list[str] | None = None
) -> dict:
    """The table's row of a launch or group path, from the ranks' words (see the module's docstring);
    its goodput `accounted` by the run record (a group's) or else over the timeline as slurmgen does,
    what each restart was from `actions` or else from the launcher's words."""
    events = records(timeline.parent, timeline.name, "")
    again = [when - fault for fault, when in ctx["faults"] if when is not None]
    resumed = [int(step) for step in RESUMED.findall(text)]
    lost = sum(max(0, before - step) for before, step in zip(ctx["before"], resumed))
    steps = [e for e in events if e.get("rank") == 0 and "step" in e and "by" not in e]
    began, ended = ctx.get("began", 0.0), ctx.get("ended", time.time())
    first = ctx["faults"][0][0] if ctx["faults"] else ended
    before = [e for e in steps if began <= e["time"] <= first]
    rate = (before[-1]["step"] - before[0]["step"]) / (before[-1]["time"] - before[0]["time"]) if len(before) > 1 else 0
    gained = max((e["step"] for e in steps if e["time"] <= ended), default=0) - (before[0]["step"] if before else 0)
    good = accounted or goodput.compute(events, (), None, ended) or {}
    if actions is None:  # the launcher's words: "... (warm restart)", in the spare or a new process
        actions = [f"{'spare' if 'goes on in the warm spare' in line else 'fresh'}" for line in text.splitlines()
                   if " generation " in line and line.endswith("(warm restart)")]  # fmt: skip
    return {
        "path": path,
        "faults": len(ctx["faults"]),
        "recovered": len(again),
        "median": statistics.median(again) if again else None,
        "max": max(again) if again else None,
        "lost_steps": lost,
        "goodput": good.get("goodput"),
        "progress": gained / (rate * (ended - began)) if rate and ended > began else None,
        "actions": actions,
    }


class GroupWords:
    """A group's output lines (the coordinator's logs API), gathered as they come (the server keeps
    only the last LOG_LINES_KEPT), in the launcher's form (`[rank N] ...`: rank 0's own lines have
    no prefix), which AGAIN and RESUMED read; `getvalue()` as a launch path's io.StringIO."""

    def __init__(self, coord, group: str):
        self.coord, self.group, self.after, self.lines = coord, group, 0, []

    def getvalue(self) -> str:
        while True:
            status, got = self.coord.api("GET", f"/api/groups/{self.group}/logs?after={self.after}&limit=5000")
            if status != 200 or not got:
                return "\n".join(self.lines)
            self.after = got[-1]["id"]
            self.lines += [
                g["line"] if g["line"].startswith("[rank ") else f"[rank {g['rank']}] {g['line']}" for g in got
            ]


def group_restarts(events: list[dict]) -> list[str]:
    """What each of a group's restarts was, from its timeline: a new attempt starts every rank again
    ('whole'); a warm restart starts one rank anew, in its node's warm spare ('spare': the process
    the agent gave the rank had started before, as its own `process` line says) or in a new
    process ('fresh')."""
    began = {e["pid"]: e["time"] for e in events if e.get("event") == phases.PROCESS and "by" not in e}
    told = sorted((e for e in events if e.get("event") == phases.PROCESS and "by" in e), key=lambda e: e["time"])
    said, whole = [], set()
    for e in told:
        if e.get(phases.GENERATION):
            said.append("spare" if began.get(e["pid"], e["time"]) < e["time"] - 1 else "fresh")
        elif e["attempt"] > 1 and e["attempt"] not in whole:
            whole.add(e["attempt"])
            said.append("whole")
    return said


def web_conftest():
    """tests/integration/web/conftest.py, where the tests start a real `slurmgen serve` and its
    agents (`_served`, `_home_env`), loaded under a name of its own (tests/conftest.py is another)."""
    sys.path.insert(0, str(REPO / "tests"))
    spec = importlib.util.spec_from_file_location("web_conftest", REPO / "tests/integration/web/conftest.py")
    module = sys.modules["web_conftest"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def group_goodput(registry: Path, key: str, wait: float = 30.0) -> dict | None:
    """The run's goodput as its run record keeps it (the server's time report at the run's end)."""
    from slurmgen.runs.model import find_run, get_row
    from slurmgen.runs.registry import Registry

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with Registry.open(str(registry)) as reg:
            seq = find_run(reg, "group", key)
            info = get_row(reg, seq)["info"] if seq is not None else {}
        if "goodput" in info:
            return info["goodput"]
        time.sleep(0.5)
    return None


def run_group_path(path: str, minutes: float, every: float, work: Path, train: list[str]) -> dict:
    """A coordinator group on a real `slurmgen serve` (127.0.0.1, its own token, registry and home)
    and 2 real agents of 2 workers each, 2 x 2 ranks, cold or warm, under `launch_faults`; the
    server and the agents (and with them every rank and spare) stopped at the end, Ctrl-C too."""
    served = web_conftest()  # tests/ on the path: helpers too
    from helpers import free_port, group_of_every_worker

    run = work / path
    run.mkdir()
    env = {**served._home_env(run, dict(os.environ)), envvars.REGISTRY: str(run / "jobs.sqlite")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(run / "torchinductor")  # which a spare's imports make; else in $TMPDIR
    key = run_key(GROUP, 1, 0)  # a new server's first attempt
    timeline = run / TIMELINE_NAME.format(job_id=key)
    config = {
        "argv": [*train, "--out-dir", str(run / "train")], "backend": "gloo", "master_port": free_port(),
        "cwd": str(run), "max_restarts": 100, "restart_mode": GROUP_PATHS[path], "stop_grace": 3,
    }  # fmt: skip
    with served._served(run, env, "127.0.0.1", [(host, []) for host in GROUP_AGENTS]) as coord:
        group_of_every_worker(coord, GROUP)
        for method, what, body in (("PATCH", "config", config), ("POST", "start", None)):
            if (answer := coord.api(method, f"/api/groups/{GROUP}/{what}", body))[0] != 200:
                sys.exit(f"{path}: the group's {what}: {answer}")
        ctx = {"timeline": timeline, "out": GroupWords(coord, GROUP), "faults": [], "before": []}
        ctx["stop"] = lambda: coord.api("POST", f"/api/groups/{GROUP}/stop")
        faults = threading.Thread(target=launch_faults, args=(ctx, minutes, every), daemon=True)
        faults.start()
        while faults.is_alive():
            faults.join(1)  # a bounded wait: Ctrl-C comes through
            state = coord.api("GET", f"/api/groups/{GROUP}")[1]["group"]["state"]
            if faults.is_alive() and "ended" not in ctx and state not in ("starting", "running"):
                sys.exit(f"{path}: the group ended ({state}) before its faults did:\n{ctx['out'].getvalue()[-3000:]}")
        accounted = group_goodput(run / "jobs.sqlite", key)
        text = ctx["out"].getvalue()
    return launch_row(path, ctx, timeline, text, accounted, group_restarts(records(run, timeline.name, "")))


def cluster_reason(reuse: bool) -> str | None:
    """Why the Slurm paths cannot run here, or None."""
    if reuse:
        return None if (CLUSTER / "cluster.json").exists() else f"--reuse: no cluster at {CLUSTER}"
    return None if os.geteuid() == 0 else "the test cluster needs root (scripts/cluster/up.sh)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long each path runs under faults")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between faults")
    every_path = [*LAUNCH_PATHS, *GROUP_PATHS, *PATHS]
    ap.add_argument("--paths", default=",".join(every_path), help="comma-separated: " + ", ".join(every_path))
    ap.add_argument("--reuse", action="store_true", help="use a cluster brought up by hand (up.sh 3)")
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait while another session owns the cluster")
    ap.add_argument("--faults", default=",".join(FAULTS), help="the Slurm paths' faults, in turn: " + ", ".join(FAULTS))
    ap.add_argument(
        "--save-every", type=int, default=SAVE_EVERY, help=f"the trainer's steps between checkpoints [{SAVE_EVERY}]"
    )
    ap.add_argument("--keep", type=Path, help="keep each path's job, logs and records under this new directory")
    opts = ap.parse_args()
    paths = [p for p in opts.paths.split(",") if p]
    if unknown := [p for p in paths if p not in every_path]:
        sys.exit(f"--paths: unknown {', '.join(unknown)} (expected {', '.join(every_path)})")
    kinds = tuple(k for k in opts.faults.split(",") if k)
    if not kinds or set(kinds) - set(FAULTS):
        ap.error(f"--faults: expected some of {', '.join(FAULTS)} (got {opts.faults!r})")
    if opts.save_every < 1:
        ap.error(f"--save-every: expected a whole number of steps of at least 1 (got {opts.save_every})")
    train = trainer(opts.save_every)
    slurm = [p for p in paths if p in PATHS]
    if slurm and (reason := cluster_reason(opts.reuse)):
        print(f"skipping {', '.join(slurm)}: {reason}")
        slurm = []
    groups = [p for p in paths if p in GROUP_PATHS]
    if groups and importlib.util.find_spec("fastapi") is None:
        print(f"skipping {', '.join(groups)}: `slurmgen serve` needs the serve extra (fastapi)")
        groups = []
    print(
        f"{opts.minutes:g} min per path, a fault every {opts.every:g} s, a checkpoint every {opts.save_every} steps "
        "(2 nodes x 2 ranks, gloo, CPU)"
    )
    head = f"{'path':<12} {'faults':>6} {'back':>5} {'median s':>9} {'max s':>7} {'lost steps':>10} {'goodput':>8}"
    print(f"{head} {'progress':>8}", flush=True)

    def each(run, path: str, *args) -> None:
        """One path's row, printed as soon as it is measured: a path that fails (its job could not
        be submitted, its group ended early) is said, and the paths after it still run."""
        try:
            print_row(run(path, *args))
        except SystemExit as failed:
            print(f"{path:<12} failed: {failed}", flush=True)

    if opts.keep:
        opts.keep.mkdir(parents=True)  # a new one: a path's directory must not hold an earlier run's records
    with (
        contextlib.nullcontext(str(opts.keep))
        if opts.keep
        else tempfile.TemporaryDirectory(prefix="bench-recovery-") as work
    ):
        for p in (p for p in paths if p in LAUNCH_PATHS):
            each(run_launch_path, p, opts.minutes, opts.every, Path(work), train)
        for p in groups:
            each(run_group_path, p, opts.minutes, opts.every, Path(work), train)
        if slurm:
            with slurm_cluster(opts.reuse, opts.wait):
                for p in slurm:
                    each(run_path, p, opts.minutes, opts.every, Path(work), train, kinds)


def print_row(r: dict) -> None:
    """A path's row of the table, and below it its figures by fault and how each attempt ended."""
    med = f"{r['median']:.1f}" if r["median"] is not None else "-"
    top = f"{r['max']:.1f}" if r["max"] is not None else "-"
    good = f"{r['goodput']:.1%}" if r["goodput"] is not None else "-"
    progress = f"{r['progress']:.0%}" if r.get("progress") is not None else "-"
    print(
        f"{r['path']:<12} {r['faults']:>6} {r['recovered']:>5} {med:>9} {top:>7} {r['lost_steps']:>10} "
        f"{good:>8} {progress:>8}"
    )
    for kind, (n, times) in r.get("by_fault", {}).items():
        if n:
            back = f"median {statistics.median(times):.1f} s, max {max(times):.1f} s" if times else "-"
            print(f"             {kind}: {n} faults, {len(times)} recovered, {back}")
    said = "restarts" if "progress" in r else "attempts ended (warm: went on)"
    print(f"             {said}: {' '.join(a or '?' for a in r['actions'])}", flush=True)


if __name__ == "__main__":
    main()
