"""The bundled trainer's cost, measured against the simplest code that does the same work.

    python benchmarks/bench_train.py [--world 2] [--steps 60] [--rounds 3] [--ckpt-mb 100] [--only SECTION]

1. Throughput: `--world` ranks on gloo (CPU) train the same GPT on the same synthetic data,
   alternately with a minimal hand-written DDP loop (nanoGPT-style: forward, backward, clip,
   AdamW, lr set by hand) and with slurmgen's Trainer (heartbeats, preemption vote, metrics,
   progress). Steps per second are taken between step --warmup and the last step, from the
   same processes in the same run, rounds alternating so that machine noise hits both alike.
   Printed: the median of each and the ratio trainer / hand-written (target >= 0.97).
2. Checkpoints of a ~--ckpt-mb MB model: slurmgen's atomic save (temporary file, fsync, rename,
   fsync, `latest` pointer, pruning) and its weights_only load, against a plain torch.save /
   torch.load of the same state to a file, and against torch.save+fsync and
   torch.load(weights_only=True), which carry the same guarantees. Printed: medians, ratios.
3. Stall per checkpoint (`stall`): how long the training loop is blocked by one checkpoint of
   a --stall-mb state (default 100 and 1000 MB), written synchronously (the whole durable
   save) and asynchronously (only the copy to CPU memory; the write goes on in a thread), in
   alternating rounds of the same run with clean page cache. The asynchronous writer prepares
   its copy buffers in the background (as the trainer does after the first optimizer step)
   while the state keeps changing, --stall-first-after seconds before its first checkpoint.
   Printed: the first checkpoint's stall, the median and max of the later ones, as ratios to
   the median synchronous save, and how long the preparation took, with torch's intra-op
   thread count and the load average: other work on the cores stretches the copy.
4. What a checkpoint costs the loop in all (`overlap`): the stall above plus the slowdown of
   the training steps while the background write runs, which shares the cores with them. A
   small MLP trains in segments of --overlap-steps steps; a segment that starts with a
   checkpoint of a --overlap-mb state (written synchronously, or asynchronously and waited for
   at the segment's end if still running) alternates with one without, in the same run, modes
   alternating round by round. Extra loop time per checkpoint = the segment's time minus the
   mean of the checkpoint-free segments on either side. Printed: the median (and range) of each
   mode, async as a ratio to sync, how long the background write took, and how often it
   outlasted its segment, with torch's intra-op thread count and the load average.
5. Coordination with many ranks (`scale`, see train_scale.py): --scale-world ranks of a tiny
   model on gloo, before (--before REF) and after: start-up, resume, peak RSS per rank,
   heartbeat file operations per second in the run directory; peak RSS per rank and time of a
   resume from a --scale-resume-mb checkpoint, big enough for a copy per rank to show.
6. FSDP2 and sharded checkpoints (`fsdp`, see bench_fsdp.py) at --fsdp-world ranks: parameter +
   optimizer memory per rank DDP vs FSDP, a sharded write vs a rank-0 single file, and the
   stall of an asynchronous sharded checkpoint as a ratio to a synchronous one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SECTIONS = ("throughput", "checkpoints", "stall", "overlap", "scale", "fsdp")
# The trainer before issue 16 (broadcast resume, per-rank heartbeats in the run directory,
# polling start-up meeting, synchronous checkpoints): the "before" of the scale section.
BEFORE = "3c2c8b1"
MODEL = dict(
    model="gpt",
    n_layer=2,
    n_head=4,
    n_embd=128,
    block_size=64,
    vocab_size=256,
    synthetic_samples=8192,
    batch_size=8,
    dropout=0.0,
)


def hand_written_loop(model, data, steps: int, warmup: int, rank: int, world: int) -> float:
    """The baseline: what a careful person writes by hand. Returns steps/s after warm-up."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from slurmgen.train.optim import lr_at

    ddp = DDP(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95)
    )
    g = torch.Generator().manual_seed(1000 + rank)
    t0 = 0.0
    for step in range(steps):
        if step == warmup:
            t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, 1e-3, 1e-4, 10, steps)
        idx = torch.randint(0, len(data), (MODEL["batch_size"],), generator=g).numpy()
        x, y = data.get_batch(idx)
        loss = ddp(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (steps - warmup) / (time.perf_counter() - t0)


def trainer_run(model, data, env, steps: int, warmup: int, out: Path) -> float:
    """The same work through slurmgen's Trainer; steps/s from its own metrics.jsonl clock."""
    from slurmgen.train.config import TrainConfig
    from slurmgen.train.trainer import Trainer

    cfg = TrainConfig(
        out_dir=str(out),
        max_steps=steps,
        log_every=warmup,
        save_every=0,
        resume="never",
        progress="none",
        eval_every=0,
        warmup_steps=10,
        **MODEL,
    ).validate()
    Trainer(model, data, env, cfg).fit()
    if env.rank != 0:
        return 0.0
    rows = {r["step"]: r["time"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    return (steps - warmup) / (rows[steps] - rows[warmup])


def worker(args: argparse.Namespace) -> None:
    import torch

    from slurmgen.train import api, dist
    from slurmgen.train.config import TrainConfig
    from slurmgen.train.data import build_datasets
    from slurmgen.train.models import build_model

    cfg = TrainConfig(**MODEL).validate()
    env = api.setup(cfg)
    data, _ = build_datasets(cfg)
    hand, ours = [], []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for r in range(args.rounds):
            order = ("hand", "ours") if r % 2 == 0 else ("ours", "hand")
            for kind in order:
                torch.manual_seed(0)
                model = build_model(cfg)
                dist.barrier()
                if kind == "hand":
                    hand.append(hand_written_loop(model, data, args.steps, args.warmup, env.rank, env.world_size))
                else:
                    ours.append(trainer_run(model, data, env, args.steps, args.warmup, Path(tmp) / f"round{r}"))
        if env.rank == 0:
            print(json.dumps({"hand": hand, "ours": ours}), flush=True)
    dist.finish(0)


def throughput(args: argparse.Namespace) -> None:
    from slurmgen.train.spawn import child_env, free_port

    port = free_port()
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--rounds",
        str(args.rounds),
        "--tmp",
        args.tmp,
    ]
    procs = [
        subprocess.Popen(cmd, env=child_env(os.environ, r, args.world, port), stdout=subprocess.PIPE, text=True)
        for r in range(args.world)
    ]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"a worker failed: exit codes {[p.returncode for p in procs]}")
    result = json.loads(outs[0].strip().splitlines()[-1])
    hand, ours = statistics.median(result["hand"]), statistics.median(result["ours"])
    print(
        f"throughput, {args.world} ranks gloo, GPT {MODEL['n_layer']}x{MODEL['n_embd']}, "
        f"batch {MODEL['batch_size']}x{MODEL['block_size']}:"
    )
    print(f"  hand-written DDP loop  {hand:8.2f} steps/s   (rounds: {', '.join(f'{v:.2f}' for v in result['hand'])})")
    print(f"  slurmgen Trainer       {ours:8.2f} steps/s   (rounds: {', '.join(f'{v:.2f}' for v in result['ours'])})")
    print(f"  ratio trainer / hand-written: {ours / hand:.3f}   (target >= 0.97)")


def checkpoints(args: argparse.Namespace) -> None:
    import torch

    from slurmgen.train.checkpoint import files as ckpt

    n = int(args.ckpt_mb * 2**20 / 4)
    state = {
        "format": ckpt.FORMAT,
        "step": 1,
        "model": {f"layer{i}.weight": torch.randn(n // 8) for i in range(8)},
        "rng": [ckpt.capture_rng()],
    }
    size_mb = sum(t.numel() * 4 for t in state["model"].values()) / 2**20
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        d, plain = Path(tmp) / "ckpt", Path(tmp) / "plain.pt"

        def save_fsync() -> None:
            with open(plain, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        ops = {
            "slurmgen save": lambda r: ckpt.save(d, r, state, keep_last=1),
            "torch.save": lambda r: torch.save(state, plain),
            "torch.save+fsync": lambda r: save_fsync(),
            "slurmgen load": lambda r: ckpt.find_latest(d),
            "torch.load": lambda r: torch.load(plain, map_location="cpu", weights_only=False),
            "torch.load(weights_only)": lambda r: torch.load(plain, map_location="cpu", weights_only=True),
        }
        times: dict[str, list[float]] = {k: [] for k in ops}
        for r in range(args.rounds):
            names = list(ops)[:3] if r % 2 == 0 else list(ops)[2::-1]
            names += list(ops)[3:] if r % 2 == 0 else list(ops)[:2:-1]
            for name in names:
                os.sync()  # start from clean page cache: no op pays for another's write-back
                t0 = time.perf_counter()
                ops[name](r)
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"checkpoint of {size_mb:.0f} MB, {args.rounds} rounds (median):")
    for k, v in med.items():
        print(f"  {k:26s} {v:7.3f} s  ({size_mb / v:6.0f} MB/s)")
    print(
        f"  ratio save: slurmgen / torch.save {med['slurmgen save'] / med['torch.save']:.2f}, "
        f"/ torch.save+fsync {med['slurmgen save'] / med['torch.save+fsync']:.2f}"
    )
    print(
        f"  ratio load: slurmgen / torch.load {med['slurmgen load'] / med['torch.load']:.2f}, "
        f"/ torch.load(weights_only) {med['slurmgen load'] / med['torch.load(weights_only)']:.2f}"
    )


def stall(args: argparse.Namespace) -> None:
    import torch

    from slurmgen.train.checkpoint import files as ckpt
    from slurmgen.train.checkpoint.writer import CheckpointWriter

    def train(state: dict) -> None:
        for t in state["model"].values():
            t.add_(1.0)  # "training" changes the state in place between checkpoints

    for mb in args.stall_mb:
        n = int(mb * 2**20 / 4)
        state = {"format": ckpt.FORMAT, "step": 0, "model": {f"layer{i}.weight": torch.randn(n // 8) for i in range(8)}}
        load = os.getloadavg()
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            writers = {
                "sync": CheckpointWriter(Path(tmp) / "sync", keep_last=1, background=False),
                "async": CheckpointWriter(Path(tmp) / "async", keep_last=1, background=True),
            }
            # As the trainer does after its first optimizer step: the buffers are prepared in the
            # background while training goes on (polling finished() once a step), until the
            # first checkpoint --stall-first-after seconds later.
            t0 = time.perf_counter()
            writers["async"].prepare(state)
            ready = None
            while time.perf_counter() - t0 < args.stall_first_after:
                train(state)
                if ready is None and writers["async"].finished():
                    writers["async"].wait()
                    ready = time.perf_counter() - t0
            stalls: dict[str, list[float]] = {k: [] for k in writers}
            written: list[float] = []
            for r in range(args.rounds + 1):  # round 0: the first checkpoint of each writer
                for name in ("async", "sync") if r % 2 == 0 else ("sync", "async"):
                    train(state)
                    os.sync()
                    t0 = time.perf_counter()
                    writers[name].submit(r, {**state, "step": r})
                    stalls[name].append(time.perf_counter() - t0)
                    if name == "async":
                        writers[name].wait()
                        written.append(time.perf_counter() - t0)
        sync, (first, *later) = statistics.median(stalls["sync"][1:]), stalls["async"]
        median, worst = statistics.median(later), max(later)
        print(
            f"stall per checkpoint of {mb:.0f} MB, first + {args.rounds} rounds, "
            "ratios to the synchronous save (goal <= 0.1):"
        )
        print(
            f"  (torch intra-op threads {torch.get_num_threads()}, "
            f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}, "
            f"load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, this benchmark included)"
        )
        print(f"  synchronous save (write, fsync, rename, pointer), median   {sync:7.3f} s")
        print(
            f"  asynchronous, first checkpoint ({args.stall_first_after:g} s after prepare)       "
            f"{first:7.3f} s   ratio {first / sync:.3f}"
        )
        print(
            f"  asynchronous, later checkpoints: median                    {median:7.3f} s   ratio {median / sync:.3f}"
        )
        print(f"  asynchronous, later checkpoints: max                       {worst:7.3f} s   ratio {worst / sync:.3f}")
        print(
            "  buffers prepared in the background in                      "
            + (
                f"{ready:7.3f} s"
                if ready is not None
                else f"  > {args.stall_first_after:g} s (the first checkpoint waited)"
            )
        )
        print(f"  asynchronous: until durable (copy + write), median         {statistics.median(written[1:]):7.3f} s")


def overlap(args: argparse.Namespace) -> None:
    import torch

    from slurmgen.train.checkpoint import files as ckpt
    from slurmgen.train.checkpoint.writer import CheckpointWriter

    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    x, y = torch.randn(128, 512), torch.randn(128, 512)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def train_step() -> None:
        (net(x) - y).square().mean().backward()  # a target that is not zero: no weights decaying into denormals
        opt.step()
        opt.zero_grad()

    n = int(args.overlap_mb * 2**20 / 4)
    state = {"format": ckpt.FORMAT, "step": 0, "model": {f"layer{i}.weight": torch.randn(n // 8) for i in range(8)}}

    def segment(writer: CheckpointWriter | None, first: int) -> tuple[float, float, float]:
        """--overlap-steps steps, a checkpoint at the first if `writer`, polled as the trainer
        does; returns the segment's time, when the write was durable (from the segment's start)
        and how long the segment's end waited for it."""
        durable, t0 = 0.0, time.perf_counter()
        for s in range(first, first + args.overlap_steps):
            train_step()
            if writer is None:
                continue
            if s == first:
                writer.submit(s, {**state, "step": s})
                durable = 0.0 if writer.background else time.perf_counter() - t0
            elif writer.finished():
                writer.wait()
                durable = time.perf_counter() - t0
        tail = time.perf_counter()
        if writer is not None and writer.busy:
            writer.wait()
            durable = time.perf_counter() - t0
        end = time.perf_counter()
        return end - t0, durable, end - tail

    load = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        writers = {
            "sync": CheckpointWriter(Path(tmp) / "sync", keep_last=1, background=False),
            "async": CheckpointWriter(Path(tmp) / "async", keep_last=1, background=True),
        }
        writers["async"].prepare(state)
        writers["async"].wait()
        extra: dict[str, list[float]] = {k: [] for k in writers}
        durable: dict[str, list[float]] = {k: [] for k in writers}
        waited: list[float] = []
        step, plain = 0, []
        for _ in range(3):  # warm-up, and the first checkpoint-free neighbour
            plain = [segment(None, step)[0]]
            step += args.overlap_steps
        for r in range(args.rounds):
            for name in ("async", "sync") if r % 2 == 0 else ("sync", "async"):
                os.sync()
                took, done, tail = segment(writers[name], step)
                os.sync()
                plain.append(segment(None, step + args.overlap_steps)[0])
                step += 2 * args.overlap_steps
                extra[name].append(took - (plain[-2] + plain[-1]) / 2)
                durable[name].append(done)
                if name == "async":
                    waited.append(tail)
    med = {k: statistics.median(v) for k, v in extra.items()}
    print(
        f"extra loop time per checkpoint of {args.overlap_mb:.0f} MB (stall + slower steps while the write runs), "
        f"{args.rounds} rounds, segments of {args.overlap_steps} steps:"
    )
    print(
        f"  (torch intra-op threads {torch.get_num_threads()}, "
        f"OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, this benchmark included)"
    )
    print(
        f"  segment without checkpoint, median                         {statistics.median(plain):7.3f} s "
        f"({statistics.median(plain) / args.overlap_steps * 1e3:.1f} ms/step)"
    )
    for name in writers:
        print(
            f"  {name + ',':6s} extra per checkpoint: median                   {med[name]:7.3f} s   "
            f"(rounds {min(extra[name]):.3f} to {max(extra[name]):.3f})"
        )
    print(f"  ratio async / sync (goal < 1: asynchronous costs less in all)  {med['async'] / med['sync']:.3f}")
    print(
        f"  synchronous save, median {statistics.median(durable['sync']):.3f} s; background write durable after "
        f"{statistics.median(durable['async']):.3f} s (median), max {max(durable['async']):.3f} s"
    )
    print(
        f"  background writes that outlasted their segment: {sum(t > 0.001 for t in waited)} of {len(waited)}"
        + (f", waited up to {max(waited):.3f} s" if max(waited) > 0.001 else "")
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ckpt-mb", type=float, default=100)
    p.add_argument("--tmp", default=tempfile.gettempdir(), help="directory for run dirs and checkpoint files")
    p.add_argument("--skip", choices=SECTIONS, action="append", default=[])
    p.add_argument("--only", choices=SECTIONS, action="append", default=[], help="run only these sections")
    p.add_argument("--stall-mb", type=float, nargs="+", default=[100, 1000])
    p.add_argument(
        "--stall-first-after",
        type=float,
        default=5.0,
        help="seconds of (simulated) training between preparing the buffers and the first checkpoint",
    )
    p.add_argument("--overlap-mb", type=float, default=300, help="checkpoint size of the overlap section")
    p.add_argument(
        "--overlap-steps",
        type=int,
        default=200,
        help="steps per segment of the overlap section: enough for the background write to end within it",
    )
    p.add_argument(
        "--before", default=BEFORE, help="git ref of the 'before' trainer for --only scale (default: %(default)s)"
    )
    p.add_argument("--scale-world", type=int, default=32)
    p.add_argument("--scale-per-node", type=int, default=8)
    p.add_argument("--scale-steps", type=int, default=60)
    p.add_argument("--scale-resume-steps", type=int, default=10)
    p.add_argument("--scale-heartbeat", type=float, default=0.5, help="--heartbeat-every of the scale runs")
    p.add_argument(
        "--scale-phases",
        nargs="+",
        choices=("fresh", "resume", "resume-only", "resume-big"),
        default=["fresh", "resume", "resume-only", "resume-big"],
        help="fresh needs to come first (resume-big stands alone)",
    )
    p.add_argument("--scale-resume-mb", type=float, default=32, help="checkpoint size of the resume-big phase")
    p.add_argument("--scale-model", default="mlp")
    p.add_argument("--scale-model-args", default="--mlp-hidden 32 --synthetic-samples 4096 --batch-size 4")
    p.add_argument("--fsdp-world", type=int, default=4, help="ranks of the fsdp section")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.steps % args.warmup:
        p.error("--steps must be a multiple of --warmup")
    if args.worker:
        return worker(args)
    wanted = [s for s in (args.only or SECTIONS) if s not in args.skip]
    if "throughput" in wanted:
        throughput(args)
    if "checkpoints" in wanted:
        checkpoints(args)
    if "stall" in wanted:
        stall(args)
    if "overlap" in wanted:
        overlap(args)
    if "scale" in wanted:
        from train_scale import scale

        from slurmgen.train.spawn import free_port

        scale(args, free_port)
    if "fsdp" in wanted:
        from bench_fsdp import fsdp_section

        fsdp_section(args.fsdp_world, args.rounds, args.tmp)


if __name__ == "__main__":
    main()
