"""What Slurm says about jobs, parsed. Pure: text in, frozen records out.

Sources, in the order `query.py` uses them:
- `scontrol show job -o [ID]`: one line per job (array tasks each on their own line), known to
  the controller until MinJobAge after the job ends; needs no accounting database, so it is
  the main source (many small sites have none).
- `sacct --parsable2 --noheader -o ...`: each step's state and exit code (batch, 0, 1, ...),
  and jobs the controller has forgotten. Fails with "accounting storage is disabled" where
  there is no database: the caller then says the state is the registry's last known one.
- The job's own log: srun writes `srun: error: NODE: task N: Exited with exit code C` for
  each failing task: the only per-task exit code Slurm keeps (sacct keeps one per step).
Checked against recorded output of Slurm 22.05.8 with slurmdbd on MariaDB (the test cluster's,
tests/unit/jobs/data/slurm/README.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slurmgen.contract import verdict
from slurmgen.contract.states import SLURM_ENDED

JOB_ID = re.compile(r"^[1-9][0-9]*(_[0-9]+)?$")
# Split before every " Key=" so values with spaces (Reason, Command) stay whole.
_FIELD = re.compile(r" (?=[A-Za-z][A-Za-z0-9:/_]*=)")
_TASK_ERROR = re.compile(r"^srun: error: (?P<node>[^:\s]+): tasks? (?P<tasks>[0-9,\-]+): (?P<what>.+)$")
_LABEL = re.compile(r"^ *(\d+): ?(.*)$")
# run_slurm.sh's rank wrapper (older scripts wrote no task).
_RANK_NOTE = re.compile(
    r"slurmgen-exit: rank (?P<rank>\d+) on (?P<node>\S+)(?: \(task (?P<task>\d+|null)\))? "
    r"exited with code (?P<code>\d+) at (?P<time>[\d.]+)"
)
_NULL = {"", "(null)", "None", "Unknown", "N/A"}
# bash's words for a command it could not start (exit code 127), said by the shells run_slurm.sh
# starts the program with (named slurmgen-task, -rank, -worker there), not by the program itself:
# `slurmgen-task: line 4: exec: torchrun: not found`, `slurmgen-rank: line 5: prog: command not found`.
_NOT_FOUND = re.compile(
    r"\bslurmgen-(?:task|rank|worker): line \d+: (?:exec: )?(?P<command>[^\n]+?): "
    r"(?:command not found|not found|No such file or directory)\r?$",
    re.M,
)


@dataclass(frozen=True)
class SlurmJob:
    """One job, or one array task, as Slurm reports it."""

    job_id: str  # the job's own id (an array task has one too)
    name: str = ""
    state: str = "UNKNOWN"
    reason: str | None = None  # why it is pending (or why it ended, e.g. NonZeroExitCode)
    array_job_id: str | None = None
    array_task: str | None = None  # "3", or "2-3%2" for the tasks not started yet
    nodes: str | None = None
    elapsed: str | None = None
    limit: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    signal: int | None = None
    stdout: str | None = None
    workdir: str | None = None
    eligible: str | None = None  # EligibleTime, the controller's local time: when a pending job may start
    expected: str | None = None  # a pending job's StartTime: when the backfill scheduler expects it to start
    end: str | None = None  # EndTime (the controller's local time): when it ended, once it has
    source: str = "scontrol"

    @property
    def key(self) -> str:
        """How users name it: ID, or ARRAYID_TASK for an array task."""
        if self.array_job_id and self.array_task is not None:
            return f"{self.array_job_id}_{self.array_task}"
        return self.job_id

    @property
    def ended(self) -> bool:
        return self.state in SLURM_ENDED

    @property
    def end_time(self) -> float | None:
        """When an ended job ended, in seconds since the epoch (None while it runs: Slurm's
        EndTime is then the limit's end; None too when Slurm gave none)."""
        if not self.ended or not self.end:
            return None
        try:
            return datetime.fromisoformat(self.end).timestamp()
        except ValueError:
            return None


@dataclass(frozen=True)
class TaskExit:
    """A task srun reported as failed, with the exit code or the signal that ended it."""

    node: str
    tasks: tuple[int, ...]
    what: str
    code: int | None = None

    def as_dict(self) -> dict:
        return {"node": self.node, "tasks": list(self.tasks), "what": self.what, "code": self.code}


def _value(text: str | None) -> str | None:
    return None if text is None or text in _NULL else text


def _exit(text: str | None) -> tuple[int | None, int | None]:
    code, _, sig = (text or "").partition(":")
    return (int(code) if code.isdigit() else None, int(sig) if sig.isdigit() else None)


def fields(line: str) -> dict[str, str]:
    """One `scontrol show ... -o` line as {Key: value}."""
    out: dict[str, str] = {}
    for part in _FIELD.split(line.strip()):
        key, _, value = part.partition("=")
        out.setdefault(key, value)
    return out


def parse_scontrol(text: str) -> list[SlurmJob]:
    """`scontrol show job -o` output: one SlurmJob per line."""
    jobs = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        f = fields(line)
        code, sig = _exit(f.get("ExitCode"))
        restarts = f.get("Restarts", "0")
        jobs.append(
            SlurmJob(
                job_id=f["JobId"],
                name=f.get("JobName", ""),
                state=f.get("JobState", "UNKNOWN").split()[0],
                reason=_value(f.get("Reason")),
                array_job_id=_value(f.get("ArrayJobId")),
                array_task=_value(f.get("ArrayTaskId")),
                nodes=_value(f.get("NodeList")),
                elapsed=_value(f.get("RunTime")),
                limit=_value(f.get("TimeLimit")),
                restarts=int(restarts) if restarts.isdigit() else 0,
                exit_code=code,
                signal=sig,
                stdout=_value(f.get("StdOut")),
                workdir=_value(f.get("WorkDir")),
                eligible=_value(f.get("EligibleTime")),
                expected=_expected_start(f),
                end=_value(f.get("EndTime")),
            )
        )
    return jobs


def _expected_start(f: dict[str, str]) -> str | None:
    """A pending job's StartTime, the backfill scheduler's estimate; not when it is before the job
    may start at all (a requeued job keeps its last run's start there until the scheduler says)."""
    start, eligible = _value(f.get("StartTime")), _value(f.get("EligibleTime"))
    if not f.get("JobState", "").startswith("PENDING") or start is None:
        return None
    return start if eligible is None or start >= eligible else None  # both ISO local times: ordered as text


# JobID names an array task ARRAY_TASK (5_1); JobIDRaw is the task's own id (8), the one its
# attempts file is named after, which only sacct still knows once the controller forgot the task.
SACCT_FIELDS = ("JobID", "JobIDRaw", "JobName", "State", "ExitCode", "Elapsed", "Timelimit", "NodeList", "WorkDir")


def parse_sacct(text: str) -> tuple[list[SlurmJob], dict[str, list[tuple[str, str, int | None]]]]:
    """`sacct --parsable2 --noheader -o <SACCT_FIELDS>`: jobs, and per job its steps (id, state, code).

    With `--duplicates` a requeued job has one record per run, oldest first: the last run is
    the job, with its steps, and the runs before it count as restarts."""
    jobs: dict[str, SlurmJob] = {}
    steps: dict[str, list[tuple[str, str, int | None]]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            continue
        f = dict(zip(SACCT_FIELDS, parts))
        job, dot, step = f["JobID"].partition(".")
        state = f["State"].split()[0] if f["State"] else "UNKNOWN"  # "CANCELLED by 0"
        code, sig = _exit(f["ExitCode"])
        if dot:
            # A step ended by a signal says 0:SIG; give it as a shell would, 128 + SIG.
            steps.setdefault(job, []).append((step, state, 128 + sig if not code and sig else code))
            continue
        array_job, _, task = job.partition("_")
        earlier = jobs.get(job)
        steps.pop(job, None)
        jobs[job] = SlurmJob(
            job_id=f["JobIDRaw"],
            name=f["JobName"],
            state=state,
            array_job_id=array_job if task else None,
            array_task=task or None,
            nodes=_value(f["NodeList"]),
            elapsed=_value(f["Elapsed"]),
            limit=_value(f["Timelimit"]),
            restarts=earlier.restarts + 1 if earlier else 0,
            exit_code=code,
            signal=sig,
            workdir=_value(f["WorkDir"]),
            source="sacct",
        )
    return list(jobs.values()), steps


def _task_ids(text: str) -> tuple[int, ...]:
    ids: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ids += range(int(lo), int(hi or lo) + 1)
    return tuple(ids)


def task_exits(log_text: str) -> list[TaskExit]:
    """srun's own lines about tasks that failed, in the order it wrote them (first = first to fail)."""
    out = []
    for line in log_text.splitlines():
        m = _TASK_ERROR.match(line)
        if not m:
            continue
        what = m["what"].strip()
        code = re.search(r"exit code (\d+)", what)
        out.append(TaskExit(m["node"], _task_ids(m["tasks"]), what, int(code.group(1)) if code else None))
    return out


def missing_command(log_text: str) -> str | None:
    """The first command the job's shells could not find (what an exit code 127 means), or None."""
    m = _NOT_FOUND.search(log_text)
    return m["command"] if m else None


def first_rank_exit(log_text: str) -> dict[str, Any] | None:
    """The rank that failed first, from the `slurmgen-exit:` notes of run_slurm.sh's rank wrapper,
    or None. The notes become verdict events ordered by their time (srun relays the nodes' notes
    in any order) and the contract's rule picks the first failure, as run_slurm.sh's
    `first_failure` does. Under torchrun srun's own lines (task_exits) name only a node's agent;
    this names the rank."""
    notes = sorted(_RANK_NOTE.finditer(log_text), key=lambda m: float(m["time"]))
    events = [
        verdict.exited(
            int(m["code"]), m["node"], int(m["rank"]), int(m["task"]) if m["task"] and m["task"].isdigit() else None
        )
        for m in notes
    ]
    first = verdict.decide(events).first
    if first is None:
        return None
    return {"rank": first.rank, "node": first.node, "task": first.task, "exit_code": first.code}


def split_label(line: str) -> tuple[int | None, str]:
    """`srun --label` output: ' 3: text' -> (3, 'text'); a line of the batch shell -> (None, line)."""
    m = _LABEL.match(line)
    return (int(m.group(1)), m.group(2)) if m else (None, line)


def valid_job_id(text: str) -> bool:
    return bool(JOB_ID.match(text))


@dataclass
class QueryResult:
    """Everything one query learned: jobs by key (and by own id), plus what could not be asked."""

    jobs: dict[str, SlurmJob] = field(default_factory=dict)
    steps: dict[str, list[tuple[str, str, int | None]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unanswered: str | None = None  # the controller did not answer: why, in one line (also in notes)

    def add(self, job: SlurmJob) -> None:
        # An array task is found by ID_N only: its own id would shadow the array's id.
        self.jobs.setdefault(job.key, job)

    def tasks_of(self, array_job_id: str) -> list[SlurmJob]:
        """Every task line of an array, by task index (a pending range sorts last)."""
        found = {j.key: j for j in self.jobs.values() if j.array_job_id == array_job_id}
        return sorted(
            found.values(),
            key=lambda j: (
                not (j.array_task or "").isdigit(),
                int(j.array_task) if j.array_task and j.array_task.isdigit() else 0,
            ),
        )


def expand_tasks(text: str) -> list[str]:
    """An ArrayTaskId of tasks not started yet ('2-3%2', '0,4-8:2') as single task ids."""
    out: list[str] = []
    for part in text.split("%")[0].split(","):
        span, _, step = part.partition(":")
        lo, _, hi = span.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out += [str(i) for i in range(int(lo), int(hi or lo) + 1, int(step) if step.isdigit() and int(step) else 1)]
    return out
