"""What a run tells the world: console lines, metrics.jsonl, and one heartbeat file per rank.

- Console: rank 0 shows progress (a tqdm bar on a terminal, a line every --log-every steps
  otherwise, so batch logs stay readable); every other rank prints warnings and errors only,
  prefixed `[rank N]`, because N copies of the same progress line hide the one line that matters.
- `metrics.jsonl` (rank 0 only): one JSON object per line with step, epoch, split, loss, lr,
  tokens_per_sec and wall_time, appendable across resumes.
- heartbeats (`Heartbeat`): each rank rewrites DIR/rank-NNNNN.json = {"rank", "step", "time",
  "pid", "host", "status"} atomically, at most every --heartbeat-every seconds and at every
  status change. DIR is $SLURMGEN_HEARTBEAT_DIR when a launcher sets it (a node-local
  directory that the launcher's watcher reads: see `contract.envvars.HEARTBEAT_DIR`). Otherwise DIR is
  private to the run on the node's tmpfs (`node_local_dir`), and each node's local rank 0
  copies its node's records into OUT_DIR/heartbeats/node-HOST-NODE_RANK.json every 5 heartbeats
  and at the end: a shared file system sees one write per node every few seconds instead of
  one per rank per second. A watcher compares `time` (the writer's clock) with its own to
  tell a hung rank (stale heartbeat) from a slow one (fresh heartbeat, slow steps). status is
  running | evaluating | checkpointing | done | preempted | failed; only "running" promises
  another beat within --heartbeat-every (during a checkpoint every rank waits while rank 0
  copies the state and waits for the previous write, which is not a hang).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from slurmgen import atomic
from slurmgen.contract import envvars, states

LOGGER = "slurmgen.train"


class _RankFormatter(logging.Formatter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            msg += "\n" + self.formatException(record.exc_info)
        if record.levelno >= logging.WARNING:
            return f"[rank {self.rank}] {record.levelname.lower()}: {msg}"
        return f"[rank {self.rank}] {msg}" if self.rank else msg


class _TqdmAwareHandler(logging.StreamHandler):
    """Writes through tqdm while a bar is on screen, so log lines do not tear the bar."""

    bar_active = False

    def emit(self, record: logging.LogRecord) -> None:
        if not _TqdmAwareHandler.bar_active:
            return super().emit(record)
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:
            self.handleError(record)


def setup_logging(rank: int) -> logging.Logger:
    """Configure the trainer's logger once per process: INFO on rank 0, WARNING elsewhere."""
    logger = logging.getLogger(LOGGER)
    for h in list(logger.handlers):
        if getattr(h, "_slurmgen", False):
            logger.removeHandler(h)
    handler = _TqdmAwareHandler(sys.stderr)
    handler._slurmgen = True  # type: ignore[attr-defined]
    handler.setFormatter(_RankFormatter(rank))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False
    return logger


# The heartbeat contract between a launcher (or watcher) and any program it starts: when the
# launcher sets this variable, rank R writes DIR/rank-%05d.json there (the format above); a
# program that writes none is never judged hung.


# The node summary is rewritten every this many heartbeat periods (and at the end).
SUMMARY_EVERY_BEATS = 5
FINAL_STATUSES = frozenset(states.HEARTBEAT_WORD[s] for s in states.ENDED if s in states.HEARTBEAT_WORD)


