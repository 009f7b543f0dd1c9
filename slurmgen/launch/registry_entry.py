"""A launch's entry in the run registry (runs/model.py): written at the start, updated per attempt
and at the end with the verdict, including when the launch fails or is interrupted.

The verdict itself is the attempt state machine's (attempt.py); this module only translates
its outcome (exit code, first failure, signals) into the run model's words.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from slurmgen.contract import envvars, exitcodes
from slurmgen.contract.files import LAUNCH_LOG_LIMIT, LAUNCH_LOG_NAME, LAUNCH_LOGS_DIR
from slurmgen.contract.states import State
from slurmgen.runs import stop_request
from slurmgen.runs.model import Failure, NewRun, Recorder
from slurmgen.runs.registry import default_path
from slurmgen.runs.trainer_records import record_dir

if TYPE_CHECKING:
    from slurmgen.launch.plan import LaunchPlan


def new_run(
    plan: LaunchPlan, name: str, command: list[str], stop_file: Path | None = None, log_file: Path | None = None
) -> NewRun:
    """The run `plan` starts: keyed by its launch id, its run records by its group (SLURMGEN_GROUP);
    `stop_file` is where the page or `slurmgen cancel` asks it to stop (runs/stop_request.py),
    `log_file` where the launcher keeps what the nodes sent (the page's log view)."""
    run_id = plan.env.get(envvars.GROUP) or None
    logs = posixpath.join(plan.workdir, plan.log_dir)
    return NewRun(
        kind="launch",
        key=plan.env.get(envvars.LAUNCH_ID) or run_id or "",
        name=name,
        workdir=plan.workdir,
        nodes=len(plan.nodes),
        ranks=plan.world_size,
        run_id=run_id,
        record_dir=record_dir(plan.workdir, command, run_id) if run_id else None,
        logs=[{"node": n.host, "path": logs} for n in plan.nodes],
        info={
            "command": command,
            "hosts": [n.host for n in plan.nodes],
            "pid": os.getpid(),
            "max_restarts": plan.max_restarts,
            **({"stop_file": str(stop_file)} if stop_file else {}),
            **({"log_file": str(log_file)} if log_file else {}),
            **({"timeline": plan.env[envvars.TIMELINE_FILE]} if plan.env.get(envvars.TIMELINE_FILE) else {}),
        },
    )


def outcome(code: int, interrupted: bool) -> State:
    """The run state an attempt's (or the launch's) exit code means."""
    if code == exitcodes.OK:
        return State.SUCCEEDED
    if interrupted:
        return State.STOPPED
    if code == exitcodes.PREEMPTED:
        return State.PREEMPTED
    return State.FAILED


@dataclass
class LaunchRecord:
    """The launch's row: `Launcher` reports attempts, `runner.launch` the end."""

    recorder: Recorder
    run: int | None = None
    failure: Failure | None = None  # the first failure of the latest attempt
    stop_file: Path | None = None  # the launch's stop channel (None: the row could not be written)
    timeline: str | None = None  # the run's timeline file (SLURMGEN_TIMELINE_FILE)
    log: IO[str] | None = None  # the nodes' lines, for the page (None: none kept)
    log_room: int = LAUNCH_LOG_LIMIT  # bytes the log may still take
    logs_at: str = ""  # where the nodes keep the rank logs (named when the log is full)

    @classmethod
    def start(
        cls, recorder: Recorder, plan: LaunchPlan, name: str, command: list[str], log_limit: int = LAUNCH_LOG_LIMIT
    ) -> LaunchRecord:
        """The row, and beside the registry it names the stop channel and the log (none without a
        launch id)."""
        launch_id = plan.env.get(envvars.LAUNCH_ID)
        registry = recorder.path or default_path()
        stop_file = stop_request.stop_file(registry, launch_id) if launch_id else None
        if stop_file is not None:
            try:
                stop_request.prepare(stop_file)
            except OSError:
                stop_file = None
        log_file = (
            registry.parent / LAUNCH_LOGS_DIR / LAUNCH_LOG_NAME.format(launch_id=launch_id) if launch_id else None
        )
        log = _private_log(log_file) if log_file else None
        run = recorder.started(new_run(plan, name, command, stop_file, log_file if log else None))
        return cls(
            recorder,
            run,
            stop_file=stop_file if run is not None else None,
            timeline=plan.env.get(envvars.TIMELINE_FILE),
            log=log,
            log_room=log_limit,
            logs_at=posixpath.join(plan.workdir, plan.log_dir),
        )

    def log_line(self, text: str) -> None:
        """One line into the launch's log while it has room; the line that would pass the limit is
        replaced by one saying where the whole logs are, and the log ends there."""
        if self.log is None:
            return
        line = text + "\n"
        self.log_room -= len(line.encode("utf-8", "replace"))
        if self.log_room < 0:
            line = (
                "slurmgen: ----- this log stops here, at its limit; "
                f"each node keeps its ranks' whole logs in {self.logs_at} -----\n"
            )
        try:
            self.log.write(line)
        except OSError:  # a full disk costs the page its log, never the launch
            self._close_log()
            return
        if self.log_room < 0:
            self._close_log()

    def _close_log(self) -> None:
        log, self.log = self.log, None
        if log is not None:
            with contextlib.suppress(OSError):  # the buffered rest did not fit either
                log.close()

    def attempt_started(self, number: int) -> None:
        self.failure = None
        self.log_line(f"slurmgen: ----- attempt {number} -----")
        self.recorder.attempt_started(self.run, number)

    def attempt_ended(self, number: int, code: int, interrupted: bool, failure: Failure | None) -> None:
        self.failure = failure
        self.recorder.attempt_ended(self.run, number, outcome(code, interrupted), failure)

    def recovered(self, number: int, what: str) -> None:
        """A warm restart in attempt `number`, or a node moved to a spare host after it."""
        self.recorder.recovered(self.run, number, what)

    def stopping(self) -> None:
        """A person's stop was taken: the run reads `stopping` until its ranks are gone."""
        self.recorder.stopping(self.run)

    def ended(self, code: int, interrupted: bool, failure: Failure | None = None) -> None:
        """The verdict: the last attempt's failure unless the launch failed outside an attempt.
        A stop request that came too late to be taken is removed with it."""
        self.recorder.ended(self.run, outcome(code, interrupted), code, failure or (self.failure if code else None))
        if self.stop_file is not None:
            self.stop_file.unlink(missing_ok=True)
        self._close_log()
        self.recorder.time_report(self.run, self.timeline)


def _private_log(path: Path) -> IO[str] | None:
    """The launch's log, 0600 in a 0700 directory (rank output may hold secrets), line-buffered so
    that the page follows it; None when it cannot be made (the launch goes on without it)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError:
        return None
    return os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="replace")
