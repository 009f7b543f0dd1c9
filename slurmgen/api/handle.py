"""A handle on one run of the registry, as `Job.submit()`, `Job.launch()` and `slurmgen.submit`
return it: what `slurmgen status`, `logs` and `cancel` tell and do, from Python.

A handle holds only where its run is (the registry, the row, an array task) and reads the rest
again at each question, through the functions the commands call (jobs/commands.py, jobs/logs.py,
jobs/control.py): a notebook that asks `h.state` an hour later gets what `slurmgen status` would
say then, and a handle made in another process (`Handle.find`) works the same.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmgen.contract.states import ENDED_WORDS, STOP_ASKED, from_slurm
from slurmgen.errors import SlurmgenError

if TYPE_CHECKING:
    from slurmgen.jobs.control import Outcome
    from slurmgen.runs.registry import JobRecord, Registry

POLL = 0.25  # seconds between two looks at a run that has not ended (jobs/commands.py polls Slurm as often)


@dataclass
class Handle:
    """One run (a Slurm job, an array task of one, or an SSH launch) of the registry at `registry`
    (None: the default, as the commands' --registry). `kind` is the registry's word ("slurm",
    "launch"), `key` the Slurm job id or the launch id. `process` is the `slurmgen launch` this
    process started, when it did: waiting on it is waiting for the launch's end."""

    registry: Path | None
    seq: int
    kind: str
    key: str
    task: str | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def find(cls, ref: str, registry: Path | None = None) -> Handle:
        """The run `ref` names as the commands take it (a job id, ID_N, a name, an output dir, a launch id)."""
        from slurmgen.jobs.resolve import find
        from slurmgen.runs.model import find_run
        from slurmgen.runs.registry import Registry

        with Registry.open(registry) as reg:
            seq = find_run(reg, "launch", ref)
            if seq is not None:
                return cls(registry, seq, "launch", ref)
            record, task = find(reg, ref)
        return cls(registry, record.seq or 0, "slurm", record.job_id, task)

    # ---- what `slurmgen status` says ----------------------------------------------------------
    @property
    def state(self) -> str:
        """The run's state in slurmgen's words (contract/states.py: pending, running, succeeded, failed,
        preempted, stopped), Slurm's own word when it has none of them (UNKNOWN)."""
        return str(self._status(False)["state"])

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """Each attempt of the run (a requeue or a restart starts a new one), as `slurmgen status` lists them."""
        return list(self._status(False).get("attempts") or [])

    @property
    def timeline(self) -> dict[str, Any]:
        """Where the run's time went, as `slurmgen status --timeline --json` says it: the per-rank
        `timeline`, `stragglers` and `goodput` (empty when no rank or launcher recorded any)."""
        view = self._status(True)
        return {k: view[k] for k in ("timeline", "stragglers", "goodput") if k in view}

    def _status(self, with_timeline: bool) -> dict[str, Any]:
        from slurmgen.jobs import commands
        from slurmgen.runs.model import get_row

        with self._registry() as reg:
            if self.kind != "slurm":
                row = get_row(reg, self.seq)
                if row is None:
                    raise SlurmgenError(f"run: the registry {str(reg.path)!r} no longer holds run {self.seq}")
                return commands.run_status(reg, row, with_timeline)
            record = self._record(reg)
            view = self._with_runner(record, lambda r: commands.status(r, reg, record, self.task, with_timeline))
        word = from_slurm(view.get("state"), view.get("exit_code"), STOP_ASKED in record.info)
        return {**view, "state": word.value if word is not None else view.get("state")}

    def wait(self, timeout: float | None = None) -> str:
        """Block until the run has ended (every rank, after every retry); its final state. Raises
        TimeoutError when `timeout` seconds pass first (the run goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"launch {self.key} still {self.state} after {timeout:g}s") from None
            return self.state  # the launcher has written its verdict (or died, its row saying where it was)
        while (state := self.state) not in ENDED_WORDS:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind} run {self.key} still {state} after {timeout:g}s")
            time.sleep(POLL)
        return state

    # ---- `slurmgen logs` and `slurmgen cancel` ------------------------------------------------
    def logs(self, rank: int | None = None) -> list[str]:
        """The run's output so far, one `[rank R] text` line each as `slurmgen logs` prints it; only
        rank `rank`'s lines (without the label) when given."""
        from slurmgen.jobs.logs import format_line, log_path, tail
        from slurmgen.jobs.slurm_runner import LocalRunner
        from slurmgen.runs.model import get_row

        path: str | None
        with self._registry() as reg:
            if self.kind == "slurm":
                record = self._record(reg)
                path, torchrun = log_path(record, self.task), record.info.get("launcher") == "torchrun"
                data = self._with_runner(record, lambda r: r.read(path))
            else:
                row = get_row(reg, self.seq)
                path, torchrun = (row["info"].get("log_file") if row else None), False
                data = LocalRunner().read(path) if path else None
        lines, _ = tail(data, None, None, {rank} if rank is not None else None, torchrun)
        return [line.text if rank is not None else format_line(line, False) for line in lines]

    def cancel(self) -> Outcome:
        """End the run as `slurmgen cancel` does (scancel for a Slurm job or this array task, a stop
        request for a launch), through jobs/control.py, the one entry of a run's controls. An
        ended run is left alone (the outcome says so); Slurm's silence raises its error."""
        from slurmgen.jobs import control
        from slurmgen.jobs.cli_shared import Runners

        with self._registry() as reg:
            run = control.read(reg, self.seq)
            if run is None:
                raise SlurmgenError(control.no_run(self.seq, control.RunControl.CANCEL).said)
            action = control.RunControl.CANCEL if run.kind == "slurm" else control.RunControl.STOP
            runners = Runners(None, [])
            try:
                outcome = control.perform(reg, run, action, runners, "from the Python API", task=self.task)
            finally:
                runners.close()
        if outcome.error is not None:
            raise outcome.error
        return outcome

    # ---- where the run is ----------------------------------------------------------------------
    def _registry(self) -> Registry:
        from slurmgen.runs.registry import Registry

        return Registry.open(self.registry)

    def _record(self, reg: Registry) -> JobRecord:
        record = reg.by_seq(self.seq)
        if record is None:
            raise SlurmgenError(f"job: the registry {str(reg.path)!r} no longer holds job {self.key}")
        return record

    @staticmethod
    def _with_runner(record: JobRecord, work: Any) -> Any:
        """`work(runner)` with the runner of the job's Slurm (here, or its login node), closed after."""
        from slurmgen.jobs.cli_shared import Runners

        runners = Runners(None, [])
        try:
            return work(runners(record.remote, record.info.get("remote_setup"), record.info.get("ssh_config")))
        finally:
            runners.close()
