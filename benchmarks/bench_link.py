"""launch_multi_node.sh started by hand on every node: from a rank's failure to the job gone.

    sudo python benchmarks/bench_link.py [--repeat 5] [--nodes 2,8] [--reuse]

Brings up scripts/cluster/up.sh 8 (root; each node a network namespace; waits while another
session owns the cluster) unless --reuse, and tears it down at the end. On each node K of the
first N, `ip netns exec sg-nodeK launch_multi_node.sh node1 N 2 K-1` (2 ranks per node, the
script from `slurmgen create` on this machine's disk), running a program that is not ours:
the last rank exits 3 one second after every rank is up, writing its own timestamp first; the
others sleep.

Measured, all in the same run:
1. link (the default): time from that timestamp to the last process of the job gone on every
   node (ranks, launchers and their link agents; a /proc scan every 10 ms, the namespaces
   share this machine's /proc), for N = 2 and 8. Target: <= 2 s.
2. baseline, one node alone (N = 1, no link needed): the same time for the node's own
   stop, which every launcher has had before the link; the link's figures are also shown as
   ratios to it.
3. SLURMGEN_LINK=off on N nodes (each node stops only itself, as before): how many of the
   other nodes' rank processes are still running 5 s after the failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_launch import down, job_pids

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# Every rank says it is up; the last one exits 3 a second after all are.
CRASHER = """
import os, sys, time
open(os.environ["CRASH_FILE"] + ".up" + os.environ["RANK"], "w").close()
if os.environ["RANK"] == os.environ["CRASH_RANK"]:
    up = [os.environ["CRASH_FILE"] + ".up" + str(r) for r in range(int(os.environ["WORLD_SIZE"]))]
    while not all(map(os.path.exists, up)):
        time.sleep(0.01)
    time.sleep(1)
    with open(os.environ["CRASH_FILE"] + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(os.environ["CRASH_FILE"] + ".tmp", os.environ["CRASH_FILE"])
    os._exit(3)
time.sleep(120)
"""
# In every link agent's command line (its code is passed with -c).
AGENT_MARK = "def launcher_died"


def up(nodes: int, wait: float = 1800) -> None:
    env = {**os.environ, "SLURMGEN_CLUSTER_OWNER": str(os.getpid())}
    deadline = time.monotonic() + wait
    while True:
        proc = subprocess.run(
            ["bash", str(REPO / "scripts/cluster/up.sh"), str(nodes)], env=env, capture_output=True, text=True
        )
        if proc.returncode == 0:
            return
        if proc.returncode != 4 or time.monotonic() > deadline:
            sys.exit(f"scripts/cluster/up.sh {nodes} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        time.sleep(5)  # busy: another session owns the cluster


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:90].decode(errors="replace")
    except OSError:
        return "(gone)"


def one_run(
    workdir: Path, nodes: int, index: int, link: bool, late_after: float = 2
) -> tuple[float, int, list[int | None], list[str]]:
    """(seconds from the failure to the last process gone, or to 5 s with the link off;
    ranks of the other nodes still running then; the launchers' exit codes; what was still
    running `late_after` seconds after the failure)."""
    marker = f"slurmgen-bench-link-{os.getpid()}-{nodes}-{index}-{int(link)}"
    out = workdir / f"out-{nodes}-{index}-{int(link)}"
    subprocess.run(
        [
            PY,
            "-m",
            "slurmgen",
            "create",
            "--nodes",
            str(nodes),
            "--gpus",
            "2",
            "--backend",
            "gloo",
            "-o",
            str(out),
            "--force",
            "--",
            PY,
            "-c",
            CRASHER,
            marker,
        ],
        check=True,
        capture_output=True,
    )
    crash_file = out / "crashed"
    env = {
        **os.environ,
        "CRASH_RANK": str(2 * nodes - 1),
        "CRASH_FILE": str(crash_file),
        "MASTER_PORT": str(21000 + index * 2 + 100 * nodes),
        "SLURMGEN_LINK": "on" if link else "off",
    }
    launchers = [
        subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                f"sg-node{k}",
                "bash",
                str(out / "launch_multi_node.sh"),
                "node1",
                str(nodes),
                "2",
                str(k - 1),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        for k in range(1, nodes + 1)
    ]
    try:
        while not crash_file.exists():
            if all(p.poll() is not None for p in launchers):
                raise RuntimeError(f"every launcher ended before the failure: {[p.returncode for p in launchers]}")
            time.sleep(0.005)
        crashed = float(crash_file.read_text())
        markers = (str(out),) + ((AGENT_MARK,) if link else ())
        limit = crashed + (30 if link else 5)
        late: list[str] = []
        while (alive := job_pids(*markers, marker)) and time.time() < limit:
            if not late and time.time() > crashed + late_after:
                late = [cmdline(pid) for pid in alive]
            time.sleep(0.01)
        took = time.time() - crashed
        left = len(job_pids(marker))  # the ranks (out's path does not hold it)
        deadline = time.monotonic() + 10
        while link and time.monotonic() < deadline and any(p.poll() is None for p in launchers):
            time.sleep(0.05)
        return took, left, [p.poll() for p in launchers], late
    finally:
        for pid in job_pids(marker, str(out)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        for p in launchers:
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--nodes", default="2,8")
    parser.add_argument("--reuse", action="store_true", help="use the cluster already up (enough nodes)")
    parser.add_argument("--late", type=float, default=2, help="show what still runs this long after a failure")
    args = parser.parse_args()
    node_counts = [int(n) for n in args.nodes.split(",")]
    if not args.reuse:
        up(max(node_counts))
    try:
        with tempfile.TemporaryDirectory(prefix="bench-link-") as tmp:
            workdir = Path(tmp)
            times: dict[int, list[float]] = {n: [] for n in [1, *node_counts]}
            for i in range(args.repeat):  # the sizes alternate, so load drifts hit all alike
                for n in times:
                    took, _, codes, late = one_run(workdir, n, i, link=True, late_after=args.late)
                    if late:
                        print(
                            f"{n} nodes, run {i}: {took:.2f}s; running {args.late} s after the failure:",
                            *late,
                            sep="\n  ",
                        )
                    if any(c in (0, None) for c in codes):
                        raise RuntimeError(f"{n} nodes: a launcher did not fail: {codes}")
                    times[n].append(took)
            off = {n: one_run(workdir, n, args.repeat, link=False)[1] for n in node_counts}
    finally:
        if not args.reuse:
            down()
    base = statistics.median(times[1])
    print(f"failure of the last rank to every process of the job gone, 2 ranks per node ({args.repeat} runs):")
    print(f"{'nodes':>6}{'median':>10}{'max':>10}{'median / 1 node':>18}")
    print("all runs:", {n: [round(s, 2) for s in samples] for n, samples in times.items()})
    for n, samples in times.items():
        label = f"{n}" + (" (baseline: the node's own stop)" if n == 1 else "")
        print(
            f"{n:>6}{statistics.median(samples):9.2f}s{max(samples):9.2f}s"
            f"{statistics.median(samples) / base:17.2f}x   {label if n == 1 else ''}"
        )
    for n, left in off.items():
        print(f"SLURMGEN_LINK=off, {n} nodes: {left} of {2 * n - 2} other ranks still running 5 s after the failure")


if __name__ == "__main__":
    main()
