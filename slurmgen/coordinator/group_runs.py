"""A coordinator group's runs in the run registry (runs/model.py) of the machine serving it.

Each `start` of a group begins a run; the restarts that follow a failure (`max_restarts`) are
attempts of that run, numbered from 1 within it (contract/attempts.py: its restarts plus the
first), in the registry, in what every rank is told (SLURMGEN_ATTEMPT, so the timeline says the
same) and in the API's `run_attempt`; the coordinator's own count over all of a group's starts
stays the API's key of an attempt (`number`), which no view shows. A run is keyed GROUP.N, N
being the coordinator's number of its first attempt: unique per group on this server, and
derived from what the coordinator's own store keeps (attempt number minus restarts), so a
restarted server finds the run of a group it left running. The registry's path is `slurmgen
serve --registry` (default: this machine's, as for every command), which is where `slurmgen
jobs` on the server's machine looks. Beside it is each run's stop channel (runs/stop_request.py),
through which a run's controls (jobs/control.py: the run page's Stop, `slurmgen cancel GROUP.N`,
the JSON API) ask the server to stop the group; the server takes it on its tick (`stop_asked`).
"""

from __future__ import annotations

import contextlib
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING

from slurmgen.contract import envvars
from slurmgen.contract.attempts import from_restart_count
from slurmgen.contract.files import TIMELINE_NAME
from slurmgen.contract.states import State
from slurmgen.runs import stop_request
from slurmgen.runs.model import Failure, NewRun, Recorder
from slurmgen.runs.registry import default_path
from slurmgen.runs.trainer_records import record_dir

if TYPE_CHECKING:
    from slurmgen.coordinator.models import GroupConfig, RankOut
    from slurmgen.coordinator.state import Outcome
    from slurmgen.coordinator.store import AttemptRow, Plan


def run_key(group: str, number: int, restarts: int) -> str:
    return f"{group}.{number - restarts}"


def timeline_env(config: GroupConfig, group: str, number: int, restarts: int) -> dict[str, str]:
    """What every rank of an attempt is told besides the torchrun contract: its attempt number
    within its run, and (with a working directory, which the nodes share) the run's timeline file, named by
    the run's key, where the agents write each rank's start and exit and the program its phases."""
    env = {envvars.ATTEMPT: str(from_restart_count(restarts))}
    if config.cwd:
        env[envvars.TIMELINE_FILE] = posixpath.join(
            config.cwd, TIMELINE_NAME.format(job_id=run_key(group, number, restarts))
        )
    return env


def run_attempt(plan: Plan) -> int | None:
    """The attempt within its run its ranks were told (timeline_env), from its stored plan; None
    for a plan with no ranks. (Plans stored by earlier versions told the group's count.)"""
    envs = list(plan.get("env", {}).values())
    told = envs[0].get(envvars.ATTEMPT) if envs else None
    return int(told) if told and told.isdigit() else None


def first_failure(attempt: AttemptRow, outcome: Outcome) -> Failure | None:
    """The failed attempt's first failure: the rank and node the verdict names (the first
    non-zero exit, the hung rank, the lost worker), with the verdict's cause and code, so the
    attempt's row names the rank its cause names."""
    if outcome.state != State.FAILED.value:
        return None
    ranks = attempt["plan"]["ranks"]
    worker = outcome.worker if outcome.worker in ranks else None
    if worker is None:  # an outcome judged before it named its worker (or by an earlier version)
        worker = next((w for w, code in attempt["exit_codes"].items() if code != 0 and w in ranks), None)
    if worker is None:
        return Failure(cause=outcome.reason or "", code=outcome.exit_code)
    code = outcome.exit_code if outcome.worker == worker else attempt["exit_codes"][worker]
    return Failure(cause=outcome.reason or "", rank=ranks[worker], node=worker.rpartition("-")[0], code=code)


