"""Run a function as N real gloo ranks (separate processes) and collect what each returned.

Workers must be module-level functions (they are pickled into spawned processes); each gets
(rank, world_size, *args) after joining a process group through a file store in `tmp`.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, tmp: str, fn, args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    out = Path(tmp) / f"result-{rank}.pt"
    tdist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        torch.save({"ok": fn(rank, world, *args)}, out)
        tdist.barrier()
    except BaseException:
        torch.save({"error": traceback.format_exc()}, out)
        raise
    finally:
        tdist.destroy_process_group()


def run_ranks(world: int, tmp: str | os.PathLike, fn, *args) -> list:
    """fn's return value of every rank, in rank order; a rank's traceback fails the test."""
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    for stale in [tmp / "store", *tmp.glob("result-*.pt")]:
        stale.unlink(missing_ok=True)
    try:
        mp.spawn(_entry, args=(world, str(tmp), fn, args), nprocs=world, join=True)
    except Exception:
        errors = [torch.load(p, weights_only=False).get("error") for p in sorted(tmp.glob("result-*.pt"))]
        raise AssertionError("\n".join(e for e in errors if e) or "a rank died") from None
    return [torch.load(tmp / f"result-{r}.pt", weights_only=False)["ok"] for r in range(world)]
