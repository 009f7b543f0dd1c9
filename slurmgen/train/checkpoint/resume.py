"""Which checkpoint a run resumes from, and how every rank gets its state.

Rank 0 chooses (--resume auto|never|PATH) and broadcasts only the path. Every rank then maps
the file itself (`checkpoint.load`: mmap, weights_only): on shared storage nothing crosses the
network twice and no rank holds a pickled copy; ranks of one node share the file's pages.
Only when some rank cannot read the file (a run directory that is not shared) does rank 0
send the whole state, as broadcast objects, with a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .. import dist
from ..config import ConfigError
from ..env import DistEnv
from . import files as ckpt

log = logging.getLogger("slurmgen.train")


def choose(resume: str, ckpt_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """Rank 0: the checkpoint --resume names (path, its state), None to start afresh."""
    if resume == "never":
        return None
    if resume == "auto":
        found = ckpt.find_latest(ckpt_dir)
    else:
        path = Path(resume)
        if not path.exists():
            raise ConfigError([f"--resume {resume}: no such file or directory"])
        # A damaged file named here is an error (CheckpointError, exit 1), not skipped.
        found = ckpt.find_latest(path) if path.is_dir() else (path, ckpt.load(path))
        if found is None:
            raise ConfigError([f"--resume {resume}: no checkpoint there"])
    return (str(found[0]), found[1]) if found else None


def load(resume: str, ckpt_dir: Path, env: DistEnv) -> tuple[str, dict[str, Any]] | None:
    """All ranks: (path, state) of the checkpoint to resume from, or None."""
    chosen = choose(resume, ckpt_dir) if env.is_main else None
    if not env.distributed:
        return chosen
    where = dist.broadcast_from_main(chosen[0] if chosen else None)
    if where is None:
        return None
    state, unreadable = chosen[1] if chosen else None, 0.0
    if state is None:
        try:
            state = ckpt.load(where)
        except Exception as exc:
            log.warning("cannot read %s here (%s): rank 0 will send the checkpoint", where, exc)
            unreadable = 1.0
    if dist.all_reduce([unreadable], op="max")[0]:
        if env.is_main:
            log.warning(
                "%s is not readable on every node (not on shared storage?): sending it from rank 0, "
                "a full copy per rank",
                where,
            )
        state = dist.broadcast_from_main(state if env.is_main else None)
    assert state is not None  # for type checkers: rank 0 read it, and sent it to every rank that could not
    return where, state
