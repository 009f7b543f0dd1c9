"""Wall time of `slurmgen create --nodes 2 --gpus 4` beside two baselines, measured in one run.

    python benchmarks/bench_create.py [--repeat 15]

Baselines: `python -c pass` (interpreter start-up, the floor) and `torchrun --help`
(what a user would otherwise wait for). Prints the median of each and the ratios; the
commands alternate round by round so that machine noise hits all of them alike.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    bindir = Path(sys.executable).parent
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "slurmgen create --nodes 2 --gpus 4": [str(bindir / "slurmgen"), "create", "--nodes", "2", "--gpus", "4", "--force"],
    }
    torchrun = shutil.which("torchrun", path=str(bindir)) or shutil.which("torchrun")
    if torchrun:
        commands["torchrun --help"] = [torchrun, "--help"]
    else:
        print("torchrun not found (install the train extra); comparing with python -c pass only")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for argv in commands.values():  # warm the page cache once
            timed(argv, cwd)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.repeat):
            for name, argv in commands.items():
                samples[name].append(timed(argv, cwd))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    create = medians["slurmgen create --nodes 2 --gpus 4"]
    print(f"{'command':40} {'median':>9} {'min':>9}   ({args.repeat} runs each)")
    for name, values in samples.items():
        print(f"{name:40} {medians[name] * 1000:7.0f}ms {min(values) * 1000:7.0f}ms")
    print(f"ratio create / python -c pass : {create / medians['python -c pass']:.2f}")
    if "torchrun --help" in medians:
        print(f"ratio create / torchrun --help: {create / medians['torchrun --help']:.2f}")


if __name__ == "__main__":
    main()
