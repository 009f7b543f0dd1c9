"""Sharded checkpoints on torch.distributed.checkpoint (DCP): every rank writes its own shard.

A checkpoint is a directory `ckpt-STEP.dcp` beside today's single files, holding
`__R_0.distcp` (rank R's shard of the model and optimizer), `.metadata` (DCP's index: which
bytes of which file hold which slice of which tensor, written by rank 0 once every rank has
written) and `meta.pt` (step, world size, strategy, data position, every rank's random
streams, scheduler and scaler: small, plain values and tensors, loadable with weights_only).

The promises are those of `files.py`, with a directory in place of a file:

1. rank 0 creates `.ckpt-STEP.dcp.tmp` (after removing a stale one); all ranks write their
   shards into it, in parallel, each file fsynced by DCP; rank 0 writes `.metadata` (fsynced)
   only after every rank reported its shard written, and `meta.pt`;
2. rank 0 fsyncs the temporary directory, renames it to `ckpt-STEP.dcp` and fsyncs the parent:
   the name appears only for a complete checkpoint;
3. `latest` flips to it (temporary file, fsync, rename), then the oldest beyond keep-last go.

A kill -9 of any rank at any instant before 2 leaves only a temporary directory (removed by the
next run) and `latest` on the previous checkpoint. A checkpoint that is named but damaged (a
shard truncated or missing, say by a disk that lied about fsync) is found by `verify`, which
checks every byte range `.metadata` refers to, and skipped by `find_latest` with a message
naming it, as for single files.

Asynchronous by default: `ShardedWriter.submit` waits for the previous checkpoint (at most one
in flight) and copies each rank's local shards into CPU buffers kept from one checkpoint to
the next (`writer.snapshot`, DTensors keep their layout around the copy): that copy is
the whole stall. No state dict is taken for it after the first: the state dict's tensors are
the live parameters and optimizer state (views of their memory), which training updates in
place, so while they are the same objects (`state_identity`: parameters, buffers, optimizer
state entries by object; a load or a new state entry changes it) one `torch._foreach_copy_`
from the tensors of the first state dict into the kept buffers refills the copy
(`writer.copy_pairs`, `refill`); only the parameter groups (lr, ...) are taken anew. The
pairs are found with the buffers in `prepare`, so the first checkpoint refills too. One thread
per writer, started once, does the rest on every rank: rank 0's temporary directory and
`meta.pt` (pickled in `submit`, written and fsynced here), the DCP write, whose planning
collectives run on a process group of the writer's own so they never interleave with the
training's, and on rank 0 steps 2 and 3 as soon as DCP has returned. `process=True` has that
thread pass the copy to DCP's writer process.

Not `dcp.async_save` on the live state: its default stager deep-copies every DTensor into fresh
memory on each call, several times the refill of kept buffers. DCP's plan is cached
(`enable_plan_caching`): the plans are the same from one checkpoint of a run to the next, and
gathering them again each time cost up to 40% of a write (4 ranks). The figures, and how to
reproduce them: docs/measurements.md, "Sharded checkpoints: why the writer is built as it is".

Loading reshards: DCP reads, for each rank, the slices of the saved tensors that overlap the
rank's own shards, whatever world size (or strategy: DDP's whole tensors, FSDP's shards) wrote
them. Model and optimizer go through `get_state_dict`/`set_state_dict`, which name parameters
by their path in the unwrapped model, so a DDP run and an FSDP run read each other's
checkpoints.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from slurmgen import atomic

from . import files as ckpt
from .writer import OneJobInFlight, Written, copy_pairs, is_dtensor, refill, snapshot

log = logging.getLogger("slurmgen.train")

FORMAT = "dcp-1"
META = "meta.pt"
_NAME = re.compile(r"ckpt-(\d+)\.dcp")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.dcp"


def temporary_name(step: int) -> str:
    return f".{checkpoint_name(step)}.tmp"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, path) of every sharded checkpoint directory (complete by name), oldest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), d / n) for n in os.listdir(d) if (m := _NAME.fullmatch(n)) and (d / n).is_dir()]
    return sorted(found)


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> int:
    """Remove temporary directories (and files) left by killed writers; returns how many."""
    d = Path(directory)
    if not d.is_dir():
        return 0
    stale = [d / n for n in os.listdir(d) if n.startswith(".") and ".tmp" in n]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return len(stale)


def app_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state keyed by parameter path: DTensor shards under FSDP, whole
    tensors otherwise. Creates the optimizer's state (a zero step) if it has none yet, so that
    a fresh optimizer has the entries a load fills."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def state_identity(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple:
    """Which tensor objects a state dict of `model` and `optimizer` would be made of: the
    parameters, buffers and optimizer state entries, by object (no tensor is read). Training
    updates them in place, so the identity stays; a load, a new parameter group or a state
    entry created later changes it."""
    return (
        tuple(map(id, model.parameters())),
        tuple(map(id, model.buffers())),
        tuple((id(p), tuple((k, id(v)) for k, v in entries.items())) for p, entries in optimizer.state.items()),
    )


def live_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> set[int]:
    """Where the memory of the model's parameters and buffers and the optimizer's state tensors
    starts (`_storage`): a state dict's tensor outside it is not refilled by training."""
    tensors = (
        *model.parameters(),
        *model.buffers(),
        *(v for entries in optimizer.state.values() for v in entries.values()),
    )
    return {_storage(t) for t in tensors if isinstance(t, torch.Tensor)}


