"""`--nproc-per-node N` with no launcher: start N copies of the trainer on this machine.

Why subprocesses and not torch.multiprocessing: each child is started exactly like a rank of a
generated script (a fresh `python -m slurmgen.train` with the torchrun variables in its
environment), so there is one code path for ranks whoever launched them, nothing has to be
pickled, and this parent never imports torch. It is a tiny launcher with the same contract as
launch_multi_node.sh: forward SIGTERM, SIGINT and the preemption signals to the children, stop the others as soon
as one fails, exit with the first failing child's code (0 only if all succeeded).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from slurmgen.contract import envvars, exitcodes

# TERM, INT and every signal that --preempt-signal may name (the children decide what it means).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGURG, signal.SIGHUP)
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL for the survivors of a failure
PREEMPT_GRACE = 60.0  # survivors of a preemption are finishing their own clean exit: wait longer


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the kernel picks it; the race window is tiny)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def child_env(base: Mapping[str, str], rank: int, nproc: int, port: int) -> dict[str, str]:
    """The torchrun contract for local rank `rank` of `nproc` on this one machine."""
    env = dict(base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        GROUP_RANK="0",
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    env[envvars.TRAIN_SPAWNED] = "1"
    env.pop("TORCHELASTIC_RUN_ID", None)
    return env


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the parent dies, so a kill -9 of it orphans nothing."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn(nproc: int, argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """Run `python -m slurmgen.train ARGV` as ranks 0..nproc-1; return the job's exit code."""
    base = os.environ if environ is None else environ
    port = int(base["MASTER_PORT"]) if base.get("MASTER_PORT") else free_port()
    cmd = [sys.executable, "-m", "slurmgen.train", *argv]
    procs = [
        subprocess.Popen(
            cmd,
            env=child_env(base, r, nproc, port),
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        for r in range(nproc)
    ]

    def forward(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        code = 0
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                # Seen in the same poll, a rank killed by a signal is the cause and the others'
                # errors its consequence (their peer vanished mid-collective): report the signal.
                first = min(failed, key=lambda c: c >= 0)
                code = first if first > 0 else 128 - first  # killed by signal N: 128+N, as shells say
                _stop(procs, PREEMPT_GRACE if code == exitcodes.PREEMPTED else STOP_GRACE)
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.05)
        return code
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    """Let the survivors leave within `grace` seconds, then SIGKILL them."""
    deadline = time.monotonic() + grace
    for p in procs:
        if p.poll() is None and grace == STOP_GRACE:
            p.send_signal(signal.SIGTERM)
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