def node_local_dir(out_dir: str | os.PathLike[str], node_rank: int, environ: Mapping[str, str]) -> Path:
    """Where a node's ranks write heartbeats when no launcher named a directory: tmpfs
    (/dev/shm) when there is one, in a directory that only this run on this node uses."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    run = "|".join([str(Path(out_dir).absolute()), environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_RESTART_COUNT", ""),
                    environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", ""), str(node_rank)])
    return base / f"slurmgen-heartbeats-{os.getuid()}-{hashlib.sha256(run.encode()).hexdigest()[:16]}"


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
    for path in sorted(d.glob("rank-*.json")) + sorted(d.glob("node-*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # vanished between glob and read
        for r in record.get("ranks", [record]):
            if r["rank"] not in found or r["time"] > found[r["rank"]]["time"]:
                found[r["rank"]] = r
    return found


class Heartbeat:
    """One small JSON file per rank; cheap enough to call every step (it throttles itself)."""

    def __init__(self, out_dir: str | os.PathLike[str], rank: int, every: float, local_rank: int = 0, node_rank: int = 0,
                 environ: Mapping[str, str] = os.environ):
        chosen = environ.get(envvars.HEARTBEAT_DIR)
        self.dir = Path(chosen) if chosen else node_local_dir(out_dir, node_rank, environ)
        # Without a launcher's watcher the run directory is the only place anyone looks.
        summarise = not chosen and local_rank == 0
        self.host, self.pid = socket.gethostname(), os.getpid()
        # Named by host and node rank: ranks started by hand may all call themselves node 0,
        # and test set-ups run several "nodes" on one host.
        node = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', self.host)}-{node_rank}"
        self.summary = Path(out_dir) / "heartbeats" / f"node-{node}.json" if summarise else None
        self.path = self.dir / f"rank-{rank:05d}.json"
        self.rank, self.every, self.last, self.summarised = rank, every, 0.0, 0.0
        self.status = "starting"

    def beat(self, step: int, status: str = "running", force: bool = False) -> None:
        now = time.time()
        if not force and status == self.status and now - self.last < self.every:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.last:
            self.remove_stale()
        record = {"rank": self.rank, "step": step, "time": now, "pid": self.pid, "host": self.host, "status": status}
        atomic.write_text(self.path, json.dumps(record) + "\n", fsync=False)
        self.last, self.status = now, status
        if self.summary is not None and (status in FINAL_STATUSES or now - self.summarised >= SUMMARY_EVERY_BEATS * self.every):
            if not self.summarised:  # the first beat of a node leader
                remove_stale_node_dirs(self.dir, now)
            self.summarise(now)

    def remove_stale(self) -> None:
        """This process's first beat: the temporary files of its own two names that a killed
        predecessor (the run this one resumes) left behind go (`atomic.remove_stale`)."""
        atomic.remove_stale(self.dir, [self.path.name])
        if self.summary is not None:
            atomic.remove_stale(self.summary.parent, [self.summary.name])

    def summarise(self, now: float | None = None) -> None:
        """Node leader: copy the node's records into the run directory's node summary."""
        if self.summary is None:
            return
        now = time.time() if now is None else now
        ranks = sorted(read_heartbeats(self.dir).values(), key=lambda r: r["rank"])
        self.summary.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(self.summary, json.dumps({"host": self.host, "time": now, "ranks": ranks}) + "\n", fsync=False)
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
            if self.summary is not None:
                shutil.rmtree(self.dir, ignore_errors=True)


class Metrics:
    """Append-only metrics.jsonl, written by rank 0 only (others get a disabled instance)."""

    def __init__(self, out_dir: str | os.PathLike[str], enabled: bool):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.enabled = enabled

    def drop_after(self, step: int) -> None:
        """On resume: forget records past the checkpoint's step; they are about to be redone."""
        if not self.enabled or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except ValueError:
                continue  # a line cut by a kill -9
        atomic.write_text(self.path, "".join(k + "\n" for k in kept), fsync=False)

    def write(self, **record: Any) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


class Progress:
    """A tqdm bar on a terminal, plain periodic lines otherwise, nothing on ranks other than 0."""

    def __init__(self, mode: str, enabled: bool, total: int, initial: int):
        self.logger = logging.getLogger(LOGGER)
        use_bar = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.bar = None
        self.lines = enabled and mode != "none" and not use_bar
        if enabled and use_bar and mode != "none":
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)
            _TqdmAwareHandler.bar_active = True

    def update(self, step: int, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def report(self, text: str, postfix: dict[str, str] | None = None) -> None:
        if self.bar is not None and postfix:
            self.bar.set_postfix(postfix, refresh=False)
        elif self.lines:
            self.logger.info(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            _TqdmAwareHandler.bar_active = False
