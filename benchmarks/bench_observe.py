"""What heartbeats and the timeline cost a training step (issue 23), at --ranks processes.

    python benchmarks/bench_observe.py [--ranks 32] [--steps 200] [--rounds 3] [--work 20000]

1. Per call: `Heartbeat.beat(step, work=...)` with a timeline file, in a tight loop, and the
   share of calls that wrote (one file write and one timeline line per --every seconds).
2. In a run: --ranks processes each do --steps steps of the trainer benchmark's step
   (--step gpt, the default: bench_train.py's GPT forward, backward and AdamW on a fixed batch,
   one thread a rank) or of pure-Python work (--step python: --work loop iterations) and, in
   one mode, beat after each step into heartbeat files and one shared timeline file,
   as the trainer does. Modes alternate round by round in the same run, so machine noise hits
   both alike. A step's time is the CPU time the rank spent in it (system time of the writes
   included): on a shared 2-core box the wall time of 32 ranks mostly measures who else runs.
   Printed: each round's median step time per mode and the ratio with / without
   (target < 1.01). The step is compute, not a collective: the beat's cost is all that differs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import os, sys, time
from slurmgen.observe.heartbeat import Heartbeat
steps, work, on, every = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
hb = Heartbeat(None, int(os.environ["RANK"]), every) if on else None
if hb is not None:
    hb.beat(0, force=True)
t0 = time.process_time()
for step in range(1, steps + 1):
    began = time.perf_counter()
    x = 0
    for i in range(work):
        x += i * i
    if hb is not None:
        hb.beat(step, work=time.perf_counter() - began)
if hb is not None:
    hb.beat(steps, status="done", force=True)
print((time.process_time() - t0) / steps)
"""


# The step of the trainer's benchmark (benchmarks/bench_train.py: its GPT, batch and AdamW, one
# intra-op thread a rank), with the beat where the trainer makes it: after each step, with the
# rank's work. Its rendezvous and all-reduce are left out: they are the same with and without.
GPT_CHILD = r"""
import os, sys, time
sys.path.insert(0, os.environ["BENCH_DIR"])
import torch
torch.set_num_threads(1)
from bench_train import MODEL
from slurmgen.observe.heartbeat import Heartbeat
from slurmgen.train.models import GPT
steps, on, every = int(sys.argv[1]), sys.argv[3] == "1", float(sys.argv[4])
torch.manual_seed(0)
model = GPT(MODEL["vocab_size"], MODEL["block_size"], MODEL["n_layer"], MODEL["n_head"], MODEL["n_embd"])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randint(MODEL["vocab_size"], (MODEL["batch_size"], MODEL["block_size"]))
y = torch.roll(x, -1, 1)
hb = Heartbeat(None, int(os.environ["RANK"]), every) if on else None
if hb is not None:
    hb.beat(0, force=True)
for _ in range(3):  # warm-up: allocator and first-call costs are the same either way
    model(x, y).backward(); opt.step(); opt.zero_grad(set_to_none=True)
t0 = time.process_time()
for step in range(1, steps + 1):
    began = time.perf_counter()
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if hb is not None:
        hb.beat(step, work=time.perf_counter() - began)
if hb is not None:
    hb.beat(steps, status="done", force=True)
print((time.process_time() - t0) / steps)
"""


def per_call(every: float, n: int = 200_000) -> tuple[float, float]:
    """CPU microseconds per beat in a tight loop (throttled: almost never writes), and per beat
    that writes (a heartbeat file and a timeline line: what happens once per period)."""
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from slurmgen.observe.heartbeat import Heartbeat
    from slurmgen.observe.timeline_writer import TimelineWriter

    with tempfile.TemporaryDirectory() as d:
        hb = Heartbeat(
            None,
            0,
            every,
            environ={"SLURMGEN_HEARTBEAT_DIR": d},
            timeline=TimelineWriter(str(Path(d) / "t.jsonl"), 0, 0),
        )
        hb.beat(0, force=True)
        t0 = time.process_time()  # CPU time (user + system): what the ranks' steps share the cores with
        for step in range(1, n + 1):
            hb.beat(step, work=1e-3)
        spent = time.process_time() - t0
        hb.every, writes = 0.0, 2000
        t0 = time.process_time()
        for step in range(n + 1, n + writes + 1):
            hb.beat(step, work=1e-3)
        wrote = time.process_time() - t0
    return spent / n * 1e6, wrote / writes * 1e6


def run(ranks: int, steps: int, work: int, on: bool, every: float, d: Path, child: str = CHILD) -> float:
    """The median over ranks of the mean CPU time per step (s)."""
    env = {
        **os.environ,
        "SLURMGEN_HEARTBEAT_DIR": str(d / "hb"),
        "SLURMGEN_TIMELINE_FILE": str(d / "timeline.jsonl"),
        "PYTHONPATH": str(Path(__file__).parents[1]),
        "BENCH_DIR": str(Path(__file__).parent),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", child, str(steps), str(work), "1" if on else "0", str(every)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    return statistics.median(float(p.communicate()[0]) for p in procs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=int, default=20000)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument(
        "--step",
        choices=("gpt", "python"),
        default="gpt",
        help="gpt: the trainer benchmark's GPT step (torch); python: --work loop iterations",
    )
    a = ap.parse_args()
    child = GPT_CHILD if a.step == "gpt" else CHILD
    us, write_us = per_call(a.every)
    # The bound that noise cannot blur: every rank pays a throttled beat per step and one write
    # per period; with all ranks on `cores` cores that CPU time is shared like the steps'.
    cores = os.cpu_count() or 1
    share = a.ranks * write_us / a.every / 1e6 / cores
    print(
        f"per call: {us:.2f} us per throttled beat, {write_us:.0f} us per beat that writes (file + timeline line); "
        f"{a.ranks} ranks on {cores} cores writing every {a.every:g} s: {100 * share:.3f}% of the CPU, "
        f"plus {us:.2f} us per step ({100 * us * 1e-6 / 0.1:.4f}% of a 100 ms step)"
    )
    ratios = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.rounds):
            modes = (False, True) if i % 2 == 0 else (True, False)
            t = {on: run(a.ranks, a.steps, a.work, on, a.every, Path(d), child) for on in modes}
            ratios.append(t[True] / t[False])
            print(
                f"round {i}: step {t[False] * 1e3:.2f} ms without, {t[True] * 1e3:.2f} ms with: ratio {ratios[-1]:.4f}"
            )
        n = len(Path(d, "timeline.jsonl").read_text().splitlines())
    print(
        f"{a.ranks} ranks, {a.step} step: median ratio with / without heartbeats+timeline "
        f"{statistics.median(ratios):.4f} "
        f"(target < 1.01); timeline lines {n}; load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
