"""Under Slurm: from a rank's failure to the last process of the job gone, beside plain srun.

    sudo python benchmarks/bench_heal.py [--repeat 3] [--reuse] [--wait 600]

Brings up scripts/cluster/up.sh 2 (root) unless --reuse, and tears it down at the end. Every
job is 2 nodes x 2 ranks of the same small program; rank 3 fails 2 s after start, noting the
time just before. Then a /proc scan every 10 ms (the nodes are namespaces of this machine)
waits until no process whose command line holds the job's marker is left. Measured in turn:

1. plain: a hand-written batch script, `srun --kill-on-bad-exit=1` (the baseline);
2. run_slurm.sh from `slurmgen create` (its attempts record, the srun stderr copy, ...);
3. run_slurm.sh --heartbeat-timeout 1, where rank 3 does not exit but stops beating and
   sleeps: from its last beat, the time includes the 1 s timeout and the watcher's 0.5 s poll.

Goal: every case within 2 s of the failure (case 3: of the timeout's end).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_launch import CLUSTER, PY, down, job_pids, up

PROGRAM = r"""
import json, os, socket, sys, time
marker, mode, note = sys.argv[1], sys.argv[2], sys.argv[3]
rank, beats = int(os.environ["RANK"]), os.environ.get("SLURMGEN_HEARTBEAT_DIR")
start = time.time()
while time.time() - start < 60:
    if beats:
        os.makedirs(beats, exist_ok=True)
        path = os.path.join(beats, "rank-%05d.json" % rank)
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps({"rank": rank, "step": 0, "time": time.time(), "pid": os.getpid(),
                                "host": socket.gethostname(), "status": "running"}) + "\n")
        os.replace(path + ".tmp", path)
    if rank == 3 and time.time() - start > 2:
        with open(note, "w") as f:
            f.write(repr(time.time()))
        if mode == "hang":
            time.sleep(600)
        sys.exit(1)
    time.sleep(0.05)
"""

HANG_TIMEOUT = 1.0
PLAIN = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --output={out}/plain-%j.out
srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID exec "$@"' task {python} {program} {marker} exit {note}
"""


def up_when_free(nodes: int, wait: float) -> None:
    """up.sh, waiting up to `wait` seconds while another session owns the shared cluster."""
    deadline = time.time() + wait
    while True:
        try:
            return up(nodes)
        except SystemExit as exc:
            if "busy" not in str(exc) or time.time() > deadline:
                raise
            time.sleep(2)


def env() -> dict[str, str]:
    facts = json.loads((CLUSTER / "cluster.json").read_text())
    return {**os.environ, "SLURM_CONF": facts["slurm_conf"], "PATH": f"{Path(PY).parent}:{os.environ['PATH']}"}


def job_state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env()).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "")


def one_run(script: Path, cwd: Path, marker: str, note: Path) -> float:
    """Seconds from the failure noted in `note` to the last process with `marker` gone."""
    job = (
        subprocess.run(
            ["sbatch", "--parsable", str(script)], cwd=cwd, capture_output=True, text=True, env=env(), check=True
        )
        .stdout.strip()
        .split(";")[0]
    )
    deadline = time.time() + 60
    while not note.exists() or not note.read_text():
        if time.time() > deadline:
            raise RuntimeError(f"job {job} never failed (state {job_state(job)})")
        time.sleep(0.01)
    while job_pids(marker):
        if time.time() > deadline:
            raise RuntimeError(f"job {job}: processes still alive after 60 s")
        time.sleep(0.01)
    gone = time.time()
    while job_state(job) not in ("FAILED", "COMPLETED", "CANCELLED", "TIMEOUT"):
        time.sleep(0.25)
    return gone - float(note.read_text())


def create(out: Path, program: Path, marker: str, mode: str, note: Path, *flags: str) -> Path:
    subprocess.run(
        [
            PY,
            "-m",
            "slurmgen",
            "create",
            "--nodes",
            "2",
            "--gpus",
            "2",
            "--backend",
            "gloo",
            "-o",
            str(out),
            "--force",
            *flags,
            "--",
            "python",
            str(program),
            marker,
            mode,
            str(note),
        ],
        check=True,
        capture_output=True,
    )
    return out / "run_slurm.sh"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--reuse", action="store_true", help="use a cluster already up (scripts/cluster/up.sh 2)")
    parser.add_argument("--wait", type=float, default=600, help="seconds to wait while the cluster is busy")
    args = parser.parse_args()
    if not args.reuse:
        up_when_free(2, args.wait)
    samples: dict[str, list[float]] = {
        "plain srun --kill-on-bad-exit": [],
        "run_slurm.sh, rank exits 1": [],
        "run_slurm.sh --heartbeat-timeout 1, rank hangs": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-heal-") as tmp:
            work = Path(tmp)
            program = work / "program.py"
            program.write_text(PROGRAM)
            for round_ in range(args.repeat):
                for name in samples:
                    marker = f"sgbench-{round_}-{len(samples[name])}-{name.split()[0]}-{os.getpid()}"
                    note = work / f"{marker}.failed"
                    out = work / marker
                    out.mkdir()
                    if name.startswith("plain"):
                        script = out / "plain.sh"
                        script.write_text(PLAIN.format(out=out, python=PY, program=program, marker=marker, note=note))
                    elif "hangs" in name:
                        script = create(out, program, marker, "hang", note, "--heartbeat-timeout", str(HANG_TIMEOUT))
                    else:
                        script = create(out, program, marker, "exit", note)
                    samples[name].append(one_run(script, work, marker, note))
    finally:
        if not args.reuse:
            down()
    base = statistics.median(samples["plain srun --kill-on-bad-exit"])
    print(f"\nfailure -> last process gone, 2 nodes x 2 ranks, median of {args.repeat} (min-max):")
    for name, values in samples.items():
        med = statistics.median(values)
        extra = (
            f"x{med / base:.2f} of plain" if "hangs" not in name else f"{med - HANG_TIMEOUT:.2f} s after the timeout"
        )
        print(f"  {name:48s} {med:6.2f} s  ({min(values):.2f}-{max(values):.2f})  {extra}")
    print(
        f"  (the hang case counts from the last beat: the {HANG_TIMEOUT:g} s timeout and up to 0.5 s of watcher poll)"
    )


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("bench_heal.py needs root (the test cluster): sudo python benchmarks/bench_heal.py")
    main()
