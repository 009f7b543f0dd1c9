"""Warm restart, the program's side: survive a peer's failure in this same process.

The protocol is contract/warm.py. When the launcher asks for it (SLURMGEN_WARM_DIR is set), a
rank whose collective failed because a peer died leaves the broken process group, waits for the
launcher's word on the new world, joins it and goes on from the latest checkpoint: no new
interpreter, no new `import torch`. The bundled trainer does it by itself; any other program
takes part with two calls around its step:

    from slurmgen.train import warm

    warm.join("nccl")  # init_process_group by env://, this world's connections noted
    while step < steps:
        try:
            train_step()
        except Exception as exc:
            if not warm.peer_failed(exc):
                raise
            warm.rejoin()  # the new world's process group, by env:// (MASTER_ADDR/PORT are updated)
            model, optimizer, step = reload_latest_checkpoint()  # and wrap the model in DDP again

A stop while a rank waits (the launcher chose a cold restart or stops the run: SIGTERM, or the
warning signal) ends the wait at once, as `rejoin` says: there is no world to step in, so a
handler that only sets the program's flag for its step loop would leave the rank waiting until
the launcher's SIGKILL.

A fresh process the launcher starts in place of the failed rank needs nothing: it is started
with the new world's MASTER_ADDR and MASTER_PORT, and resumes from the checkpoint as after any
restart. A program that does not take part just fails, and the launcher restarts it whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping

from slurmgen.contract import envvars, exitcodes
from slurmgen.contract import warm as protocol

log = logging.getLogger("slurmgen.train")
WAIT = 120.0  # the longest a rank waits for the launcher's word before it gives up (and fails)


class NoNewWorld(RuntimeError):
    """The launcher said nothing about a new world in time: the rank fails as it would have."""


class Stopped(SystemExit):
    """A stop signal came while the rank waited for a new world: the rank ends with
    exitcodes.PREEMPTED (75), what the bundled trainer exits with after SIGTERM or the warning
    signal in its step loop ("run me again": the latest checkpoint is the state, as after any
    stop). A SystemExit, so that a program that does not catch it ends with that code and no
    traceback, and an `except Exception` around the step does not take it for a peer's failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(exitcodes.PREEMPTED)
        self.signum = signum
        self.why = f"signal {signal.Signals(signum).name} while {protocol.WAITING}: stopping"


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the launcher asked for warm restarts (SLURMGEN_WARM_DIR set)."""
    return bool(environ.get(envvars.WARM_DIR))


def generation(environ: Mapping[str, str] = os.environ) -> int:
    """The world this process is in: 0 for the job's first, the launcher's number for a fresh
    process started after a warm restart (SLURMGEN_WARM_GENERATION)."""
    return protocol.generation_of(environ)


def peer_failed(exc: BaseException, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `exc` is a collective that failed (a peer died: gloo's closed connection, NCCL's
    abort), and the launcher offers a new world for it. Anything else is the program's own error."""
    import torch.distributed as dist

    if not enabled(environ) or not isinstance(exc, RuntimeError):
        return False
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return any(word in text for word in ("gloo", "nccl", "connection", "peer", "socket", "timed out"))


def wait_world(
    after: int,
    environ: Mapping[str, str] = os.environ,
    timeout: float = WAIT,
    beat: Callable[[], None] = lambda: None,
    stopped: Callable[[], int | None] = lambda: None,
) -> protocol.World:
    """The launcher's new world: the first one written whose generation is above `after`. `beat`
    is called at every look: a rank heartbeats while it waits, so that a watcher's
    --heartbeat-timeout does not judge it hung during a long wait (a replacement's start).
    `stopped` is read at every look too (every protocol.POLL): the number of a stop signal that
    arrived (the caller's handler noted it), which raises Stopped; None to go on waiting."""
    directory, deadline = environ.get(envvars.WARM_DIR, ""), time.monotonic() + timeout
    while True:
        beat()
        signum = stopped()
        if signum is not None:
            raise Stopped(signum)
        world = protocol.read(directory)
        if world is not None and world.generation > after:
            return world
        if time.monotonic() >= deadline:
            raise NoNewWorld(f"no new world from the launcher within {timeout:g} s (generation {after} was left)")
        time.sleep(protocol.POLL)


