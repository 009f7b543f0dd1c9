"""How attempts are numbered, the one rule every launcher and every reader uses.

An attempt is one run of a job: the first start, then each restart (`slurmgen launch`, a
coordinator group) or requeue (Slurm). They are counted from 1, everywhere a user sees them
(the page, `slurmgen status [--timeline] [--json]`, the attempts and timeline files, the run
records of slurmgen.tracking): "attempt 1" is the first run, as a person counts and as
`slurmgen launch` ("attempt 1 of 2 failed") and the tracking records always did. Slurm counts
requeues from 0 (SLURM_RESTART_COUNT), so a Slurm job's attempt is its restart count plus FIRST;
run_slurm.sh computes the same in bash from the FIRST it is rendered with.

A run's attempts are its own: a coordinator group is started many times, each start a new run
whose first attempt is attempt 1 however many starts came before (the coordinator's store keys
its attempts by a count over the group's life, which no user sees): its attempt is its restarts
since that start plus FIRST, the rule `from_restart_count` is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FIRST = 1


def from_restart_count(count: int) -> int:
    """The attempt of a run restarted `count` times since it started: a Slurm job requeued
    `count` times (SLURM_RESTART_COUNT), a group's run after `count` restarts."""
    return count + FIRST


def attempt_number(record: Mapping[str, Any]) -> int:
    """The attempt a timeline or attempts line names; the first when it names none (a program
    run by hand, outside any launcher)."""
    value = record.get("attempt")
    return FIRST if value is None else int(value)
