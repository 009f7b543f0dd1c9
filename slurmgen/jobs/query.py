"""Asking Slurm about registered jobs: one `scontrol` call, then `sacct` for what it forgot
or, for one job's status, for its steps.

The side-effect half of `slurm.py`: which commands to run for a set of job ids, and what to
say when a source is missing.

Every query is bounded: a controller that is down makes each Slurm client command retry for
its MessageTimeout and more (18 s a call on the test cluster), so a query gets `timeout()`
seconds, is asked once more, and is then given up with one note saying the controller does not
answer; the caller shows what the registry last saw.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from slurmgen.contract.envvars import SLURM_TIMEOUT
from slurmgen.errors import SlurmgenError
from slurmgen.jobs.slurm import SACCT_FIELDS, QueryResult, parse_sacct, parse_scontrol
from slurmgen.jobs.slurm_runner import Result, Runner, Unanswered

# With more ids than this, listing every job in one call is cheaper than naming them.
MANY = 8
# A healthy controller answers `scontrol show job` in tens of milliseconds; 0.8 s, asked twice,
# keeps `status` (0.75 s of it is starting Python) within 3 s while it is down.
DEFAULT_TIMEOUT = 0.8
TRIES = 2


def timeout() -> float:
    """Seconds each try of a Slurm query gets: $SLURMGEN_SLURM_TIMEOUT, else DEFAULT_TIMEOUT."""
    text = os.environ.get(SLURM_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise SlurmgenError(f"{SLURM_TIMEOUT}: expected seconds, a number above 0 (got {text!r})")
    return value


def bounded(runner: Runner, argv: Sequence[str]) -> Result | None:
    """argv's result, or None when it did not answer within `timeout()` on any of TRIES tries."""
    seconds = timeout()
    for _ in range(TRIES):
        try:
            return runner.run(argv, timeout=seconds)
        except Unanswered:
            continue
    return None


def unanswered(command: str) -> str:
    """The one line said when the controller (or, for sacct, the accounting daemon) is silent."""
    who = "Slurm's accounting (slurmdbd)" if command == "sacct" else "the Slurm controller"
    return f"{who} does not answer ({command}: no answer within {timeout():g} s, {TRIES} tries)"


def _base(job_id: str) -> str:
    return job_id.split("_")[0]


def ask(
    runner: Runner, job_ids: Sequence[str], *, accounting: bool = True, steps: bool = False, batched: bool = False
) -> QueryResult:
    """What Slurm knows about these job ids (array ids bring all their tasks).

    `batched`: one `scontrol` call listing every job whatever the number of ids (the runs list's
    refresh: one query per refresh, never one per row), then at most one `sacct` for the rest.

    `accounting`: ask sacct about the jobs the controller has forgotten. `steps`: ask it about
    every job, for its steps' states and exit codes, which scontrol does not keep; what scontrol
    says about a job still wins. Where there is no accounting, only forgotten jobs get a note."""
    snap = QueryResult()
    wanted = sorted({_base(j) for j in job_ids})
    if not wanted:
        return snap
    texts, errors = [], []
    for argv in (
        [["scontrol", "show", "job", "-o"]]
        if batched or len(wanted) > MANY
        else [["scontrol", "show", "job", "-o", job] for job in wanted]
    ):
        res = bounded(runner, argv)
        if res is None:  # down: the other ids would wait as long, for nothing
            snap.unanswered = unanswered("scontrol")
            snap.notes.append(snap.unanswered)
            break
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
    # A silent controller: accounting lags it (a job running for seconds may still be PENDING
    # there) and its steps are not worth a second wait; the registry's last word stands.
    if asked and accounting and not snap.unanswered:
        res = bounded(
            runner,
            ["sacct", "--parsable2", "--noheader", "--duplicates", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(asked)],
        )
        if res is None:
            snap.notes.append(unanswered("sacct"))
        elif res.code == 0:
            jobs, job_steps = parse_sacct(res.out)
            for job in jobs:
                if (job.array_job_id or job.job_id) in missing:
                    snap.add(job)
            snap.steps.update(job_steps)
        elif missing:
            snap.notes.append(
                f"sacct: {res.err.strip() or 'failed'}; showing the last state slurmgen saw for "
                f"{len(missing)} job(s) the controller no longer knows"
            )
    return snap
