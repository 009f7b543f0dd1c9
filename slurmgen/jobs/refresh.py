"""Live Slurm states for every view of the runs: Slurm asked once per login node, the answer kept.

`ask_slurm` is the one way a list of Slurm jobs is asked about: grouped by where they were
submitted (here, or each `--remote` login node), one `query.ask` per group, and every state,
end time and attempt Slurm gave written back to the registry with when it was told
(`state_seen`). `slurmgen jobs` (listing.py) asks it about the rows it lists; the runs page
asks `refresh_active` about every Slurm job not known to have ended, in one batched query per
group (scontrol's one listing of every job for the living: it gives the restart count and end
time squeue's formats lack, and its output is parsed against recorded answers; sacct for the
ones the controller has forgotten, which have ended). Each query is bounded (query.timeout).

`Refresher` keeps the page fast: at most one refresh every REFRESH_EVERY seconds per registry,
in a thread of its own, which a request waits for at most WAIT seconds; a state the refresh
could not renew keeps its age (`stale_for`), which the list shows ("running, as of 2 min ago").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurmgen.contract.attempts import attempt_number
from slurmgen.contract.states import ENDED_WORDS, State, from_slurm
from slurmgen.errors import SlurmgenError
from slurmgen.heal.attempts import attempts_path, job_failure, parse_attempts, read_attempts
from slurmgen.jobs.commands import all_tasks
from slurmgen.jobs.query import ask
from slurmgen.jobs.slurm import SlurmJob
from slurmgen.jobs.slurm_runner import Runner
from slurmgen.jobs.view import attempt, attempt_start, ended_at, exit_code, overall
from slurmgen.runs.model import Failure, keep_failures
from slurmgen.runs.registry import JobRecord, Registry

# The page polls every few seconds; Slurm is asked at most this often for it.
REFRESH_EVERY = 5.0
# How long a request waits for a refresh it started (a healthy controller answers in tens of
# milliseconds; one that is down is waited for in the refresh's thread, not by the page).
WAIT = 1.0
# A state Slurm last told longer ago than this was not renewed by the refreshes since: say its age.
STALE_AFTER = 3 * REFRESH_EVERY
# The end of a job's attempts record the list reads for its in-job restarts (the latest attempt's
# lines are the last ones; a line is a few hundred bytes, a hung rank's with its stack a few KiB):
# each refresh reads at most this much per active job, however long the job has run.
ATTEMPTS_TAIL = 64 * 1024


def ask_slurm(
    runner_for: Callable[..., Runner],
    registry: Registry,
    records: list[JobRecord],
    note: Callable[[str], None],
    *,
    accounting: bool = False,
    batched: bool = False,
    now: float | None = None,
) -> dict[int, tuple[list[SlurmJob], bool]]:
    """seq -> (Slurm's lines for the job, whether its id now names a later job); the states,
    ends and attempts seen are kept, with `now` as when Slurm told them. `note` hears of a
    cluster whose controller does not answer (its jobs keep the state last seen, and its age)."""
    reused = registry.superseded()  # Slurm's answer for a reused id is about the newest job only
    by_where: dict[str | None, list[JobRecord]] = {}
    for r in records:
        by_where.setdefault(r.remote, []).append(r)
    found: dict[int, tuple[list[SlurmJob], bool]] = {}
    seen: dict[int, tuple[str, int | None]] = {}
    ended: dict[int, float | None] = {}
    attempts: dict[int, int] = {}
    started: dict[int, float | None] = {}
    told = time.time() if now is None else now
    for where, group in by_where.items():
        runner = runner_for(where, group[0].info.get("remote_setup"), group[0].info.get("ssh_config"))
        snap = ask(runner, [r.job_id for r in group], accounting=accounting, batched=batched)
        if snap.unanswered:
            note(snap.unanswered + (f" on {where}" if where else ""))
        for r in group:
            jobs = [] if r.seq in reused else all_tasks(snap, r)
            found[r.seq] = (jobs, r.seq in reused)  # type: ignore[index]
            if jobs and r.seq is not None:
                seen[r.seq] = overall(jobs) if r.info.get("array") else (jobs[0].state, exit_code(jobs[0]))
                known, end = ended_at(jobs)
                if known:
                    ended[r.seq] = end
                numbers = [n for n in (attempt(jobs), attempt_here(r)) if n is not None]
                if numbers:
                    attempts[r.seq] = max(numbers)
                known, start = attempt_start(jobs, told)
                if known:
                    started[r.seq] = start
    registry.remember_states(seen, ended, attempts, told, started)
    changed = [r for r in records if r.seq in seen and seen[r.seq] != (r.last_state, r.last_exit)]
    keep_failures(registry, {r.seq: failure_here(r, *seen[r.seq]) for r in changed if r.seq is not None})
    return found


def failure_here(record: JobRecord, state: str, code: int | None) -> Failure | None:
    """The first failure of a job that Slurm now says failed, from its attempts record when that is
    on this machine (run_slurm.sh's verdict: the rank and node; a --remote job's or an array's is
    named by `slurmgen status` and the job's page); None for a job that did not fail."""
    log_dir = record.info.get("log_dir")
    if from_slurm(state, code) is not State.FAILED or record.remote or record.info.get("array") or not log_dir:
        return None
    try:
        return job_failure(read_attempts(attempts_path(log_dir, record.job_id)))
    except (OSError, UnicodeDecodeError):
        return None


def attempt_here(record: JobRecord) -> int | None:
    """The attempt a job with in-job restarts (`restarts`) is at by its attempts record, when that
    is on this machine: each restart is a new job step in the same allocation, which Slurm's
    restart count never sees. Read from the file's last ATTEMPTS_TAIL bytes (its last attempt is
    there); None for any other job (a --remote job's or an array task's: `slurmgen status` and
    the job's page read those) or a record not readable from here."""
    log_dir = record.info.get("log_dir")
    if not record.info.get("restarts") or record.remote or record.info.get("array") or not log_dir:
        return None
    try:
        with open(attempts_path(log_dir, record.job_id), "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - ATTEMPTS_TAIL))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    if size > ATTEMPTS_TAIL:
        text = text.partition("\n")[2]  # the first line read is cut: not a record
    return max((attempt_number(r) for r in parse_attempts(text)), default=None)


def refresh_active(
    runner_for: Callable[..., Runner], registry: Registry, note: Callable[[str], None], now: float | None = None
) -> int:
    """Ask Slurm about every Slurm job of the registry not known to have ended, one batched query
    per login node (and here), and keep what it says; how many jobs were asked about."""
    records = registry.active()
    if records:
        ask_slurm(runner_for, registry, records, note, accounting=True, batched=True, now=now)
    return len(records)


def stale_for(row: dict[str, Any], now: float) -> float | None:
    """Seconds since Slurm last told this active Slurm job's state, when no refresh renewed it
    within STALE_AFTER (None: fresh, ended, or not a Slurm job). Never told: since submission."""
    if row.get("kind") != "slurm" or (row.get("state") or "") in ENDED_WORDS:
        return None
    told = row.get("state_seen") or row.get("submitted")
    age = now - told if told is not None else None
    return age if age is not None and age > STALE_AFTER else None


class Refresher:
    """At most one refresh of a registry's active Slurm jobs every `every` seconds, each in its own
    thread; `refresh(path)` starts one when due and waits for it at most `wait` seconds."""

    def __init__(self, runner_for: Callable[[], Any], every: float = REFRESH_EVERY, wait: float = WAIT):
        self.runner_for, self.every, self.wait = runner_for, every, wait
        self.lock = threading.Lock()
        self.started: dict[Any, float] = {}
        self.done: dict[Any, threading.Event] = {}
        self.notes: dict[Any, list[str]] = {}

    def refresh(self, path: Path | None) -> list[str]:
        """Start a refresh of `path` when one is due and wait for it (bounded); a request that
        finds one already under way does not wait (a slow controller costs one request, not every
        poll). What the last finished refresh had to say."""
        started = None
        with self.lock:
            done = self.done.get(path)
            if (done is None or done.is_set()) and time.monotonic() - self.started.get(path, -1e9) >= self.every:
                self.started[path], started = time.monotonic(), threading.Event()
                self.done[path] = started
                threading.Thread(target=self._run, args=(path, started), daemon=True, name="slurmgen-refresh").start()
        if started is not None:
            started.wait(self.wait)
        return list(self.notes.get(path, []))

    def _run(self, path: Path | None, done: threading.Event) -> None:
        notes: list[str] = []
        runners = self.runner_for()
        try:
            with Registry.open(path) as reg:
                refresh_active(runners, reg, notes.append)
        except SlurmgenError as exc:  # no registry yet, Slurm not installed here, a login node refused
            notes.append(str(exc))
        finally:
            runners.close()
            self.notes[path] = notes
            done.set()
