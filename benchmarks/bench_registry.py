"""The list of runs with 1,000 runs in the registry (50 of them active, 3 attempts each).

    python benchmarks/bench_registry.py [--repeat 7] [--runs 1000]

Measures `runs.list_rows` (the one SELECT the list of runs is answered with, JSON fields
decoded) in-process, and `slurmgen jobs --json` for the launches and groups (no Slurm asked)
beside `python -c pass`, the interpreter's start-up, as a whole command. Medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurmgen.contract.states import State
from slurmgen.runs.model import Failure, NewRun, add_run, end_attempt, end_run, list_rows, start_attempt
from slurmgen.runs.registry import Registry


def fill(path: Path, runs: int, records: Path | None = None, steps: int = 200) -> None:
    """`runs` runs of the three kinds; every 20th still running. With `records`, each run has its
    run record there (`steps` train losses, as the bundled trainer logs them), which the runs
    list reads its last loss from."""
    failure = Failure("rank 3 exited with code 1", 3, "node2", 1)
    with Registry.open(path, create=True) as reg:
        reg.db.execute("BEGIN")
        for i in range(runs):
            kind = ("slurm", "launch", "group")[i % 3]
            where = str(_record(records / f"k{i}", steps)) if records else None
            row = add_run(
                reg,
                NewRun(
                    kind,
                    f"k{i}",
                    f"exp{i}",
                    "/w",
                    2,
                    8,
                    f"{kind}-k{i}",
                    record_dir=where,
                    logs=[{"node": "node1", "path": "/w/out/logs"}],
                ),
                1.0e9 + i,
            )
            for n in (1, 2, 3):
                start_attempt(reg, row, n, 1.0e9 + i)
                if i % 20 or n < 3:
                    end_attempt(reg, row, n, State.FAILED, failure, 1.0e9 + i + n)
            if i % 20:
                end_run(reg, row, State.FAILED, 1, failure, 1.0e9 + i + 3)
        reg.db.execute("COMMIT")


def _record(where: Path, steps: int) -> Path:
    from slurmgen import tracking

    run = tracking.init(where / "tracking", group="bench", name="main", environ={})
    for step in range(1, steps + 1):
        run.log("train", {"loss": 10.0 / step, "lr": 1e-3, "tokens_per_sec": 1000.0}, step=step)
    run.finish()
    return where


def median_time(work, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobs.sqlite"
        fill(path, args.runs)
        with Registry.open(path) as reg:
            rows = median_time(lambda: list_rows(reg), args.repeat)
            active = median_time(lambda: list_rows(reg, states=["running"]), args.repeat)
        jobs = [
            sys.executable,
            "-m",
            "slurmgen",
            "jobs",
            "--registry",
            str(path),
            "--json",
            "--kind",
            "launch",
            "--kind",
            "group",
        ]
        cli = median_time(lambda: subprocess.run(jobs, check=True, stdout=subprocess.DEVNULL), args.repeat)
        floor = median_time(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.repeat)
    print(f"list_rows, {args.runs} runs x 3 attempts:     {rows * 1000:7.1f} ms (goal < 200 ms)")
    print(f"list_rows --state running ({args.runs // 20} runs): {active * 1000:7.1f} ms")
    print(f"slurmgen jobs --json (launches, groups): {cli * 1000:7.1f} ms, python -c pass {floor * 1000:.1f} ms")


if __name__ == "__main__":
    main()
