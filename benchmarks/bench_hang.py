"""A frozen rank, named 10 of 10 times: under Slurm and with launch_multi_node.sh (issue 24).

    sudo python benchmarks/bench_hang.py [--runs 10] [-k slurm|launch]

Runs tests/integration/test_hang_blame.py with SLURMGEN_HANG_RUNS=N (each run: a 2 x 2 gloo job,
rank 3 SIGSTOPped after 50 steps, --heartbeat-timeout 4; the test cluster comes up and goes down
through the pytest fixture) and summarises what every run printed: the seconds from the freeze
to the end of the attempt (Slurm) or of both nodes' launchers. Every run must name rank 3 and
end within the timeout + 3 s, or its test fails. Goal (issue 24): 10 of 10, timeout + 2 s.
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
    parser.add_argument("-k", default="frozen", help="pytest -k expression (default: both launchers)")
    args = parser.parse_args()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-k", args.k,
                           str(REPO / "tests" / "integration" / "test_hang_blame.py")],
                          env={**os.environ, "SLURMGEN_HANG_RUNS": str(args.runs)}, cwd=REPO,
                          capture_output=True, text=True)
    found: dict[str, list[float]] = {}
    for what, seconds in re.findall(r"run \d+: frozen -> (attempt|both nodes) ended ([0-9.]+) s", proc.stdout):
        found.setdefault("slurm" if what == "attempt" else "launch_multi_node.sh", []).append(float(seconds))
    for name, times in found.items():
        print(f"{name}: {len(times)} runs named rank 3; freeze -> end {min(times):.2f}-{max(times):.2f} s, "
              f"median {statistics.median(times):.2f} s (timeout 4 s)")
    print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
