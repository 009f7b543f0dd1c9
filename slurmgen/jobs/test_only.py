"""`sbatch --test-only`: when Slurm expects a job to start, or why it never can, nothing submitted.

The controller answers from its backfill scheduler: the start is estimated from the time limits
of the jobs running now (a job that ends early starts the next one sooner). Both answers come on
stderr; as Slurm 22.05.8 prints them (the test cluster, tests/unit/jobs/test_earliest.py):

    sbatch: Job 3 to start at 2026-11-28T10:27:56 using 2 processors on nodes node[1-2] in partition debug
    allocation failure: Requested node configuration is not available
    sbatch: error: invalid partition specified: nosuch

The script goes on stdin, so asking needs no file on the machine that runs sbatch (a login node
with --remote). The times are the controller's local time, as `date` prints it there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from slurmgen.jobs.slurm_runner import Runner

_START = re.compile(
    r"Job \d+ to start at (?P<start>\S+) using \d+ processors on nodes (?P<nodes>\S+) in partition (?P<partition>\S+)"
)
TIMEOUT = 60.0  # seconds: one answer of the controller


@dataclass(frozen=True)
class Estimate:
    """Slurm's answer for one request: when and where it would start, or why it never can."""

    start: datetime | None = None
    partition: str | None = None
    nodes: str | None = None
    error: str | None = None


def parse(err: str, code: int) -> Estimate:
    """sbatch --test-only's stderr (and exit code) to an Estimate."""
    m = _START.search(err)
    if code == 0 and m:
        try:
            start = datetime.fromisoformat(m["start"])
        except ValueError:
            return Estimate(error=f"an expected start sbatch wrote unreadably: {m['start']!r}")
        return Estimate(start, m["partition"], m["nodes"])
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    failure = [line.split(":", 1)[1].strip() for line in lines if line.startswith("allocation failure:")]
    said = [line.removeprefix("sbatch: ").removeprefix("error: ") for line in lines]
    return Estimate(error=(failure or said or [f"sbatch --test-only exited with code {code}"])[-1])


def ask(runner: Runner, script: str, cwd: str | None = None) -> Estimate:
    """Slurm's expected start of `script` (run_slurm.sh's text, its #SBATCH lines the request)."""
    res = runner.run(["sbatch", "--test-only"], cwd=cwd, stdin=script.encode(), timeout=TIMEOUT)
    return parse(res.err, res.code)


def clock(runner: Runner) -> datetime | None:
    """The time where sbatch runs, in its local time (the zone of its expected starts)."""
    res = runner.run(["date", "+%Y-%m-%dT%H:%M:%S"], timeout=TIMEOUT)
    try:
        return datetime.fromisoformat(res.out.strip()) if res.code == 0 else None
    except ValueError:
        return None
