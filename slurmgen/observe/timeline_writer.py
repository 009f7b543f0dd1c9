"""The timeline writer: one JSON line per phase of a rank, appended to $SLURMGEN_TIMELINE_FILE.

Why one file per job, appended by every rank with a single O_APPEND write per line: the reader
(`slurmgen status`, perhaps over SSH) then reads one file, and a line is far shorter than
PIPE_BUF, so local appends never interleave. On a network file system a line cut by a race is
skipped by the reader (slurmgen/jsonl.py) and costs one sample, never the run. The words and
fields are in contract/phases.py.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurmgen.contract import attempts, envvars, phases, warm


def attempt_of(environ: Mapping[str, str]) -> int:
    """The attempt this process belongs to (contract/attempts.py, counted from 1): the
    launcher's count, else Slurm's restarts plus one, else the first."""
    if environ.get(envvars.ATTEMPT, "").isdigit():
        return int(environ[envvars.ATTEMPT])
    restarts = environ.get("SLURM_RESTART_COUNT", "")
    return attempts.from_restart_count(int(restarts)) if restarts.isdigit() else attempts.FIRST


def process_start_time(
    stat_text: str | None = None, uptime_text: str | None = None, now: float | None = None
) -> float | None:
    """When the OS started this process (what its launcher did), from /proc; None elsewhere.
    Measured back from now through the uptime (1/100 s), not from the boot time /proc/stat
    gives (whole seconds)."""
    try:
        stat_text = stat_text if stat_text is not None else Path("/proc/self/stat").read_text()
        uptime_text = uptime_text if uptime_text is not None else Path("/proc/uptime").read_text()
        now = time.time() if now is None else now
        ticks = int(stat_text.rsplit(")", 1)[1].split()[19])  # field 22: starttime, after comm
        return now - (float(uptime_text.split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class TimelineWriter:
    """Appends this rank's timeline events; every failure to write is swallowed (a full disk
    must not stop training), counted in `lost`."""

    def __init__(self, path: str, rank: int, attempt: int, generation: int = 0):
        self.path, self.rank, self.attempt = path, rank, attempt
        # The warm restart's world this rank is in (phases.GENERATION): a process started for
        # one is told by its environment, a rank that kept its process moves on (Heartbeat.rejoined).
        self.generation = generation
        self.host, self.pid, self.lost = socket.gethostname(), os.getpid(), 0

    @classmethod
    def from_env(cls, rank: int, environ: Mapping[str, str] = os.environ) -> TimelineWriter | None:
        path = environ.get(envvars.TIMELINE_FILE)
        return cls(path, rank, attempt_of(environ), warm.generation_of(environ)) if path else None

    def write(self, event: str, when: float | None = None, **fields: Any) -> None:
        record = {
            "event": event,
            "rank": self.rank,
            "attempt": self.attempt,
            "time": time.time() if when is None else when,
            "host": self.host,
            "pid": self.pid,
            **({phases.GENERATION: self.generation} if self.generation else {}),
            **fields,
        }
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(record) + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            self.lost += 1

    def started(self) -> None:
        """The first words of a rank: when its process started (if the OS says)."""
        when = process_start_time()
        if when is not None:
            self.write(phases.PROCESS, when)


def rank_started(rank: int, environ: Mapping[str, str] = os.environ) -> TimelineWriter | None:
    """A rank whose imports are done: its process start and the imports phase; the writer for
    the rendezvous (None when no launcher asked for a timeline)."""
    timeline = TimelineWriter.from_env(rank, environ)
    if timeline is not None:
        timeline.started()
        timeline.write(phases.IMPORTS)
    return timeline
