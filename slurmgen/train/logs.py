"""What a run tells the world: console lines, metrics.jsonl, and one heartbeat file per rank.

- Console: rank 0 shows progress (a tqdm bar on a terminal, a line every --log-every steps
  otherwise, so batch logs stay readable); every other rank prints warnings and errors only,
  prefixed `[rank N]`, because N copies of the same progress line hide the one line that matters.
- `metrics.jsonl` (rank 0 only): one JSON object per line with step, epoch, split, loss, lr,
  tokens_per_sec and wall_time, appendable across resumes.
- heartbeats: see slurmgen/observe/heartbeat.py (the writer `slurmgen.beat` shares).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

# The heartbeat writer lives in slurmgen.observe (any program's `slurmgen.beat` shares it);
# these names stay importable from here for the trainer and its tests.
from slurmgen import atomic
from slurmgen.observe.heartbeat import STALE_AFTER, Heartbeat, node_local_dir, read_heartbeats, remove_stale_node_dirs  # noqa: F401

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
