"""The heartbeat protocol's writer, shared by the bundled trainer and `slurmgen.beat`.

heartbeats (`Heartbeat`): each rank rewrites DIR/rank-NNNNN.json = {"rank", "step", "time",
  "pid", "host", "status"} atomically, at most every --heartbeat-every seconds and at every
  status change. DIR is $SLURMGEN_HEARTBEAT_DIR when a launcher sets it (a node-local
  directory that the launcher's watcher reads: see `contract.envvars.HEARTBEAT_DIR`). Otherwise DIR is
  private to the run on the node's tmpfs (`node_local_dir`), and each node's local rank 0
  copies its node's records into OUT_DIR/heartbeats/node-HOST-NODE_RANK.json every 5 heartbeats
  and at the end: a shared file system sees one write per node every few seconds instead of
  one per rank per second. A watcher compares `time` (the writer's clock) with its own to
  tell a hung rank (stale heartbeat) from a slow one (fresh heartbeat, slow steps). status is
  starting | running | evaluating | checkpointing | done | preempted | failed; only "running"
  promises another beat within --heartbeat-every (during a checkpoint every rank waits while
  rank 0 copies the state and waits for the previous write, which is not a hang; how long it may
  wait, the rank learns from its earlier ones).

Additive fields (contract/hangs.py): `timeout`, the seconds after `time` by which the next beat
is due, learned from this rank's own step (evaluation, checkpoint) times once it has enough of them;
`stack`: true when the rank dumps its Python stack into DIR/stack-NNNNN.txt on
contract.hangs.STACK_SIGNAL (faulthandler), which a watcher sends before it kills a hung rank.

Besides the heartbeat file, a `Heartbeat` given a timeline writer (observe/timeline_writer.py) records
the phases it can see from the beats themselves: the first step, each checkpoint's stall (the
time spent in "checkpointing"), the end, and a step sample at most once per period.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurmgen import atomic
from slurmgen.contract import envvars, files, hangs, phases, states, warm
from slurmgen.observe.timeline_writer import TimelineWriter

# The heartbeat contract between a launcher (or watcher) and any program it starts: when the
# launcher sets this variable, rank R writes DIR/files.HEARTBEAT_NAME there (the format above); a
# program that writes none is never judged hung.


# The node summary is rewritten every this many heartbeat periods (and at the end).
SUMMARY_EVERY_BEATS = 5
# The protocol's words this module writes and judges by (contract.states.HEARTBEAT_WORD).
STARTING, RUNNING = states.HEARTBEAT_WORD[states.State.STARTING], states.HEARTBEAT_WORD[states.State.RUNNING]
FINAL_STATUSES = frozenset(states.HEARTBEAT_WORD[s] for s in states.ENDED if s in states.HEARTBEAT_WORD)


def node_local_dir(out_dir: str | os.PathLike[str], node_rank: int, environ: Mapping[str, str]) -> Path:
    """Where a node's ranks write heartbeats when no launcher named a directory: tmpfs
    (/dev/shm) when there is one, in a directory that only this run on this node uses."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    run = "|".join(
        [
            str(Path(out_dir).absolute()),
            environ.get("SLURM_JOB_ID", ""),
            environ.get("SLURM_RESTART_COUNT", ""),
            environ.get("MASTER_ADDR", ""),
            _first_port(environ),
            str(node_rank),
        ]
    )
    return base / f"slurmgen-heartbeats-{os.getuid()}-{hashlib.sha256(run.encode()).hexdigest()[:16]}"


def _first_port(environ: Mapping[str, str]) -> str:
    """MASTER_PORT as the job started with it: a process started in a warm restart's world
    (contract/warm.py) has that world's port, and writes beside the ranks that kept theirs."""
    port, generation = environ.get("MASTER_PORT", ""), environ.get(envvars.WARM_GENERATION, "")
    if port.isdigit() and generation.isdigit():
        return str(warm.first_port(int(port), int(generation)))
    return port


