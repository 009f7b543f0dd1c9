"""Checkpoint files: atomic writes, a `latest` pointer, the last K kept, RNG states captured.

Why each step of `save()` is there (a kill -9 may land between any two of them):

1. write `.ckpt-STEP.pt.tmp.PID` in the checkpoint directory (same file system, so the
   rename below is atomic), flush and fsync it: the bytes are on disk before anyone can see
   the name;
2. rename it to `ckpt-STEP.pt` and fsync the directory: the name now survives a crash;
3. write `latest.tmp`, fsync, rename over `latest`, fsync the directory: the pointer flips
   from one complete file to another, never to a half-written one;
4. delete checkpoints beyond the newest K, never the one `latest` names.

A crash before 3 leaves `latest` on the previous checkpoint (plus a stray temporary file,
removed by the next run); a crash after 3 leaves a complete new checkpoint. `find_latest()`
also survives a missing or dangling pointer by scanning, and skips an unreadable file with a
warning, so `--resume auto` always finds the newest loadable state.

Files are loaded with `weights_only=True`: a checkpoint holds tensors and plain values only,
so resuming never executes pickled code from the run directory. They are memory-mapped
(`mmap=True`): tensors are read from the page cache when they are copied into the model, so a
rank holds no private copy of the file, and ranks of one node share its pages.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import pickle
import random
import re
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slurmgen import atomic
from slurmgen.contract import envvars

log = logging.getLogger("slurmgen.train")

LATEST = "latest"
FORMAT = 1
_NAME = re.compile(r"ckpt-(\d+)\.pt")
# Test hook: SLURMGEN_TRAIN_FAULT=<point>[@<step>] kills this process with SIGKILL at that
# point of save() (of that step's checkpoint), so tests can place a kill -9 exactly between two
# steps of the protocol instead of hoping a random kill lands there.
FAULT_POINTS = ("mid-write", "before-rename", "before-pointer", "before-prune")
_fault_step: int | None = None


def arm_fault(step: int) -> None:
    """The checkpoint being written is that of `step` (for SLURMGEN_TRAIN_FAULT=<point>@<step>)."""
    global _fault_step
    _fault_step = step


def fault(point: str) -> None:
    spec = os.environ.get(envvars.TRAIN_FAULT)
    if not spec:
        return
    name, _, step = spec.partition("@")
    if name == point and (not step or _fault_step == int(step)):
        os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), d / n) for n in os.listdir(d) if (m := _NAME.fullmatch(n))]
    return sorted(found)


def write_durably(final: Path, write) -> None:
    """Write through a temporary file in the same directory, fsync, rename, fsync the dir
    (`atomic.replace`, which removes the temporary file when the write fails).

    `write(path)` creates the temporary file by name: torch.save to a path uses its own C++
    writer, measurably faster than through a Python file object. fsync then goes through a
    fresh descriptor, which flushes the same inode.
    """
    atomic.replace(final, write, fsync=True, fsync_dir_after=True, before_rename=lambda: fault("before-rename"))


class _FaultingFile:
    """File wrapper that fires the `mid-write` fault once some bytes have been written."""

    def __init__(self, f):
        self.f, self.written = f, 0

    def write(self, b) -> int:
        n = self.f.write(b)
        self.written += n
        if self.written > 4096:
            fault("mid-write")
        return n

    def __getattr__(self, name: str):
        return getattr(self.f, name)


def save(directory: str | os.PathLike[str], step: int, state: dict[str, Any], keep_last: int) -> Path:
    """Write `state` as the checkpoint of `step` atomically, point `latest` at it, prune."""
    arm_fault(step)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / checkpoint_name(step)

    def write(path: Path) -> None:
        if os.environ.get(envvars.TRAIN_FAULT):
            with open(path, "wb") as f:
                torch.save(state, _FaultingFile(f))
        else:
            torch.save(state, str(path))

    with _disk_full_said(d, step, state):
        write_durably(final, write)
        fault("before-pointer")
        write_durably(d / LATEST, lambda path: path.write_text(final.name + "\n"))
    fault("before-prune")
    prune(d, keep_last, protect=final.name)
    return final


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used (or written); the message is one line naming it."""


def estimated_size(state: Any) -> int:
    """About the bytes torch.save will write for `state`: every tensor storage once (tied
    weights share one), plus a margin for the pickled structure and the zip records."""
    seen: dict[int, int] = {}

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(state)
    return sum(seen.values()) + 64 * 1024 + 64 * len(seen)


