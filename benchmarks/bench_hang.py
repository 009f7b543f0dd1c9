"""A frozen rank, named 10 of 10 times under every launcher (issue 24).

    sudo python benchmarks/bench_hang.py [--runs 10] [-k slurm|launch_multi|coordinator|frozen_rank_on]

Runs the frozen-rank tests with SLURMGEN_HANG_RUNS=N: tests/integration/test_hang_blame.py
(Slurm, launch_multi_node.sh, a coordinator group: a 2 x 2 gloo job, rank 3 SIGSTOPped after 50
steps, heartbeat timeout 4 s) and tests/integration/test_ssh_launch.py (`slurmgen launch` over
SSH, the bundled trainer, rank 3 on node2 SIGSTOPped, --heartbeat-timeout 3); the test cluster
comes up and goes down through the pytest fixture. It summarises what every run printed: the
seconds from the freeze to the end of the attempt (Slurm), of both nodes' launchers, of the
`slurmgen launch` process, or to the coordinator group's failure. Every run must name rank 3
(on node2) and end within its test's bound, or its test fails. Goal: 10 of 10, timeout + 2 s.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("-k", default="frozen", help="pytest -k expression (default: every launcher)")
    args = parser.parse_args()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-rf",
            "-p",
            "no:cacheprovider",
            "-k",
            args.k,
            str(REPO / "tests" / "integration" / "test_hang_blame.py"),
            str(REPO / "tests" / "integration" / "test_ssh_launch.py"),
        ],
        env={**os.environ, "SLURMGEN_HANG_RUNS": str(args.runs)},
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    found: dict[str, list[float]] = {}
    names = {
        "attempt": "slurm",
        "both nodes": "launch_multi_node.sh",
        "launch": "slurmgen launch (timeout 3 s)",
        "group": "coordinator group",
    }
    for what, seconds in re.findall(
        r"run \d+: frozen -> (attempt|both nodes|launch|group) (?:ended|failed) ([0-9.]+) s", proc.stdout
    ):
        found.setdefault(names[what], []).append(float(seconds))
    for name, times in found.items():
        print(
            f"{name}: {len(times)} runs named rank 3; freeze -> end {min(times):.2f}-{max(times):.2f} s, "
            f"median {statistics.median(times):.2f} s (timeout 4 s unless said)"
        )
    for line in proc.stdout.splitlines():  # a run that printed its time may still have failed an assertion
        if line.startswith("FAILED "):
            print(line)
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
