"""Checkpoints written in the background, so that training waits only for a copy to CPU memory.

`CheckpointWriter.submit()` first waits for the previous write (at most one is in flight, so
a slow file system slows checkpoints down, never piles them up in memory), then copies every
tensor of the state into CPU buffers (`snapshot`) and hands the copy to a thread that runs
the unchanged durable protocol of `checkpoint.save()`: temporary file, fsync, rename, fsync
of the directory, `latest` pointer, pruning. A kill -9 may therefore land in the thread at
exactly the same points as before, with the same outcome: `latest` names a complete file.

The buffers are kept and refilled in place by the next snapshot: the price of async
checkpoints is one extra copy of the state in the writing rank's host memory. Allocating and
faulting in that copy costs far more than filling it (measured here: 1.7 s for a first GB of
fresh memory, 0.2 s for memory the process had before, 0.04 s to copy into touched buffers),
so `prepare()` does it in the same background slot as the writes, as soon as the state's
shapes are known (after the first optimizer step, which creates Adam's moments), and the
first checkpoint finds them ready; it waits for the preparation only if it comes sooner.
A tensor whose shape, dtype or tying changed since gets a fresh buffer, so a prepared or
reused buffer can make a checkpoint slower, never different.

The copy runs on one intra-op thread (`one_intra_op_thread`). Copying is bound by memory
bandwidth, which a second thread barely raises (here, median after an os.sync: 100 MB 5.6 ms
with two threads, 5.9 ms with one; 1 GB 72 and 63 ms, fastest 56 and 59 ms), but every copy_
of a big tensor is an OpenMP region that ends only when all the threads of the team have done
their part. When another task holds a core (another job on the node, a daemon), the team's
second thread waits for a scheduler tick or more before it runs, and the copy waits with it:
with torch's two threads on two cores and one busy process beside, up to 20 ms per 12.5 MB
tensor (multiples of the 4 ms tick) and 94 ms (38-115) for 100 MB, against 9.7 ms (6-14) with one
thread, while no other thread of the process ran. One thread needs one free core, not all.
The price is what a parallel copy gains on a quiet node with many cores per rank (not
measured: this machine has two); CUDA states are copied by the device, not by these threads.

CUDA states are copied synchronously into pageable memory, which is correct (the copy is
ordered after the step's kernels) but slower than it could be. Not done, for want of a GPU to
test it on: pinned buffers (registered in place with cudaHostRegister; torch's caching host
allocator rounds every block up to a power of two, which could make the one extra copy
nearly two), `copy_(non_blocking=True)` for every tensor and one synchronize per device
before the copy is handed to the writer thread.

`wait()` returns the path of the finished write, or raises what the write (or the
preparation) raised: callers wait before the next checkpoint, before acting on preemption and
at the end of training. With `background=False` the write happens inside `submit()`, as it
always did, and nothing is prepared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

from . import files as ckpt


def _map_tensors(state: Any, old: Any, fill: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]) -> Any:
    """`state` with every tensor replaced by `fill(tensor, buffer)`; the buffer is the tensor at
    the same place in `old` if it can hold a copy of `tensor` (CPU, same shape and dtype, not
    already filled in this pass), else None.

    Tensors that share memory in `state` (tied weights) are filled once and share the result,
    so the file stays as small as torch.save makes it; a buffer that was shared by two places
    before and is no longer is not filled twice.
    """
    memo: dict[tuple, torch.Tensor] = {}
    filled: set[int] = set()

    def walk(value: Any, old: Any) -> Any:
        if is_dtensor(value):
            return _map_dtensor(value, old, memo, walk)
        if isinstance(value, torch.Tensor):
            key = (
                value.untyped_storage().data_ptr(),
                value.storage_offset(),
                tuple(value.shape),
                tuple(value.stride()),
                value.dtype,
                value.device,
            )
            if key in memo:
                return memo[key]
            t = value.detach()
            fits = (
                isinstance(old, torch.Tensor)
                and not is_dtensor(old)
                and old.shape == t.shape
                and old.dtype == t.dtype
                and old.device.type == "cpu"
                and _address(old) not in filled
            )
            out = memo[key] = fill(t, old if fits else None)
            filled.add(_address(out))
            return out
        if isinstance(value, dict):
            return {k: walk(v, old.get(k) if isinstance(old, dict) else None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            olds = old if isinstance(old, (list, tuple)) and len(old) == len(value) else [None] * len(value)
            return type(value)(walk(v, o) for v, o in zip(value, olds))
        return value

    return walk(state, old)


def _address(t: torch.Tensor) -> int:
    """Where a buffer's bytes start: a DTensor's local shard is a new Python object at every
    `to_local()`, so a buffer is known by its memory, not by its id (empty ones own nothing)."""
    return t.data_ptr() if t.numel() else -id(t)


def is_dtensor(value: Any) -> TypeGuard[DTensor]:
    """A DTensor (a shard of a bigger tensor, as FSDP2 holds them) without importing it when
    torch.distributed is not there."""
    return type(value).__name__ == "DTensor" and hasattr(value, "to_local")


def _map_dtensor(value: Any, old: Any, memo: dict[tuple, Any], walk: Callable[[Any, Any], Any]) -> Any:
    """A DTensor with the same layout (mesh, placements, global shape and stride) whose local
    shard is `walk(local shard)`: the local shard is filled like any tensor, and `old`'s
    wrapper is reused when its local shard was the buffer, so a kept snapshot is not wrapped anew."""
    key = ("dtensor", id(value))  # the same DTensor twice (tied weights) gives one result
    if key in memo:
        return memo[key]
    same = (
        is_dtensor(old)
        and old.device_mesh == value.device_mesh
        and old.placements == value.placements
        and old.shape == value.shape
        and old.stride() == value.stride()
    )
    old_local = old.to_local() if same else None
    local = walk(value.to_local(), old_local)
    if old_local is not None and local.data_ptr() == old_local.data_ptr() and local.shape == old_local.shape:
        out = old
    else:
        from torch.distributed.tensor import DTensor

        out = DTensor.from_local(
            local, value.device_mesh, value.placements, run_check=False, shape=value.shape, stride=value.stride()
        )
    memo[key] = out
    return out


@contextmanager
def one_intra_op_thread() -> Iterator[None]:
    """torch's intra-op thread count is 1 inside, and what it was after (also on error).

    The count is process-wide: meant for the training thread while the writer is idle, when
    no other thread of the process runs torch operators (any that did would only be slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def snapshot(state: Any, into: Any = None) -> Any:
    """A copy of `state` whose tensors live in CPU memory the caller will not touch.

    Tensors are copied into the matching tensor of `into` (a previous snapshot, or
    `buffers_for(state)`) when it fits, else into new memory, on one intra-op thread (see
    the module's docstring: a copy that needs all cores at once waits for a busy one)."""

    def copy(t: torch.Tensor, buffer: torch.Tensor | None) -> torch.Tensor:
        return (buffer if buffer is not None else torch.empty_like(t, device="cpu")).copy_(t)

    with one_intra_op_thread():
        return _map_tensors(state, into, copy)


def copy_pairs(state: Any, staged: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """(sources, buffers): every tensor of `state` (a DTensor's local shard) and the buffer of
    `staged = snapshot(state, ...)` its copy went into, each buffer once (tied weights share
    one), empty ones left out; None if `state` holds anything but tensors in its containers.

    While `state`'s tensors are the live ones, updated in place (parameters and optimizer state
    are), `refill(sources, buffers)` leaves `staged` as a new snapshot would, in one call."""
    sources: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    seen: set[int] = set()

    def walk(value: Any, kept: Any) -> bool:
        if is_dtensor(value):
            return walk(value.to_local(), kept.to_local()) if is_dtensor(kept) else False
        if isinstance(value, torch.Tensor):
            if not isinstance(kept, torch.Tensor) or kept.shape != value.shape:
                return False
            if kept.numel() and kept.data_ptr() not in seen:
                seen.add(kept.data_ptr())
                sources.append(value.detach())
                buffers.append(kept)
            return True
        if isinstance(value, dict) and isinstance(kept, dict) and value.keys() == kept.keys():
            return all(walk(v, kept[k]) for k, v in value.items())
        if isinstance(value, (list, tuple)) and isinstance(kept, (list, tuple)) and len(value) == len(kept):
            return all(walk(v, k) for v, k in zip(value, kept))
        return False

    return (sources, buffers) if walk(state, staged) else None


def refill(sources: list[torch.Tensor], buffers: list[torch.Tensor]) -> None:
    """Copy every source into its buffer with one operator call, on one intra-op thread (see
    `snapshot`): the per-tensor Python of a walk over the state is gone from the loop."""
    with one_intra_op_thread():
        torch._foreach_copy_(buffers, sources)


def buffers_for(state: Any) -> Any:
    """Zero-filled CPU tensors in the layout `snapshot(state)` would produce, every page
    written once: `snapshot(state, into=buffers_for(state))` then only copies."""
    return _map_tensors(state, None, lambda t, _: torch.zeros_like(t, device="cpu"))


@dataclass(frozen=True)
class Written:
    """A checkpoint that is durable on disk, and what `describe` made of it (its run record)."""

    step: int
    path: Path
    record: Any = None


class OneJobInFlight:
    """What both checkpoint writers share (this module's and the sharded one): at most one job
    in flight in a background thread, a checkpoint write or the preparation of the copy
    buffers before the first one, and the CPU copy kept from one checkpoint to the next.

    The thread is started once, by the first job, and waits for the next one: handing it a
    job costs the loop a queue put (0.02-0.07 ms), where starting a thread per checkpoint cost
    it up to a scheduler tick on a busy machine (Thread.start waits until the new thread has
    run: median 0.1-3 ms, up to 7 ms, measured here). It is joined at interpreter exit, so a
    write in flight then is finished, not cut off.
    """

    def __init__(self, background: bool, thread_name: str):
        self.background = background
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._job: Future | None = None  # the write in flight, or the buffers being prepared
        self._buffers: Any = None  # the kept CPU copy of the state

    @property
    def busy(self) -> bool:
        """A job is in flight, or finished and not yet collected by `wait()`."""
        return self._job is not None

    @property
    def needs_buffers(self) -> bool:
        """Writing in the background, without copy buffers yet, and none being prepared."""
        return self.background and self._buffers is None and self._job is None

    def finished(self) -> bool:
        """The job in flight has ended: `wait()` would return at once."""
        return self._job is not None and self._job.done()

    def _prepare_buffers(self, state: dict[str, Any], then: Callable[[], None] | None = None) -> None:
        """Allocate and fault in the copy buffers for a state shaped like `state`, in the
        background, so that the first write only copies, then run `then` there. Only the
        tensors' shapes, dtypes and tying are read, so the caller may go on changing their values."""
        self._job = self._pool.submit(self._fill_buffers, state, then)

    def _fill_buffers(self, state: dict[str, Any], then: Callable[[], None] | None) -> None:
        self._buffers = buffers_for(state)
        if then is not None:
            then()

    def _in_background(
        self, write: Callable[..., Written | None], step: int, state: dict[str, Any], *args: Any
    ) -> None:
        """Copy `state` into the kept buffers (the loop waits for this only) and hand
        `write(step, copy, *args)` to the thread."""
        self._buffers = snapshot(state, self._buffers)
        self._hand_over(write, step, *args)

    def _hand_over(self, write: Callable[..., Written | None], step: int, *args: Any) -> None:
        """Hand `write(step, kept copy, *args)` to the thread: the copy is complete."""
        self._job = self._pool.submit(write, step, self._buffers, *args)

    def wait(self) -> Written | None:
        """Block until the job in flight has ended; return the write it made durable (None if
        there was none, or it was a preparation, or not rank 0's); raise what the job raised."""
        if self._job is None:
            return None
        job, self._job = self._job, None
        return job.result()


class CheckpointWriter(OneJobInFlight):
    """Single-file checkpoints (rank 0's), written in the background (or every write inline).

    `describe(step, path)`, if given, runs right after a write (in the writer's thread): work
    that reads the finished file, such as hashing it for the run record, stays off the loop.
    """

    def __init__(
        self,
        directory: str | Path,
        keep_last: int,
        background: bool = True,
        describe: Callable[[int, Path], Any] | None = None,
    ):
        super().__init__(background, "slurmgen-checkpoint")
        self.directory, self.keep_last = Path(directory), keep_last
        self.describe = describe

    def prepare(self, state: dict[str, Any]) -> None:
        """The copy buffers for a state shaped like `state`, prepared in the background so
        that the first `submit()` only copies. Does nothing unless `needs_buffers`."""
        if self.needs_buffers:
            self._prepare_buffers(state)

    def submit(self, step: int, state: dict[str, Any]) -> Written | None:
        """Write `state` as the checkpoint of `step`, in the background unless told otherwise.

        Waits for the previous job first, and returns the previous write if it was not
        collected yet; writing inline, returns this one."""
        previous = self.wait()
        if not self.background:
            return self._save(step, state)
        self._in_background(self._save, step, state)
        return previous

    def _save(self, step: int, state: dict[str, Any]) -> Written:
        path = ckpt.save(self.directory, step, state, self.keep_last)
        return Written(step, path, self.describe(step, path) if self.describe else None)
