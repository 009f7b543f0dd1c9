"""Which ended attempt is worth another: one rule for every launcher that starts a job again.

run_slurm.sh requeues its job (the spec's `retries` and `retry_on`), `slurmgen launch
--max-restarts` starts every node again, and so does a coordinator group with `max_restarts`.
Worth another attempt: a failure the next one may not repeat, a crashed rank, a hung rank, a
lost node. Never: success; bad input (exitcodes.BAD_INPUT: the same input fails the same way);
a preemption (exitcodes.PREEMPTED: the program saved a checkpoint and is resumed by its own
path, the requeue the preemption asked for, as run_slurm.sh has always done); a person's stop
(Ctrl-C, `slurmgen cancel`, the page's Stop), whatever code it ended with. `retry_on` narrows
the codes to a list: a Slurm job's own (its spec's, handed to run_slurm.sh's template); the
number of attempts is each caller's budget.
"""

from __future__ import annotations

from collections.abc import Collection

from slurmgen.contract import exitcodes

NEVER = frozenset({exitcodes.OK, exitcodes.BAD_INPUT, exitcodes.PREEMPTED})


def worth_retry(code: int | None, stopped: bool = False, retry_on: Collection[int] | None = None) -> bool:
    """Whether an attempt that ended with exit `code` (None: a failure without one, a lost
    worker) is worth another; `stopped`: a person stopped it. Without `retry_on` every code but
    NEVER is; with it, only the codes it lists."""
    if stopped or code in NEVER:
        return False
    return retry_on is None or code in retry_on
