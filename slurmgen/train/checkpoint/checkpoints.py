"""A run's checkpoints as one object: what a checkpoint holds, resuming from the latest, saving
at a step boundary, keeping the last K, with the asynchronous writer behind it.

The training loop calls it at fixed points and knows nothing else about checkpoints:
`resume()` before the first step, `prepare()` and `poll()` after every step, `save()` at a
checkpoint step, `settle()` before the run reports anything, `settle_after_failure()` when it
fails. The files (atomic writes, the `latest` pointer, pruning, loading) are `files.py`;
the background thread is `writer.py`; which file a run resumes from, and how every rank
gets it, is `resume.py`. A sharded strategy (FSDP2) changes what `state()` gathers and how
`resume()` puts it back, here, and nothing in the loop.

Every rank calls every method (some collectives are inside), in the same order; only rank 0
touches the writer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from torch import nn

from slurmgen.contract.hangs import CHECKPOINTING
from slurmgen.contract.states import HEARTBEAT_WORD, State

from .. import dist, fsdp
from ..config import ConfigError, TrainConfig
from ..data import ShardedBatches
from ..env import DistEnv
from ..logs import Heartbeat
from ..track import Tracking
from . import files as ckpt
from . import resume, sharded
from .writer import CheckpointWriter, Written

log = logging.getLogger("slurmgen.train")


class Resumed(NamedTuple):
    """Where a resumed run continues: the checkpoint, its step, the run record it continues, and
    the batch it was trained with as (processes, per-process batch, accumulation), or None."""

    path: str
    step: int
    tracking: Any
    batch: tuple[int, int, int] | None = None


def _batch(state: dict[str, Any]) -> tuple[int, int, int] | None:
    """The batch a checkpoint was trained with, from its world size and config (None if older)."""
    config = state.get("config") or {}
    try:
        return int(state["world_size"]), int(config["batch_size"]), int(config["grad_accum"])
    except (KeyError, TypeError, ValueError):
        return None


class Checkpointing:
    """The checkpoints of one run in `<out_dir>/checkpoints`, for every rank of it.

    `tracking` returns the run record of the moment: it is opened only after `resume()` has
    said which run this one continues, and every durable checkpoint enters it."""

    def __init__(
        self,
        config: TrainConfig,
        env: DistEnv,
        heartbeat: Heartbeat,
        batches: ShardedBatches,
        model: nn.Module,
        optimizer: Any,
        scheduler: Any,
        scaler: Any,
        tracking: Callable[[], Tracking],
    ):
        self.cfg, self.env, self.heartbeat, self.batches, self.tracking = config, env, heartbeat, batches, tracking
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.directory = Path(config.out_dir) / "checkpoints"
        self.writer = CheckpointWriter(
            self.directory,
            config.keep_last,
            background=config.checkpoint_async,
            describe=lambda step, path: self.tracking().artifact(str(path), step),
        )
        # --strategy fsdp: every rank writes its shard (sharded.py); its own process group, so
        # made on every rank here. Resuming reads either format under either strategy.
        self.sharded = (
            sharded.ShardedWriter(
                self.directory,
                config.keep_last,
                background=config.checkpoint_async,
                process=config.checkpoint_writer == "process",
            )
            if config.strategy == "fsdp"
            else None
        )
        self.last: str | None = None  # the last checkpoint written (durable) or resumed from

    def remove_stale(self) -> None:
        """Rank 0, before anything: temporary files of a write that was killed go."""
        removed = sharded.remove_stale_temporaries(self.directory)  # files and sharded directories
        if removed:
            log.warning("removed %d temporary file(s) left by an interrupted checkpoint write", removed)

    def resume(self) -> Resumed | None:
        """All ranks: put the state of the checkpoint --resume names back, None to start afresh."""
        chosen = self._sharded_choice()
        if chosen is not None:
            return self._resume_sharded(chosen)
        found = resume.load(self.cfg.resume, self.directory, self.env)
        if found is None:
            return None
        where, state = found
        try:
            if fsdp.is_sharded(self.model):
                fsdp.load_full_state(self.model, self.optimizer, state["model"], state["optimizer"])
            else:
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
        except RuntimeError as exc:
            raise ConfigError([f"checkpoint {where} does not fit this model: {str(exc).splitlines()[0]}"]) from None
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.last = where
        rngs = state["rng"]
        if len(rngs) == self.env.world_size:
            ckpt.restore_rng(rngs[self.env.rank])
        else:
            log.warning(
                "checkpoint from %d processes, now %d: random streams and data order differ from an uninterrupted run",
                len(rngs),
                self.env.world_size,
            )
        return Resumed(where, int(state["step"]), state.get("tracking"), _batch(state))

    def _sharded_choice(self) -> str | None:
        """All ranks: the sharded checkpoint to resume from (rank 0 chooses), None if the
        choice is a single file or nothing. `auto` takes the newer of the two formats."""
        where = None
        if self.env.is_main and self.cfg.resume != "never":
            target = Path(self.cfg.resume) if self.cfg.resume != "auto" else self.directory
            if (target / ".metadata").is_file():
                where = str(target)
            elif self.cfg.resume == "auto" or target.is_dir():
                found = sharded.find_latest(target)
                files = ckpt.list_checkpoints(target)
                if found is not None and (not files or files[-1][0] <= found[1]["step"]):
                    where = str(found[0])
        return dist.broadcast_from_main(where) if self.env.distributed else where

    def _resume_sharded(self, where: str) -> Resumed:
        """All ranks: model and optimizer resharded from `where`, the rest from its meta."""
        meta = sharded.load(where, self.model, self.optimizer, self.env.world_size)
        self.scheduler.load_state_dict(meta["scheduler"])
        self.scaler.load_state_dict(meta["scaler"])
        self.last = where
        if meta["world_size"] == self.env.world_size:
            ckpt.restore_rng(meta["rng"][self.env.rank])
        return Resumed(where, int(meta["step"]), meta.get("tracking"), _batch(meta))

    def state(self, step: int, rngs: list[Any]) -> dict[str, Any]:
        """What the checkpoint of `step` holds; its tensors are the live ones (the writer copies them)."""
        epoch, in_epoch = self.batches.position(step)
        return {
            "format": ckpt.FORMAT,
            "step": step,
            "epoch": epoch,
            "data_position": {
                "epoch": epoch,
                "step_in_epoch": in_epoch,
                "steps_per_epoch": self.batches.steps_per_epoch,
            },
            "world_size": self.env.world_size,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "rng": rngs,
            "config": self.cfg.to_dict(),
            "time": time.time(),
            "tracking": self.tracking().state(),
        }

    def save(self, step: int) -> None:
        """All ranks call this: their RNG states go to rank 0, which hands the state to the
        writer (a copy to CPU memory, the write in the background), then all continue.

        The heartbeat says "checkpointing" meanwhile: the others wait at the barrier for as
        long as rank 0 waits for the previous write and copies the state, which a heartbeat
        watcher must not take for a hang unless it lasts far longer than this run's earlier
        stalls (contract/hangs.py)."""
        self.heartbeat.beat(step, status=CHECKPOINTING, force=True)
        rngs = dist.gather_to_main(ckpt.capture_rng(), self.env.rank)  # None except on rank 0
        if self.sharded is not None:  # every rank writes its shard; the rest of the state is rank 0's
            meta = self.meta(step, rngs) if self.env.is_main and rngs is not None else None
            self._record(self.sharded.submit(step, self.model, self.optimizer, meta))
        elif self.env.is_main:
            assert rngs is not None  # for type checkers: rank 0 gathered them
            state = self.state(step, rngs)
            self._record(self.writer.wait())
            self._record(self.writer.submit(step, state))
        dist.barrier()
        self.heartbeat.beat(step, status=HEARTBEAT_WORD[State.RUNNING], force=True)

    def meta(self, step: int, rngs: list[Any]) -> dict[str, Any]:
        """What a sharded checkpoint holds beside the shards: the state without model and optimizer."""
        state = self.state(step, rngs)
        del state["model"], state["optimizer"]
        return {**state, "format": sharded.FORMAT, "strategy": self.cfg.strategy}

    @property
    def _writer(self) -> Any:
        return self.sharded if self.sharded is not None else self.writer

    def prepare(self, step: int) -> None:
        """The writer allocates its copy buffers in the background (rank 0's, or under fsdp
        every rank's for its shards) as soon as the state has its final shapes: Adam's moments
        exist once the optimizer has stepped (a float16 scaler may skip the first steps). The
        first checkpoint then only copies."""
        if not self.optimizer.state:
            return
        if self.sharded is not None:  # every rank copies its own shards
            if self.sharded.needs_buffers:
                self.sharded.prepare(self.model, self.optimizer)
        elif self.env.is_main and self.writer.needs_buffers:
            self.writer.prepare(self.state(step, []))

    def poll(self) -> None:
        """A background write that has become durable (or buffers that are ready) is recorded now."""
        if self._writer.finished():
            self._record(self._writer.wait())

    def settle(self, step: int) -> None:
        """Wait for the write in flight (rank 0), saying "checkpointing" meanwhile: a checkpoint
        is durable before anything reports success, stops or requeues. Not `bounded`: a whole
        write takes as long as the disk needs, which the stalls learned so far do not bound."""
        if self._writer.busy:
            self.heartbeat.beat(step, status=CHECKPOINTING, force=True, bounded=False)
            self._record(self._writer.wait())

    def close(self) -> None:
        """After `settle`: the writers end (a process writer's DCP process with them)."""
        if self.sharded is not None:
            self.sharded.close()

    def settle_after_failure(self) -> None:
        """A failing run still lets the write in flight finish: it may be the newest good state."""
        try:
            self._record(self._writer.wait())
        except BaseException as exc:
            log.error("the checkpoint write in flight failed too: %s", exc)

    def _record(self, written: Written | None) -> None:
        """A checkpoint is durable: it becomes the run's last checkpoint and enters the run record."""
        if written is not None:
            self.last = str(written.path)
            self.tracking().mark(written.record)
