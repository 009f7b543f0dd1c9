"""Checkpoints written in the background, so that training waits only for a copy to CPU memory.

`CheckpointWriter.submit()` first waits for the previous write (at most one is in flight, so
a slow file system slows checkpoints down, never piles them up in memory), then copies every
tensor of the state into CPU buffers (`snapshot`) and hands the copy to a thread that runs
the unchanged durable protocol of `checkpoint.save()`: temporary file, fsync, rename, fsync
of the directory, `latest` pointer, pruning. A kill -9 may therefore land in the thread at
exactly the same points as before, with the same outcome: `latest` names a complete file.

The buffers are kept and refilled in place by the next snapshot (allocating and faulting in
a fresh copy of a large state costs about as much as copying it again): the price of async
checkpoints is one extra copy of the state in rank 0's host memory.

`wait()` returns the path of the finished write, or raises what the write raised: callers
wait before the next checkpoint, before acting on preemption and at the end of training.
With `background=False` the write happens inside `submit()`, as it always did.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from . import checkpoint as ckpt


def snapshot(state: Any, into: Any = None) -> Any:
    """A copy of `state` whose tensors live in CPU memory the caller will not touch.

    Tensors are copied into the matching tensor of `into` (a previous snapshot) when shape
    and dtype agree, else into new memory. Tensors that share memory in `state` (tied
    weights) share it in the copy too, so the file stays as small as torch.save makes it.
    """
    memo: dict[tuple, torch.Tensor] = {}

    def copy(value: Any, old: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
                   tuple(value.stride()), value.dtype, value.device)
            if key in memo:
                return memo[key]
            t = value.detach()
            if isinstance(old, torch.Tensor) and old.shape == t.shape and old.dtype == t.dtype and old.device.type == "cpu":
                out = old.copy_(t)
            else:
                out = t.to("cpu", copy=True)
            memo[key] = out
            return out
        if isinstance(value, dict):
            return {k: copy(v, old.get(k) if isinstance(old, dict) else None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            olds = old if isinstance(old, (list, tuple)) and len(old) == len(value) else [None] * len(value)
            return type(value)(copy(v, o) for v, o in zip(value, olds))
        return value

    return copy(state, into)


@dataclass(frozen=True)
class Written:
    """A checkpoint that is durable on disk, and what `describe` made of it (its run record)."""

    step: int
    path: Path
    record: Any = None


class CheckpointWriter:
    """At most one checkpoint write in flight, in a background thread (or inline).

    `describe(step, path)`, if given, runs right after a write (in the writer's thread): work
    that reads the finished file, such as hashing it for the run record, stays off the loop.
    """

    def __init__(self, directory: str | Path, keep_last: int, background: bool = True,
                 describe: Callable[[int, Path], Any] | None = None):
        self.directory, self.keep_last, self.background = Path(directory), keep_last, background
        self.describe = describe
        self._thread: threading.Thread | None = None
        self._done: Written | None = None
        self._error: BaseException | None = None
        self._buffers: Any = None

    @property
    def busy(self) -> bool:
        """A write is in flight, or finished and not yet collected by `wait()`."""
        return self._thread is not None

    def finished(self) -> bool:
        """The write in flight has ended: `wait()` would return at once."""
        return self._thread is not None and not self._thread.is_alive()

    def submit(self, step: int, state: dict[str, Any]) -> Written | None:
        """Write `state` as the checkpoint of `step`, in the background unless told otherwise.

        Waits for the previous write first, and returns it if it was not collected yet;
        writing inline, returns this one."""
        previous = self.wait()
        if not self.background:
            return self._save(step, state)
        self._buffers = snapshot(state, self._buffers)
        self._thread = threading.Thread(target=self._run, args=(step, self._buffers),
                                        name=f"slurmgen-checkpoint-{step}", daemon=True)
        self._thread.start()
        return previous

    def _save(self, step: int, state: dict[str, Any]) -> Written:
        path = ckpt.save(self.directory, step, state, self.keep_last)
        return Written(step, path, self.describe(step, path) if self.describe else None)

    def _run(self, step: int, state: dict[str, Any]) -> None:
        try:
            self._done = self._save(step, state)
        except BaseException as exc:  # handed to the training thread by wait()
            self._error = exc

    def wait(self) -> Written | None:
        """Block until the write in flight is durable and return it (None if there was none);
        raises what the write raised."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        done, error, self._done, self._error = self._done, self._error, None, None
        if error is not None:
            raise error
        return done
