"""A warm spare process: Python with torch already imported, idle until a warm restart promotes it
in place of a failed rank (contract/warm.py). Then the failed rank's replacement costs no
interpreter start and no `import torch` (seconds on a loaded node), only the program's own start.

    python -m slurmgen.train.spare ORDERS_FD PROGRAM_ARGS...

`launch_multi_node.sh` starts one per node when warm restarts are on and the program is Python
(`python -m MODULE ...`, `python SCRIPT ...`, `python -c CODE ...`: PROGRAM_ARGS is what follows
the interpreter), and a new one each time its spare is promoted; so does `run_slurm.sh` under
Slurm (restart_mode: warm, srun mode): each spare is the one task of a job step of its own, under
the rank wrapper (templates/run_slurm_spare.sh.j2), which hands it the orders srun passes on.
The spare reads one line from the descriptor ORDERS_FD (the read end of a FIFO, opened by the
node script before it started the spare, so orders given while the spare is still importing wait
in the pipe for it): `RANK LOCAL_RANK GENERATION MASTER_ADDR MASTER_PORT WORLD_SIZE`. It takes
that place in the environment, prints `SPARE_TAG RANK` (contract/warm.py) as its first line of
output (the node script then sends the rest to that rank's log), and runs the program in this
process as `python PROGRAM_ARGS` would. The end of ORDERS without a line (the node is done), or
any other line, ends it with 0, untouched.
"""

from __future__ import annotations

import os
import runpy
import sys

from slurmgen.contract import envvars
from slurmgen.contract.warm import SPARE_TAG


def _prepare(args: list[str]) -> None:
    """Import what the program's start would: torch always, with what a torch.optim optimizer's
    constructor imports (torch._dynamo: 2.2 s of CPU here, which a promoted spare would otherwise
    pay before its first step), and the bundled trainer when it is the program."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401

    if args[:2] == ["-m", "slurmgen.train"]:
        import slurmgen.train.cli  # noqa: F401
        import slurmgen.train.trainer  # noqa: F401


def _promote(line: str) -> None:
    rank, local_rank, generation, addr, port, size = line.split()
    os.environ.update(
        RANK=rank,
        LOCAL_RANK=local_rank,
        MASTER_ADDR=addr,
        MASTER_PORT=port,
        WORLD_SIZE=size,
        **{envvars.WARM_GENERATION: generation},
    )
    print(f"{SPARE_TAG} {rank}", flush=True)


def _run(args: list[str]) -> None:
    """The program, as `python ARGS` runs it."""
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = list(args)
        runpy.run_path(args[0], run_name="__main__")


def main(argv: list[str]) -> None:
    orders, args = argv[0], argv[1:]
    _prepare(args)
    with open(int(orders), encoding="utf-8") as f:
        line = f.readline()
    if len(line.split()) != 6:
        return  # the node is done with its spare
    _promote(line)
    _run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
