"""One model of a run, whatever started it, in the registry's SQLite file (registry.py).

A run is a row of the registry: a Slurm job (`submit`), an SSH launch (`launch`) or a start of a
coordinator group (`serve`), with its kind, name, state (a contract/states.py word), nodes x
ranks, when it started and ended, its exit code, its first failure (rank, node, code, cause),
the id its run records carry (`run_id`: the SLURMGEN_GROUP every rank was given, so a record is
found by id, never by walking directories; `record_dir` where that directory is known) and where
its logs are. Its attempts (restarts of a launch or group) are rows of `attempts`, each with
its state, cause and first failure; what a launch recovered without ending an attempt (a warm
restart, a node moved to a spare host) is kept in the row's info (`note_recovery`). A Slurm
job's attempts are in the attempts file its run_slurm.sh writes beside its logs; the row keeps
only how many (`attempt`, from Slurm's restart count whenever `jobs` or `status` asks), so the
list counts attempts of every kind in its SELECT.

`list_rows` answers the list of runs in one SELECT over indexed columns (1,000 runs in a few
milliseconds: tests/unit/jobs/test_runs.py measures it), newest first. `Recorder` is how a launcher
writes: one short connection per write, so a coordinator serving from several threads, or a
launch that lasts a week, never holds the file open between writes.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

from slurmgen.contract.exitcodes import HUNG
from slurmgen.contract.states import ACTIVE_WORDS, ENDED_WORDS, RUN_STATES, State
from slurmgen.errors import SlurmgenError
from slurmgen.runs.registry import JobRecord, Registry

KINDS = ("slurm", "launch", "group")
# The states of a run not yet ended, as the page counts them (SQL parameters: the order is fixed).
_NOT_ENDED = sorted({State.PENDING.value, *ACTIVE_WORDS})
log = logging.getLogger("slurmgen.runs")
# The key of a run's info holding the recoveries inside its attempts (note_recovery).
RECOVERIES = "recoveries"


class FailureFields(TypedDict):
    """A first failure as its row stores it (Failure.as_dict, the `failure` column's JSON)."""

    rank: int | None
    node: str | None
    code: int | None
    cause: str


# A run as `list_rows` and `get_row` return it (the shape the type checker holds readers to;
# a test keeps it equal to the SELECT's columns): the `jobs` table's columns, the JSON ones
# decoded, its attempt count (`attempts`: Slurm's restart count or its attempts' rows) and the
# newest attempt's cause.
class RunRow(TypedDict):
    seq: int
    kind: str
    job_id: str  # a Slurm job id; the launch id or GROUP.FIRST_ATTEMPT of the other kinds
    name: str
    state: str | None  # a contract/states.py word
    last_state: str | None  # Slurm's word for a Slurm job
    last_exit: int | None
    nodes: int | None
    ranks: int | None
    started: float | None
    ended: float | None
    remote: str | None
    output_dir: str
    submitted: float
    run_id: str | None
    record_dir: str | None
    logs: list[dict[str, str]]  # where its logs are: {"node", "path"} (and a group's "group")
    failure: FailureFields | None
    info: dict[str, Any]
    cluster: str
    state_seen: float | None  # when Slurm last told a Slurm job's state (None: never, or not a Slurm job)
    attempt_started: float | None  # when a Slurm job's current attempt started (None: not known, or not one)
    attempts: int
    last_cause: str | None


# One of a run's attempts as `attempts_of` returns it: the `attempts` table's columns but `run`.
class RunAttemptRow(TypedDict):
    number: int
    state: str
    started: float
    ended: float | None
    cause: str | None
    rank: int | None
    node: str | None
    code: int | None


@dataclass(frozen=True)
class Failure:
    """The first failure of a run or attempt: which rank on which node, its code, and why."""

    cause: str
    rank: int | None = None
    node: str | None = None
    code: int | None = None

    def as_dict(self) -> FailureFields:
        return {"rank": self.rank, "node": self.node, "code": self.code, "cause": self.cause}


@dataclass(frozen=True)
class NewRun:
    """What a launcher knows of a run when it starts it."""

    kind: str
    key: str  # unique per kind and machine: the launch id, GROUP.FIRST_ATTEMPT
    name: str
    workdir: str
    nodes: int
    ranks: int
    run_id: str | None = None
    record_dir: str | None = None
    logs: Sequence[dict[str, str]] = ()
    info: dict[str, Any] = field(default_factory=dict)


def size(nodes: int | None, ranks: int | None) -> str | None:
    """A run's size as every view writes it: nodes x ranks per node, as a job is asked for ("2x4":
    `--nodes 2 --gpus 4`, 8 ranks), or "3 nodes, 5 ranks" when the ranks do not split evenly (a
    group over hosts of different slots); None when either is unknown. (The row keeps the total.)"""
    if not nodes or not ranks:
        return None
    return f"{nodes}x{ranks // nodes}" if ranks % nodes == 0 else f"{nodes} nodes, {ranks} ranks"


def chain_label(info: Mapping[str, Any]) -> str | None:
    """Which link of which chain a Slurm job's row is (`submit --chain`, jobs/chain.py), as every
    list of runs writes it beside the name: "link 2/3 of chain 101"; None for a job of no chain.
    The links of a chain are rows of their own, each with its id, log and state; this groups them."""
    chain = info.get("chain")
    if not isinstance(chain, Mapping) or not chain.get("links"):
        return None
    return f"link {chain.get('link')}/{len(chain['links'])} of chain {chain.get('id')}"


def check_kinds(kinds: Iterable[str]) -> list[str]:
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise SlurmgenError(f"kind: expected one of {', '.join(KINDS)} (got {bad[0]!r})")
    return list(kinds)


def check_states(states: Iterable[str]) -> list[str]:
    words = [s.value for s in RUN_STATES]
    bad = [s for s in states if s not in words]
    if bad:
        raise SlurmgenError(f"state: expected one of {', '.join(words)} (got {bad[0]!r})")
    return list(states)


def add_run(reg: Registry, run: NewRun, now: float) -> int:
    """Insert a run (state running) and return its row number."""
    cursor = reg.db.execute(
        "INSERT INTO jobs (job_id, name, output_dir, remote, submitted, last_state, info, cluster, kind, state, "
        "nodes, ranks, started, run_id, record_dir, logs) VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            run.key,
            run.name,
            run.workdir,
            now,
            State.RUNNING.value,
            json.dumps(run.info, sort_keys=True),
            socket.gethostname(),
            run.kind,
            State.RUNNING.value,
            run.nodes,
            run.ranks,
            now,
            run.run_id,
            run.record_dir,
            json.dumps(list(run.logs)),
        ),
    )
    assert cursor.lastrowid is not None  # for type checkers: an INSERT sets it
    return cursor.lastrowid


