"""What `create` can check on this machine about the programs a job will need. Side effects.

The login node that runs `create` is often not a compute node, so nothing here refuses a
job: a program that is missing here may well be installed on the nodes. What can be known
is said in one note line, before the job fails with `command not found` minutes later.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from slurmgen.generate.render import runs_python
from slurmgen.generate.spec import JobSpec

_HAS_TORCH = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"


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