def adopt(world: protocol.World, environ: MutableMapping[str, str] = os.environ) -> None:
    """Make `world` this process's: MASTER_ADDR, MASTER_PORT, WORLD_SIZE and the generation, as a
    fresh process of it would be started."""
    environ.update(
        MASTER_ADDR=world.master_addr,
        MASTER_PORT=str(world.master_port),
        WORLD_SIZE=str(world.world_size),
        **{envvars.WARM_GENERATION: str(world.generation)},
    )


def join(backend: str = "gloo") -> None:
    """For any program: `init_process_group` by env:// (RANK, WORLD_SIZE, MASTER_ADDR/PORT), with
    this world's connections noted, so that leaving it after a peer's failure shuts them down and
    a healthy peer blocked in a collective with this rank learns of the failure at once."""
    import torch.distributed as dist

    from . import dist as ours

    before = ours.open_sockets() if enabled() else None
    dist.init_process_group(backend, init_method="env://")
    if before is not None:
        ours.hold_world(before)
        protocol.note_met(os.environ[envvars.WARM_DIR], dist.get_rank())


@contextlib.contextmanager
def stop_watch(warning: str = "USR2") -> Iterator[Callable[[], int | None]]:
    """For the wait only: SIGTERM and the warning signal (SIG<warning>, the trainer's
    --preempt-signal) end it. Yields what `wait_world` reads as `stopped`.

    Only a signal the program handles in Python is wrapped: its own handler runs first (its flag
    is set, its record kept, as the program expects), then the wait ends. A signal left to its
    default action already ends the process at once (143 for SIGTERM, as it would in the step
    loop); an ignored one stays ignored: neither is changed. Handlers are restored after the wait."""
    seen: list[int] = []
    previous: dict[signal.Signals, Callable] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in {signal.SIGTERM, signal.Signals[f"SIG{warning}"]}:
            handler = signal.getsignal(signum)
            if callable(handler):
                previous[signum] = handler
                signal.signal(signum, _chained(handler, seen))
    try:
        yield lambda: seen[0] if seen else None
    finally:
        for signum, mine in previous.items():
            signal.signal(signum, mine)


def _chained(handler: Callable, seen: list[int]) -> Callable:
    def both(signum: int, frame: object) -> None:
        seen.append(signum)
        handler(signum, frame)

    return both


def rejoin(
    backend: str | None = None,
    timeout: float = WAIT,
    beat: Callable[[], None] = lambda: None,
    warning: str = "USR2",
) -> protocol.World:
    """For any program: leave the broken process group, wait for the new world (calling `beat`,
    e.g. a `slurmgen.beat` heartbeat, as it waits), `join` it with this process's RANK. Returns the
    world joined; the caller reloads its checkpoint.

    SIGTERM or SIG<warning> during the wait (`stop_watch`) raises Stopped (exit 75, one log line,
    no traceback unless the program catches it): the launcher stops this rank (a cold restart, a
    person's stop, scancel), and without a world the program's step loop cannot act on its flag."""
    import torch.distributed as dist

    backend = backend or (dist.get_backend() if dist.is_initialized() else "gloo")
    from . import dist as ours

    ours.leave()
    log.warning("a peer failed: %s", protocol.WAITING)
    with stop_watch(warning) as stopped:
        try:
            world = wait_world(generation(), timeout=timeout, beat=beat, stopped=stopped)
        except Stopped as stop:
            log.warning("%s", stop.why)
            raise
    adopt(world)
    join(backend)
    log.warning("warm restart: joined generation %d at %s:%d", world.generation, world.master_addr, world.master_port)
    return world