class GroupRuns:
    """What the coordinator's service tells the registry: an attempt started or ended, a run ended."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.rows: dict[str, int | None] = {}  # run key -> registry row
        self.registry = recorder.path or default_path()

    def stop_file(self, group: str, number: int, restarts: int) -> Path:
        """The stop channel of the run whose attempt `number` follows `restarts` restarts."""
        return stop_request.group_stop_file(self.registry, run_key(group, number, restarts))

    def stop_asked(self, group: str, number: int, restarts: int) -> str | None:
        """Who asked to stop this active attempt's run (the request taken, once), or None: one
        stat when no one did."""
        return stop_request.take(self.stop_file(group, number, restarts))

    def _stop_channel(self, group: str, number: int) -> dict[str, str]:
        """A new run's stop channel, ready (no leftover request), as its row's info names it; {}
        when the directory cannot be made (the run is then stopped from its group's page only)."""
        path = self.stop_file(group, number, 0)
        try:
            stop_request.prepare(path)
        except OSError:
            return {}
        return {"stop_file": str(path)}

    def _row(self, key: str) -> int | None:
        if key not in self.rows:
            self.rows[key] = self.recorder.find("group", key)
        return self.rows[key]

    def attempt_started(
        self, group: str, number: int, restarts: int, config: GroupConfig, ranks: list[RankOut], store_path: Path
    ) -> None:
        key = run_key(group, number, restarts)
        if restarts == 0:
            cwd = config.cwd or ""
            self.rows[key] = self.recorder.started(
                NewRun(
                    kind="group",
                    key=key,
                    name=group,
                    workdir=cwd,
                    nodes=len({r.host for r in ranks}),
                    ranks=len(ranks),
                    run_id=group,
                    record_dir=record_dir(cwd, config.argv, group) if cwd else None,
                    # the coordinator keeps the recent lines of every rank; the agents keep whole files
                    logs=[{"node": "coordinator", "path": str(store_path), "group": group}],
                    info={
                        "command": list(config.argv),
                        "workers": [r.worker for r in ranks],
                        "max_restarts": config.max_restarts,
                        **self._stop_channel(group, number),
                        **(
                            {"timeline": t}
                            if (t := timeline_env(config, group, number, 0).get(envvars.TIMELINE_FILE))
                            else {}
                        ),
                    },
                )
            )
        self.recorder.attempt_started(self._row(key), from_restart_count(restarts))

    def attempt_ended(self, group: str, attempt: AttemptRow, restarts: int, outcome: Outcome) -> None:
        row = self._row(run_key(group, attempt["number"], restarts))
        number = from_restart_count(restarts)
        self.recorder.attempt_ended(row, number, State(outcome.state), first_failure(attempt, outcome))

    def recovered(self, group: str, number: int, restarts: int, what: str) -> None:
        """A node moved to a spare for attempt `number` (after `restarts` restarts), kept with the
        attempt that runs on the spare (`slurmgen launch` keeps its moves with the attempt they
        followed; a group's move may also happen inside an attempt that had not started yet)."""
        self.recorder.recovered(self._row(run_key(group, number, restarts)), from_restart_count(restarts), what)

    def retold(self, group: str, number: int, key_attempt: int, restarts: int, old: str, new: str) -> None:
        """Attempt `number`'s failure in more words (where the hung rank was stuck); the run's key
        from any attempt of it (`key_attempt` with the `restarts` before it)."""
        in_run = from_restart_count(restarts - (key_attempt - number))
        self.recorder.retold(self._row(run_key(group, key_attempt, restarts)), in_run, old, new)

    def ended(self, group: str, attempt: AttemptRow, restarts: int, outcome: Outcome) -> None:
        key = run_key(group, attempt["number"], restarts)
        row = self._row(key)
        self.recorder.ended(row, State(outcome.state), outcome.exit_code, first_failure(attempt, outcome))
        envs = list(attempt.get("plan", {}).get("env", {}).values())  # a plan stored before timelines has none
        self.recorder.time_report(row, envs[0].get(envvars.TIMELINE_FILE) if envs else None)
        self.rows.pop(key, None)
        with contextlib.suppress(OSError):  # a request that came too late to be taken goes with the run
            self.stop_file(group, attempt["number"], restarts).unlink(missing_ok=True)
