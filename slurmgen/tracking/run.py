"""A run: one process's record of one training, kept in a directory of readable files.

`init()` decides, from the mode and the environment, whether this process records at all
(rank-0 mode: only rank 0; the others get a `NoOpRun` that checks its arguments and writes
nothing), which group and job type it belongs to, and which directory is its run
(identity.py). If that directory already holds a run, the process is a requeued or restarted
attempt of it: same id, `restart_count` + 1, a new entry in `attempts`, and metrics after
`resume_step` (the step of the checkpoint it resumed from) are dropped, because the resumed job
is about to log them again. A step a previous attempt already recorded is never written twice.

Status: running until `finish()`; the trainer maps its exit code (0, 75, anything else) to
finished, preempted or failed. A process that ends without `finish` is closed at exit as
finished, or failed after an uncaught exception; a killed one stays "running" until the next
attempt marks that attempt "lost".
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from slurmgen.contract.states import RUN_RECORD_WORD, State, from_exit_code

from . import store
from .adapters import Adapter
from .artifact import Artifact
from .errors import RunStateError, TrackingError
from .values import METRIC_TYPES, check_choice, check_epoch, check_metrics, check_step

log = logging.getLogger("slurmgen.tracking")
STATUSES = tuple(RUN_RECORD_WORD.values())  # running first, then the final ones
RUNNING, FINISHED, FAILED = (RUN_RECORD_WORD[s] for s in (State.RUNNING, State.SUCCEEDED, State.FAILED))
TOUCH_EVERY = 30.0  # seconds between refreshes of run.json's "updated" while logging


def now_iso() -> str:
    return datetime.now().astimezone().isoformat(timespec="milliseconds")


def status_for_exit_code(code: int | None) -> str:
    """The run record's word for how a program that exited with `code` ended."""
    return RUN_RECORD_WORD[from_exit_code(code)]


class _Checks:
    """Argument checks shared by Run and NoOpRun, so a bad call fails on every rank alike."""

    def _check_log(self, type: object, metrics: object, step: object, epoch: object):
        return (
            check_choice("type", type, METRIC_TYPES),
            check_metrics(metrics),
            check_step("step", step),
            check_epoch(epoch),
        )

    @staticmethod
    def _check_artifact(artifact: object, how: str) -> Artifact:
        if not isinstance(artifact, Artifact):
            raise TrackingError(how, "expects an Artifact from create_artifact()", type(artifact).__name__)
        return artifact


