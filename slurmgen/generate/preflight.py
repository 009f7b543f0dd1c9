"""What `create` can check on this machine about the programs a job will need. Side effects.

The login node that runs `create` is often not a compute node, so a program missing here is
no reason to refuse a job: it may well be installed on the nodes. What can be known is said in
one note line, before the job fails with `command not found` minutes later.

The one refusal here is a warm restart asked of a program that cannot take part in it
(`warm_refusal`): every launcher asks it (`create`/`submit` and `slurmgen.Job` through
`job_warm_refusal`, `slurmgen launch`'s plan, a coordinator group's config). It lives in the
generator layer, not in contract/, because it reads the program's script (contract/ is pure);
and not in the spec's validators, because a saved job.yaml must load the same tomorrow whatever
its script has become, and because only the command that starts a job knows where it runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from slurmgen.contract import warm
from slurmgen.errors import show
from slurmgen.generate.render import runs_python
from slurmgen.generate.spec import JobSpec

_HAS_TORCH = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
# A program that mentions the trainer or its warm hook may take part in a warm restart.
TAKES_PART = re.compile(r"slurmgen\.train|from slurmgen import train")
# A setup line that moves the job elsewhere (`cd DIR`, `pushd DIR`): its relative paths are not this directory's.
_MOVES = re.compile(r"(^|[;&|(]|\s)(cd|pushd)(\s|$)")


def torchrun_note(spec: JobSpec) -> str | None:
    """A note when run_slurm.sh's torchrun agent is known to be missing here, else None."""
    if spec.launcher != "torchrun":
        return None
    if not runs_python(spec):
        if spec.container is not None or shutil.which("torchrun"):
            return None
        return (
            "launcher torchrun: 'torchrun' is not on PATH here; the nodes need it there "
            "(or make the program the venv's Python: -- /path/to/venv/bin/python train.py)"
        )
    program = spec.command[0]
    if spec.container is not None or "/" not in program or not Path(program).is_file():
        return None  # a bare name or a path on the nodes only: cannot be known here
    try:
        found = subprocess.run([program, "-c", _HAS_TORCH], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return f"launcher torchrun: {program} could not be run here to look for torch"
    return (
        None
        if found
        else f"launcher torchrun: {program} has no torch here ({program} -m torch.distributed.run would fail)"
    )


def warm_refusal(mode: str, command: Sequence[str], workdir: str | None) -> str | None:
    """Why `mode` cannot be had for `command`, where that is knowable here: an unknown mode, or a
    warm restart asked of a program that cannot take part (torchrun, whose agent restarts its
    workers itself; a Python script or `-c` code here that never uses slurmgen.train). A program
    this cannot read (a module, a script only on the nodes, a relative path when `workdir`, the
    directory the ranks start in, is not known here: None) is let be: if it does not take part,
    its ranks fail together and the launcher restarts it whole."""
    if mode not in warm.RESTART_MODES:
        return f"restart_mode: must be one of {', '.join(warm.RESTART_MODES)} (got {show(mode)})"
    if mode == warm.COLD or not command:
        return None
    program = PurePosixPath(command[0]).name
    if program == "torchrun" or "torch.distributed.run" in command[1:3]:
        return "restart_mode: warm needs a program that takes part in it, and torchrun restarts its workers itself"
    if not warm.PYTHON.match(program) or len(command) < 2 or command[1] == "-m":
        return None
    code = command[2] if command[1] == "-c" and len(command) > 2 else None
    where = "the -c code"
    if code is None:
        where = command[1]
        if workdir is None and not where.startswith("/"):
            return None  # where the ranks start is not known here
        try:
            code = Path(workdir or "/", where).read_text(errors="replace")
        except OSError:
            return None  # only on the nodes: not knowable here
    if TAKES_PART.search(code):
        return None
    return (
        f"restart_mode: warm needs a program that takes part in it (the bundled trainer, or "
        f"slurmgen.train.warm), and {where} does not use slurmgen.train"
    )


def job_warm_refusal(spec: JobSpec) -> str | None:
    """`warm_refusal` for a Slurm job (`create`, `submit`, `slurmgen.Job`): its ranks start where
    sbatch runs, this directory (`create` says `sbatch out/run_slurm.sh` from here), unless the
    job moves (`--chdir` in sbatch_extra, a `cd` in setup) or runs in a container's own files:
    then only an absolute path is read here. Launcher torchrun is the spec's own refusal."""
    if spec.restart_mode == warm.COLD:
        return None
    moved = (
        spec.container is not None
        or any(a.startswith(("--chdir", "-D")) for a in spec.sbatch_extra)
        or any(_MOVES.search(line) for line in spec.setup)
    )
    return warm_refusal(spec.restart_mode, spec.command, None if moved else os.getcwd())