def find_run(reg: Registry, kind: str, key: str) -> int | None:
    """The newest run of this kind with this key recorded on this machine."""
    row = reg.db.execute(
        "SELECT seq FROM jobs WHERE kind = ? AND job_id = ? AND cluster = ? ORDER BY seq DESC LIMIT 1",
        (kind, key, socket.gethostname()),
    ).fetchone()
    return row[0] if row else None


def start_attempt(reg: Registry, run: int, number: int, now: float) -> None:
    reg.db.execute(
        "INSERT OR REPLACE INTO attempts (run, number, state, started) VALUES (?, ?, ?, ?)",
        (run, number, State.RUNNING.value, now),
    )
    reg.db.execute(
        "UPDATE jobs SET state = ?, last_state = ? WHERE seq = ?", (State.RUNNING.value, State.RUNNING.value, run)
    )


def mark_stopping(reg: Registry, run: int) -> None:
    """A stop was taken and the ranks are being stopped: the run (and its open attempt) reads
    `stopping` until the launcher records how it ended."""
    words = (State.STOPPING.value, State.STOPPING.value)
    reg.db.execute("UPDATE jobs SET state = ?, last_state = ? WHERE seq = ? AND ended IS NULL", (*words, run))
    reg.db.execute("UPDATE attempts SET state = ? WHERE run = ? AND ended IS NULL", (State.STOPPING.value, run))


def mark_slurm_stopping(reg: Registry, run: int) -> None:
    """A person's "checkpoint and stop" of a running Slurm job was sent: it reads `stopping` until
    Slurm says how it ended (its `last_state` stays Slurm's word, which the refreshes compare)."""
    reg.db.execute(
        "UPDATE jobs SET state = ? WHERE seq = ? AND state IN (?, ?)",
        (State.STOPPING.value, run, State.STARTING.value, State.RUNNING.value),
    )


