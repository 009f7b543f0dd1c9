"""Wall time of `slurmgen create --nodes 2 --gpus 4` beside its baselines, measured in one run.

    python benchmarks/bench_create.py [--repeat 15]

Baselines: `python -c pass` (interpreter start-up), `torchrun --help` (what a user would
otherwise wait for) and `torchx run --dryrun --scheduler slurm dist.ddp -j 2x4` (the closest
tool: it writes the same sbatch script for the same job shape). One more line, "create's
floor", imports only what create cannot do without (its spec's validator msgspec, the template
engine jinja2, slurmgen's spec and render modules) and does nothing else: no command line, no
job.yaml writer, no work, so its ratio to torchx is the lowest create could reach with
everything around them rewritten. The goal (issue 32) is create at most 1.5x its floor and at
most 0.4x of torchx, on a quiet machine: under load the wall times say more about the load.
Prints the median of each and the ratios; the commands alternate round by round so that
machine noise hits all of them alike.
torchx is not a dependency of slurmgen (nor of its test extra: it pulls docker, fsspec and
more); without it the torchx line is skipped with a note. To compare, install it beside
slurmgen without letting it change torch:
`pip install --no-deps torchx==0.7.0 pyre-extensions typing-inspect mypy-extensions
docstring-parser tabulate` (the rest of what its dry run imports comes with slurmgen's extras).
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


TORCHX = "torchx run --dryrun (slurm, 2x4)"
FLOOR = "create's floor (its imports only)"


def torchx_command(bindir: Path) -> list[str] | None:
    """The torchx dry run of the same job shape, or None (with a note) when torchx cannot run."""
    torchx = shutil.which("torchx", path=str(bindir)) or shutil.which("torchx")
    if not torchx:
        print("torchx not found: skipping the torchx baseline (see this file's docstring to install it)")
        return None
    argv = [torchx, "run", "--dryrun", "--scheduler", "slurm", "dist.ddp", "-j", "2x4", "--script", "train.py"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "train.py").write_text("")  # torchx's dist.ddp wants its script to exist
        probe = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"torchx cannot run here ({last}): skipping the torchx baseline")
        return None
    return argv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    bindir = Path(sys.executable).parent
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "slurmgen create --nodes 2 --gpus 4": [
            str(bindir / "slurmgen"),
            "create",
            "--nodes",
            "2",
            "--gpus",
            "4",
            "--force",
        ],
        FLOOR: [sys.executable, "-c", "import slurmgen.generate.spec, slurmgen.generate.render"],
    }
    torchrun = shutil.which("torchrun", path=str(bindir)) or shutil.which("torchrun")
    if torchrun:
        commands["torchrun --help"] = [torchrun, "--help"]
    else:
        print("torchrun not found (install the train extra); skipping the torchrun --help baseline")
    torchx = torchx_command(bindir)
    if torchx:
        commands[TORCHX] = torchx
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "train.py").write_text("")  # torchx's dist.ddp wants its script to exist
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
    floor = create / medians[FLOOR]
    print(f"ratio create / its floor      : {floor:.2f} ({'within' if floor <= 1.5 else 'ABOVE'} the 1.5 goal)")
    if "torchrun --help" in medians:
        print(f"ratio create / torchrun --help: {create / medians['torchrun --help']:.2f}")
    if TORCHX in medians:
        ratio = create / medians[TORCHX]
        print(f"ratio create / torchx dryrun  : {ratio:.2f} ({'within' if ratio <= 0.4 else 'ABOVE'} the 0.4 goal)")
        print(f"ratio floor  / torchx dryrun  : {medians[FLOOR] / medians[TORCHX]:.2f}")


if __name__ == "__main__":
    main()