def _no_space(exc: BaseException | None) -> bool:
    """ENOSPC anywhere in the chain: torch reports it as `basic_ios::clear: iostream error`
    with the OSError only in a secondary exception."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class DiskFull(CheckpointError):
    """A checkpoint that did not fit: one line naming the directory, the sizes, and the
    checkpoint `latest` still names, which the failed write left intact."""

    def __init__(self, directory: Path, step: int, need: int, free: int):
        previous = list_checkpoints(directory)
        intact = (
            f"the previous checkpoint (step {previous[-1][0]}) is intact"
            if previous
            else "there is no previous checkpoint"
        )
        super().__init__(
            f"checkpoint step {step}: no space left on {directory} (needs ~{need / 1e6:.1f} MB, "
            f"{free / 1e6:.1f} MB free); {intact}"
        )


@contextmanager
def _disk_full_said(directory: Path, step: int, state: Any) -> Iterator[None]:
    """Refuse a write that cannot fit before writing a byte (the failure path then still finds
    room for its heartbeat and run record), and turn ENOSPC during the write into `DiskFull`.

    The original error is dropped, not chained: its traceback holds torch's file writer, whose
    open descriptor keeps the removed temporary file's blocks allocated until it is collected."""
    need = estimated_size(state)
    if shutil.disk_usage(directory).free < need:
        raise DiskFull(directory, step, need, shutil.disk_usage(directory).free)
    full = False
    try:
        yield
    except Exception as exc:
        if not _no_space(exc):
            raise
        full = True
    if full:
        gc.collect()  # close the writer's descriptor: the blocks are free again
        raise DiskFull(directory, step, need, shutil.disk_usage(directory).free)


def prune(directory: Path, keep_last: int, protect: str) -> None:
    """Delete all but the newest `keep_last` checkpoints (never `protect`)."""
    for _, path in list_checkpoints(directory)[:-keep_last]:
        if path.name != protect:
            path.unlink(missing_ok=True)


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> int:
    """Remove temporary files left by a writer that was killed; returns how many."""
    d = Path(directory)
    if not d.is_dir():
        return 0
    stale = [d / n for n in os.listdir(d) if n.startswith(".") and ".tmp." in n]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state in `path`, or CheckpointError saying in one line why it cannot be used.

    torch's own message for a file that holds arbitrary objects advises loading with
    weights_only=False, which would run code from the file: it is never passed on.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # truncated, not a zip/pickle at all, foreign objects, I/O error ...
        text = str(exc).strip()
        if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in text:
            raise CheckpointError(
                f"{path} is not a slurmgen.train checkpoint: it holds objects other than "
                "tensors and plain values, which are not loaded"
            ) from None
        # torch wraps any unpickling failure in its advice; keep only what went wrong.
        text = text.split("WeightsUnpickler error:", 1)[-1].strip()
        reason = (text.splitlines() or [type(exc).__name__])[0][:120]
        raise CheckpointError(f"{path} is damaged or not a checkpoint ({reason})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a slurmgen.train checkpoint (format {FORMAT})")
    return state


def candidates(directory: str | os.PathLike[str], listing=None) -> list[Path]:
    """Checkpoints to try for `--resume auto`, best first: the pointer's, then newest first.

    `listing(directory)` lists them as (step, path) oldest first (`list_checkpoints` unless
    given: the sharded format lists its directories with the same pointer rules)."""
    d = Path(directory)
    ordered = [p for _, p in reversed((listing or list_checkpoints)(d))]
    pointer = d / LATEST
    if pointer.is_file():
        try:
            named = d / pointer.read_text(encoding="utf-8").strip()
        except (OSError, ValueError):  # a damaged pointer: the scan below still finds the newest
            log.warning("%s is damaged; scanning for checkpoints", pointer)
            return ordered
        if named in ordered:
            ordered.remove(named)
            ordered.insert(0, named)
        elif not named.exists():  # (one that exists is of the other format: not this listing's business)
            log.warning("%s names %s, which does not exist; scanning for checkpoints", pointer, named.name)
    return ordered


def find_latest(directory: str | os.PathLike[str], listing=None, loader=None) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, and its state; None when there is none.

    A damaged newer one must not stop a resume from an older one; skipping it is said in
    one line naming both files. `listing` and `loader` (`load` unless given) let the sharded
    format keep the same rules.
    """
    skipped: list[CheckpointError] = []
    for path in candidates(directory, listing):
        try:
            state = (loader or load)(path)
        except CheckpointError as exc:
            skipped.append(exc)
            continue
        if skipped:
            log.warning(
                "resuming from %s, the newest good checkpoint: skipped %s", path, "; ".join(str(e) for e in skipped)
            )
        return path, state
    if skipped:
        log.warning(
            "no checkpoint in %s can be loaded, starting from step 0: %s", directory, "; ".join(str(e) for e in skipped)
        )
    return None


# --- random number generator states --------------------------------------------------------
# Stored as tensors and plain values only, so that weights_only loading accepts them.


def capture_rng() -> dict[str, Any]:
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # for type checkers: the legacy form (the default), not the dict
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [py_version, torch.tensor(py_internal, dtype=torch.int64), py_gauss],
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(v) for v in internal.tolist()), gauss))