def end_attempt(reg: Registry, run: int, number: int, state: State, failure: Failure | None, now: float) -> None:
    f = failure or Failure(cause="")
    reg.db.execute(
        "UPDATE attempts SET state = ?, ended = ?, cause = ?, rank = ?, node = ?, code = ? "
        "WHERE run = ? AND number = ?",
        (state.value, now, f.cause or None, f.rank, f.node, f.code, run, number),
    )


def end_run(reg: Registry, run: int, state: State, code: int | None, failure: Failure | None, now: float) -> None:
    """The run's verdict: its state, exit code and first failure (None: it did not fail)."""
    reg.db.execute(
        "UPDATE jobs SET state = ?, last_state = ?, last_exit = ?, ended = ?, failure = ? WHERE seq = ?",
        (state.value, state.value, code, now, json.dumps(failure.as_dict()) if failure else None, run),
    )


def keep_failures(reg: Registry, failures: Mapping[int, Failure | None]) -> None:
    """A Slurm job's first failure as its attempts record tells it (None: it did not fail, e.g. it
    was requeued and runs again), kept in its row so the runs list names the failed rank of a
    Slurm job as it does a launch's and a group's."""
    with reg.transaction():
        reg.db.executemany(
            "UPDATE jobs SET failure = ? WHERE seq = ? AND failure IS NOT ?",
            [(text, seq, text) for seq, f in failures.items() for text in [json.dumps(f.as_dict()) if f else None]],
        )


def retell_cause(reg: Registry, run: int, number: int, old: str, new: str) -> None:
    """A failure told again once more is known of it (where a hung rank was stuck, which a
    coordinator's agent reports after the verdict): the attempt's words and, where they are
    the same, the run's."""
    reg.db.execute("UPDATE attempts SET cause = ? WHERE run = ? AND number = ? AND cause = ?", (new, run, number, old))
    row = reg.db.execute("SELECT failure FROM jobs WHERE seq = ?", (run,)).fetchone()
    failure = json.loads(row[0]) if row is not None and row[0] else None
    if isinstance(failure, dict) and failure.get("cause") == old:
        reg.db.execute("UPDATE jobs SET failure = ? WHERE seq = ?", (json.dumps({**failure, "cause": new}), run))


def note_recovery(reg: Registry, run: int, number: int, what: str, now: float) -> None:
    """A recovery of attempt `number` that did not end it, kept in the row's info (RECOVERIES):
    a launch's warm restart ("warm restart 1: rank 3 started anew after ...") or a node moved to a
    spare host before the next attempt. Only the launcher knew of them; the run page's attempts
    and `slurmgen status` show them from here (`recoveries_of`)."""
    row = reg.db.execute("SELECT info FROM jobs WHERE seq = ?", (run,)).fetchone()
    if row is not None:
        info = json.loads(row[0] or "{}")
        info[RECOVERIES] = [*info.get(RECOVERIES, []), {"attempt": number, "time": now, "what": what}]
        reg.db.execute("UPDATE jobs SET info = ? WHERE seq = ?", (json.dumps(info, sort_keys=True), run))


def recoveries_of(info: Mapping[str, Any]) -> dict[int, list[str]]:
    """attempt -> what was recovered in it, in order (`note_recovery`), from a run row's info."""
    out: dict[int, list[str]] = {}
    for r in info.get(RECOVERIES) or []:
        if isinstance(r, dict) and isinstance(r.get("attempt"), int) and r.get("what"):
            out.setdefault(r["attempt"], []).append(str(r["what"]))
    return out


def keep_time_report(reg: Registry, run: int, report: dict[str, Any]) -> None:
    """Write where the run's time went (its stragglers and goodput, observe/report.py) into its
    row's info: the run record keeps them once the timeline file is gone or out of reach."""
    row = reg.db.execute("SELECT info FROM jobs WHERE seq = ?", (run,)).fetchone()
    if row is not None:
        info = {**json.loads(row[0] or "{}"), **{k: report[k] for k in ("stragglers", "goodput") if k in report}}
        reg.db.execute("UPDATE jobs SET info = ? WHERE seq = ?", (json.dumps(info, sort_keys=True), run))


