"""How many OpenMP threads a rank gets when nobody said: the launchers' one rule. Pure.

The generated scripts state the same rule in bash (templates/omp_threads.sh.j2); this is it for
the ranks Python starts (the coordinator's agent). A rank that inherits no OMP_NUM_THREADS
starts one OpenMP thread per core of the machine, and the ranks of one node then fight over
the cores: 3.4x (nanoGPT) and 7.7x (minGPT) slower than under torchrun, which sets 1.
"""

from __future__ import annotations

from collections.abc import Mapping


def default_omp_threads(
    environ: Mapping[str, str], sharing: int, per_node: int, bound_cores: int | None = None
) -> str | None:
    """OMP_NUM_THREADS for a rank started with `environ`, or None to leave it as it is.

    The user's value (any non-empty OMP_NUM_THREADS) wins. Else a rank bound to cores of its
    own (the spec's `bind`, templates/bind_cores.sh.j2) runs one thread per core it got
    (`bound_cores`). Else the CPUs Slurm gave the task
    (SLURM_CPUS_PER_TASK) shared by the `sharing` ranks it runs, at least 1; where Slurm did not
    say, 1 when the node runs several ranks (`per_node`), as torchrun does; a lone rank keeps
    the OpenMP default (all cores).
    """
    if environ.get("OMP_NUM_THREADS"):
        return None
    if bound_cores:
        return str(bound_cores)
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isascii() and cpus.isdigit() and int(cpus) > 0:
        return str(max(1, int(cpus) // max(1, sharing)))
    return "1" if per_node > 1 else None