# A node-local directory nobody wrote to for this long belongs to a run that was killed.
STALE_AFTER = 3600.0


def remove_stale_node_dirs(mine: Path, now: float) -> None:
    """Remove this user's node-local heartbeat directories that killed runs left behind. Safe
    for a live run too: its next beat creates its directory again."""
    for d in mine.parent.glob(f"slurmgen-heartbeats-{os.getuid()}-*"):
        try:
            newest = max([f.stat().st_mtime for f in d.iterdir()] + [d.stat().st_mtime])
        except OSError:
            continue
        if d != mine and now - newest > STALE_AFTER:
            shutil.rmtree(d, ignore_errors=True)


def read_heartbeats(directory: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Every rank's latest record in DIR: from rank-NNNNN.json files and node summaries."""
    found: dict[int, dict[str, Any]] = {}
    d = Path(directory)
    for path in sorted(d.glob(files.HEARTBEAT_GLOB)) + sorted(d.glob("node-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # vanished between glob and read
        for r in record.get("ranks", [record]):
            if r["rank"] not in found or r["time"] > found[r["rank"]]["time"]:
                found[r["rank"]] = r
    return found


class _Learner:
    """This rank's step, evaluation and checkpoint durations, and the timeout they give
    (contract/hangs.py).

    A step sample is the time between two step beats while running, per step; the first step of
    the process (start-up) and a step after a checkpoint or evaluation start afresh. An
    evaluation (checkpoint) sample is the time from entering "evaluating" ("checkpointing") to
    leaving it; a checkpoint beat that is not `bounded` (the wait for a whole write) is none."""

    LEAST = {
        RUNNING: hangs.LEAST_STEPS,
        hangs.EVALUATING: hangs.LEAST_EVALS,
        hangs.CHECKPOINTING: hangs.LEAST_CHECKPOINTS,
    }

    def __init__(self, period: float, factor: float, floor: float):
        self.period, self.factor, self.floor = period, factor, floor
        self.samples: dict[str, deque[float]] = {phase: deque(maxlen=hangs.WINDOW) for phase in self.LEAST}
        self.longest = dict.fromkeys(self.LEAST, 0.0)  # the longest sample ever, per phase
        self.mark: tuple[int, float] | None = None  # the last step beat while running
        self.counts = False  # whether the step after the mark is a sample (not start-up)
        self.entered: dict[str, float] = {}  # when the phase in progress began, for a phase sampled whole

    def observe(self, step: int, status: str, previous: str, now: float, bounded: bool = True) -> None:
        if status != previous:
            if previous in self.entered:
                self._sample(previous, now - self.entered.pop(previous))
            if status in hangs.LEARNED_PHASES and bounded:
                self.entered[status] = now
        if status != RUNNING:
            self.mark = None
            return
        if self.mark is None or previous != RUNNING:
            self.counts = self.mark is not None or previous in hangs.LEARNED_PHASES
            self.mark = (step, now)
        elif step > self.mark[0]:
            if self.counts:
                self._sample(RUNNING, (now - self.mark[1]) / (step - self.mark[0]))
            self.mark, self.counts = (step, now), True

    def _sample(self, phase: str, seconds: float) -> None:
        self.samples[phase].append(seconds)
        self.longest[phase] = max(self.longest[phase], seconds)

    def timeout(self, status: str, bounded: bool = True) -> float | None:
        if status not in self.LEAST or not bounded:
            return None
        return hangs.learned_timeout(
            self.samples[status], self.factor, self.floor, self.period, self.LEAST[status], self.longest[status]
        )


# The open stack file of this process: faulthandler writes into it from a signal handler, so it
# must stay open for the life of the process.
_stack_file: Any = None


def register_stack(path: Path) -> bool:
    """Dump every thread's Python stack into `path` on contract.hangs.STACK_SIGNAL (appending:
    a watcher empties the file before it asks). False where it cannot (no such signal, no file)."""
    global _stack_file
    try:
        f = open(path, "a")  # noqa: SIM115 - held open for the life of the process
        faulthandler.register(signal.Signals[f"SIG{hangs.STACK_SIGNAL}"], file=f, all_threads=True, chain=True)
    except (OSError, KeyError, ValueError, RuntimeError):
        return False
    _stack_file = f
    return True


class Heartbeat:
    """One small JSON file per rank; cheap enough to call every step (it throttles itself).

    `out_dir=None` (a program that has no run directory, `slurmgen.beat`) writes heartbeat
    files only where a launcher named a directory. `timeline` (default: from the environment)
    receives the phases the beats show: first step, checkpoint stalls, the end, step samples."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str] | None,
        rank: int,
        every: float,
        local_rank: int = 0,
        node_rank: int = 0,
        environ: Mapping[str, str] = os.environ,
        timeline: TimelineWriter | None | bool = True,
    ):
        chosen = environ.get(envvars.HEARTBEAT_DIR)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.dir = Path(chosen) if chosen else None if out_dir is None else node_local_dir(out_dir, node_rank, environ)
        # Without a launcher's watcher the run directory is the only place anyone looks.
        summarise = not chosen and local_rank == 0 and out_dir is not None
        # Named by host and node rank: ranks started by hand may all call themselves node 0,
        # and test set-ups run several "nodes" on one host.
        node = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.host)}-{node_rank}"
        self.summary = Path(out_dir) / "heartbeats" / f"node-{node}.json" if summarise and out_dir is not None else None
        self.path = self.dir / (files.HEARTBEAT_NAME % rank) if self.dir is not None else None
        self.rank, self.every, self.last, self.summarised = rank, every, 0.0, 0.0
        self.status = STARTING
        self.timeline = TimelineWriter.from_env(rank, environ) if timeline is True else timeline or None
        self.environ = environ  # live: slurmgen.train.warm.rejoin moves a program to its new world there
        # What the timeline needs between beats: the step the attempt began at, the start of
        # the checkpoint in progress, the last sample and the work done since.
        self.start_step: int | None = None
        self.first_done, self.ckpt_start, self.work = False, 0.0, 0.0
        self.sampled_step = self.ckpt_step = 0
        self.learn = _Learner(every, *hangs.settings(environ))
        self.stack = False

    def beat(
        self, step: int, status: str = RUNNING, force: bool = False, work: float | None = None, bounded: bool = True
    ) -> None:
        """`work`: seconds this rank spent working (not waiting for peers) in the step just done;
        the straggler check compares ranks by it, since a collective evens out step times.
        `bounded=False`: a phase whose length nothing this run learned bounds (the wait for a
        whole checkpoint write before the end): its beats publish no timeout, so a watcher judges
        it only if its process is stopped (contract/hangs.py)."""
        now = time.time()
        due = force or status != self.status or now - self.last >= self.every
        if self.timeline is not None:
            self._timeline(step, status, now, work, due)
        self.learn.observe(step, status, self.status, now, bounded)
        if not due:
            return
        if self.path is not None and not self.last:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.remove_stale()
            self.stack = register_stack(self.path.parent / (files.STACK_NAME % self.rank))
        # Made once: gone later, its launcher removed it as the run ended (scancel's TERM reaches the
        # watcher and the ranks at once); a last beat after that ("stopped", after the checkpoint
        # a TERM asks for) would make it again, left behind on the node.
        if self.path is not None and self.path.parent.is_dir():
            record: dict[str, Any] = {
                "rank": self.rank,
                "step": step,
                "time": now,
                "pid": self.pid,
                "host": self.host,
                "status": status,
            }
            timeout = self.learn.timeout(status, bounded)
            if timeout is not None:
                record["timeout"] = timeout
            if self.stack:
                record["stack"] = True
            with contextlib.suppress(FileNotFoundError):  # removed between the look and the write
                atomic.write_text(self.path, json.dumps(record) + "\n", fsync=False)
        self.last, self.status = now, status
        if self.summary is not None and (
            status in FINAL_STATUSES or now - self.summarised >= SUMMARY_EVERY_BEATS * self.every
        ):
            if not self.summarised and self.dir is not None:  # the first beat of a node leader
                remove_stale_node_dirs(self.dir, now)
            self.summarise(now)

    def rejoined(self, generation: int, step: int) -> None:
        """This rank kept its process through a warm restart and steps on from `step` (the
        checkpoint it reloaded) in world `generation`: its timeline lines carry the generation
        from now on, and its next step is that world's first step (contract/phases.py). The
        trainer says so when it rejoined; for a program of its own, `slurmgen.train.warm.rejoin`
        sets the generation in its environment, and its next beat finds it there."""
        if self.timeline is not None:
            self.timeline.generation = generation
        self.start_step, self.first_done, self.sampled_step, self.work = step, False, step, 0.0

    def _timeline(self, step: int, status: str, now: float, work: float | None, due: bool) -> None:
        """The phases this beat shows (contract/phases.py), written as they happen. A step sample
        is taken on the beats that write the heartbeat file (`due`), so a rank's last step on the
        timeline is its last heartbeat's, the step a hang verdict names ("stopped beating at step N")."""
        tl = self.timeline
        assert tl is not None
        if warm.generation_of(self.environ) > tl.generation:  # a program of its own rejoined (train/warm.py):
            self.rejoined(warm.generation_of(self.environ), step - 1)  # its first beat there is a step done
        if self.start_step is None:
            self.start_step = step
        elif not self.first_done and step > self.start_step:
            self.first_done, self.sampled_step = True, self.start_step
            tl.write(phases.FIRST_STEP, now, step=step)
        if work is not None:
            self.work += work
        if status == hangs.CHECKPOINTING and self.status != hangs.CHECKPOINTING:
            self.ckpt_start, self.ckpt_step = now, step
        elif self.status == hangs.CHECKPOINTING and status != hangs.CHECKPOINTING:
            tl.write(phases.CHECKPOINT, now, step=self.ckpt_step, stall=round(now - self.ckpt_start, 6))
        final = status in FINAL_STATUSES and status != self.status
        if self.first_done and step > self.sampled_step and (final or status == RUNNING and due):
            tl.write(phases.STEPS, now, step=step, work=round(self.work, 6))  # the last sample too: short runs get one
            self.sampled_step, self.work = step, 0.0
        if final:
            tl.write(phases.END, now, step=step, status=status)

    def remove_stale(self) -> None:
        """This process's first beat: the temporary files of its own two names that a killed
        predecessor (the run this one resumes) left behind go (`atomic.remove_stale`)."""
        if self.path is not None:
            atomic.remove_stale(self.path.parent, [self.path.name])
        if self.summary is not None:
            atomic.remove_stale(self.summary.parent, [self.summary.name])

    def summarise(self, now: float | None = None) -> None:
        """Node leader: copy the node's records into the run directory's node summary."""
        if self.summary is None or self.dir is None:  # (the second: for type checkers; a summary has a dir)
            return
        now = time.time() if now is None else now
        ranks = sorted(read_heartbeats(self.dir).values(), key=lambda r: r["rank"])
        self.summary.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(
            self.summary, json.dumps({"host": self.host, "time": now, "ranks": ranks}) + "\n", fsync=False
        )
        self.summarised = now

    def finish(self, barrier: Callable[[], None] = lambda: None) -> None:
        """Once every rank has written its last beat: the node leader's final summary, then the
        node-local directory removed (a launcher's directory is the launcher's to remove).

        Called by every rank with a collective `barrier` between the two (or none when peers may
        be gone): ranks started by hand on one host all call themselves local rank 0 of node 0,
        so several leaders share one directory and one summary, and a leader removing it must
        not cut short another one's summary. A summary that cannot be written (a full disk)
        still meets the barrier and removes the directory, then raises."""
        try:
            if self.summary is not None:
                self.summarise()
        finally:
            barrier()
            if self.summary is not None and self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