def time_report(reg: Registry, run: int, timeline: str, now: float) -> dict[str, Any]:
    """Where a launch's or group's time went (observe/report.py: the per-rank timeline,
    stragglers, goodput) from its timeline file and its attempts in the registry; {} when the
    file cannot be read here. Neither waits in a queue: the moments between the row and its first
    attempt are the launcher's own start-up, not a queue wait, so no submission time is given."""
    from slurmgen.observe.report import analyse

    try:
        text = Path(timeline).read_text(errors="replace")
    except OSError:
        return {}
    return analyse(text, attempt_bounds(attempts_of(reg, run)), None, now)


def find_by_ref(reg: Registry, ref: str, kinds: Sequence[str] = ("launch", "group")) -> RunRow | None:
    """The newest run of these kinds whose key (launch id, GROUP.N) or run id (SLURMGEN_GROUP)
    is `ref`: one indexed lookup, never a walk through directories."""
    marks = ", ".join("?" * len(kinds))
    row = reg.db.execute(
        f"SELECT seq FROM jobs WHERE kind IN ({marks}) AND (job_id = ? OR run_id = ?) ORDER BY seq DESC LIMIT 1",
        (*kinds, ref, ref),
    ).fetchone()
    return get_row(reg, row[0]) if row else None


def attempt_bounds(attempts: Sequence[RunAttemptRow]) -> list[dict[str, Any]]:
    """A run's attempts (attempts_of) in the attempts record's words (heal/attempts.py), which the
    timeline and goodput take: each attempt's start and end, by the launcher's clock."""
    out: list[dict[str, Any]] = []
    for a in attempts:
        out.append({"event": "start", "attempt": a["number"], "time": a["started"]})
        if a.get("ended") is not None:
            end = {"event": "end", "attempt": a["number"], "time": a["ended"], "state": a["state"]}
            told = {"code": a.get("code"), "rank": a.get("rank")}
            hung = {"hung_rank": a.get("rank")} if a.get("code") == HUNG else {}
            out.append({**end, **{k: v for k, v in told.items() if v is not None}, **hung})
    return out


_LIST_SQL = """
SELECT j.seq, j.kind, j.job_id, j.name, j.state, j.last_state, j.last_exit, j.nodes, j.ranks, j.started, j.ended,
       j.remote, j.output_dir, j.submitted, j.run_id, j.record_dir, j.logs, j.failure, j.info, j.cluster, j.state_seen,
       j.attempt_started, COALESCE(j.attempt, (SELECT COUNT(*) FROM attempts AS a WHERE a.run = j.seq)) AS attempts,
       (SELECT a.cause FROM attempts AS a WHERE a.run = j.seq ORDER BY a.number DESC LIMIT 1) AS last_cause
FROM jobs AS j {where} ORDER BY j.started DESC, j.seq DESC {limit}
"""


def _where(kinds: Sequence[str], states: Sequence[str], or_active: bool) -> tuple[str, list[str]]:
    where, args = [], []
    if kinds:
        where.append(f"j.kind IN ({', '.join('?' * len(kinds))})")
        args += list(kinds)
    if states:
        ended = sorted(ENDED_WORDS) if or_active else []
        also = f" OR j.state IS NULL OR j.state NOT IN ({', '.join('?' * len(ended))})" if ended else ""
        where.append(f"(j.state IN ({', '.join('?' * len(states))}){also})")
        args += [*states, *ended]
    return ("WHERE " + " AND ".join(where)) if where else "", args


def list_rows(
    reg: Registry,
    kinds: Sequence[str] = (),
    states: Sequence[str] = (),
    limit: int | None = None,
    or_active: bool = False,
    offset: int = 0,
) -> list[RunRow]:
    """The runs, newest first, as the list shows them: one SELECT (indexes on started, kind, state).

    `or_active`: also the runs not yet ended whatever `states` says (their stored state may be
    stale: `jobs` asks Slurm, then filters again). `offset` skips the newest ones (a page)."""
    where, args = _where(kinds, states, or_active)
    page = (f"LIMIT {int(limit)}" if limit else "") + (f" OFFSET {int(offset)}" if limit and offset else "")
    return _decoded(reg.db.execute(_LIST_SQL.format(where=where, limit=page), args))


