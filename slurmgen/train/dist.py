"""Process-group set-up and tear-down, with errors a person can act on.

Set-up (`init`): under torchrun the agent already hosts the store at MASTER_ADDR:MASTER_PORT,
so we join it with env://. Everywhere else we build the TCPStore ourselves: rank 0 hosts it,
the others first wait for the port with plain sockets. That is what turns torch's C++ stack
dumps into one line: "cannot resolve MASTER_ADDR=nodeA", "nothing listens on 10.0.0.1:29500
after 120 s", "MASTER_PORT 29500 is already in use on this host", and lets every rank compare
its WORLD_SIZE with rank 0's before a mismatch turns into a silent hang.

Tear-down (`finish`): barrier, destroy the process group, flush, then `os._exit`. Skipping
interpreter finalisation is deliberate: with torch 2.13 on gloo about 1 run in 20 aborted at
exit ("terminate called without an active exception") because gloo's worker thread freed work
objects holding Python tensors while the interpreter was shutting down (see the project's notes,
"The gloo exit crash"). After a failure there is no barrier (the peers may be gone).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import sys
import time
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from slurmgen.contract import envvars, exitcodes, warm

from .env import DistEnv

log = logging.getLogger("slurmgen.train")
# Collectives other than the rendezvous may legitimately wait long (rank 0 writing a large
# checkpoint while the others wait at the barrier); hangs are the heartbeat's business.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


class DistSetupError(RuntimeError):
    """Joining the process group failed in a way the user can fix."""


def configure_runtime(env: DistEnv, threads: int, tf32: bool) -> None:
    """Threads, TF32 and NCCL defaults: things that must be right before the first kernel."""
    if threads > 0:
        torch.set_num_threads(threads)
    elif "OMP_NUM_THREADS" not in os.environ and env.device == "cpu":
        # N processes on one machine each default to all cores: N-fold oversubscription.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // env.local_world_size))
    if env.backend == "nccl":
        # Abort a collective that failed on another rank instead of hanging in it.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if env.device.startswith("cuda"):
        torch.cuda.set_device(env.local_rank)
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def _resolve(addr: str) -> None:
    try:
        socket.getaddrinfo(addr, None)
    except socket.gaierror as exc:
        raise DistSetupError(
            f"cannot resolve MASTER_ADDR={addr} ({exc.strerror}): check the name or give an IP address"
        ) from None


def wait_for_port(addr: str, port: int, timeout: float) -> None:
    """Return once something accepts TCP connections on addr:port; else a DistSetupError."""
    deadline, last = time.monotonic() + timeout, "no attempt"
    while True:
        try:
            with socket.create_connection((addr, port), timeout=min(2.0, max(0.1, timeout))):
                return
        except OSError as exc:
            last = exc.strerror or str(exc)
        if time.monotonic() >= deadline:
            raise DistSetupError(
                f"cannot reach the master at {addr}:{port} within {timeout:g} s ({last}): is rank 0 "
                "running, and do MASTER_ADDR and MASTER_PORT point to it? (--init-timeout to wait longer)"
            )
        time.sleep(0.2)


def _store(env: DistEnv, timeout: float) -> dist.Store:
    td = timedelta(seconds=timeout)
    if env.rank == 0:
        try:
            return dist.TCPStore(env.master_addr, env.master_port, env.world_size, True, td, wait_for_workers=False)
        except Exception as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if "in use" in msg.lower():
                raise DistSetupError(
                    f"MASTER_PORT {env.master_port} is already in use on this host: pick another port"
                ) from None
            raise DistSetupError(f"rank 0 could not host the store on port {env.master_port}: {msg}") from None
    wait_for_port(env.master_addr, env.master_port, timeout)
    try:
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, False, td)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DistSetupError(f"joining the master at {env.master_addr}:{env.master_port} failed: {msg}") from None


def _meet(store: dist.Store, env: DistEnv, timeout: float) -> None:
    """Wait until all WORLD_SIZE ranks have checked in, and compare world sizes with rank 0.

    Done on the store before init_process_group so that a missing rank or a mismatch fails
    within --init-timeout with a sentence, on every rank, instead of hanging for the
    collective timeout inside torch.
    """
    store.set(f"slurmgen/world/{env.rank}", str(env.world_size))
    deadline = time.monotonic() + timeout
    if env.rank != 0:
        try:
            store.wait(["slurmgen/world/0"], timedelta(seconds=timeout))
        except Exception:
            raise DistSetupError(
                f"rank 0 did not check in at {env.master_addr}:{env.master_port} within {timeout:g} s"
            ) from None
        theirs = int(store.get("slurmgen/world/0"))
        if theirs != env.world_size:
            raise DistSetupError(
                f"inconsistent WORLD_SIZE: rank {env.rank} has {env.world_size}, rank 0 has {theirs}: "
                "every process must be started with the same world size"
            )
    # No polling: the rank whose increment completes the count sets a key that the others
    # block on in store.wait (one request each, instead of one every 50 ms from every rank).
    arrived = store.add("slurmgen/arrived", 1)  # only ranks that agree with rank 0 count
    if arrived >= env.world_size:
        store.set("slurmgen/all-arrived", "1")
        return
    try:
        store.wait(["slurmgen/all-arrived"], timedelta(seconds=max(0.001, deadline - time.monotonic())))
    except Exception:
        arrived = store.add("slurmgen/arrived", 0)
        raise DistSetupError(
            f"only {arrived} of WORLD_SIZE={env.world_size} ranks arrived at {env.master_addr}:{env.master_port} "
            f"within {timeout:g} s: are all nodes started, with the same world size? (--init-timeout to wait longer)"
        ) from None


def init(env: DistEnv, timeout: float) -> None:
    """Join the process group described by `env` (no-op for a single process)."""
    if not env.distributed or dist.is_initialized():
        return
    _resolve(env.master_addr)
    before = _sockets() if os.environ.get(envvars.WARM_DIR) else None
    kwargs: dict[str, Any] = {"backend": env.backend, "timeout": COLLECTIVE_TIMEOUT}
    if env.device.startswith("cuda"):
        kwargs["device_id"] = torch.device(env.device)
    if env.launcher == "torchrun":
        try:
            dist.init_process_group(init_method="env://", **kwargs)
        except Exception as exc:
            raise DistSetupError(
                f"joining torchrun's process group at {env.master_addr}:{env.master_port} failed: {exc}"
            ) from None
    else:
        store = _store(env, timeout)
        _meet(store, env, timeout)
        dist.init_process_group(store=store, rank=env.rank, world_size=env.world_size, **kwargs)
    global _CONTROL
    # Small CPU-side messages (votes, RNG states, a resumed state) go over gloo even when the
    # gradients use NCCL: they then cost no GPU memory and never synchronise a CUDA stream.
    _CONTROL = dist.new_group(backend="gloo") if env.backend != "gloo" else None
    if before is not None:  # a warm restart may have to cut this world's connections (leave)
        _WORLD_SOCKETS.update(_sockets() - before)
        warm.note_met(os.environ[envvars.WARM_DIR], env.rank)


_CONTROL: Any = None  # the gloo group for CPU-side messages; None = the default group


_WORLD_SOCKETS: set[int] = set()  # the sockets `init` opened (warm restarts only): the store's, gloo's


def _sockets() -> set[int]:
    """The file descriptors of this process that are sockets."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                if stat.S_ISSOCK(os.stat(f"/proc/self/fd/{name}").st_mode):
                    found.add(int(name))
    return found


