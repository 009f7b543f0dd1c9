"""Asking Slurm about registered jobs: one `scontrol` call, then `sacct` for what it forgot
or, for one job's status, for its steps.

The side-effect half of `slurm.py`: which commands to run for a set of job ids, and what to
say when a source is missing.
"""

from __future__ import annotations

from typing import Sequence

from slurmgen.jobs.runner import Runner
from slurmgen.jobs.slurm import SACCT_FIELDS, Snapshot, parse_sacct, parse_scontrol

# With more ids than this, listing every job in one call is cheaper than naming them.
MANY = 8


def _base(job_id: str) -> str:
    return job_id.split("_")[0]


def ask(runner: Runner, job_ids: Sequence[str], *, accounting: bool = True, steps: bool = False) -> Snapshot:
    """What Slurm knows about these job ids (array ids bring all their tasks).

    `accounting`: ask sacct about the jobs the controller has forgotten. `steps`: ask it about
    every job, for its steps' states and exit codes, which scontrol does not keep; what scontrol
    says about a job still wins. Where there is no accounting, only forgotten jobs get a note."""
    snap = Snapshot()
    wanted = sorted({_base(j) for j in job_ids})
    if not wanted:
        return snap
    if len(wanted) > MANY:
        res = runner.run(["scontrol", "show", "job", "-o"], timeout=30)
        texts = [res.out] if res.code == 0 else []
        errors = [res.err.strip()] if res.code else []
    else:
        texts, errors = [], []
        for job in wanted:
            res = runner.run(["scontrol", "show", "job", "-o", job], timeout=30)
            if res.code == 0:
                texts.append(res.out)
            elif "Invalid job id" not in res.err:  # the controller forgot it: not an error here
                errors.append(res.err.strip())
    for text in texts:
        for job in parse_scontrol(text):
            snap.add(job)
    if errors:
        snap.notes.append(f"scontrol failed: {errors[0]}")
    known = {j.array_job_id or j.job_id for j in snap.jobs.values()}
    missing = [j for j in wanted if j not in known]
    asked = wanted if steps else missing
    if asked and accounting:
        res = runner.run(["sacct", "--parsable2", "--noheader", "--duplicates", "-o", ",".join(SACCT_FIELDS),
                          "-j", ",".join(asked)], timeout=30)
        if res.code == 0:
            jobs, job_steps = parse_sacct(res.out)
            for job in jobs:
                if (job.array_job_id or job.job_id) in missing:
                    snap.add(job)
            snap.steps.update(job_steps)
        elif missing:
            snap.notes.append(f"sacct: {res.err.strip() or 'failed'}; showing the last state slurmgen saw for "
                              f"{len(missing)} job(s) the controller no longer knows")
    return snap
