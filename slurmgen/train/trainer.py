"""The DDP training loop: one optimizer step at a time, everything else at step boundaries.

Order inside a step (why): micro-batches with gradient sync only on the last one (`no_sync`
saves grad_accum - 1 all-reduces per step); unscale, clip, step, update the scaler; then the
step counter moves and the boundary work happens in a fixed order on every rank, so every rank
takes part in the same collectives in the same order: preemption vote, logging, evaluation,
checkpoint. A checkpoint at step s holds the state *after* s steps, and the batch of a step is
a pure function of the step, so a resumed run continues exactly where the saved one was.

`fit()` is that loop and nothing else, readable in one screen as nanoGPT's train.py is: what
happens before the first step (`_begin`), a logging line (`_log_train`, `_log_eval`) and each
way out (`_done`, `_preempted`, `_failed`) are named methods, and everything about
checkpoints is one `Checkpointing` object (checkpoint/checkpoints.py) that the loop calls at its
step boundaries.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from slurmgen.contract import envvars, hangs
from slurmgen.contract import warm as protocol
from slurmgen.contract.states import HEARTBEAT_WORD, State
from slurmgen.observe import stragglers

from . import dist, fsdp, warm
from .checkpoint import files as ckpt
from .checkpoint.checkpoints import Checkpointing
from .config import DEFAULT_MAX_STEPS, EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED, TrainConfig, refit, refit_line
from .data import ShardedBatches, eval_indices, fetch
from .env import DistEnv
from .logs import Heartbeat, Metrics, Progress
from .optim import build_optimizer, build_scheduler
from .preempt import STOP, PreemptFlag, after_preemption
from .track import Tracking

log = logging.getLogger("slurmgen.train")
AUTOCAST = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class TrainResult:
    exit_code: int  # EXIT_OK, or EXIT_PREEMPTED after a signal
    step: int
    train_loss: float | None
    val_loss: float | None
    checkpoint: str | None  # the last checkpoint written or resumed from
    run_dir: str | None = None  # the run record (slurmgen.tracking) of this process, if any


def _move(batch: Any, device: str) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_move(b, device) for b in batch)
    return batch


def _items(inputs: Any) -> int:
    """Tokens in a batch of token ids, else samples: the unit of the throughput metric."""
    if isinstance(inputs, torch.Tensor) and inputs.dim() == 2 and not inputs.is_floating_point():
        return inputs.numel()
    return len(inputs) if hasattr(inputs, "__len__") else 1


def slow_for(rank: int, environ: Any) -> float:
    """Test hook SLURMGEN_TRAIN_SLOW=RANK:SECONDS: that rank sleeps in each step (a straggler)."""
    who, _, seconds = environ.get(envvars.TRAIN_SLOW, "").partition(":")
    return float(seconds) if who.strip() == str(rank) and seconds else 0.0


class Trainer:
    """Train `model` on `train_dataset` in the process group described by `env`."""

    train_loss: float | None  # the mean over all ranks of the last window (None before the first)
    val_loss: float | None

    def __init__(
        self,
        model: nn.Module,
        train_dataset: Any,
        env: DistEnv,
        config: TrainConfig,
        eval_dataset: Any = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        shard_units: fsdp.Units = None,
    ):
        self.cfg, self.env, self.loss_fn = config, env, loss_fn
        self.model = model.to(env.device)
        # FSDP2 before the optimizer exists: sharding replaces the parameters by DTensor ones.
        self.sharded = config.strategy == "fsdp" and env.distributed
        if self.sharded:
            fsdp.shard(self.model, config.dtype, shard_units)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.out = Path(config.out_dir)
        self.device_type = "cuda" if env.device.startswith("cuda") else "cpu"
        self.batches = ShardedBatches(
            train_dataset, env.world_size, env.rank, config.batch_size, config.grad_accum, config.seed
        )
        self.max_steps = config.max_steps or (
            config.epochs * self.batches.steps_per_epoch if config.epochs else DEFAULT_MAX_STEPS
        )
        self.optimizer = build_optimizer(self.model, config.lr, config.weight_decay, (config.beta1, config.beta2))
        self.scheduler = build_scheduler(
            self.optimizer, config.lr, config.effective_min_lr, config.warmup_steps, self.max_steps
        )
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=config.dtype == "float16")
        self.metrics = Metrics(self.out, enabled=env.is_main)
        self.spells = stragglers.Spells()  # the straggler rule of the page, over the log's windows
        self.heartbeat = Heartbeat(self.out, env.rank, config.heartbeat_every, env.local_rank, env.node_rank)
        self.tracking = Tracking()  # inert until fit() knows which run this one is (after a resume)
        self.checkpoints = Checkpointing(
            config,
            env,
            self.heartbeat,
            self.batches,
            self.model,
            self.optimizer,
            self.scheduler,
            self.scaler,
            tracking=lambda: self.tracking,
        )
        self.step, self.train_loss, self.val_loss, self._start = 0, None, None, time.time()
        self.work, self.slow = 0.0, slow_for(env.rank, os.environ)
        # Warm restarts (train/warm.py): the world this process is in, and when it began waiting
        # to step again (a process started in place of a failed rank: its start).
        self.generation = warm.generation()
        self.again: tuple[float, str] | None = (time.time(), "start") if self.generation else None
        self._rng_seed()

    def _rng_seed(self) -> None:
        # Per-rank streams (different dropout masks per rank); a resume replaces them.
        seed = self.cfg.seed + 1000 * self.env.rank
        torch.manual_seed(seed)
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed % 2**32)

    # --- one step and evaluation ------------------------------------------------------------
    def _loss(self, module: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch[0], batch[1]
        if self.loss_fn is None:
            return module(inputs, targets)
        return self.loss_fn(module(inputs), targets)

    def _autocast(self):
        dtype = AUTOCAST.get(self.cfg.dtype)
        return torch.autocast(self.device_type, dtype=dtype) if dtype else contextlib.nullcontext()

    @staticmethod
    def _no_sync(ddp: nn.Module, sync: bool):
        """No gradient all-reduce (DDP) or reduce-scatter (FSDP) unless `sync`: the micro-steps
        before the last of an accumulation only add up local gradients."""
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext() if sync else ddp.no_sync()
        return fsdp.no_sync(ddp, sync)

    def train_step(self, ddp: nn.Module) -> tuple[torch.Tensor, int]:
        """One optimizer step; returns (this rank's loss as a tensor, items processed).

        The loss stays a tensor (no .item()) so that a GPU is never forced to synchronise
        here; it becomes a number only at logging steps."""
        accum, total, items = self.cfg.grad_accum, torch.zeros((), device=self.env.device), 0
        began = time.perf_counter()
        if self.slow:
            time.sleep(self.slow)
        for micro in range(accum):
            batch = _move(self.batches.batch(self.step, micro), self.env.device)
            sync = micro == accum - 1
            with self._no_sync(ddp, sync=sync):
                with self._autocast():
                    loss = self._loss(ddp, batch) / accum
                if sync:  # the rank's own work ends where it may wait for its peers (the all-reduce)
                    self.work = time.perf_counter() - began
                self.scaler.scale(loss).backward()
            total += loss.detach().float()
            items += _items(batch[0])
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            fsdp.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)  # plain or sharded gradients
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return total, items

    def _settle_buckets(self, ddp: nn.Module) -> None:
        """A throwaway backward through DDP (the loss times 0) before the first step of a resumed
        run, so that this step runs on the gradient buckets the uninterrupted run had there.

        Why: DDP first puts all gradients in one bucket in parameter order and, after its first
        backward, lays them out again in the order they became ready, for good. The allreduce
        adds the ranks' values up in an order that depends on where an element sits in its
        bucket (which chunk of the ring it falls in), so from three ranks on a step on the first
        layout can differ in the last bit from the same step on the second (two ranks sum a+b,
        which has no order). Only the layout may change here: the random streams, buffers (batch
        norm statistics) and gradients are put back; the data position does not move."""
        rng, buffers = ckpt.capture_rng(), [b.detach().clone() for b in self.model.buffers()]
        batch = _move(self.batches.batch(self.step, 0), self.env.device)
        with self._autocast():
            loss = self._loss(ddp, batch)
        (loss * 0).backward()
        self.model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for buffer, saved in zip(self.model.buffers(), buffers):
                buffer.copy_(saved)
        ckpt.restore_rng(rng)

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean loss over --eval-iters batches per rank, averaged over all ranks."""
        if self.eval_dataset is None or len(self.eval_dataset) == 0:
            return None
        self.heartbeat.beat(self.step, status=hangs.EVALUATING, force=True)
        self.model.eval()
        total = 0.0
        for i in range(self.cfg.eval_iters):
            idx = eval_indices(len(self.eval_dataset), self.env.world_size, self.env.rank, self.cfg.batch_size, i)
            batch = _move(fetch(self.eval_dataset, idx), self.env.device)
            with self._autocast():
                total += self._loss(self.model, batch).item()
        self.model.train()
        s, n = dist.all_reduce([total, float(self.cfg.eval_iters)])
        self.heartbeat.beat(self.step, status=HEARTBEAT_WORD[State.RUNNING], force=True)
        return s / n

    # --- the run ----------------------------------------------------------------------------
    def fit(self) -> TrainResult:
        """Resume, train to --max-steps one optimizer step at a time, and stop: done, preempted
        (a checkpoint is written, exit 75) or failed (re-raised after the write in flight ends)."""
        cfg = self.cfg
        ddp = self._begin()
        flag, vote = PreemptFlag(cfg.preempt_signal).install(), dist.Vote()
        progress = Progress(cfg.progress, self.env.is_main, self.max_steps, self.step)
        window, preempted = _Window(self.env.device), 0
        self.heartbeat.beat(self.step, force=True)
        try:
            while self.step < self.max_steps:
                try:
                    window.add(*self.train_step(ddp), work=self.work)
                    self._stepping_again()
                    self.checkpoints.prepare(self.step)
                    self.heartbeat.beat(self.step, work=self.work)
                    progress.update(self.step)
                    self.checkpoints.poll()
                    # Every rank votes every step (the result arrives one step later): a signal that
                    # reached any rank stops all of them at the same step.
                    preempted = vote.cast(flag.level)  # 0, or preempt.REQUEUE / STOP
                    last = self.step == self.max_steps or preempted
                    if self.step % cfg.log_every == 0 or last:
                        self._log_train(window, progress)
                    if (cfg.eval_every and self.step % cfg.eval_every == 0) or (last and not preempted):
                        self._log_eval(progress)
                    if last or (cfg.save_every and self.step % cfg.save_every == 0):
                        self.checkpoints.save(self.step)
                except Exception as exc:
                    if self.sharded or not warm.peer_failed(exc):
                        raise
                    self._drop_world(exc, ddp)
                    del ddp, vote  # their hold on the old process group goes, so its sockets close
                    ddp, vote = self._rejoin(exc, flag), dist.Vote()
                    window.reset()
                    continue
                if preempted:
                    break
            vote.settle()  # the last vote is still in flight: finish it before other collectives
            self.checkpoints.settle(self.step)  # durable before anything reports success, stops or requeues
            self.checkpoints.close()
        except warm.Stopped as stop:
            return self._stopped_waiting(stop, flag)
        except BaseException:
            self._failed()
            raise
        finally:
            progress.close()
            if not preempted:
                # A preempted run keeps its handlers: Slurm signals node after node, and the
                # warning may reach a rank only after the vote stopped it (default action: die).
                flag.restore()
        return self._preempted(preempted, flag) if preempted else self._done()

    def _begin(self) -> nn.Module:
        """Everything before the first step: the run directory, the resume (and the batch of a
        checkpoint from a world of another size), the run record, DDP."""
        env = self.env
        if env.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.checkpoints.remove_stale()
        resumed, refitted = self.checkpoints.resume(), None
        if resumed is not None:
            self.step = resumed.step
            self.metrics.drop_after(self.step)
            log.info("resumed from %s at step %d", resumed.path, self.step)
            refitted = self._refit(resumed.batch) if resumed.batch else None
        cfg = self.cfg
        self.tracking = Tracking.open(cfg, env, resumed.tracking if resumed else None, self.step)
        if refitted is not None:
            self.tracking.note("batch", refitted)
        ddp = self._wrap()
        first_items = _items(self.batches.batch(0, 0)[0])
        log.info(
            "global batch: %d samples (%d per process x %d accumulation x %d processes), %d items per step; "
            "%d steps, %d per epoch",
            cfg.batch_size * cfg.grad_accum * env.world_size,
            cfg.batch_size,
            cfg.grad_accum,
            env.world_size,
            first_items * cfg.grad_accum * env.world_size,
            self.max_steps,
            self.batches.steps_per_epoch,
        )
        self._start = time.time()
        return ddp

    def _refit(self, before: tuple[int, int, int]) -> dict[str, Any] | None:
        """A checkpoint trained on a world of another size (a smaller world after a lost node,
        `--min-nodes`, or more nodes after a requeue): the accumulation that keeps its global
        batch where it divides, else the per-process batch as it is (config.refit), said in one
        log line. Returns what the run record keeps of it; None when the world is the checkpoint's."""
        cfg, world = self.cfg, self.env.world_size
        if before[0] == world:
            return None
        accum, kept = refit(before[0] * before[1] * before[2], cfg.batch_size, world, cfg.grad_accum)
        line = refit_line(before, (world, cfg.batch_size, accum))
        (log.info if kept else log.warning)("%s", line)
        if accum != cfg.grad_accum:
            self.cfg = replace(cfg, grad_accum=accum)
            self.batches = ShardedBatches(self.train_dataset, world, self.env.rank, cfg.batch_size, accum, cfg.seed)
            self.checkpoints.cfg, self.checkpoints.batches = self.cfg, self.batches
        return {
            "world_size": world,
            "batch_size": cfg.batch_size,
            "grad_accum": accum,
            "global_batch": world * cfg.batch_size * accum,
            "kept": kept,
            "before": dict(zip(("world_size", "batch_size", "grad_accum"), before)),
            "note": line,
        }

    def _wrap(self) -> nn.Module:
        """The model as the loop steps it: in DDP when distributed (FSDP shards in place), its
        gradient buckets settled as an uninterrupted run's after a resume."""
        env, ddp = self.env, self.model
        if env.distributed and not self.sharded:
            ids = [env.local_rank] if env.device.startswith("cuda") else None
            ddp = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.model.train()
        if env.distributed and not self.sharded and 0 < self.step < self.max_steps:
            self._settle_buckets(ddp)
        return ddp

    @staticmethod
    def _drop_world(exc: Exception, ddp: nn.Module) -> None:
        """Let go of the old world: the model's gradient hooks must not fire in the new one, and
        the failure's traceback must not keep the old process group alive. Its sockets close only
        with the last reference, and a healthy peer blocked in a collective with this rank learns
        of the failure only then: each rank that leaves wakes the next."""
        if isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            ddp._remove_autograd_hooks()
        traceback.clear_frames(exc.__traceback__)

    def _rejoin(self, exc: Exception, flag: PreemptFlag) -> nn.Module:
        """A peer failed and the launcher offers warm restarts (train/warm.py): leave the broken
        process group, wait for the new world, join it, reload the latest checkpoint and wrap the
        model anew, in this process. Without a word in time or a checkpoint the run fails as before.
        A stop signal during the wait (`flag`, the step loop's own) ends it: warm.Stopped."""
        seen = time.time()
        log.warning("a peer failed (%s): %s", str(exc).splitlines()[0][:200], protocol.WAITING)
        dist.leave()
        gc.collect()  # the old process group's last references (DDP's reducer, a vote in flight)
        self.checkpoints.settle_after_failure()  # the write in flight may be the newest good state
        # Beats while it waits say "starting" (the new world's rendezvous is not done): fresh, so
        # no watcher judges the wait a hang, and the wait is no step time the hang timeout learns.
        waiting = HEARTBEAT_WORD[State.STARTING]
        try:
            world = warm.wait_world(
                self.generation,
                beat=lambda: self.heartbeat.beat(self.step, status=waiting),
                stopped=lambda: flag.signum if flag.level else None,
            )
        except warm.NoNewWorld as late:
            raise RuntimeError(f"{exc} (warm restart: {late})") from None
        self.generation = world.generation
        self.env = self.checkpoints.env = replace(
            self.env, master_addr=world.master_addr, master_port=world.master_port
        )
        dist.init(self.env, self.cfg.init_timeout)
        resumed = self.checkpoints.resume()
        if resumed is None:
            raise RuntimeError(f"{exc} (warm restart: no checkpoint to go on from)") from None
        Tracking.meet(self.cfg, self.env)  # the fresh process opens its run record here (`_begin`)
        self.step, self.again = resumed.step, (seen, "failure")
        self.heartbeat.rejoined(world.generation, self.step)
        self.metrics.drop_after(self.step)
        log.warning(
            "warm restart: joined generation %d, resumed from %s at step %d", world.generation, resumed.path, self.step
        )
        return self._wrap()

    def _stepping_again(self) -> None:
        """The first step after a warm restart (or of a process started for one): said once, with
        the wall clock, so the time from a fault to stepping again can be read off the log."""
        if self.again is not None:
            now, (since, what) = time.time(), self.again
            log.warning(
                "warm restart: generation %d stepping again at step %d, %.2f s after the %s (at %.3f)",
                self.generation,
                self.step,
                now - since,
                what,
                now,
            )
            self.again = None

    def _log_train(self, window: _Window, progress: Progress) -> None:
        """The mean training loss since the last line, over all ranks (the one GPU sync of a
        logging step): a metrics record, the run record and the progress display."""
        # Each rank's work per step at its own index (the others add 0): the same collective
        # tells every rank who the straggler of this window is.
        work = [0.0] * self.env.world_size
        work[self.env.rank] = window.work / max(window.steps, 1)
        s, n, it, *work = dist.all_reduce([window.loss.item(), float(window.steps), float(window.items), *work])
        straggler = self.spells.update(work, window.steps)
        now = time.time()
        self.train_loss = s / n
        lr = self.scheduler.get_last_lr()[0]
        rate = it / max(now - window.start, 1e-9)
        epoch = self.batches.position(self.step - 1)[0]
        self.metrics.write(
            step=self.step,
            epoch=epoch,
            split="train",
            loss=self.train_loss,
            lr=lr,
            tokens_per_sec=rate,
            wall_time=now - self._start,
            time=now,
            **({"straggler": straggler} if straggler else {}),
        )
        self.tracking.log("train", self.step, epoch, loss=self.train_loss, lr=lr, tokens_per_sec=rate)
        slow = (
            f"; straggler: rank {straggler['rank']} {straggler['ratio']}x the others' median work "
            f"for {straggler['steps']} steps"
            if straggler
            else ""
        )
        progress.report(
            f"step {self.step}/{self.max_steps} loss {self.train_loss:.4f} lr {lr:.3g} {rate:,.0f} items/s{slow}",
            {"loss": f"{self.train_loss:.4f}", "lr": f"{lr:.2g}"},
        )
        window.reset()

    def _log_eval(self, progress: Progress) -> None:
        """Evaluate (all ranks) and record the validation loss, if there is an eval set."""
        self.val_loss = self.evaluate()
        if self.val_loss is None:
            return
        now, epoch = time.time(), self.batches.position(self.step - 1)[0]
        self.metrics.write(
            step=self.step,
            epoch=epoch,
            split="val",
            loss=self.val_loss,
            lr=self.scheduler.get_last_lr()[0],
            wall_time=now - self._start,
            time=now,
        )
        self.tracking.log("val", self.step, epoch, loss=self.val_loss)
        progress.report(f"step {self.step} val loss {self.val_loss:.4f}", {"val": f"{self.val_loss:.4f}"})

    def _failed(self) -> None:
        """The run raised: keep the write in flight, and say "failed" where launchers look.

        Each write is best effort and guarded on its own: the disk that failed the run may fail
        these too (ENOSPC), and one of them failing must neither skip the others (the run
        record left "running") nor replace the run's own error."""
        steps = (
            ("checkpoint write in flight", self.checkpoints.settle_after_failure),
            # a launcher can tell failed from hung
            ("heartbeat", lambda: self.heartbeat.beat(self.step, status=HEARTBEAT_WORD[State.FAILED], force=True)),
            ("node summary", self.heartbeat.finish),  # says "failed"; no peer to wait for
            ("run record", lambda: self.tracking.finish(EXIT_FAILED)),
        )
        for what, write in steps:
            try:
                write()
            except Exception as exc:
                log.warning("the run failed, and its %s could not be written either: %s", what, exc)

    def _preempted(self, preempted: int, flag: PreemptFlag) -> TrainResult:
        """Stopped by a signal after a checkpoint: say so everywhere, then (rank 0) maybe requeue."""
        log.info("signal %s: checkpoint written at step %d, stopping", flag.signum or "on another rank", self.step)
        self.heartbeat.beat(self.step, status=HEARTBEAT_WORD[State.PREEMPTED], force=True)
        run_dir = self.tracking.finish(EXIT_PREEMPTED)
        # Requeue last, once every rank has written its heartbeat and the run record: Slurm
        # ends all tasks the moment it requeues, and would cut those writes short.
        dist.barrier()
        self.heartbeat.finish(dist.barrier)
        if self.env.is_main:
            warn, said = after_preemption(preempted, flag, os.environ, self.cfg.requeue)
            (log.warning if warn else log.info)("%s", said)
        return self._result(EXIT_PREEMPTED, run_dir)

    def _stopped_waiting(self, stop: warm.Stopped, flag: PreemptFlag) -> TrainResult:
        """A stop signal while waiting for a new world (the launcher chose a cold restart, or
        stops the run): no world to vote or checkpoint in, and the latest checkpoint is already
        the state (its write in flight was settled before the wait), so the rank says why and
        ends as a stopped rank of the step loop does: "preempted" everywhere, EXIT_PREEMPTED.
        Best effort, as `_failed`: the launcher is stopping, these writes must not hold it up.
        Rank 0 still asks for a requeue after the warning signal, as the step loop would."""
        log.warning("%s", stop.why)
        run_dir = None
        with contextlib.suppress(Exception):
            self.heartbeat.beat(self.step, status=HEARTBEAT_WORD[State.PREEMPTED], force=True)
        with contextlib.suppress(Exception):
            self.heartbeat.finish()  # no peer to wait for
        with contextlib.suppress(Exception):
            run_dir = self.tracking.finish(EXIT_PREEMPTED)
        if self.env.is_main and flag.level < STOP:
            warn, said = after_preemption(flag.level, flag, os.environ, self.cfg.requeue)
            (log.warning if warn else log.info)("%s", said)
        return self._result(EXIT_PREEMPTED, run_dir)

    def _done(self) -> TrainResult:
        self.heartbeat.beat(self.step, status=HEARTBEAT_WORD[State.SUCCEEDED], force=True)
        dist.barrier()  # every rank's last beat is written: the node summary can be final
        self.heartbeat.finish(dist.barrier)
        log.info(
            "done: step %d, train loss %s, val loss %s",
            self.step,
            f"{self.train_loss:.4f}" if self.train_loss is not None else "-",
            f"{self.val_loss:.4f}" if self.val_loss is not None else "-",
        )
        self.tracking.checkpoint(self.checkpoints.last, self.step, kind="model")
        return self._result(EXIT_OK, self.tracking.finish(EXIT_OK))

    def _result(self, code: int, run_dir: str | None) -> TrainResult:
        return TrainResult(code, self.step, self.train_loss, self.val_loss, self.checkpoints.last, run_dir)


class _Window:
    """The steps since the last progress line: their summed loss (a tensor: adding it never
    makes a GPU wait), how many, the items they processed, and when the window opened."""

    loss: torch.Tensor
    steps: int
    items: int
    work: float
    start: float

    def __init__(self, device: str):
        self.device = device
        self.reset()

    def add(self, loss: torch.Tensor, items: int, work: float = 0.0) -> None:
        self.loss, self.steps, self.items = self.loss + loss, self.steps + 1, self.items + items
        self.work += work

    def reset(self) -> None:
        self.loss, self.steps, self.items, self.work = torch.zeros((), device=self.device), 0, 0, 0.0
        self.start = time.time()