def open_sockets() -> set[int]:
    """The sockets this process holds now (before joining a world: see `hold_world`)."""
    return _sockets()


def hold_world(before: set[int]) -> None:
    """The sockets opened since `before` are the world just joined: `leave` shuts them down."""
    _WORLD_SOCKETS.update(_sockets() - before)


def _close_world_sockets() -> None:
    """Shut down the connections of the world being left, now: neither an abort nor a destroy of a
    gloo group closes them while its work in flight holds them, and a healthy peer blocked in a
    collective with this rank (not with the dead one) would wait for them until this process
    ended. Shut down, each peer's collective fails at once and it leaves too."""
    for fd in sorted(_WORLD_SOCKETS & _sockets()):
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=fd)
            try:  # connections only: gloo's listener thread must keep its socket (it aborts on an error)
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.detach()  # the descriptor stays torch's to close
    _WORLD_SOCKETS.clear()


def leave() -> None:
    """Leave a process group a peer's failure broke, without a barrier (the peer is gone): every
    group is aborted, which closes its connections at once (a destroy would wait for the last
    reference, and a healthy peer blocked in a collective with this rank would wait with it), so
    `init` can join a new world in this same process (a warm restart)."""
    global _CONTROL
    _CONTROL = None
    _close_world_sockets()
    if not active():
        return
    try:
        dist.distributed_c10d._abort_process_group()
    except Exception as exc:  # already half torn down by the failure: what is left goes with the process
        log.warning("leaving the broken process group: %s", str(exc).splitlines()[0] if str(exc) else exc)


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Sum (or max) a few floats over all ranks in one collective, on the CPU side."""
    if not active():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=_CONTROL)
    return t.tolist()


class Vote:
    """ "What is the highest flag any rank raised?", agreed on by all ranks one call late.

    Each call starts an asynchronous MAX all-reduce of this rank's flag (0 for none; the
    preemption levels of preempt.py) and returns the result of the previous call's, which has
    long finished: the vote overlaps a training step instead of adding a round trip to every
    step. Every rank reads the same result at the same call, so they all stop at the same step.
    """

    def __init__(self) -> None:
        self._pending: Any = None
        self._buf: torch.Tensor | None = None

    def cast(self, flag: int) -> int:
        if not active():
            return int(flag)
        result = self.settle()
        self._buf = torch.tensor([float(flag)])
        self._pending = dist.all_reduce(self._buf, op=dist.ReduceOp.MAX, group=_CONTROL, async_op=True)
        return result

    def settle(self) -> int:
        """Wait for the outstanding vote (before other collectives end the run); its result."""
        if self._pending is None:
            return 0
        self._pending.wait()
        self._pending = None
        return int(self._buf.item()) if self._buf is not None else 0


def gather_to_main(obj: Any, rank: int) -> list[Any] | None:
    """Every rank's `obj` on rank 0 (None elsewhere)."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(obj, out, dst=0, group=_CONTROL)
    return out


def broadcast_from_main(obj: Any) -> Any:
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_CONTROL)
    return box[0]


def barrier() -> None:
    if active():
        dist.barrier()


def finish(code: int) -> NoReturn:
    """Leave the process: after success, barrier and destroy; always flush, then os._exit."""
    if active() and code in (exitcodes.OK, exitcodes.PREEMPTED):
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception as exc:  # a peer that died now must not turn success into a hang
            log.warning("tear-down: %s", str(exc).splitlines()[0] if str(exc) else exc)
            code = code or 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
