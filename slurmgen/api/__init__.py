"""The Python API: jobs driven from Python as from the command line (docs/guides/python-api.md).

- `Job`: a job spec (keyword arguments or a YAML file) with `render()`, `submit()`, `launch()`;
- `submit(fn, *args, nodes=, gpus=)`: a function run on every rank, rank 0's result back;
- `Handle`: a run's `state`, `wait()`, `logs()`, `cancel()`, `attempts`, `timeline`.

Each is loaded on first use (module `__getattr__`): `api/rank.py` runs on every rank of a
function's job, and importing this package for it must not load the spec, the templates or Slurm's
side.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmgen.api.function import FunctionJob, submit
    from slurmgen.api.handle import Handle
    from slurmgen.api.job import Job

__all__ = ["FunctionJob", "Handle", "Job", "submit"]
_WHERE = {"Job": "job", "Handle": "handle", "submit": "function", "FunctionJob": "function"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'slurmgen.api' has no attribute {name!r}")
    return getattr(import_module(f"slurmgen.api.{_WHERE[name]}"), name)