def count_rows(reg: Registry, kinds: Sequence[str] = (), states: Sequence[str] = ()) -> tuple[int, int]:
    """(runs, of them not ended) that `list_rows` would list without a limit: the page's count."""
    where, args = _where(kinds, states, False)
    row = reg.db.execute(
        f"SELECT COUNT(*), SUM(j.state IN ({', '.join('?' * len(_NOT_ENDED))})) FROM jobs AS j {where}",
        [*_NOT_ENDED, *args],
    ).fetchone()
    return int(row[0] or 0), int(row[1] or 0)


def job_record(row: RunRow) -> JobRecord:
    """A Slurm job's row as the registry's JobRecord (what `status`, `cancel` and `logs` take)."""
    return JobRecord(
        row["job_id"],
        row["name"],
        row["output_dir"],
        row["submitted"],
        row["remote"],
        row["last_state"],
        row["last_exit"],
        dict(row.get("info") or {}),
        row["seq"],
    )


def get_row(reg: Registry, seq: int) -> RunRow | None:
    """One run as the list shows it (None: no run with that row number)."""
    rows = _decoded(reg.db.execute(_LIST_SQL.format(where="WHERE j.seq = ?", limit=""), (seq,)))
    return rows[0] if rows else None


def _decoded(cursor: sqlite3.Cursor) -> list[RunRow]:
    names = [d[0] for d in cursor.description]
    rows = []
    for values in cursor:
        row = dict(zip(names, values))
        row["logs"] = json.loads(row["logs"] or "[]")
        row["failure"] = json.loads(row["failure"]) if row["failure"] else None
        row["info"] = json.loads(row["info"] or "{}")
        rows.append(cast("RunRow", row))
    return rows


def attempts_of(reg: Registry, run: int) -> list[RunAttemptRow]:
    cursor = reg.db.execute(
        "SELECT number, state, started, ended, cause, rank, node, code FROM attempts WHERE run = ? ORDER BY number",
        (run,),
    )
    names = [d[0] for d in cursor.description]
    return [cast("RunAttemptRow", dict(zip(names, values))) for values in cursor]


class Recorder:
    """Writes runs into the registry at `path` (None: the default), one short connection a write.

    `check()` before the run starts: a registry that cannot be opened is an error while nothing
    has started yet. After that a write that fails is logged and the run goes on: the registry
    describes runs, it must never stop one."""

    def __init__(self, path: Path | None = None, clock: Any = time.time):
        self.path, self.clock = path, clock

    def check(self) -> None:
        """Open (create) the registry once: a bad path fails here, before anything starts."""
        Registry.open(self.path, create=True).close()

    def _write(self, work: Any) -> Any:
        try:
            with Registry.open(self.path, create=True) as reg, reg.transaction(immediate=True):
                return work(reg, self.clock())
        except Exception as exc:  # whatever went wrong, the run itself goes on
            log.warning("slurmgen: warning: run registry %s: %s", self.path or "(default)", exc)
            return None

    def started(self, run: NewRun) -> int | None:
        return self._write(lambda reg, now: add_run(reg, run, now))

    def attempt_started(self, run: int | None, number: int) -> None:
        if run is not None:
            self._write(lambda reg, now: start_attempt(reg, run, number, now))

    def attempt_ended(self, run: int | None, number: int, state: State, failure: Failure | None) -> None:
        if run is not None:
            self._write(lambda reg, now: end_attempt(reg, run, number, state, failure, now))

    def stopping(self, run: int | None) -> None:
        if run is not None:
            self._write(lambda reg, now: mark_stopping(reg, run))

    def ended(self, run: int | None, state: State, code: int | None, failure: Failure | None) -> None:
        if run is not None:
            self._write(lambda reg, now: end_run(reg, run, state, code, failure, now))

    def recovered(self, run: int | None, number: int, what: str) -> None:
        if run is not None:
            self._write(lambda reg, now: note_recovery(reg, run, number, what, now))

    def retold(self, run: int | None, number: int, old: str, new: str) -> None:
        if run is not None:
            self._write(lambda reg, now: retell_cause(reg, run, number, old, new))

    def find(self, kind: str, key: str) -> int | None:
        return self._write(lambda reg, now: find_run(reg, kind, key))

    def time_report(self, run: int | None, timeline: str | None) -> None:
        """At the run's end: its stragglers and goodput from its timeline file, when this machine
        can read it (a file system the nodes share), kept in its row."""
        if run is not None and timeline:
            self._write(lambda reg, now: keep_time_report(reg, run, time_report(reg, run, timeline, now)))