def param_groups(optimizer: torch.optim.Optimizer, names: list[list[str]]) -> list[dict[str, Any]]:
    """The optimizer's parameter groups as `get_state_dict` gives them (hyperparameters, the
    parameters by path), taken now: a scheduler changes lr between checkpoints."""
    groups = optimizer.state_dict()["param_groups"]
    for group, params in zip(groups, names, strict=True):
        group["params"] = list(params)
    return groups


def verify(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`meta.pt` of the checkpoint at `path` if every byte its index refers to is there; else a
    CheckpointError naming `path` and what is wrong."""
    from torch.distributed.checkpoint import FileSystemReader

    p = Path(path)
    try:
        meta = torch.load(p / META, map_location="cpu", weights_only=True)
        index = FileSystemReader(str(p)).read_metadata()
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise ckpt.CheckpointError(f"{p} is damaged or not a sharded checkpoint ({reason})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ckpt.CheckpointError(f"{p} is not a slurmgen.train sharded checkpoint (format {FORMAT})")
    needed: dict[str, int] = {}
    for item in (index.storage_data or {}).values():
        needed[item.relative_path] = max(needed.get(item.relative_path, 0), item.offset + item.length)
    for name, size in sorted(needed.items()):
        have = (p / name).stat().st_size if (p / name).is_file() else -1
        if have < size:
            what = "missing" if have < 0 else f"{have} of {size} bytes"
            raise ckpt.CheckpointError(f"{p} is damaged ({name}: {what})")
    return meta


def find_latest(directory: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete sharded checkpoint and its meta; damaged newer ones skipped with a
    warning naming them (the same rules as single files: `checkpoint.find_latest`)."""
    return ckpt.find_latest(directory, listing=list_checkpoints, loader=verify)


def prune(directory: Path, keep_last: int, protect: str) -> None:
    """Delete all but the newest `keep_last` sharded checkpoints (never `protect`)."""
    for _, path in list_checkpoints(directory)[:-keep_last]:
        if path.name != protect:
            shutil.rmtree(path, ignore_errors=True)


def _storage(t: torch.Tensor) -> int:
    """Where the memory of a tensor (a DTensor's local shard) starts: views of it share it."""
    return (t.to_local() if is_dtensor(t) else t).untyped_storage().data_ptr()


def _rank() -> int:
    return tdist.get_rank() if tdist.is_initialized() else 0


class _Passthrough:
    """DCP's stager protocol for a state that is staged already (our kept CPU copy)."""

    should_synchronize_after_execute = False
    _synchronize_after_execute = False  # what AsyncStager's protocol reads the line above from

    def stage(self, state: Any) -> Any:
        return state

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _KeptState:
    """The tensors of a state dict taken once (`sources`: the live parameters' and optimizer
    state's local shards) and their places in the kept copy (`buffers`), valid while the state
    has `identity`; `names`, each parameter group's parameters by path."""

    identity: tuple
    sources: list[torch.Tensor]
    buffers: list[torch.Tensor]
    names: list[list[str]]


class ShardedWriter(OneJobInFlight):
    """Sharded checkpoints of one run; every rank makes the same calls in the same order.

    `background=False` writes inside `submit` (all steps of the protocol before it returns).
    Otherwise `submit` only copies the rank's shards into CPU buffers it keeps from one
    checkpoint to the next (`snapshot` the first time, as the single-file writer does, then
    `refill` while the state's tensors are the same objects) and hands the rest to
    one thread per writer, started once: rank 0's temporary directory and `meta.pt`, the DCP
    write (its planning collectives on the writer's own process group) and, on rank 0, the
    rename, `latest` and pruning. `process=True` has that thread pass the copy to DCP's
    writer process (its own GIL and allocator; the copy goes over in shared memory)."""

    def __init__(self, directory: str | Path, keep_last: int, background: bool = True, process: bool = False):
        super().__init__(background, "slurmgen-sharded-checkpoint")
        self.directory, self.keep_last, self.process = Path(directory), keep_last, process
        # Collectives of a background save must not interleave with the training's: own group.
        self.group = tdist.new_group(backend="gloo") if tdist.is_initialized() else None
        self._kept: _KeptState | None = None  # how to refill the kept copy without a state dict

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Allocate the copy buffers in the background once the state has its final shapes
        (Adam's moments exist), so that the first checkpoint only copies."""
        if self.needs_buffers:
            state = app_state(model, optimizer)
            identity, live = state_identity(model, optimizer), live_memory(model, optimizer)
            self._prepare_buffers(state, lambda: self._keep(identity, live, state))

    def submit(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict[str, Any] | None
    ) -> Written | None:
        """Checkpoint `step`: `meta` (rank 0's; others pass None) beside every rank's shards.

        Returns the previous write if it had not been collected yet; writing inline, this one.
        The loop waits only for the previous write, the state dict and the copy of its shards."""
        previous = self.wait()
        blob = None
        if _rank() == 0:  # pickled now: the meta's values may change as soon as we return
            blob = io.BytesIO()
            torch.save({**(meta or {}), "format": FORMAT, "step": step}, blob)
        if not self.background:
            return self._write(step, app_state(model, optimizer), blob)
        self._stage(model, optimizer)
        self._hand_over(self._write, step, blob)
        return previous

    def _stage(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Fill the kept copy with the state of now: refill it from the tensors of the last state
        dict if they are still the live ones (`state_identity`), else take a state dict and copy
        it (`snapshot`), keeping how to refill it next time."""
        identity, kept = state_identity(model, optimizer), self._kept
        if kept is not None and kept.identity == identity:
            refill(kept.sources, kept.buffers)
            self._buffers["optimizer"]["param_groups"] = snapshot(param_groups(optimizer, kept.names))
            return
        state = app_state(model, optimizer)
        self._buffers = snapshot(state, self._buffers)
        self._keep(identity, live_memory(model, optimizer), state)

    def _keep(self, identity: tuple, live: set[int], state: dict[str, Any]) -> None:
        """Remember how to refill the kept copy from `state`'s tensors (see `_stage`), if they
        all live in `live` memory (`live_memory`: a state dict hook that computed a tensor would
        make a refill stale: then none). Reads only where `state`'s tensors are, not the model
        or the optimizer, so it may run in the writer's thread (after `prepare`)."""
        tensors = {"model": state["model"], "optimizer": state["optimizer"]["state"]}
        pairs = copy_pairs(tensors, {"model": self._buffers["model"], "optimizer": self._buffers["optimizer"]["state"]})
        names = [group["params"] for group in state["optimizer"]["param_groups"]]
        if pairs is None or any(_storage(t) not in live for t in pairs[0]):
            self._kept = None
        else:
            self._kept = _KeptState(identity, *pairs, names)

    def _write(self, step: int, state: dict[str, Any], blob: io.BytesIO | None) -> Written | None:
        """All ranks (in the writer's thread unless inline): the protocol of the module's docstring.

        Rank 0 prepares the temporary directory before it joins DCP's planning; the others
        write their files only once the plan comes back from rank 0, so after that."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        tmp = self.directory / temporary_name(step)
        if blob is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(exist_ok=True)  # another rank's DCP may have created it meanwhile
            (tmp / META).write_bytes(blob.getbuffer())
            atomic.fsync_path(tmp / META)
        # The plan (which rank writes which slices where) is the same from one checkpoint to the
        # next: DCP keeps it and the ranks send only what changed (see the module's docstring).
        planner = DefaultSavePlanner(enable_plan_caching=True)
        if self.process:
            kind = dcp.state_dict_saver.AsyncCheckpointerType.PROCESS
            saved = dcp.async_save(
                state,
                checkpoint_id=str(tmp),
                process_group=self.group,
                async_checkpointer_type=kind,
                async_stager=_Passthrough(),
                planner=planner,
                no_dist=self.group is None,
            )
            assert isinstance(saved, Future)  # not an AsyncSaveResponse: _Passthrough stages nothing later
            saved.result()
        else:
            dcp.save(
                state, checkpoint_id=str(tmp), process_group=self.group, planner=planner, no_dist=self.group is None
            )
        return self._finish(step)

    def _finish(self, step: int) -> Written | None:
        if _rank() != 0:
            return None
        ckpt.arm_fault(step)
        tmp, final = self.directory / temporary_name(step), self.directory / checkpoint_name(step)
        atomic.fsync_path(tmp)
        ckpt.fault("before-rename")
        shutil.rmtree(final, ignore_errors=True)  # a rewrite of the same step (a resumed run)
        os.replace(tmp, final)
        atomic.fsync_dir(self.directory)
        ckpt.fault("before-pointer")
        ckpt.write_durably(self.directory / ckpt.LATEST, lambda path: path.write_text(final.name + "\n"))
        ckpt.fault("before-prune")
        prune(self.directory, self.keep_last, protect=final.name)
        return Written(step, final)

    def close(self) -> None:
        """Finish the write in flight; the writer's process group goes away with the world's.
        DCP's writer process (`process=True`) is told to end: left to the rank's exit, it died on
        the closed pipe with an EOFError traceback at the end of every successful run."""
        self.wait()
        if self.process:
            _end_writer_process()


def _end_writer_process() -> None:
    """DCP keeps its writer process for the life of the rank in a module global (torch 2.13:
    `_async_process_executor._CHECKPOINT_PROCESS`), shared by every writer of the process and
    made again by the next `async_save`. Its own `__del__` sends the process TERMINATE and joins
    it (SIGTERM after 5 s); without that global (another torch) nothing is done."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    writer = getattr(executor, "_CHECKPOINT_PROCESS", None)
    if writer is not None:
        executor._CHECKPOINT_PROCESS = None
        writer.__del__()


def load_into(
    path: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer, group=None
) -> None:
    """All ranks: model and optimizer from the sharded checkpoint at `path`, resharded onto
    this world's layout (any world size, DDP or FSDP)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = app_state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path), process_group=group, no_dist=not tdist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def resume(
    directory: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer, world_size: int
) -> tuple[Path, dict[str, Any]] | None:
    """All ranks: load the newest good sharded checkpoint in `directory` into model and
    optimizer; (path, meta) or None. Rank 0 chooses, the path is broadcast; a different world
    size than the one that wrote it is resharded, with a warning."""
    found = find_latest(directory) if _rank() == 0 else None
    if tdist.is_initialized():
        box = [str(found[0]) if found else None]
        tdist.broadcast_object_list(box, src=0)
        where = box[0]
    else:
        where = str(found[0]) if found else None
    if where is None:
        return None
    return Path(where), load(where, model, optimizer, world_size)


def load(
    where: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer, world_size: int
) -> dict[str, Any]:
    """All ranks: model and optimizer from the sharded checkpoint `where`; its meta. A damaged
    one is a CheckpointError naming it; another world size is resharded, with a warning."""
    meta = verify(where)
    if meta["world_size"] != world_size and _rank() == 0:
        log.warning(
            "%s was written by %d processes, now %d: resharding it; random streams and data order "
            "differ from an uninterrupted run",
            where,
            meta["world_size"],
            world_size,
        )
    started = time.time()
    load_into(where, model, optimizer)
    log.info("loaded sharded checkpoint %s (step %d) in %.2f s", where, meta["step"], time.time() - started)
    return meta


# --- looking at a run's checkpoints from outside a run (`slurmgen ckpt`) -------------------------


def checkpoints_dir(run_dir: str | os.PathLike[str]) -> Path:
    """A run's checkpoint directory, given the run directory or the checkpoint directory."""
    p = Path(run_dir)
    return p / "checkpoints" if (p / "checkpoints").is_dir() else p


def describe(path: Path) -> dict[str, Any]:
    """What `slurmgen ckpt info` says about one checkpoint (either format): step, world size,
    format, the size of each file, and whether it is complete (else why not)."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    info: dict[str, Any] = {"name": path.name, "files": {f.name: f.stat().st_size for f in files if f.is_file()}}
    try:
        meta = verify(path) if path.is_dir() else ckpt.load(path)
    except ckpt.CheckpointError as exc:
        return {**info, "complete": False, "problem": str(exc)}
    fmt = f"sharded ({FORMAT})" if path.is_dir() else f"single file ({ckpt.FORMAT})"
    return {
        **info,
        "complete": True,
        "step": int(meta["step"]),
        "world_size": meta.get("world_size"),
        "format": fmt,
        "strategy": meta.get("strategy", "ddp"),
    }


def all_checkpoints(run_dir: str | os.PathLike[str]) -> tuple[Path, list[Path], str | None]:
    """(checkpoint directory, every checkpoint in it oldest first, what `latest` names)."""
    d = checkpoints_dir(run_dir)
    found = sorted([*ckpt.list_checkpoints(d), *list_checkpoints(d)])
    pointer = d / ckpt.LATEST
    named = pointer.read_text(encoding="utf-8", errors="replace").strip() if pointer.is_file() else None
    return d, [p for _, p in found], named


def newest_good(run_dir: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint a resume would take, of either format: the newest step that loads."""
    d = checkpoints_dir(run_dir)
    found = [f for f in (ckpt.find_latest(d), find_latest(d)) if f is not None]
    return max(found, key=lambda f: f[1]["step"]) if found else None


def full_model_state(path: Path) -> dict[str, torch.Tensor]:
    """The whole model's state dict from a checkpoint of either format, in this process only
    (no process group: DCP reads every shard's slices of every tensor)."""
    if not path.is_dir():
        return dict(ckpt.load(path)["model"])
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(path)),
        planner=_EmptyStateDictLoadPlanner(keys={"model"}),
        no_dist=True,
    )
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}
