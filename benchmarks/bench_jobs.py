"""`slurmgen status` / `jobs` with 1,000 registered jobs, and a 1,000-point sweep submit.

    sudo python benchmarks/bench_jobs.py [--repeat 7] [--jobs 1000] [--reuse]

Brings up scripts/cluster/up.sh 2 (root) unless --reuse, and tears it down at the end.

1. 1,000 held jobs are submitted (plain sbatch --hold) and registered in a throwaway registry.
   Timed, as whole commands (Python start-up included), medians of --repeat runs, alternated:
   - slurmgen --version        (Python start-up and the CLI's imports: the floor of every command)
   - slurmgen status           (the newest job: scontrol for it, sacct for its steps, its log, its attempts file)
   - slurmgen jobs             (all 1,000 with their current state: one scontrol call)
   - plain `scontrol show job -o` for all jobs and `squeue` (the baseline), and `sacct` for the
     same ids (real: the test cluster keeps accounts in slurmdbd).
   Target: status under 1 s.
2. `slurmgen submit --sweep i=0,...,999 --hold`: wall time, and how many times sbatch ran
   (counted by a logging shim in front of the real sbatch on PATH). Target: one call, < 2 s.
Every job it made is cancelled at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER = Path(os.environ.get("SLURMGEN_CLUSTER_DIR", "/tmp/slurmgen-cluster"))
PY = sys.executable


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
        time.sleep(5)  # another test session owns the cluster


def down() -> None:
    subprocess.run(["bash", str(REPO / "scripts/cluster/down.sh")], capture_output=True)


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1) or (proc.returncode and "accounting" not in proc.stderr):
        sys.exit(f"{' '.join(argv[:4])} failed ({proc.returncode}): {proc.stderr[-1000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--reuse", action="store_true", help="use the cluster already up")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the test cluster runs Slurm in network namespaces")
    if not args.reuse:
        up(2)
    made: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp:
            work = Path(tmp)
            env = {
                **os.environ,
                "SLURM_CONF": str(CLUSTER / "etc" / "slurm.conf"),
                "SLURMGEN_REGISTRY": str(work / "jobs.sqlite"),
                "PATH": f"{Path(PY).parent}:{os.environ['PATH']}",
            }
            made += registered_jobs(work, env, args.jobs)
            compare_status(work, env, made, args.repeat)
            made += sweep_submit(work, env, args.jobs)
    finally:
        for i in range(0, len(made), 200):
            subprocess.run(
                ["scancel", *made[i : i + 200]],
                env={**os.environ, "SLURM_CONF": str(CLUSTER / "etc" / "slurm.conf")},
                capture_output=True,
            )
        if not args.reuse:
            down()


def registered_jobs(work: Path, env: dict[str, str], count: int) -> list[str]:
    sys.path.insert(0, str(REPO))
    from slurmgen.runs.registry import JobRecord, Registry

    t0 = time.perf_counter()
    ids = []
    for _ in range(count):
        out = subprocess.run(
            ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        ids.append(out.strip().split(";")[0])
    print(f"submitted {count} held jobs in {time.perf_counter() - t0:.1f} s")
    info = {
        "log_dir": str(work / "logs"),
        "workdir": str(work),
        "command": ["true"],
        "nodes": 1,
        "gpus": 1,
        "launcher": "srun",
        "array": None,
    }
    with Registry.open(work / "jobs.sqlite", create=True) as reg:
        reg.add_many(
            [
                JobRecord(j, "wrap", str(work / "out"), time.time() + i * 1e-3, None, None, None, info)
                for i, j in enumerate(ids)
            ]
        )
    return ids


def compare_status(work: Path, env: dict[str, str], ids: list[str], repeat: int) -> None:
    commands = {
        "slurmgen --version": [PY, "-m", "slurmgen", "--version"],
        "slurmgen status": [PY, "-m", "slurmgen", "status"],
        "slurmgen jobs (all 1000)": [PY, "-m", "slurmgen", "jobs"],
        "scontrol show job -o": ["scontrol", "show", "job", "-o"],
        "squeue": ["squeue"],
        "sacct -j <all ids>": ["sacct", "--parsable2", "-j", ",".join(ids)],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, argv in commands.items():
            times[name].append(timed(argv, env, work))
    base = statistics.median(times["scontrol show job -o"])
    print(f"\n{'command':<28}{'median s':>10}{'x scontrol':>12}   (repeat {repeat}, {len(ids)} registered jobs)")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<28}{med:>10.3f}{med / base:>12.1f}")
    status = statistics.median(times["slurmgen status"])
    floor = statistics.median(times["slurmgen --version"])
    print(
        f"target: slurmgen status < 1 s: {'met' if status < 1 else 'MISSED'} ({status:.3f} s, of which "
        f"{status - floor:.3f} s beyond start-up)"
    )


def sweep_submit(work: Path, env: dict[str, str], points: int) -> list[str]:
    shim = work / "shim"
    shim.mkdir()
    log = work / "sbatch-calls"
    real = subprocess.run(["bash", "-c", "command -v sbatch"], env=env, capture_output=True, text=True).stdout.strip()
    (shim / "sbatch").write_text(f'#!/usr/bin/env bash\necho call >> "{log}"\nexec "{real}" "$@"\n')
    (shim / "sbatch").chmod(0o755)
    shim_env = {**env, "PATH": f"{shim}:{env['PATH']}"}
    values = ",".join(str(i) for i in range(points))
    argv = [PY, "-m", "slurmgen", "submit", "-o", str(work / "sweep"), "--sweep", f"i={values}", "--hold", "--", "true"]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=shim_env, cwd=work, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"sweep submit failed: {proc.stderr}")
    calls = len(log.read_text().splitlines())
    script = (work / "sweep" / "run_slurm.sh").read_text()
    print(
        f"\n{points}-point sweep: submitted in {elapsed:.2f} s with {calls} sbatch call(s); "
        f"one script of {len(script) // 1024} KiB; target one call and < 2 s: "
        f"{'met' if calls == 1 and elapsed < 2 else 'MISSED'}"
    )
    return [proc.stdout.strip()]


if __name__ == "__main__":
    main()
