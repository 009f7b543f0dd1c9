"""slurmgen: multi-node PyTorch launching made boring and correct.

Deliberately import-free: every rank of every job imports this package, and
`slurmgen --help` must stay fast and must not pull in torch or paramiko. `slurmgen.beat`
loads its writer (stdlib only, slurmgen/observe/helper.py) on the first call.
"""

from __future__ import annotations

from typing import Any

from slurmgen.contract import phases as _phases  # noqa: F401  (notes when slurmgen was imported: IMPORTED_AT)
from slurmgen.contract.version import VERSION as __version__

__all__ = ["__version__", "beat"]


def beat(step: int | None = None, loss: float | None = None, phase: str | None = None, **metrics: Any) -> None:
    """Heartbeats, timeline and metrics for any program: see slurmgen/observe/helper.py."""
    from slurmgen.observe.helper import beat as _beat

    _beat(step, loss, phase, **metrics)
