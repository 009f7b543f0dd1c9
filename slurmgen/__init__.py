"""slurmgen: multi-node PyTorch launching made boring and correct.

Deliberately import-free: every rank of every job imports this package, and
`slurmgen --help` must stay fast and must not pull in torch or paramiko. `slurmgen.beat`
loads its writer (stdlib only, slurmgen/observe/helper.py) on the first call; the Python API
(`slurmgen.Job`, `slurmgen.submit`, `slurmgen.Handle`: slurmgen/api/) is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurmgen.contract import phases as _phases  # noqa: F401  (notes when slurmgen was imported: IMPORTED_AT)
from slurmgen.contract.version import VERSION as __version__

if TYPE_CHECKING:
    from slurmgen.api import FunctionJob, Handle, Job, submit

__all__ = ["FunctionJob", "Handle", "Job", "__version__", "beat", "submit"]
_API = ("FunctionJob", "Handle", "Job", "submit")


def beat(step: int | None = None, loss: float | None = None, phase: str | None = None, **metrics: Any) -> None:
    """Heartbeats, timeline and metrics for any program: see slurmgen/observe/helper.py."""
    from slurmgen.observe.helper import beat as _beat

    _beat(step, loss, phase, **metrics)


def __getattr__(name: str) -> Any:
    """`slurmgen.Job`, `slurmgen.submit`, ...: the Python API (slurmgen/api/), imported when first named."""
    if name in _API:
        from slurmgen import api

        return getattr(api, name)
    raise AttributeError(f"module 'slurmgen' has no attribute {name!r}")
