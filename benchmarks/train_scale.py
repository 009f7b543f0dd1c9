"""Coordination costs of the trainer with many ranks, before and after a change (bench_train.py --only scale).

Why before/after from source trees: start-up, resume and heartbeats are about how ranks talk
and touch files, so the same machine, run, model and flags are used for both, and only the
trainer's code differs: `--before REF` is exported with `git archive` into a temporary
directory and put first on PYTHONPATH; "after" is this checkout.

Ranks are started directly with the torchrun variables, NODE_RANK = rank // --per-node, so a
single machine looks like several nodes (the node-local heartbeat directory and the per-node
summary behave as they would on a cluster). Measured for each source tree:
- start-up: from starting the processes to rank 0's first metrics record (log every step);
- resume: the same for a second run that resumes from the first one's final checkpoint;
- peak resident memory (ru_maxrss from wait4) of each rank in a third run that resumes from the second's
  final checkpoint and has no step left to do: start-up plus resume, without training's own
  peak (gradients, optimizer state, activations) hiding it;
- the same, and that run's wall time (start to the last rank gone), from a checkpoint of about
  --scale-resume-mb MB (phase resume-big: an MLP wide enough, its checkpoint made by one step of
  the same ranks): the tiny model's state is too small for a copy per rank to show. ru_maxrss
  counts the file pages a rank has mapped and touched, which the ranks of a node share in the
  page cache: it overstates "after", never "before";
- heartbeat file operations in the run directory per second while all ranks train (renames
  and opens for writing under OUT_DIR/heartbeats, timed by an audit hook in every process).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Installed through PYTHONPATH (sitecustomize): counts, per process, file operations that
# create or rename something under $BENCH_HB_ROOT, with its time (written at once: ranks leave
# by os._exit).
AUDIT = r"""
import os, sys, time
_root = os.environ.get("BENCH_HB_ROOT")
if _root:
    _fd = os.open(os.path.join(os.environ["BENCH_HB_LOG"], str(os.getpid())), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    _W = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def _hook(event, args):
        if event == "open":
            p, mode, flags = args
            writes_mode = isinstance(mode, str) and any(c in mode for c in "wax+")
            if not writes_mode and not (isinstance(flags, int) and flags & _W):
                return
            paths = [p]
        elif event == "os.rename":
            paths = [args[1]]
        else:
            return
        for p in paths:
            if isinstance(p, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(p)).startswith(_root):
                os.write(_fd, b"%.3f\n" % time.time())
    sys.addaudithook(_hook)
"""


def export_tree(ref: str, into: Path) -> Path:
    """slurmgen/ of git REF, unpacked into INTO/src; returns that directory."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "slurmgen"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    (src / "slurmgen" / "templates").symlink_to(REPO / "templates")
    return src


def run_ranks(src: Path, world: int, per_node: int, args: list[str], out: Path, scratch: Path, port: int) -> dict:
    """Start WORLD ranks of `python -m slurmgen.train ARGS --out-dir OUT` from SRC; measure."""
    hooks, log = scratch / "hook", scratch / f"ops-{out.name}"
    hooks.mkdir(parents=True, exist_ok=True)
    log.mkdir()
    (hooks / "sitecustomize.py").write_text(AUDIT)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "RANK", "LOCAL_", "WORLD", "MASTER", "SLURMGEN"))
    }
    base.update(
        PYTHONPATH=f"{hooks}:{src}",
        BENCH_HB_ROOT=str(out / "heartbeats"),
        BENCH_HB_LOG=str(log),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "slurmgen.train",
        "--out-dir",
        str(out),
        "--progress",
        "none",
        "--threads",
        "1",
        "--backend",
        "gloo",
        "--init-timeout",
        "600",
        *args,
    ]
    t0 = time.time()
    procs, logs = [], []
    for r in range(world):
        env = dict(
            base,
            RANK=str(r),
            LOCAL_RANK=str(r % per_node),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(per_node),
            NODE_RANK=str(r // per_node),
            GROUP_RANK=str(r // per_node),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        logs.append(open(log / f"stderr-{r}.txt", "w+"))  # noqa: SIM115  (held past this line: a child's output or a writer kept open)
        # cwd: `python -m` puts it first on sys.path, where a checkout's slurmgen/ would win.
        procs.append(subprocess.Popen(cmd, env=env, cwd=scratch, stdout=subprocess.DEVNULL, stderr=logs[-1]))
    # wait4 reports each child's peak resident memory (ru_maxrss, KiB) as the kernel kept it.
    peaks = []
    for p in procs:
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        peaks.append(usage.ru_maxrss)
    if any(p.returncode for p in procs):
        bad = next(i for i, p in enumerate(procs) if p.returncode)
        raise SystemExit(
            f"rank {bad} exited with {procs[bad].returncode}:\n{(log / f'stderr-{bad}.txt').read_text()[-3000:]}"
        )
    wall = time.time() - t0
    for f in logs:
        f.close()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train" and r["time"] >= t0]
    if not train:  # a run that only resumed: its peak memory is what resuming costs
        return {"hwm_mb": [k / 1024 for k in peaks], "wall_s": wall}
    # Steady state: operations while every rank is stepping (start-up and the final beats aside).
    begin, end = train[0]["time"], train[-1]["time"]
    ops = sum(begin <= float(t) <= end for f in log.iterdir() if f.name.isdigit() for t in f.read_text().split())
    span = max(end - begin, 1e-9)
    return {
        "first_step_s": train[0]["time"] - t0,
        "hwm_mb": [k / 1024 for k in peaks],
        "hb_ops_per_s": ops / span,
        "steps": len(train),
        "train_s": span,
        "wall_s": wall,
    }


def scale(args, free_port) -> None:
    """Print start-up, resume, peak RSS and heartbeat file operations, before vs after."""
    model = ["--model", args.scale_model, *args.scale_model_args.split()]
    steps = args.scale_steps
    first = [
        *model,
        "--max-steps",
        str(steps),
        "--save-every",
        "0",
        "--log-every",
        "1",
        "--heartbeat-every",
        str(args.scale_heartbeat),
    ]
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        scratch = Path(tmp)
        trees = {"before": export_tree(args.before, scratch / "before"), "after": REPO}
        results: dict[str, dict[str, dict]] = {k: {} for k in trees}
        extras = {
            "fresh": [],
            "resume": ["--max-steps", str(steps + args.scale_resume_steps)],
            "resume-only": ["--max-steps", str(steps)],
        }  # resumes at or past the end: no step
        for phase in (p for p in args.scale_phases if p != "resume-big"):
            for name in ("before", "after") if phase != "resume" else ("after", "before"):
                extra = extras[phase]
                out = scratch / f"run-{name}"
                results[name][phase] = run_ranks(
                    trees[name], args.scale_world, args.scale_per_node, first + extra, out, scratch / phase, free_port()
                )
        if "resume-big" in args.scale_phases:
            big = resume_big(args, trees, scratch, free_port)
    print(
        f"coordination, {args.scale_world} ranks gloo ({args.scale_world // args.scale_per_node} 'nodes' of "
        f"{args.scale_per_node}), {args.scale_model} {args.scale_model_args}; "
        f"before = {args.before}, after = this checkout:"
    )
    for phase, label in (("fresh", "start-up to first step"), ("resume", "start-up to first step, resuming")):
        if phase not in args.scale_phases:
            continue
        b, a = results["before"][phase]["first_step_s"], results["after"][phase]["first_step_s"]
        print(f"  {label:34s} before {b:6.1f} s  after {a:6.1f} s  ratio after/before {a / b:.2f}")
    for phase, label in (("fresh", "training run"), ("resume-only", "resume, no step")):
        if phase in args.scale_phases:
            print_peaks(label, results["before"][phase]["hwm_mb"], results["after"][phase]["hwm_mb"])
    if "resume-big" in args.scale_phases:
        b, a = big["before"], big["after"]
        print(
            f"  resume, no step, from a {a['ckpt_mb']:.0f} MB checkpoint (MLP, hidden {a['hidden']}; before "
            f"{b['ckpt_mb']:.0f} MB):"
        )
        print_peaks("", b["hwm_mb"], a["hwm_mb"])
        print(
            f"  wall time, start to last rank gone: before {b['wall_s']:6.1f} s  after {a['wall_s']:6.1f} s  "
            f"ratio {a['wall_s'] / b['wall_s']:.2f}"
        )
    if "fresh" not in args.scale_phases:
        return
    b, a = results["before"]["fresh"]["hb_ops_per_s"], results["after"]["fresh"]["hb_ops_per_s"]
    print(
        f"  heartbeat file operations in the run directory: before {b:.1f}/s, after {a:.1f}/s "
        f"(ratio {a / max(b, 1e-9):.3f}; --heartbeat-every {args.scale_heartbeat}; over "
        f"{results['after']['fresh']['train_s']:.0f} s of training)"
    )


def print_peaks(label: str, before: list[float], after: list[float]) -> None:
    """One line: peak RSS per rank (MB) before and after; rank 0 apart, it holds the state first."""
    b, a = statistics.median(before), statistics.median(after)
    print(
        f"  peak RSS per rank{', ' if label else ''}{label:15s} before median {b:5.0f} MB (rank 0 {before[0]:.0f}, "
        f"max {max(before):.0f})  after median {a:5.0f} MB (rank 0 {after[0]:.0f}, max {max(after):.0f})  "
        f"ratio of medians {a / b:.2f}"
    )


def resume_big(args, trees: dict[str, Path], scratch: Path, free_port) -> dict[str, dict]:
    """Per source tree: one step of an MLP whose checkpoint (weights and AdamW moments, 3 x 4
    bytes a parameter) is about --scale-resume-mb MB, then a run that resumes from it with no
    step left: peak RSS per rank and wall time of that run."""
    hidden = round(math.sqrt(args.scale_resume_mb * 2**20 / 12))  # the hidden x hidden layer dominates
    run = [
        "--model",
        "mlp",
        "--mlp-hidden",
        str(hidden),
        "--synthetic-samples",
        "4096",
        "--batch-size",
        "4",
        "--max-steps",
        "1",
        "--save-every",
        "0",
        "--log-every",
        "1",
        "--heartbeat-every",
        str(args.scale_heartbeat),
    ]
    results = {}
    for name in ("before", "after"):
        out = scratch / f"big-{name}"
        run_ranks(trees[name], args.scale_world, args.scale_per_node, run, out, scratch / "big-make", free_port())
        results[name] = run_ranks(
            trees[name], args.scale_world, args.scale_per_node, run, out, scratch / "big-resume", free_port()
        )
        size = sum(f.stat().st_size for f in (out / "checkpoints").glob("ckpt-*.pt"))
        results[name].update(ckpt_mb=size / 2**20, hidden=hidden)
    return results