class NoOpRun(_Checks):
    """What ranks other than 0 get in rank-0 mode: same methods, checks arguments, writes nothing."""

    id = name = group = job_type = dir = None
    recording = False
    status = RUNNING

    def log(self, type: str, metrics: Mapping[str, Any], step: int | None = None, epoch: float | None = None) -> None:
        self._check_log(type, metrics, step, epoch)

    def create_artifact(
        self, name: str, type: str, description: str | None = None, metadata: dict | None = None
    ) -> Artifact:
        return Artifact(name, type, description, metadata, hash_files=False)

    def mark_output(self, artifact: Artifact) -> None:
        self._check_artifact(artifact, "mark_output")

    def mark_input(self, artifact: Artifact) -> None:
        self._check_artifact(artifact, "mark_input")

    def finish(self, status: str = FINISHED, exit_code: int | None = None) -> None:
        check_choice("status", status, STATUSES[1:])

    def note(self, key: str, value: Any) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Run(_Checks):
    """The recording run of this process. Create it with `init()`, not directly."""

    recording = True

    def __init__(
        self,
        run_dir: Path,
        root: Path,
        meta: dict[str, Any],
        floor: dict[str, int],
        last_step: int,
        adapters: list[Adapter],
    ):
        self.dir, self.root, self.meta = run_dir, root, meta
        self._floor = floor  # per type: the highest step that earlier attempts recorded
        self._high: dict[str, int] = {}  # per type: the highest step this attempt recorded
        self._last_step = last_step
        self._metrics = store.JsonlAppender(run_dir / store.METRICS_FILE)
        self._artifacts = store.JsonlAppender(run_dir / store.ARTIFACTS_FILE)
        self._adapters = adapters
        self._warned: set[str] = set()
        self._touched = time.monotonic()

    # -- identity --------------------------------------------------------------------------
    id = property(lambda self: self.meta["id"])
    name = property(lambda self: self.meta["name"])
    group = property(lambda self: self.meta["group"])
    job_type = property(lambda self: self.meta["job_type"])
    status = property(lambda self: self.meta["status"])
    restart_count = property(lambda self: self.meta["restart_count"])

    # -- recording -------------------------------------------------------------------------
    def log(self, type: str, metrics: Mapping[str, Any], step: int | None = None, epoch: float | None = None) -> None:
        """Append one record: `type` train|val|test, `metrics` name -> number, the global step
        (default: one past the last) and the epoch."""
        type, values, step, epoch = self._check_log(type, metrics, step, epoch)
        self._check_open("log")
        if step is None:
            step = self._last_step + 1
        if step <= self._floor.get(type, -1) or step < self._high.get(type, -1):
            self._warn_once(
                f"dup-{type}",
                f"{type} step {step} is not after step "
                f"{max(self._floor.get(type, -1), self._high.get(type, -1))} already recorded: dropped",
            )
            return
        record: dict[str, Any] = {"type": type, "step": step}
        if epoch is not None:
            record["epoch"] = epoch
        record["time"] = round(time.time(), 3)
        record["metrics"] = values
        self._metrics.append(record)
        self._high[type] = step
        self._last_step = max(self._last_step, step)
        self.meta["summary"].setdefault(type, {}).update(values)
        self.meta["steps"] = max(self.meta.get("steps") or 0, step)
        self._each_adapter("log", type, step, epoch, values)
        if time.monotonic() - self._touched > TOUCH_EVERY:
            self._save()

    def create_artifact(
        self, name: str, type: str, description: str | None = None, metadata: dict | None = None
    ) -> Artifact:
        return Artifact(name, type, description, metadata)

    def mark_output(self, artifact: Artifact) -> None:
        """Record `artifact` as something this run produced (a checkpoint, the final model)."""
        self._mark(artifact, "output")

    def mark_input(self, artifact: Artifact) -> None:
        """Record `artifact` as something this run read (a data set, a starting checkpoint)."""
        self._mark(artifact, "input")

    def _mark(self, artifact: Artifact, role: str) -> None:
        self._check_artifact(artifact, f"mark_{role}")
        self._check_open(f"mark_{role}")
        record = artifact.record(role, self._last_step if self._last_step >= 0 else None)
        self._artifacts.append(record)
        counts = self.meta["artifacts"]
        counts[f"{role}s"] = counts.get(f"{role}s", 0) + 1
        self._each_adapter("artifact", record)
        self._save()

    def note(self, key: str, value: Any) -> None:
        """Keep `value` (JSON) under `key` in this attempt's entry of run.json's `attempts`: what is
        true of this attempt alone, as the trainer's batch after the world changed size."""
        self._check_open("note")
        self.meta["attempts"][-1][key] = value
        self._save()

    def finish(self, status: str = FINISHED, exit_code: int | None = None) -> None:
        """End this attempt: status finished | failed | preempted. A second call does nothing."""
        check_choice("status", status, STATUSES[1:])
        if self.meta["status"] != RUNNING:
            return
        end = now_iso()
        self.meta.update(status=status, end=end, updated=end)
        if exit_code is not None:
            self.meta["exit_code"] = exit_code
        attempt = self.meta["attempts"][-1]
        attempt.update(end=end, status=status, **({"exit_code": exit_code} if exit_code is not None else {}))
        self._each_adapter("finish", status)
        self._save(final=True)
        self._metrics.close()
        self._artifacts.close()
        _open_runs.discard(self)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            self.finish(FINISHED)
        elif issubclass(kind, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            self.finish(status_for_exit_code(code), code)
        else:
            self.finish(FAILED)

    # -- internals -------------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self.meta["status"] != RUNNING:
            raise RunStateError(what, f"run {self.id!r} is already {self.meta['status']}", what, has_value=False)

    def _save(self, final: bool = False) -> None:
        """Rewrite run.json; the `final` one (finish) even on a full disk, in place if it must:
        a run that failed of a full disk must not stay "running" for good."""
        self.meta["updated"] = now_iso()
        store.write_json_atomic(self.dir / store.RUN_FILE, self.meta, in_place_when_full=final)
        self._touched = time.monotonic()

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("slurmgen.tracking: run %s: %s", self.id, message)

    def _each_adapter(self, hook: str, *args: Any) -> None:
        for adapter in list(self._adapters):
            try:
                getattr(adapter, hook)(*args)
            except Exception as exc:  # a mirror must not stop training: switch it off, say so once
                self._adapters.remove(adapter)
                log.warning(
                    "slurmgen.tracking: %s adapter failed in %s (%s: %s); it is off for the rest of this run",
                    adapter.name,
                    hook,
                    type(exc).__name__,
                    exc,
                )

    def __repr__(self) -> str:
        return f"Run({self.id!r}, status={self.status!r}, dir={str(self.dir)!r})"


_open_runs: set[Run] = set()
_crashed = False


def _excepthook(kind, value, tb) -> None:
    global _crashed
    _crashed = True
    _previous_hook(kind, value, tb)


def _close_at_exit() -> None:
    for run in list(_open_runs):
        with contextlib.suppress(Exception):  # never turn a clean exit into a traceback
            run.finish(FAILED if _crashed else FINISHED)


_previous_hook = sys.excepthook
_hooks_installed = False


def forget_open(run_dir: Path) -> None:
    """A new attempt of `run_dir` in this same process takes over from an older Run object of it:
    the old one stops writing (else closing it at exit would overwrite the new record)."""
    target = run_dir.resolve()
    for run in list(_open_runs):
        if run.dir.resolve() == target:
            run._metrics.close()
            run._artifacts.close()
            run.meta = dict(run.meta, status="superseded")
            _open_runs.discard(run)


def register(run: Run) -> None:
    """Close `run` at interpreter exit if the program forgets to (hooks installed on first use,
    not at import: importing the library must change nothing in the process)."""
    global _hooks_installed, _previous_hook
    if not _hooks_installed:
        _previous_hook = sys.excepthook
        sys.excepthook = _excepthook
        atexit.register(_close_at_exit)
        _hooks_installed = True
    _open_runs.add(run)
