"""FSDP2 and sharded checkpoints at --fsdp-world ranks (the `fsdp` section of bench_train.py).

Two runs of the same GPT on gloo (CPU), one DDP and one FSDP, each reporting per rank:
- parameter + optimizer bytes held (the tensors' local storage: what FSDP divides by the world
  size) and the process's peak RSS after a few training steps;
- (FSDP run) a sharded synchronous write (every rank its shard, `ShardedWriter(background=False)`)
  against what a DDP-style checkpoint costs: gather the full state to rank 0 and let it write one
  file with `checkpoint.save`, rounds alternating, page cache flushed before each;
- (FSDP run) the stall of an asynchronous sharded checkpoint (the time `submit` blocks the loop,
  the previous write waited for outside the timing) as a ratio to the synchronous write, with
  the writer's thread and with DCP's writer process (whose first checkpoint starts the
  process); the copy buffers are prepared first, as the trainer does after its first step.
  --fsdp-world 2 holds 62 MB of parameters and AdamW moments per rank.
"""

from __future__ import annotations

import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

GPT_SIZE = dict(vocab_size=256, block_size=64, n_layer=6, n_head=6, n_embd=384)


def _local_bytes(model, opt) -> int:
    import torch

    def size(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(size(p) for p in model.parameters())
    states = sum(size(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return params + states


def _steps(model, opt, rank: int, n: int) -> None:
    import torch

    g = torch.Generator().manual_seed(rank)
    for _ in range(n):
        x = torch.randint(0, GPT_SIZE["vocab_size"], (4, GPT_SIZE["block_size"] + 1), generator=g)
        model(x[:, :-1], x[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _timed(fn) -> float:
    import torch.distributed as tdist

    os.sync()
    tdist.barrier()
    t0 = time.perf_counter()
    fn()
    tdist.barrier()
    return time.perf_counter() - t0


def _write_times(model, opt, rank: int, world: int, tmp: str, rounds: int) -> dict:
    import torch.distributed as tdist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from slurmgen.train.checkpoint import files as ckpt
    from slurmgen.train.checkpoint import sharded

    d = Path(tmp) / "ck"
    sync = sharded.ShardedWriter(d / "sharded", keep_last=1, background=False)
    both = sharded.ShardedWriter(d / "async", keep_last=1)
    proc = sharded.ShardedWriter(d / "process", keep_last=1, process=True)
    for writer in (both, proc):  # as the trainer does after its first optimizer step
        writer.prepare(model, opt)
        writer.wait()

    def single_file(r: int) -> None:
        m, o = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            ckpt.save(d / "single", r, {"format": ckpt.FORMAT, "step": r, "model": m, "optimizer": o}, keep_last=1)

    out: dict[str, list[float]] = {"sharded": [], "single": [], "stall": [], "stall_process": []}
    for r in range(1, rounds + 1):
        # The previous round's asynchronous writes are done before the timed ones start: else they
        # share the disk and the cores with them (measured in one process at 2 ranks, the ratio of
        # a round spread 0.36-1.61 with them in flight, 0.27-0.63 without).
        both.wait()
        proc.wait()
        for kind in ("sharded", "single") if r % 2 else ("single", "sharded"):
            if kind == "sharded":
                out[kind].append(
                    _timed(lambda r=r: sync.submit(r, model, opt, {"world_size": world} if rank == 0 else None))
                )
            else:
                out[kind].append(_timed(lambda r=r: single_file(r)))
        for writer, key in ((both, "stall"), (proc, "stall_process")):
            writer.wait()
            tdist.barrier()
            t0 = time.perf_counter()
            writer.submit(r, model, opt, {"world_size": world} if rank == 0 else None)
            out[key].append(time.perf_counter() - t0)
            _steps(model, opt, rank, 1)
    both.wait()
    proc.wait()
    return out


def worker(rank: int, world: int, strategy: str, tmp: str, rounds: int, result: dict) -> None:
    import torch
    import torch.distributed as tdist

    from slurmgen.train import fsdp
    from slurmgen.train.models import GPT
    from slurmgen.train.optim import build_optimizer

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"file://{tmp}/store-{strategy}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(**GPT_SIZE)
    inner = model
    model = fsdp.shard(model) if strategy == "fsdp" else torch.nn.parallel.DistributedDataParallel(model)
    opt = build_optimizer(inner, 1e-3, 0.1, (0.9, 0.95))
    _steps(model, opt, rank, 3)
    entry = {
        "state_bytes": _local_bytes(inner, opt),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if strategy == "fsdp":
        entry.update(_write_times(model, opt, rank, world, tmp, rounds))
    result[f"{strategy}-{rank}"] = entry
    tdist.barrier()
    tdist.destroy_process_group()


def fsdp_section(world: int, rounds: int, tmp_root: str) -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(dir=tmp_root) as tmp, mp.Manager() as manager:
        result = manager.dict()
        for strategy in ("ddp", "fsdp"):
            mp.spawn(worker, args=(world, strategy, tmp, rounds, result), nprocs=world, join=True)
        result = dict(result)
    mb = 2**20
    ddp = [result[f"ddp-{r}"] for r in range(world)]
    fs = [result[f"fsdp-{r}"] for r in range(world)]
    print(
        f"fsdp, {world} ranks gloo, GPT {GPT_SIZE['n_layer']}x{GPT_SIZE['n_embd']} (AdamW), "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores:"
    )
    print(
        f"  parameter+optimizer MB per rank: DDP {max(e['state_bytes'] for e in ddp) / mb:.1f}, "
        f"FSDP {max(e['state_bytes'] for e in fs) / mb:.1f}  ratio FSDP/DDP "
        f"{max(e['state_bytes'] for e in fs) / max(e['state_bytes'] for e in ddp):.3f}  (ideal {1 / world:.3f})"
    )
    print(
        f"  peak RSS MB per rank (max): DDP {max(e['peak_rss'] for e in ddp) / mb:.0f}, "
        f"FSDP {max(e['peak_rss'] for e in fs) / mb:.0f}  (includes torch itself, ~300 MB)"
    )
    med = {k: statistics.median(fs[0][k]) for k in ("sharded", "single", "stall")}
    print(
        f"  checkpoint write, {rounds} rounds (median): sharded {med['sharded']:.3f} s, "
        f"rank-0 single file {med['single']:.3f} s  ratio sharded/single {med['sharded'] / med['single']:.2f}"
    )
    for key, kind in (("stall", "thread"), ("stall_process", "process")):
        stalls = [max(fs[r][key][i] for r in range(world)) for i in range(rounds)]
        later = statistics.median(stalls[1:]) if rounds > 1 else stalls[0]
        print(
            f"  async sharded stall, {kind} writer (slowest rank): first {stalls[0]:.4f} s (ratio "
            f"{stalls[0] / med['sharded']:.3f}), later median {later:.4f} s (ratio {later / med['sharded']:.3f}; "
            f"{', '.join(f'{v:.3f}' for v in stalls[1:])})  (target <= 0.1)"
        )
